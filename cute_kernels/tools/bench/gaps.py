"""Issue 36's gaps: nine workloads, each of ours against the figure its target names, under the
paired timer (:func:`.timing.paired_times`), the ceiling measured in the same run.

Each row is a case with its own sizes (the decode rows their head dim, the GEMM rows their batch):

- decode (``decode_attn``, bf16, contiguous cache, one new token): against the bare read of the same
  K/V bytes (:func:`.ceiling.bare_read`) plus the library's merge of the split partials alone (the
  split count ``decode_attn``'s plan takes; fp32 partial outputs and LSEs into a bf16 output through
  :func:`cute_kernels.attention.merge.launch_merge`), each timed alone; the ratio is
  (read + merge) / ours, and the bare read alone is reported beside it (the issue's figures before
  the work are of the bare read);
- GEMM (``cute_kernels.gemm``, bf16, row-major operands): cuBLAS (``torch.matmul``) / ours;
- forward (``flash_attn``): FlashAttention-4 / ours or cuDNN SDPA / ours (the row's target names
  which; the other is timed and reported too).

Paired timer: each repetition calls every implementation of a row once, in an order rotated by the
repetition, each call after its own L2 flush (``zero_`` of 256 MiB) and timed alone by CUDA events;
a ratio is the median of the per-repetition ratios.  A row meets its target when its ratio reaches
it; a row whose reference cannot run here (FA4 not installed) is not judged.  Every output of ours is
checked once before timing (decode against ``decode_attn_reference``, GEMM against the float32
product, forward against the reference's output); a wrong one fails the row.

    cute-kernels bench gaps [--repeats N] [--only SUBSTR] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from ..args import OneLineParser, int_in
from . import attention, decode, gemm, results

KIND = "gaps"
REPEATS, QUICK_REPEATS = 100, 20
READ, MERGE, READ_MERGE = decode.READ, "merge", "read KV + merge"
FORWARD_PEERS = ("cudnn_sdpa", "fa4")
#: the largest difference of our output from the reference's, over the reference's largest |value|,
#: that is timed (bf16 rounding is 2^-8 of a value; a kernel writing zeros is off by 1)
CHECK_TOL = 2e-2
TIMER = ("paired: every implementation once per repetition, in an order rotated by the repetition, each call "
         "after its own L2 flush (zero_ of 256 MiB) and timed alone by CUDA events; a ratio is the median of "
         "the per-repetition ratios")


class Case(NamedTuple):
    """One row of the issue's table."""

    family: str  # "decode" | "gemm" | "forward"
    workload: str  # the words
    params: dict  # decode B, Hq, Hkv, L, D; gemm batch (None: 2-D operands), M, N, K; forward B, Hq, Hkv, S, D, causal
    reference: str  # the implementation (decode: the ceiling) the target is against
    now: float  # the figure before the work (decode: a fraction of the bare read alone)
    target: float  # reference time / ours must reach this

    @property
    def name(self) -> str:
        p = self.params
        if self.family == "decode":
            return f"decode_b{p['B']}_hq{p['Hq']}_hkv{p['Hkv']}_L{p['L']}_d{p['D']}"
        if self.family == "gemm":
            return f"gemm_{'b%d_' % p['batch'] if p['batch'] else ''}{p['M']}x{p['N']}x{p['K']}"
        return f"forward_b{p['B']}_hq{p['Hq']}_hkv{p['Hkv']}_s{p['S']}_d{p['D']}_{'causal' if p['causal'] else 'full'}"


def _dec(B, Hq, Hkv, L, D):
    return {"B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "D": D}


def _mm(batch, M, N, K):
    return {"batch": batch, "M": M, "N": N, "K": K}


def _fwd(B, Hq, Hkv, S, D, causal):
    return {"B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "causal": causal}


#: the issue's table (bf16 throughout)
CASES = [
    Case("decode", "decode b1 hq32 hkv8 L32768 d128", _dec(1, 32, 8, 32768, 128), READ_MERGE, 0.88, 0.95),
    Case("decode", "decode b8 hq32 hkv8 L8192 d128", _dec(8, 32, 8, 8192, 128), READ_MERGE, 0.955, 0.97),
    Case("decode", "decode b4 hq32 hkv4 L16384 d64", _dec(4, 32, 4, 16384, 64), READ_MERGE, 0.82, 0.93),
    Case("gemm", "GEMM 4097x127x1000 (N not a multiple of 8)", _mm(None, 4097, 127, 1000), gemm.CUBLAS, 0.45, 1.0),
    Case("gemm", "GEMM batched 3 x 1000^3", _mm(3, 1000, 1000, 1000), gemm.CUBLAS, 0.87, 1.0),
    Case("gemm", "GEMM 1024x1024x32768", _mm(None, 1024, 1024, 32768), gemm.CUBLAS, 0.95, 1.0),
    Case("gemm", "GEMM 512x4096x14336", _mm(None, 512, 4096, 14336), gemm.CUBLAS, 0.97, 1.0),
    Case("forward", "forward b3 hq24 hkv8 s5000 d96 full", _fwd(3, 24, 8, 5000, 96, False), "fa4", 0.875, 1.0),
    Case("forward", "forward b32 hq32 hkv8 s512 d128 causal", _fwd(32, 32, 8, 512, 128, True), "cudnn_sdpa", 0.93,
         1.0),
]


def select(only: str = "") -> list[Case]:
    """The cases whose name or workload contains ``only`` (all of them for "")."""
    return [c for c in CASES if not only or only in c.name or only in c.workload]


# ---------------------------------------------------------------------------------------- building
@dataclass
class Built:
    """A row's implementations, ready to time."""

    impls: dict[str, Callable[[], object]]  # name -> call, every one timed
    roles: dict[str, str]  # name -> results role ("ours", "peer", "ceiling")
    flops: float
    nbytes: float
    errors: dict[str, float] = field(default_factory=dict)  # name -> its output's error, checked before timing
    extra: dict = field(default_factory=dict)  # more fields of the row


def checked_difference(out, ref, what: str) -> float:
    """max |out - ref| / max |ref|; RuntimeError above :data:`CHECK_TOL` (``what``: the reference)."""
    ref = ref.float()
    err = ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    if not err <= CHECK_TOL:
        raise RuntimeError(f"wrong result: max difference {err:.3g} of the largest value, against {what}")
    return err


def merge_alone(P: int, B: int, Hq: int, D: int) -> Callable[[], object]:
    """The library's merge of a split decode's partials, launched alone: P fp32 partial outputs
    (P, B, 1, Hq, D) and natural-log LSEs (P, B, 1, Hq) into a bf16 (B, 1, Hq, D) output and its LSEs --
    the second kernel of a split ``decode_attn`` call (which launches it as a programmatic dependent)."""
    import torch

    from ...attention.merge import launch_merge

    o_parts = torch.randn(P, B, 1, Hq, D, device="cuda", dtype=torch.float32)
    lse_parts = torch.randn(P, B, 1, Hq, device="cuda", dtype=torch.float32)
    out = torch.empty(B, 1, Hq, D, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(B, 1, Hq, device="cuda", dtype=torch.float32)
    return lambda: launch_merge(o_parts, lse_parts, out, lse)


def build_decode(case: Case, bench, quick: bool, notes: list[str]) -> Built:
    """Ours, the bare read of the K/V bytes and (when the plan splits) the merge alone."""
    import torch

    from ...attention.decode import decode_attn_reference, explain
    from . import ceiling

    B, Hq, Hkv, L, D = (case.params[k] for k in ("B", "Hq", "Hkv", "L", "D"))
    q, k, v, seqlens = decode.make_inputs(B, Hq, Hkv, L, D)
    ours, get = decode.ours_impl(q, k, v, seqlens)
    ours()
    torch.cuda.synchronize()
    err = checked_difference(get(), decode_attn_reference(q, k, v, seqlens)[0], "decode_attn_reference")
    fl, nb = decode.flops_bytes(B, Hq, Hkv, L, D)
    read_fn, read_what = ceiling.bare_read(int(nb), bench, quick)
    splits = explain(B, Hq, Hkv, L, head_dim=D)["num_splits"]
    impls = {decode.OURS: ours, READ: read_fn}
    if splits > 1:
        impls[MERGE] = merge_alone(splits, B, Hq, D)
    else:
        notes.append("one split: decode_attn runs no merge; the ceiling is the bare read alone")
    roles = {decode.OURS: "ours", READ: "ceiling", MERGE: "ceiling"}
    return Built(impls, roles, fl, nb, {decode.OURS: err}, {"num_splits": splits, "read_what": read_what})


def build_gemm(case: Case, bench, quick: bool, notes: list[str]) -> Built:
    """Ours and cuBLAS on one pair of row-major operands (batched: 3-D)."""
    import torch

    import cute_kernels

    batch, M, N, K = (case.params[k] for k in ("batch", "M", "N", "K"))
    lead = (batch,) if batch else ()
    a = torch.randn(*lead, M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(*lead, K, N, device="cuda", dtype=torch.bfloat16)
    err = gemm.rel_error(cute_kernels.gemm(a, b), torch.matmul(a.float(), b.float()))
    fl, nb = gemm.flops_bytes(M, N, K, batch or 1)
    impls = {gemm.OURS: lambda: cute_kernels.gemm(a, b), gemm.CUBLAS: lambda: torch.matmul(a, b)}
    return Built(impls, {gemm.OURS: "ours", gemm.CUBLAS: "peer"}, fl, nb, {gemm.OURS: err})


def build_forward(case: Case, bench, quick: bool, notes: list[str]) -> Built:
    """Ours, cuDNN SDPA and FA4 (those that run here: the attention bench's builders, without our MMA
    bound); ours checked against the row's reference (else the first peer that ran)."""
    import torch

    p = case.params
    built = attention.build_impls(p["B"], p["Hq"], p["Hkv"], p["S"], p["D"], p["causal"], notes, bound=False)
    if attention.OURS not in built:
        raise RuntimeError(f"{attention.OURS} cannot run this shape: {'; '.join(notes)[:200]}")
    names = [n for n in (attention.OURS, *FORWARD_PEERS) if n in built]
    for n in names:
        built[n][0]()
    torch.cuda.synchronize()
    ref = case.reference if case.reference in built else next((n for n in names[1:]), None)
    errors = {}
    if ref is not None:
        errors[attention.OURS] = checked_difference(built[attention.OURS][1](), built[ref][1](), ref)
    fl, nb = attention.flops_bytes(p["B"], p["Hq"], p["Hkv"], p["S"], p["D"], p["causal"])
    roles = {n: "ours" if n == attention.OURS else "peer" for n in names}
    return Built({n: built[n][0] for n in names}, roles, fl, nb, errors, {"checked_against": ref})


def warmup_entries(cases) -> list:
    """The ``cute_kernels.warmup`` entries of our kernels for ``cases``: what each row's first call
    compiles (decode's config and split count from ``explain``, on meta tensors)."""
    import torch

    from ...attention import forward as FW
    from ...attention.decode import explain
    from ...attention.merge import MergeConfig

    out = []
    for c in cases:
        p = c.params
        if c.family == "decode":
            plan = explain(p["B"], p["Hq"], p["Hkv"], p["L"], head_dim=p["D"])
            out.append(("decode_attn", plan["config"]))
            if plan["num_splits"] > 1:
                out.append(("merge_states", MergeConfig("float32", "bfloat16", p["D"])))
        elif c.family == "gemm":
            spec = {"m": p["M"], "n": p["N"], "k": p["K"]}
            out.append(("gemm", spec if p["batch"] is None else {**spec, "batch": p["batch"]}))
        else:
            out.append(("flash_attn", FW.plan(torch.bfloat16, p["D"], p["causal"])))
    return list({repr(e): e for e in out}.values())


def precompile(cases) -> None:
    """Our kernels for ``cases`` compiled in parallel processes before timing (disk cache)."""
    from ...common import jit
    from .timing import precompile_and_report, warm_one

    precompile_and_report(lambda entries: jit.precompile_in_processes(warm_one, entries), warmup_entries(cases))


# ---------------------------------------------------------------------------------------- rows
def make_row(case: Case, built: Built, times: dict[str, list[float]], notes: list[str]) -> dict:
    """The results row of ``case`` from its paired ``times``: every implementation's figures, the
    decode ceiling (read + merge, summed per repetition), the paired ratio against the reference,
    the target and whether it is met, and the other paired ratios (``also``)."""
    from .timing import paired_ratio

    ours = next(n for n, r in built.roles.items() if r == "ours")
    row = {"shape": case.name, "workload": case.workload, "family": case.family, "params": dict(case.params),
           "flops": built.flops, "bytes": built.nbytes, "bound": "memory" if case.family == "decode" else "compute",
           "impls": {}, "notes": notes, "ours": ours, "reference": case.reference, "target": case.target,
           "issue_now": case.now, **built.extra}
    for n, ts in times.items():
        role = built.roles[n]
        flops = built.flops if role != "ceiling" else None
        nbytes = built.nbytes if n != MERGE else None
        e = results.impl_entry(role, ts, flops, nbytes)
        if n in built.errors:
            e["error_vs_reference"] = built.errors[n]
        row["impls"][n] = e
    also = {}
    if case.family == "decode":
        parts = tuple(n for n in (READ, MERGE) if n in times)
        sums = [sum(x) for x in zip(*(times[n] for n in parts))]
        row["impls"][READ_MERGE] = results.impl_entry("ceiling", sums, None, built.nbytes, parts=list(parts))
        row["ceiling"] = READ_MERGE
        ref = parts
        also[f"of {READ}"] = paired_ratio(times, READ, ours)
    else:
        ref = case.reference if case.reference in times else None
        for n, r in built.roles.items():
            if r == "peer" and n != case.reference and n in times:
                also[f"x {n}"] = paired_ratio(times, n, ours)
    if ref is None:
        notes.append(f"{case.reference}: not timed here, the target is not judged")
    row["ratio"] = paired_ratio(times, ref, ours) if ref is not None else None
    row["met"] = None if row["ratio"] is None else row["ratio"] >= case.target
    row["also"] = also
    return row


def failed_row(case: Case, error: BaseException, notes: list[str]) -> dict:
    """The row of a case whose build or timing failed: the error, target not met."""
    return {"shape": case.name, "workload": case.workload, "family": case.family, "params": dict(case.params),
            "impls": {}, "notes": notes, "reference": case.reference, "target": case.target, "issue_now": case.now,
            "ratio": None, "met": False, "also": {}, "error": f"{type(error).__name__}: {str(error)[:300]}"}


def run(cases, repeats: int = REPEATS, quick: bool = False) -> dict:
    """Time ``cases`` (of :data:`CASES`); returns the results document of kind ``gaps``."""
    import torch

    from . import ceiling, timing
    from .progress import Progress

    bench, timer, roofs = ceiling.start_run("bench gaps", quick)
    precompile(cases)
    builders = {"decode": build_decode, "gemm": build_gemm, "forward": build_forward}
    rows = []
    per_row = {"decode": 3, "gemm": 2, "forward": 1 + len(FORWARD_PEERS)}  # implementations timed
    with Progress(sum(per_row[c.family] for c in cases) * repeats, "bench gaps") as prog:
        for case in cases:
            notes: list[str] = []
            try:
                built = builders[case.family](case, bench, quick, notes)
                times = timing.paired_times(built.impls, repeats, tick=lambda n, s=case.name: prog.step(f"{s} {n}"))
                row = make_row(case, built, times, notes)
            except Exception as e:  # noqa: BLE001 - one row failing must not lose the others
                row = failed_row(case, e, notes)
            rows.append(row)
            prog.note(_line(row))
            for nt in notes:
                prog.note(f"    note: {nt}")
            built = times = None
            torch.cuda.empty_cache()
    meta = results.run_meta(TIMER, repeats, quick=quick, bare_read_chosen_by=timer)
    doc = results.document(KIND, meta, rows, roofs)
    judged = [r for r in doc["rows"] if r.get("met") is not None]
    doc["summary"].update(targets_met=sum(bool(r["met"]) for r in judged), targets_judged=len(judged),
                          not_met=[r["workload"] for r in judged if not r["met"]])
    return doc


# ---------------------------------------------------------------------------------------- output
def _ratio_words(row: dict, x) -> str:
    if x is None:
        return "-"
    return f"{x:.3f} of ceiling" if row["family"] == "decode" else f"{x:.3f}x"


def _cell(row: dict, name: str) -> str:
    e = row["impls"].get(name)
    if not e or not e.get("median_us"):
        return "-"
    key, unit = ("TBps", "TB/s") if row["family"] == "decode" else ("tflops", "TFLOP/s")
    rate = e.get(key)
    return f"{e['median_us']:.1f}" + (f" ({rate:.{2 if unit == 'TB/s' else 0}f} {unit})" if rate else "")


def _also(row: dict) -> str:
    """The row's other paired ratios: "0.930 of read KV", "1.020x cudnn_sdpa"."""
    return ", ".join(f"{v:.3f}x {k[2:]}" if k.startswith("x ") else f"{v:.3f} {k}" for k, v in row["also"].items())


def _met_word(row: dict) -> str:
    return {True: "yes", False: "**no**", None: "not judged"}[row.get("met")]


def _line(row: dict) -> str:
    """One progress line per row."""
    if row.get("error"):
        return f"{row['workload']:45s} failed: {row['error'][:160]}"
    also = _also(row)
    return (f"{row['workload']:45s} ours {_cell(row, row['ours'])} us  {row['reference']} "
            f"{_cell(row, row['reference'])} us  ratio {_ratio_words(row, row['ratio'])} (target {row['target']}: "
            f"{_met_word(row)})" + (f"  [{also}]" if also else ""))


def markdown(doc: dict) -> str:
    """The run as a markdown table: per row ours, the reference, the paired ratio, the target, met."""
    meta, rows = doc["meta"], doc["rows"]
    vers = ", ".join(f"{k} {x}" for k, x in meta.get("versions", {}).items())
    lines = [f"# {results.TITLES.get(KIND, KIND)}, {meta.get('device', '?')}, {meta.get('date', '?')}, "
             f"commit {meta.get('commit', '?')}", "",
             f"Timer: {meta.get('timer', '?')}; {meta.get('repeats', '?')} repetitions.  Versions: {vers}.", "",
             "Cells: median microseconds (rate).  Ratio: the reference's time / ours, paired (decode: (bare read "
             "of the K/V bytes + the merge alone) / ours, a fraction of that ceiling; the others: x the peer).  "
             "Met: ratio >= target.  Also: the row's other paired ratios.  Before: the issue's figure (decode: "
             "of the bare read alone).", ""]
    if doc.get("roofs"):
        lines += [f"Roofs measured in this run: {results.roof_words(doc['roofs'])}.", ""]
    lines += ["| workload | ours us | reference | reference us | ratio | target | met | also | before |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        before = f"{r['issue_now']} of bare read" if r["family"] == "decode" else f"{r['issue_now']}x"
        if r.get("error"):
            lines.append(f"| {r['workload']} | {r['error'][:80]} | {r['reference']} | - | - | >= {r['target']} | "
                         f"{_met_word(r)} | - | {before} |")
            continue
        also = _also(r)
        lines.append(f"| {r['workload']} | {_cell(r, r['ours'])} | {r['reference']} | {_cell(r, r['reference'])} | "
                     f"{_ratio_words(r, r['ratio'])} | >= {r['target']} | {_met_word(r)} | {also or '-'} | {before} |")
    s = doc.get("summary", {})
    lines += ["", f"Targets met: {s.get('targets_met', 0)} of {s.get('targets_judged', 0)} judged ({len(rows)} rows)"
              + (f"; not met: {', '.join(s['not_met'])}." if s.get("not_met") else ".")]
    notes = list(doc.get("notes", [])) + [f"{r['shape']}: {n}" for r in rows for n in r.get("notes", [])]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def build_parser(prog: str = "cute-kernels bench gaps") -> argparse.ArgumentParser:
    ap = OneLineParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int_in(1), default=REPEATS,
                    help=f"paired repetitions per row (default {REPEATS})")
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_REPEATS} repetitions and a shorter search for the fastest bare read")
    ap.add_argument("--only", default="", help="substring filter on the rows' names or workloads (decode, gemm_b3, ...)")
    ap.add_argument("--tag", default="", help="suffix of the file names after the kind")
    ap.add_argument("--out", "--out-dir", dest="out", default=os.path.join("profiles", "results"),
                    help="folder for the JSON and markdown (default profiles/results)")
    return ap


def main(argv: list[str] | None = None, prog: str = "cute-kernels bench gaps") -> int:
    ap = build_parser(prog)
    args = ap.parse_args(argv)
    cases = select(args.only)
    if not cases:
        ap.error(f"--only {args.only!r} matches no row")
    if results.cuda_missing(prog):
        return 2
    doc = run(cases, QUICK_REPEATS if args.quick else args.repeats, args.quick)
    return results.publish(doc, args.out, args.tag or ("quick" if args.quick else ""), to_markdown=markdown)
