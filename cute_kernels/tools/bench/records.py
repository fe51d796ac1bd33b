"""Read recorded benchmark results, of this package's schema (:mod:`.results`) or of the per-script
formats ``profiles/`` wrote before it, into documents of that schema (no torch, no GPU).

Recognized older formats: the GEMM bench (``{"env", "rows": [{"shape": [M, N, K], "cuBLAS": {"ms"...}}]}``),
the attention bench (``{"meta", "summary", "results": [{"flops", "impls"...}]}``), the decode bench
(``{"meta", "results": [{"kv_bytes", "impls"...}]}``, date and commit taken from the file name), the
bare-read ceiling probe (``{"meta", "rows": [{"label", "do_bench_us"...}]}``, kind ``read-ceiling``),
whose reads become the ceiling of the matching GEMM and decode rows (:func:`attach_ceilings`), and
the model benchmark's (``{"meta": {"model"...}, "bandwidth", "points"}``, kind ``model-decode``).

Which file is the record of each kind is not inferred from names, dates or git history (a copy
without ``.git`` would pick another): :data:`MANIFEST` in the results folder names it
(:func:`latest`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from . import results

KINDS = ("gemm", "attention", "decode")
#: the file in a results folder naming the record of each kind (:func:`latest`)
MANIFEST = "latest.json"
#: every kind :func:`load` reads (the package's schema: gemm, attention, attention-varlen, attention-backward, decode,
#: gaps)
READ_KINDS = ("gemm", "attention", "attention-varlen", "attention-backward", "decode", "gaps", "read-ceiling",
              "model-decode")
_DATE_COMMIT = re.compile(r"(\d{4}-\d{2}-\d{2})-([0-9a-f]{7,40})")
GEMM_PEERS = ("cuBLAS", "quack")
MATMUL_ROOF = "matmul roof"
ATTN_PEERS = ("cudnn_sdpa", "fa2_sdpa", "fa4")


def _from_name(name: str) -> dict:
    m = _DATE_COMMIT.search(name)
    return {"date": m.group(1), "commit": m.group(2)} if m else {}


def detect(d: dict) -> str | None:
    """The kind of a loaded JSON document, or None when it is none this module reads."""
    if not isinstance(d, dict):
        return None
    if d.get("schema") == results.SCHEMA:
        return d.get("kind")
    rows = d.get("rows") or []
    res = d.get("results") or []
    if "env" in d and rows and isinstance(rows[0], dict) and isinstance(rows[0].get("cuBLAS"), dict) \
            and "ms" in rows[0]["cuBLAS"]:
        return "gemm"
    if res and isinstance(res[0], dict) and "impls" in res[0]:
        if "kv_bytes" in res[0]:
            return "decode"
        if "flops" in res[0] and "S" in res[0]:
            return "attention"
    if rows and isinstance(rows[0], dict) and "label" in rows[0] and any("do_bench_us" in r for r in rows):
        return "read-ceiling"
    pts = d.get("points")
    if isinstance(d.get("meta"), dict) and "model" in d["meta"] and isinstance(d.get("bandwidth"), dict) \
            and isinstance(pts, list) and all(isinstance(p, dict) and "configs" in p for p in pts):
        return "model-decode"
    return None


def _finish(row: dict, recorded_best: float | None = None) -> dict:
    results.finish_row(row)
    if recorded_best:  # the per-round ratio the run recorded beats one recomputed from medians
        row["ratio_vs_best_peer"] = recorded_best
    return row


def _gemm(d: dict, name: str) -> dict:
    env = d["env"]
    meta = {"device": env.get("gpu", "?"), "date": env.get("date"), "commit": env.get("commit"),
            "versions": {"torch": env.get("torch")}, "timer": "triton.testing.do_bench (median, L2 flushed per call)",
            "repeats": env.get("repeats"), "quack_tuned": env.get("quack_tuned"),
            "preset": "decode" if "-decode-" in name else "llm" if "-llm-" in name else "issue"}
    rows = []
    for r in d["rows"]:
        m, n, k = r["shape"]
        fl, nb = 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n)
        impls = {}
        for nm, e in r.items():
            if nm == "shape" or not isinstance(e, dict):
                continue
            role = "ours" if nm == "cute-kernels" else "peer" if nm in GEMM_PEERS else "variant"
            if "ms" not in e:
                impls[nm] = {"role": role, "error": e.get("error", "not run")}
                continue
            us = e["ms"] * 1e3
            impls[nm] = {"role": role, "median_us": us, "tflops": fl / us / 1e6, "TBps": nb / us / 1e6,
                         **{x: e[x] for x in ("first_call_s", "clean_flush_us") if e.get(x) is not None}}
        bound = "memory" if fl / nb < results.ridge(None) else "compute"
        row = {"shape": f"{m}x{n}x{k}", "params": {"M": m, "N": n, "K": k}, "flops": fl, "bytes": nb,
               "bound": bound, "impls": impls, "notes": [], "ceiling": None}
        rows.append((row, (r.get("cute-kernels") or {}).get("ratio_vs_best_peer")))
    # compute-bound rows: the file's fastest cuBLAS rate as the matmul roof (no same-run ceiling then)
    roof = max((e["tflops"] for row, _ in rows for nm, e in row["impls"].items() if nm == "cuBLAS"
                and e.get("tflops")), default=None)
    for row, _ in rows:
        if roof and row["bound"] == "compute":
            row["impls"][MATMUL_ROOF] = {"role": "ceiling", "median_us": row["flops"] / roof / 1e6,
                                         "tflops": roof, "what": "the fastest cuBLAS rate of this run"}
            row["ceiling"] = MATMUL_ROOF
    rows = [_finish(row, best) for row, best in rows]
    return {"schema": results.SCHEMA, "kind": "gemm", "meta": meta, "roofs": {}, "rows": rows,
            "summary": results.summarize(rows), "notes": []}


def _attention(d: dict, name: str) -> dict:
    meta = {**_from_name(name), **d.get("meta", {})}
    rows = []
    for r in d["results"]:
        impls = {}
        for nm, e in r["impls"].items():
            role = "ours" if nm == "cute" else "ceiling" if nm == "mma_bound" else "peer" if nm in ATTN_PEERS \
                else "variant"
            impls[nm] = {"role": role, **{x: e[x] for x in ("median_us", "times_us", "tflops", "mismatch") if x in e}}
        nb = 2.0 * r["B"] * r["S"] * r["D"] * (2 * r["Hq"] + 2 * r["Hkv"])
        row = {"shape": r["shape"], "params": {x: r[x] for x in ("B", "Hq", "Hkv", "S", "D", "causal")},
               "flops": r["flops"], "bytes": nb, "bound": "compute", "impls": impls, "notes": r.get("notes", []),
               "ceiling": "mma_bound" if "mma_bound" in impls else None}
        rows.append(_finish(row, (r["impls"].get("cute") or {}).get("ratio_vs_best_peer")))
    return {"schema": results.SCHEMA, "kind": "attention", "meta": meta, "roofs": {}, "rows": rows,
            "summary": results.summarize(rows), "notes": []}


def _decode(d: dict, name: str) -> dict:
    meta = {**_from_name(name), **{k: v for k, v in d.get("meta", {}).items() if k != "summary"}}
    rows = []
    for r in d["results"]:
        D = r.get("D", 128)
        fl = 4.0 * r["B"] * r["Hq"] * r["L"] * D
        impls = {}
        for nm, e in r["impls"].items():
            role = "ours" if nm == "cute" else "peer" if nm in ATTN_PEERS else "variant"
            impls[nm] = {"role": role, "tflops": fl / e["median_us"] / 1e6,
                         **{x: e[x] for x in ("median_us", "times_us", "TBps") if x in e}}
        row = {"shape": r["shape"], "params": {x: r[x] for x in ("B", "Hq", "Hkv", "L") if x in r} | {"D": D},
               "flops": fl, "bytes": float(r["kv_bytes"]), "kv_bytes": r["kv_bytes"], "bound": "memory",
               "impls": impls, "notes": (d.get("notes") or {}).get(r["shape"], []), "ceiling": None}
        rows.append(_finish(row))
    return {"schema": results.SCHEMA, "kind": "decode", "meta": meta, "roofs": {}, "rows": rows,
            "summary": results.summarize(rows), "notes": []}


def _read_ceiling(d: dict, name: str) -> dict:
    """Rows {label, bytes, us, TBps, what}: the fastest bare read of each target's bytes under do_bench;
    with ``times_us`` (every column of the run: the bare reads, ours, the peers) and ``target_us``
    (the time the target asks) for the chart."""
    meta = {**_from_name(name), **d.get("meta", {})}
    rows = []
    for r in d["rows"]:
        if "do_bench_us" not in r or not r.get("bytes"):
            continue
        reads = {k: v for k, v in r["do_bench_us"].items() if is_bare_read(k)}
        if not reads:
            continue
        what = min(reads, key=reads.get)
        rows.append({"label": r["label"], "bytes": r["bytes"], "us": reads[what],
                     "TBps": r["bytes"] / reads[what] / 1e6, "what": what,
                     "times_us": {k: v for k, v in r["do_bench_us"].items() if isinstance(v, (int, float)) and v > 0},
                     "target": r.get("target"), "target_us": r.get("target_us")})
    return {"schema": results.SCHEMA, "kind": "read-ceiling", "meta": meta, "rows": rows, "roofs": {}}


def is_bare_read(column: str) -> bool:
    """A read-ceiling column that is a bare read (``torch.sum``, the Triton sums), not a kernel."""
    return column == "torch.sum" or column.startswith("triton")


#: the model benchmark's side of the kernels (cute_kernels.tools.bench_model.OURS; that module imports torch)
MODEL_OURS = "cute_kernels"
MODEL_BOUND = "read bound"


def _model_decode(d: dict, name: str) -> dict:
    """One row per (batch, context) point: every configuration's step time, our fastest as ``ours`` (the
    others ours "variant"), the PyTorch ones as peers, the step's read bound as the ceiling; rate:
    tokens per second.  The ratio to the best peer is the run's own best-vs-best ratio."""
    meta = {**_from_name(name), **d.get("meta", {})}
    rows = []
    for p in d["points"]:
        batch, nbytes = p["batch"], p.get("read_bytes")
        impls = {}
        for cname, c in p["configs"].items():
            role = "peer" if c.get("side") != MODEL_OURS else "ours" if cname == p.get("ours") else "variant"
            impls[cname] = {"role": role, "median_us": c["us"], "times_us": list(c.get("rounds_us") or []),
                            "tokens_per_s": batch * 1e6 / c["us"],
                            **({"TBps": nbytes / c["us"] / 1e6} if nbytes else {})}
        bound = p.get("bound_us")
        if bound:
            impls[MODEL_BOUND] = {"role": "ceiling", "median_us": bound, "tokens_per_s": batch * 1e6 / bound,
                                  **({"TBps": nbytes / bound / 1e6} if nbytes else {})}
        row = {"shape": f"b{batch}_ctx{p['ctx']}", "params": {"batch": batch, "ctx": p["ctx"]}, "flops": None,
               "bytes": nbytes, "bound": "memory", "impls": impls, "ours": p.get("ours"),
               "notes": list(p.get("notes") or []) + ([f"status: {p['status']}"] if p.get("status") else []),
               "ceiling": MODEL_BOUND if bound else None}
        rows.append(_finish(row, p.get("ratio")))
    return {"schema": results.SCHEMA, "kind": "model-decode", "meta": meta, "roofs": {}, "rows": rows,
            "summary": {**results.summarize(rows), "recorded": d.get("summary", {})}, "notes": []}


_ADAPTERS = {"gemm": _gemm, "attention": _attention, "decode": _decode, "read-ceiling": _read_ceiling,
             "model-decode": _model_decode}


def load(path: str | Path) -> dict:
    """A results file as a document of :data:`results.SCHEMA`, with ``source`` (its file name);
    raises ValueError for a file of no known format."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read a results file ({type(e).__name__}: {e})") from e
    kind = detect(d)
    if kind is None:
        raise ValueError(f"{path}: not a benchmark results file this version reads ({', '.join(READ_KINDS)})")
    doc = d if d.get("schema") == results.SCHEMA else _ADAPTERS[kind](d, path.name)
    doc["source"] = path.name
    doc.setdefault("meta", {}).setdefault("date", _from_name(path.name).get("date", "?"))
    doc["meta"].setdefault("commit", _from_name(path.name).get("commit", "?"))
    return doc


def _ceiling_key(label: str) -> str:
    """``"decode b1 hq32 hkv8 L32768"`` -> ``"b1_hq32_hkv8_L32768"``; ``"gemm 128x4096x4096 (A+B)"`` -> ``"128x4096x4096"``."""
    label = label.split("(")[0].strip()
    kind, _, rest = label.partition(" ")
    return rest.replace(" ", "_") if kind == "decode" else rest


def attach_ceilings(docs: list[dict]) -> None:
    """Give GEMM and decode rows without a ceiling the bare read of a ``read-ceiling`` document of the
    same shape (another run: the impl is named so, role "ceiling")."""
    reads = {}
    for doc in docs:
        if doc["kind"] == "read-ceiling":
            for r in doc["rows"]:
                reads[_ceiling_key(r["label"])] = (r, doc["meta"].get("commit", "?"))
    for doc in docs:
        if doc["kind"] not in ("gemm", "decode"):
            continue
        for row in doc["rows"]:
            hit = reads.get(row["shape"])
            if hit is None or (row.get("ceiling") and row["ceiling"] in row["impls"]
                               and row["bound"] == "memory"):
                continue
            if row["bound"] != "memory":
                continue
            r, commit = hit
            name = f"bare read ({commit})"
            row["impls"][name] = {"role": "ceiling", "median_us": r["us"], "TBps": r["bytes"] / r["us"] / 1e6,
                                  "what": r["what"]}
            row["ceiling"] = name
            results.finish_row(row)
        doc["summary"] = {**doc.get("summary", {}), "geomean_vs_ceiling": results.geomean(
            r.get("ours_vs_ceiling") for r in doc["rows"])}


def roofs(docs: list[dict]) -> dict:
    """The roofs to draw: those a document measured (the latest), else estimates from the records --
    the fastest bare read of a ``read-ceiling`` document (or the fastest KV read of any decode
    implementation) and the fastest cuBLAS rate of a GEMM document -- with ``how`` saying which."""
    measured = [d for d in docs if d.get("roofs", {}).get("matmul_TFLOPs")]
    if measured:
        best = max(measured, key=lambda d: str(d["meta"].get("date")))
        return {**best["roofs"], "source": best.get("source", "?")}
    out, how = {}, []
    reads = [(r["TBps"], r["label"], d) for d in docs if d["kind"] == "read-ceiling" for r in d["rows"]]
    if reads:
        tb, label, d = max(reads)
        out["read_TBps"] = tb
        how.append(f"read: fastest bare read of {d.get('source', '?')} ({label})")
    else:
        kv = [(e["TBps"], n, d) for d in docs if d["kind"] == "decode" for r in d["rows"]
              for n, e in r["impls"].items() if e.get("TBps")]
        if kv:
            tb, n, d = max(kv)
            out["read_TBps"] = tb
            how.append(f"read: fastest KV read in {d.get('source', '?')} ({n})")
    mm = [(e["tflops"], r["shape"], d) for d in docs if d["kind"] == "gemm" for r in d["rows"]
          for n, e in r["impls"].items() if n == "cuBLAS" and e.get("tflops")]
    if mm:
        tf, shape, d = max(mm)
        out["matmul_TFLOPs"] = tf
        how.append(f"matmul: fastest cuBLAS bf16 in {d.get('source', '?')} ({shape})")
    if how:
        out["how"] = "; ".join(how)
    return out


def record_kind(doc: dict) -> str:
    """The manifest's key for a loaded document: its kind, with the GEMM's non-default presets apart
    (``gemm-decode``, ``gemm-llm``: other shapes than the issue's)."""
    preset = doc["meta"].get("preset", "issue") if doc["kind"] == "gemm" else "issue"
    return doc["kind"] if preset in (None, "issue") else f"{doc['kind']}-{preset}"


def manifest(folder: str | Path) -> dict:
    """``folder``/:data:`MANIFEST`: ``{"latest": {kind: file name}, "charts": [kind, ...]}``; raises
    ValueError (one line) when it is missing or malformed."""
    path = Path(folder) / MANIFEST
    try:
        m = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read the manifest naming the latest records ({type(e).__name__}: {e})") \
            from e
    named = m.get("latest") if isinstance(m, dict) else None
    charts = m.get("charts") if isinstance(m, dict) else None
    if not (isinstance(named, dict) and named and all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in named.items())):
        raise ValueError(f'{path}: expected {{"latest": {{kind: file name, ...}}, "charts": [kind, ...]}}')
    if not (isinstance(charts, list) and charts and all(k in named for k in charts)):
        raise ValueError(f'{path}: "charts" must list kinds named in "latest", got {charts!r}')
    return m


def latest(folder: str | Path, kinds=None) -> list[Path]:
    """The records :data:`MANIFEST` in ``folder`` names for ``kinds`` (default: its ``charts`` list, the
    kinds the README's charts and tables draw), in that order.  Each must exist and be of the kind it
    is named for; anything else raises ValueError (one line)."""
    folder = Path(folder)
    m = manifest(folder)
    named = m["latest"]
    out = []
    for kind in m["charts"] if kinds is None else kinds:
        if kind not in named:
            raise ValueError(f"{folder / MANIFEST}: names no {kind!r} record (it names {', '.join(named)})")
        path = folder / named[kind]
        doc = load(path)  # ValueError when missing or unreadable
        if record_kind(doc) != kind:
            raise ValueError(f"{folder / MANIFEST}: {named[kind]} is a {record_kind(doc)!r} record, named as {kind!r}")
        out.append(path)
    return out
