"""Packed (variable-length) attention backward: ``flash_attn``'s gradients on packed sequences vs
FlashAttention-4's varlen backward (issue 33), one process, the paired timer --
``cute-kernels bench attention --backward --varlen``.

Cases: the packed ones of the forward's varlen bench (:mod:`.attention_varlen_cases`, the same length
draws, so the shapes are identical): ``varlen_b32_logu1-8192_hq32_hkv8_d128_causal`` (32 sequences,
lengths log-uniform in 1..8192, ``random.Random(0)``) and ``manyshort_b1024_logu1-512_hq32_hkv8_d128_causal``
(1024 sequences, 1..512); q and k/v packed with the same lengths, causal, bf16.  ``--quick``: the
forward bench's quick packed case (8 sequences, 1..2048).

Each side's timed call is ``torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)``, ``out`` from
one untimed forward on the packed leaves (``requires_grad=True``): ours ``cute_kernels.flash_attn(q, k, v,
cu_seqlens_q=, cu_seqlens_k=, max_seqlen_q=, max_seqlen_k=, causal=True)`` (its autograd runs
``flash_attn_backward`` with the same cu_seqlens); FA4 ``flash_attn.cute`` ``flash_attn_varlen_func`` with
the same arguments (its ``(out, lse)`` -> out).  A side whose forward or backward raises is recorded
as failed with its error (an ``error`` entry, not timed); the other side is still timed.

Timing: the paired timer (:func:`.timing.paired_times`): 3 untimed calls of each side, then every
repetition calls every side once, in an order rotated by the repetition, each call after its own L2
flush (``zero_`` of 256 MiB) and timed alone by CUDA events; the ratio to FA4 is the median of the
per-repetition ratios (FA4's time / ours: above 1, ours is faster).

FLOPs: 2.5x the forward's of the real work (:func:`.attention_varlen_cases.flops_bytes`: 4 * D * Hq *
the unmasked (query, key) pairs counted exactly per sequence), the backward's five GEMMs against the
forward's two.  Bytes: q, k, v, out, dout read once, dq, dk, dv written once (bf16).

Correctness, once before timing: ours against FA4 (max |diff| per dq, dk, dv, and that over FA4's max
|value|, flagged above the dense backward bench's ``GRAD_RTOL``); every side against a float32 autograd
reference on up to three sampled sequences (the shortest of at least ``REF_MIN_LEN`` rows, the median
one and the longest of at most ``REF_MAX_LEN``), flagged the same way.  A flagged side is still timed
(``mismatch`` in its entry and in the summary).

The target (issue 33): ours at least ``TARGET_VS_FA4`` x FA4's speed on every case (``summary``:
``fa4_target_met``, ``min_vs_fa4``).  Results: kind ``attention-backward`` (:mod:`.records` reads it;
``meta.mode`` is "varlen"), files ``attention-backward-varlen[-TAG]-DATE-COMMIT`` .json / .md.

    cute-kernels bench attention --backward --varlen [--quick] [--only SUBSTR] [--repeats N] [--tag T]
                                                     [--out DIR] [--list]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

from ..args import OneLineParser, int_in
from . import attention_varlen_cases as VC
from . import results
from .attention_backward import FLOP_FACTOR, GRAD_RTOL, GRADS, KIND
from .attention_varlen_calls import fa4_functions

MODE = "varlen"
OURS, PEER = "cute", "fa4"
TARGET_VS_FA4 = 1.0
REPEATS, QUICK_REPEATS = 30, 5
SPLIT_STEPS = 3  # profiled calls per side for the kernel split
REF_SEQS, REF_MIN_LEN, REF_MAX_LEN = 3, 64, 2048
DEVICE = "cuda"  # where :func:`build` makes the inputs (the CPU tests run the whole row with stand-ins)
TIMER = ("paired: every side once per repetition, in an order rotated by the repetition, each call after its own "
         "L2 flush (zero_ of 256 MiB) and timed alone by CUDA events; a ratio is the median of the per-repetition "
         "ratios")
OURS_FORM = ("cute_kernels.flash_attn(q, k, v, cu_seqlens_q=, cu_seqlens_k=, max_seqlen_q=, max_seqlen_k=, "
             "causal=) -> autograd.grad")
FA4_FORM = ("flash_attn.cute flash_attn_varlen_func(q, k, v, cu_seqlens_q=, cu_seqlens_k=, max_seqlen_q=, "
            "max_seqlen_k=, causal=)[0] -> autograd.grad")


# ---------------------------------------------------------------------------------------- cases
def all_cases(quick: bool = False) -> list:
    """The forward varlen bench's packed cases (its issue case and its many-short one; ``quick``: its
    quick packed case)."""
    pool = VC.cases(quick) + ([] if quick else VC.extra_cases())
    return [c for c in pool if c.mode == "varlen"]


def select(only: str = "", quick: bool = False) -> list:
    """The cases whose name contains one of the comma-separated substrings of ``only`` (all when empty)."""
    keys = [s.strip() for s in only.split(",") if s.strip()]
    return [c for c in all_cases(quick) if not keys or any(k in c.name for k in keys)]


def flops_bytes(case) -> tuple:
    """(2.5x the forward's FLOPs of the unmasked pairs; bf16 bytes of q, k, v, out, dout read once and dq,
    dk, dv written once)."""
    fl, _ = VC.flops_bytes(case)
    tq, tk = sum(case.lens_q), sum(case.lens_k)
    return FLOP_FACTOR * fl, 2.0 * case.D * (4 * case.Hq * tq + 4 * case.Hkv * tk)


def case_params(case) -> dict:
    return {"mode": MODE, "B": case.B, "Hq": case.Hq, "Hkv": case.Hkv, "D": case.D, "causal": case.causal,
            "max_seqlen_q": case.max_q, "max_seqlen_k": case.max_k, "total_q": sum(case.lens_q),
            "total_k": sum(case.lens_k)}


def ref_sequences(case) -> list:
    """Indices of the sequences checked against the float32 reference: the shortest of at least
    ``REF_MIN_LEN`` rows, the median-length one and the longest of at most ``REF_MAX_LEN`` (distinct)."""
    ok = sorted((n, b) for b, n in enumerate(case.lens_q) if REF_MIN_LEN <= n <= REF_MAX_LEN
                and case.lens_k[b] == n)
    if not ok:
        return []
    picks = [ok[0][1], ok[len(ok) // 2][1], ok[-1][1]]
    return list(dict.fromkeys(picks))[:REF_SEQS]


# ---------------------------------------------------------------------------------------- sides
@dataclasses.dataclass
class Side:
    run: object  # the timed call: autograd.grad -> (dq, dk, dv) packed
    form: str
    first_call_s: float


def ours_forward(case, inp):
    import cute_kernels

    return cute_kernels.flash_attn(inp["q"], inp["k"], inp["v"], cu_seqlens_q=inp["cu_q"], cu_seqlens_k=inp["cu_k"],
                                   max_seqlen_q=case.max_q, max_seqlen_k=case.max_k, causal=case.causal)


def fa4_forward(case, inp, fa4v):
    r = fa4v(inp["q"], inp["k"], inp["v"], cu_seqlens_q=inp["cu_q"], cu_seqlens_k=inp["cu_k"],
             max_seqlen_q=case.max_q, max_seqlen_k=case.max_k, causal=case.causal)
    return r[0] if isinstance(r, tuple) else r


def grad_call(out, inputs, dout):
    """The timed call: ``torch.autograd.grad`` of one forward's output (the graph kept for the next call)."""
    import torch

    def run():
        return torch.autograd.grad(out, inputs, dout, retain_graph=True)

    return run


def build(case, notes: list) -> tuple:
    """(inputs, dout, {name: Side}, {name: error}): the packed leaves, each side's forward run once and its
    backward once (compiled, checked to run); a side that raises goes into the errors (and the notes)."""
    import torch

    inp = VC.make_inputs(case, DEVICE)
    leaves = tuple(inp[n].requires_grad_() for n in ("q", "k", "v"))
    dout = torch.randn(inp["q"].shape, dtype=inp["q"].dtype, device=inp["q"].device)
    _, fa4v, why = fa4_functions()
    todo = [(OURS, OURS_FORM, lambda: ours_forward(case, inp))]
    errors: dict = {}
    if fa4v is None:
        errors[PEER] = f"skipped, flash_attn.cute not importable ({why})"
        notes.append(f"{PEER}: {errors[PEER]}")
    else:
        todo.append((PEER, FA4_FORM, lambda: fa4_forward(case, inp, fa4v)))
    sides: dict = {}
    for name, form, forward in todo:
        stage = "forward"
        try:
            t0 = time.time()
            out = forward()
            torch.cuda.synchronize()
            stage = "backward"
            run = grad_call(out, leaves, dout)
            run()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - this side cannot run the case: recorded as failed, the other timed
            errors[name] = f"{stage}: {type(e).__name__}: {str(e)[:300]}"
            notes.append(f"{name}: FAILED, not timed ({errors[name]})")
            continue
        sides[name] = Side(run, form, time.time() - t0)
    return inp, dout, sides, errors


# ---------------------------------------------------------------------------------------- checks
def reference_grads(case, inp, dout, b: int):
    """float32 (dq, dk, dv) of sequence ``b`` by autograd of softmax(q k^T / sqrt(D)) v (bottom-right
    causal, GQA by expanding the KV heads): (L, H, D) each."""
    import math

    import torch

    oq, ok_ = case.offsets_q()[b], case.offsets_k()[b]
    lq, lk = case.lens_q[b], case.lens_k[b]
    g = case.Hq // case.Hkv
    q = inp["q"].detach()[oq:oq + lq].float().requires_grad_()
    k = inp["k"].detach()[ok_:ok_ + lk].float().requires_grad_()
    v = inp["v"].detach()[ok_:ok_ + lk].float().requires_grad_()
    qh, kh, vh = q.transpose(0, 1), k.repeat_interleave(g, 1).transpose(0, 1), v.repeat_interleave(g, 1).transpose(0, 1)
    s = qh @ kh.transpose(-1, -2) / math.sqrt(case.D)  # (H, lq, lk)
    if case.causal:
        i = torch.arange(lq, device=s.device)[:, None] + (lk - lq)
        s = s.masked_fill(torch.arange(lk, device=s.device)[None, :] > i, float("-inf"))
    o = (torch.softmax(s, -1).nan_to_num(0.0) @ vh).transpose(0, 1)
    return torch.autograd.grad(o, (q, k, v), dout[oq:oq + lq].float())


def _diff(a, b) -> tuple:
    """(max |a - b|, that over max |b|); NaN / inf count as an infinite difference."""
    d = (a.float() - b.float()).abs().max().item()
    d = d if d == d and d != float("inf") else float("inf")
    return d, d / max(b.float().abs().max().item(), 1e-30)


def check(case, inp, dout, sides: dict) -> dict:
    """{name: check entry}: ours against FA4 (``max_abs_diff_vs_fa4`` / ``rel_diff_vs_ref`` per dq, dk, dv)
    and every side against the float32 reference on :func:`ref_sequences` (``ref_max_rel_err`` per
    gradient); ``mismatch`` when any relative figure exceeds ``GRAD_RTOL``."""
    import torch

    grads = {n: s.run() for n, s in sides.items()}
    out: dict = {n: {"mismatch": False} for n in sides}
    if OURS in grads and PEER in grads:
        pairs = [_diff(a, b) for a, b in zip(grads[OURS], grads[PEER])]
        c = out[OURS]
        c[f"max_abs_diff_vs_{PEER}"] = {g: p[0] for g, p in zip(GRADS, pairs)}
        c["rel_diff_vs_ref"] = {g: p[1] for g, p in zip(GRADS, pairs)}
        c["mismatch"] = not all(p[1] <= GRAD_RTOL for p in pairs)
    seqs = ref_sequences(case)
    for b in seqs:
        ref = reference_grads(case, inp, dout, b)
        rows = [(case.offsets_q()[b], case.lens_q[b]), (case.offsets_k()[b], case.lens_k[b]),
                (case.offsets_k()[b], case.lens_k[b])]
        for n, gs in grads.items():
            worst = out[n].setdefault("ref_max_rel_err", {g: 0.0 for g in GRADS})
            for g, x, r, (o, ln) in zip(GRADS, gs, ref, rows):
                worst[g] = max(worst[g], _diff(x[o:o + ln], r)[1])
        del ref
    for n in grads:
        out[n]["ref_sequences"] = [[b, case.lens_q[b]] for b in seqs]
        if seqs and not all(x <= GRAD_RTOL for x in out[n]["ref_max_rel_err"].values()):
            out[n]["mismatch"] = True
    del grads
    torch.cuda.synchronize()
    return out


# ---------------------------------------------------------------------------------------- one case
def make_row(case, times: dict, sides: dict, errors: dict, checks: dict, notes: list) -> dict:
    """One results row from the per-repetition times (microseconds), the failures and the checks."""
    fl, nb = flops_bytes(case)
    row = {"shape": case.name, "params": case_params(case), "direction": "backward", "flops": fl, "bytes": nb,
           "bound": "compute", "lengths_q": list(case.lens_q), "lengths_k": list(case.lens_k),
           "pairs_per_head": VC.case_pairs(case), "ours": OURS, "ceiling": None, "impls": {}, "notes": notes,
           "reference": (f"{PEER} (full gradients); " if OURS in checks and PEER in checks else "")
           + "float32 autograd on sampled sequences"}
    for n, s in sides.items():
        e = results.impl_entry("ours" if n == OURS else "peer", times[n], fl, nb, form=s.form,
                               first_call_s=round(s.first_call_s, 3), **checks.get(n, {}))
        if "rel_diff_vs_ref" in e:
            e["max_rel_diff_vs_ref"] = max(e["rel_diff_vs_ref"].values())
        row["impls"][n] = e
    for n, err in errors.items():
        row["impls"][n] = {"role": "ours" if n == OURS else "peer", "error": err,
                           "form": OURS_FORM if n == OURS else FA4_FORM}
    return row


def kernel_split(kernels: list, steps: int) -> list:
    """``[[name, us per call], ...]`` of a profiled side, summed by kernel name cut to its first 72
    characters (:func:`.results.per_kernel`), longest first."""
    return [[n, round(us, 1)] for n, us in results.per_kernel([(n[:72], us) for n, us in kernels], steps)]


def failed_row(case, error: BaseException, notes: list) -> dict:
    fl, nb = flops_bytes(case)
    return {"shape": case.name, "params": case_params(case), "direction": "backward", "flops": fl, "bytes": nb,
            "bound": "compute", "lengths_q": list(case.lens_q), "lengths_k": list(case.lens_k),
            "pairs_per_head": VC.case_pairs(case), "impls": {}, "failed": True,
            "notes": notes + [f"FAILED: {type(error).__name__}: {str(error)[:400]}"]}


def run_case(case, repeats: int, prog) -> dict:
    """Build, check, time the sides that ran: one row."""
    import torch

    from . import timing

    notes: list = []
    inp, dout, sides, errors = build(case, notes)
    checks = check(case, inp, dout, sides)
    times = timing.paired_times({n: s.run for n, s in sides.items()}, repeats,
                                tick=lambda n, s=case.name: prog.step(f"{s[:24]} {n}")) if sides else {}
    row = make_row(case, times, sides, errors, checks, notes)
    for n, s in sides.items():  # where each side's backward spends its time, kernel by kernel
        row["impls"][n]["kernels_us"] = kernel_split(timing.profiled_kernels(s.run, SPLIT_STEPS), SPLIT_STEPS)
    del inp, dout, sides
    torch.cuda.empty_cache()
    return row


# ---------------------------------------------------------------------------------------- run
def precompile(selected) -> None:
    """Our packed forward and backward configurations of the run, compiled in parallel processes (disk
    cache) before timing; a plan this version cannot name compiles at its first call instead."""
    import torch

    from ...attention import backward as BW
    from ...attention import forward as FW
    from .timing import precompile_and_report

    bf16 = torch.bfloat16
    keys = sorted({(c.D, c.causal, c.Hq != c.Hkv) for c in selected})
    try:
        fwd = [FW.plan(bf16, D, causal, varlen=True) for D, causal, _ in keys]
        bwd = [cfg for D, causal, gqa in keys for cfg in BW.bwd_plan(bf16, D, causal, gqa=gqa, varlen=True)]
    except Exception as e:  # noqa: BLE001 - another plan signature: compiled at the first call instead
        print(f"not precompiled: {type(e).__name__}: {str(e)[:160]}", flush=True)
        return
    if fwd:
        precompile_and_report(FW.precompile, fwd)
        precompile_and_report(lambda cfgs: BW.precompile([cfgs]), list(dict.fromkeys(bwd)))


def fa4_summary(rows: list) -> dict:
    """Our ratio to FA4 (FA4's time / ours) over the cases: its lowest and whether the target is met on
    every case (None: no case with both sides timed)."""
    xs = [r["ratio_vs"][PEER] for r in rows if PEER in r.get("ratio_vs", {})]
    if not xs:
        return {"fa4_target_met": None}
    ours_ok = all(not r["impls"][OURS].get("mismatch") for r in rows if PEER in r.get("ratio_vs", {}))
    return {"min_vs_fa4": min(xs), "fa4_cases": len(xs),
            "fa4_target_met": bool(min(xs) >= TARGET_VS_FA4 and ours_ok and len(xs) == len(rows))}


def document(meta: dict, rows: list, roofs=None) -> dict:
    doc = results.document(KIND, meta, [dict(r) for r in rows], roofs, notes=[
        "Packed (varlen) backward: FLOPs 2.5x the forward's of the unmasked (query, key) pairs, counted "
        "exactly per sequence (bottom-right causal).",
        f"Gradients flagged above {GRAD_RTOL:g} of the reference's max |value| (vs {PEER}'s full gradients; vs "
        f"float32 autograd on up to {REF_SEQS} sampled sequences)."], direction="backward")
    s = doc["summary"]
    s.update(fa4_summary(doc["rows"]))
    s["mismatches"] = [f"{r['shape']}:{n}" for r in doc["rows"] for n, v in r["impls"].items() if v.get("mismatch")]
    s["failed_sides"] = [f"{r['shape']}:{n}: {v['error']}" for r in doc["rows"] for n, v in r["impls"].items()
                         if "error" in v]
    s["failed_cases"] = [r["shape"] for r in doc["rows"] if r.get("failed")]
    return doc


def run(selected, repeats: int = REPEATS, quick: bool = False, on_row=None) -> dict:
    """Benchmark the cases; returns the results document.  ``on_row(doc)`` after each case with the
    document so far; a case that raises becomes a ``failed`` row and the run goes on."""
    from .ceiling import start_run
    from .progress import Progress

    _, timer, roofs = start_run("bench attention --backward --varlen", quick)
    meta = results.run_meta(TIMER, repeats, quick=quick, direction="backward", mode=MODE,
                            roofs_timer=timer)
    precompile(selected)
    rows: list = []
    with Progress(len(selected) * repeats * 2, "bench attention --backward --varlen") as prog:
        for case in selected:
            t0 = time.time()
            try:
                row = run_case(case, repeats, prog)
            except Exception as e:  # noqa: BLE001 - one case failing (even a device fault) must not lose the others
                row = failed_row(case, e, [])
            rows.append(row)
            prog.note(f"{case.name} ({time.time() - t0:.0f} s): " + "  ".join(
                f"{n}={v['median_us']:.0f}us/{v['tflops']:.0f}TF{'!' if v.get('mismatch') else ''}"
                if v.get("median_us") else f"{n}=FAILED" for n, v in row["impls"].items()))
            for nt in row["notes"]:
                prog.note(f"    note: {nt}")
            if on_row is not None:
                on_row(document(meta, rows, roofs))
    return document(meta, rows, roofs)


# ---------------------------------------------------------------------------------------- output
def _fmt_grads(d: dict | None, spec: str = ".2e") -> str:
    return "-" if not d else " ".join(f"{d[g]:{spec}}" for g in GRADS)


def markdown(doc: dict) -> str:
    """The shared table, then per case: our ratio to FA4 against the target, the gradient checks, the
    lengths and the call forms."""
    md = results.markdown(doc).rstrip("\n")
    md = md.replace("(the ceiling: " + results._ceiling_words(KIND) + ")", "(the ceiling: none in this mode)")
    s = doc["summary"]
    lines = ["", f"Packed (varlen) backward, ours vs FA4 (FA4's time / ours, paired; target >= {TARGET_VS_FA4:.1f}x "
                 "on every case):", "",
             f"| case | x {PEER} | ours - {PEER}: max abs diff dq dk dv | (over {PEER}'s max) | "
             "vs float32 (max rel err dq dk dv per side) |", "|---|---|---|---|---|"]
    for r in doc["rows"]:
        x = r.get("ratio_vs", {}).get(PEER)
        o = r["impls"].get(OURS, {})
        ref = "; ".join(f"{n} {_fmt_grads(e.get('ref_max_rel_err'), '.4f')}{' MISMATCH' if e.get('mismatch') else ''}"
                        for n, e in r["impls"].items() if e.get("ref_max_rel_err"))
        lines.append(f"| {r['shape']} | {'-' if x is None else f'{x:.3f}x'} | "
                     f"{_fmt_grads(o.get(f'max_abs_diff_vs_{PEER}'))} | {_fmt_grads(o.get('rel_diff_vs_ref'), '.4f')} | "
                     f"{ref or '-'} |")
    met = s.get("fa4_target_met")
    lines += ["", "FA4: " + ("not timed beside ours." if met is None else
                             f"lowest {s['min_vs_fa4']:.3f}x over {s['fa4_cases']} case(s): target "
                             + ("met." if met else "NOT met.")),
              f"Gradients flagged (> {GRAD_RTOL:g} of the reference's max |value|): "
              + (", ".join(s.get("mismatches") or []) or "none") + ".",
              "Failed sides: " + ("; ".join(s.get("failed_sides") or []) or "none") + "."]
    for r in doc["rows"]:
        p = r["params"]
        lines += ["", f"### {r['shape']}", "",
                  f"- B {p['B']}, hq{p['Hq']} hkv{p['Hkv']} d{p['D']}, causal {p['causal']}; total_q {p['total_q']}, "
                  f"max_seqlen {p['max_seqlen_q']}; pairs per head {r['pairs_per_head']}, "
                  f"{r['flops'] / 1e12:.4f} TFLOP (2.5x the forward's)",
                  f"- lengths (q = k): {r['lengths_q']}" if len(r["lengths_q"]) <= 64 else
                  f"- lengths (q = k): {len(r['lengths_q'])} sequences, the first 16 {r['lengths_q'][:16]}"]
        for n, e in r["impls"].items():
            if e.get("kernels_us"):
                lines.append(f"- {n}, kernels per call (us, torch.profiler over {SPLIT_STEPS} calls): "
                             + "; ".join(f"`{k}` {us:.0f}" for k, us in e["kernels_us"][:6]))
        for n, e in r["impls"].items():
            seqs = e.get("ref_sequences")
            lines.append(f"- {n}: `{e.get('form')}`" + (f"; first call {e['first_call_s']} s" if "first_call_s" in e else "")
                         + (f"; float32 reference on (sequence, length) {seqs}" if seqs else "")
                         + (f"; FAILED: {e['error']}" if "error" in e else ""))
    return md + "\n" + "\n".join(lines) + "\n"


def stem_tag(tag: str = "", quick: bool = False) -> str:
    """The file names' tag: ``varlen`` first (these records stay apart from the dense backward's)."""
    return "-".join(x for x in (MODE, tag or ("quick" if quick else "")) if x)


def write(doc: dict, out_dir, tag: str = "") -> tuple:
    """JSON + markdown (:func:`markdown`) of a run into ``out_dir``; ``tag`` as :func:`stem_tag` makes it."""
    return results.write(doc, out_dir, tag, to_markdown=markdown)


def describe(selected) -> str:
    """``--list``: each case, its lengths, totals, FLOPs and bytes, and the sampled reference sequences."""
    lines = []
    for c in selected:
        fl, nb = flops_bytes(c)
        lines += [f"{c.name}: B {c.B}, hq{c.Hq} hkv{c.Hkv} d{c.D}, causal {c.causal}, max_seqlen {c.max_q}",
                  f"  lengths {list(c.lens_q)}",
                  f"  total_q {sum(c.lens_q)}, pairs/head {VC.case_pairs(c)}, backward {fl / 1e12:.4f} TFLOP "
                  f"(2.5x the forward's), {nb / 1e9:.3f} GB (q, k, v, out, dout read; dq, dk, dv written)",
                  f"  float32 reference on sequences {[(b, c.lens_q[b]) for b in ref_sequences(c)]}"]
    return "\n".join(lines)


def build_parser(prog: str = "cute-kernels bench attention --backward --varlen") -> argparse.ArgumentParser:
    ap = OneLineParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"the small packed case, {QUICK_REPEATS} repetitions")
    ap.add_argument("--repeats", type=int_in(1), default=REPEATS,
                    help=f"paired repetitions (default {REPEATS})")
    ap.add_argument("--only", default="", help="comma-separated substrings of case names (varlen_b32, manyshort)")
    ap.add_argument("--tag", default="", help="suffix of the file names after attention-backward-varlen")
    ap.add_argument("--out", "--out-dir", dest="out", default=os.path.join("profiles", "results"),
                    help="folder for the JSON and markdown (default profiles/results)")
    ap.add_argument("--list", action="store_true", help="print the cases, their lengths and FLOPs; no GPU")
    return ap


def main(argv: list | None = None, prog: str = "cute-kernels bench attention --backward --varlen") -> int:
    ap = build_parser(prog)
    args = ap.parse_args(argv)
    selected = select(args.only, args.quick)
    if not selected:
        ap.error(f"--only {args.only!r} matches no case ({', '.join(c.name for c in all_cases(args.quick))})")
    if args.list:
        print(describe(selected))
        return 0
    if results.cuda_missing(prog):
        return 2
    tag = stem_tag(args.tag, args.quick)
    doc = run(selected, QUICK_REPEATS if args.quick else args.repeats, args.quick, on_row=lambda d: write(d, args.out, tag))
    return results.publish(doc, args.out, tag, to_markdown=markdown)
