"""What every benchmark writes: one JSON document and one markdown table per run, in one schema.

A document (``SCHEMA``) holds the run's metadata (device, date, commit, versions, timer), the device's
measured roofs (copy bandwidth and matmul rate, :mod:`.ceiling`), and one row per shape::

    {"shape": "4096x4096x4096", "params": {...}, "flops": F, "bytes": B, "bound": "compute" | "memory",
     "impls": {name: {"role": "ours" | "peer" | "ceiling" | "variant", "median_us": t,
                      "times_us": [t per round], "tflops": F / t, "TBps": B / t, ...}},
     "ours": name, "best_peer": name, "ratio_vs_best_peer": x, "ratio_vs": {peer: x},
     "ceiling": name, "ours_vs_ceiling": ceiling time / our time, "notes": [...]}

Ratios are peer time / our time (above 1: ours is faster), the median of the per-round ratios when
both were timed in the same rounds.  This module imports no torch at import time: the charts read
documents on any machine (:mod:`.records` also reads the older per-script formats).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sys
import platform
import statistics
import subprocess
from pathlib import Path

SCHEMA = "cute-kernels-bench/1"
ROLES = ("ours", "peer", "ceiling", "variant")
#: what each kind's rate column is: (key in an impl, unit)
RATE = {"gemm": ("tflops", "TFLOP/s"), "attention": ("tflops", "TFLOP/s"), "attention-varlen": ("tflops", "TFLOP/s"),
        "attention-backward": ("tflops", "TFLOP/s"), "decode": ("TBps", "TB/s"), "model-decode": ("tokens_per_s", "tok/s")}
TITLES = {"gemm": "GEMM bf16", "attention": "Attention forward (prefill) bf16",
          "attention-varlen": "Attention forward bf16: packed (varlen), paged and windowed",
          "attention-backward": "Attention backward bf16 (dq, dk, dv)", "decode": "Decode attention bf16",
          "model-decode": "End-to-end decode step, Llama-3-8B shapes",
          "gaps": "Issue 36 gaps: ours against the targets, paired timer"}


def geomean(xs) -> float | None:
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def ridge(roofs: dict | None) -> float:
    """FLOPs per byte where the matmul roof meets the read roof (H200 figures when not measured:
    4.0 TB/s, 700 TFLOP/s)."""
    roofs = roofs or {}
    return (roofs.get("matmul_TFLOPs") or 700.0) / (roofs.get("read_TBps") or 4.0)


# ---- metadata ------------------------------------------------------------------------------------
def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def commit_name(root: str | os.PathLike | None = None) -> str:
    """``CK_COMMIT`` (the device copy's .git may be stale: the caller names it), else the short hash
    of the repository holding this package, else "unknown"."""
    c = os.environ.get("CK_COMMIT")
    if c:
        return c
    root = root or Path(__file__).resolve().parents[3]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root,
                             timeout=10, check=False).stdout.strip()
        return out or "unknown"
    except (OSError, subprocess.SubprocessError):  # no git, or not a repository
        return "unknown"


def run_meta(timer: str, repeats: int, **extra) -> dict:
    """The run's metadata: device, UTC date and time, commit, the versions that set the figures."""
    import torch

    now = datetime.datetime.now(datetime.timezone.utc)
    versions = {"cute-kernels": _version("cute-kernels"), "torch": torch.__version__, "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                "nvidia-cutlass-dsl": _version("nvidia-cutlass-dsl"), "triton": _version("triton"),
                "quack": _version("quack-kernels"), "flash-attn": _version("flash-attn") or _version("flash-attn-4"),
                "python": platform.python_version()}
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"device": dev, "date": now.date().isoformat(), "time_utc": now.strftime("%H:%M:%S"),
            "commit": commit_name(), "versions": {k: v for k, v in versions.items() if v is not None},
            "timer": timer, "repeats": repeats, **extra}


# ---- rows ----------------------------------------------------------------------------------------
def impl_entry(role: str, times_us: list[float], flops: float | None, nbytes: float | None, **extra) -> dict:
    """One implementation's figures from its per-round times (microseconds)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    med = statistics.median(times_us)
    e = {"role": role, "median_us": med, "times_us": list(times_us)}
    if flops:
        e["tflops"] = flops / (med * 1e-6) / 1e12
    if nbytes:
        e["TBps"] = nbytes / (med * 1e-6) / 1e12
    e.update(extra)
    return e


def _ratio(num: dict, den: dict) -> float:
    """num's time / den's time: the median of per-round ratios when both have the same rounds."""
    a, b = num.get("times_us") or [], den.get("times_us") or []
    if a and len(a) == len(b):
        return statistics.median(x / y for x, y in zip(a, b))
    return num["median_us"] / den["median_us"]


def finish_row(row: dict) -> dict:
    """Fill ``ours``, ``ratio_vs``, ``best_peer``, ``ratio_vs_best_peer`` and ``ours_vs_ceiling`` of a
    row from its impls' roles and times (a ceiling named in ``row["ceiling"]`` may be any impl)."""
    impls = row["impls"]
    ours = row.get("ours") or next((n for n, v in impls.items() if v.get("role") == "ours"), None)
    row["ours"] = ours
    peers = {n: v for n, v in impls.items() if v.get("role") == "peer" and v.get("median_us")}
    if row.get("ceiling") is None:
        row["ceiling"] = next((n for n, v in impls.items() if v.get("role") == "ceiling"), None)
    o = impls.get(ours) if ours else None
    if o and o.get("median_us"):
        row["ratio_vs"] = {p: _ratio(v, o) for p, v in peers.items()}
        if peers:
            best = min(peers, key=lambda p: peers[p]["median_us"])
            row["best_peer"] = best
            # per round: the best peer of that round against ours (as the GEMM bench always did)
            rounds = [v.get("times_us") or [] for v in peers.values()]
            ot = o.get("times_us") or []
            if ot and all(len(r) == len(ot) for r in rounds):
                row["ratio_vs_best_peer"] = statistics.median(min(r[i] for r in rounds) / t for i, t in enumerate(ot))
            else:
                row["ratio_vs_best_peer"] = peers[best]["median_us"] / o["median_us"]
        c = impls.get(row["ceiling"]) if row.get("ceiling") else None
        if c and c.get("median_us"):
            row["ours_vs_ceiling"] = c["median_us"] / o["median_us"]
    return row


def summarize(rows: list[dict]) -> dict:
    """Geomeans of our ratio to the best peer, to each peer, and of our fraction of the ceiling."""
    peers = sorted({p for r in rows for p in r.get("ratio_vs", {})})
    s = {"geomean_vs_best_peer": geomean(r.get("ratio_vs_best_peer") for r in rows),
         "geomean_vs_ceiling": geomean(r.get("ours_vs_ceiling") for r in rows)}
    for p in peers:
        s[f"geomean_vs_{p}"] = geomean(r.get("ratio_vs", {}).get(p) for r in rows)
    return s


def document(kind: str, meta: dict, rows: list[dict], roofs: dict | None = None, notes: list[str] | None = None,
             **extra) -> dict:
    rows = [finish_row(r) for r in rows]
    return {"schema": SCHEMA, "kind": kind, "meta": meta, "roofs": roofs or {}, "rows": rows,
            "summary": summarize(rows), "notes": list(notes or []), **extra}


# ---- writing -------------------------------------------------------------------------------------
def _fmt(x, spec=".2f", suffix="x") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def markdown(doc: dict) -> str:
    """The run as a markdown table: each implementation's time and rate, our ratio to the best peer
    and our fraction of the ceiling, then the geomeans and the notes."""
    kind, meta, rows = doc["kind"], doc["meta"], doc["rows"]
    rate_key, unit = RATE.get(kind, ("tflops", "TFLOP/s"))
    names: list[str] = []
    for r in rows:
        names += [n for n in r["impls"] if n not in names]
    order = {"ours": 0, "variant": 1, "peer": 2, "ceiling": 3}
    role = {n: next(r["impls"][n].get("role", "peer") for r in rows if n in r["impls"]) for n in names}
    names.sort(key=lambda n: order.get(role[n], 2))
    v = meta.get("versions", {})
    vers = ", ".join(f"{k} {x}" for k, x in v.items())
    title = (f"# {TITLES.get(kind, kind)}, {meta.get('device', '?')}, {meta.get('date', '?')}, "
             f"commit {meta.get('commit', '?')}")
    lines = [title, "",
             f"{meta.get('timer', '?')}; {meta.get('repeats', '?')} interleaved rounds, median.  Versions: {vers}.",
             f"Cells: microseconds ({unit}).  x best peer = best peer's time / ours (same rounds); "
             "of ceiling = ceiling time / ours (the ceiling: " + _ceiling_words(kind) + ").", ""]
    roofs = doc.get("roofs") or {}
    if roofs:
        lines += [f"Roofs measured in this run: {roof_words(roofs)}.", ""]
    lines += ["| shape | bound | " + " | ".join(f"{n} ({role[n]})" for n in names) + " | x best peer | of ceiling |",
              "|---|---|" + "---|" * (len(names) + 2)]
    for r in rows:
        cells = []
        for n in names:
            e = r["impls"].get(n)
            if not e or not e.get("median_us"):
                cells.append((e or {}).get("error", "-")[:40] or "-")
                continue
            rate = e.get(rate_key)
            cells.append(f"{e['median_us']:.1f}" + (f" ({rate:.{0 if unit == 'TFLOP/s' else 2}f})" if rate else ""))
        best = r.get("ratio_vs_best_peer")
        cells.append(f"{best:.2f}x ({r.get('best_peer')})" if best else "-")
        cells.append(_fmt(r.get("ours_vs_ceiling")) + (f" ({r['ceiling']})" if r.get("ceiling") else ""))
        lines.append(f"| {r['shape']} | {r.get('bound', '-')} | " + " | ".join(cells) + " |")
    s = doc.get("summary", {})
    lines += ["", "Geomean of our ratio: best peer " + _fmt(s.get("geomean_vs_best_peer"))
              + "".join(f", {k[len('geomean_vs_'):]} {_fmt(x)}" for k, x in s.items()
                        if k.startswith("geomean_vs_") and k not in ("geomean_vs_best_peer", "geomean_vs_ceiling"))
              + f"; of ceiling {_fmt(s.get('geomean_vs_ceiling'))}."]
    notes = list(doc.get("notes", [])) + [f"{r['shape']}: {n}" for r in rows for n in r.get("notes", [])]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _ceiling_words(kind: str) -> str:
    return {"gemm": "a bare read of A and B for memory-bound shapes, a square cuBLAS matmul of the same "
                    "FLOPs for compute-bound ones",
            "attention": "our kernel with the mask and softmax compiled out (mma_bound)",
            "attention-backward": "our backward's main kernel with its elementwise work compiled out "
                                  "(mma_bound; the pre- and post-passes not run)",
            "decode": "a bare read of the KV bytes"}.get(kind, "none")


def roof_words(roofs: dict) -> str:
    parts = []
    if roofs.get("read_TBps"):
        parts.append(f"read {roofs['read_TBps']:.2f} TB/s")
    if roofs.get("copy_TBps"):
        parts.append(f"copy {roofs['copy_TBps']:.2f} TB/s")
    if roofs.get("matmul_TFLOPs"):
        parts.append(f"bf16 matmul {roofs['matmul_TFLOPs']:.0f} TFLOP/s")
    return ", ".join(parts) + (f" ({roofs['how']})" if roofs.get("how") else "")


def stem(kind: str, meta: dict, tag: str = "") -> str:
    """``<kind>[-<tag>]-<date>-<commit>``: the name of a run's files."""
    return f"{kind}{'-' + tag if tag else ''}-{meta['date']}-{meta['commit']}"


def write(doc: dict, out_dir: str | os.PathLike, tag: str = "", to_markdown=None) -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.md`` into ``out_dir`` (created); returns their paths.
    ``to_markdown``: a benchmark's own rendering (default :func:`markdown`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = out / stem(doc["kind"], doc["meta"], tag)
    js, md = Path(f"{base}.json"), Path(f"{base}.md")
    js.write_text(json.dumps(doc, indent=1, default=_jsonable) + "\n")
    md.write_text((to_markdown or markdown)(doc))
    return js, md


def cuda_missing(prog: str) -> bool:
    """A bench command's check before it benchmarks: True, with the one-line error on stderr, when
    there is no CUDA device."""
    import torch

    if torch.cuda.is_available():
        return False
    print(f"{prog}: error: needs a CUDA device (charts from recorded results: cute-kernels charts)", file=sys.stderr)
    return True


def per_kernel(kernels, steps: int = 1) -> list:
    """``[(kernel name, microseconds per step), ...]`` of ``[(name, microseconds), ...]`` recorded over
    ``steps`` steps (:func:`.timing.profiled_kernels`), summed by name, longest first."""
    per_name: dict[str, float] = {}
    for name, us in kernels:
        per_name[name] = per_name.get(name, 0.0) + us / steps
    return sorted(per_name.items(), key=lambda kv: -kv[1])


def transformers_missing(prog: str) -> bool:
    """The check of a bench command that runs a Transformers model: True, with the one-line error on
    stderr, unless transformers 5.x is installed."""
    try:
        import transformers

        major = int(transformers.__version__.split(".")[0])
    except ImportError:
        major = None
    if major == 5:
        return False
    print(f"{prog}: error: needs transformers 5.x (pip install 'cute-kernels[hf]')", file=sys.stderr)
    return True


def publish(doc: dict, out_dir, tag: str = "", to_markdown=None) -> int:
    """A bench command's end: :func:`write` the run, print its table and the files written; status 0."""
    js, md = write(doc, out_dir, tag, to_markdown)
    print((to_markdown or markdown)(doc))
    print(f"wrote {js} and {md}")
    return 0


def _jsonable(x):
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)
