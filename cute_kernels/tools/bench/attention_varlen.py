"""Attention forward on packed, paged and windowed inputs (issue 18): ``flash_attn`` vs FlashAttention-4
(``flash_attn.cute``), one process, one timer -- ``python profiles/bench_attention.py --varlen``.

Cases (bf16, hq32 hkv8 d128, causal bottom-right; ``--quick``: smaller versions of the same three):

1. ``varlen``: 32 packed sequences, lengths log-uniform in 1..8192 (``random.Random(0)``, recorded in
   the row), q and k/v packed with the same lengths.  Ours: ``flash_attn(cu_seqlens_q/k, max_seqlen_q/k)``;
   FA4: ``flash_attn_varlen_func`` with the same arguments.
2. ``window``: b2 s16384, ``window_size=(4096, 0)`` with causal, dense.  FA4: ``flash_attn_func(
   window_size=(4096, 0), causal=True)``.
3. ``paged`` (run last: the newest kernel; rows are written as they finish and a case that raises
   becomes a ``failed`` row): B = 8, 2048 new tokens each against 30,000 cached (``seqused_k`` = 32048,
   the new tokens the last 2048 of the cache), pages of 64 in a shuffled order.  Ours: ``flash_attn(
   block_table=, seqused_k=)`` with q dense (8, 2048, 32, 128), else q packed (the first form ours
   accepts; FA4 is given the same form first).  Skipped with a note while ``flash_attn`` has no
   ``block_table`` (an older version: the A/B runs).  FA4:
   ``flash_attn_varlen_func(page_table=, seqused_k=)``.

FLOPs count only the unmasked (query, key) pairs, exactly (:func:`visible_pairs`): 4 * D * Hq * pairs,
query i of a sequence (Lq queries, Lk keys) at position p = i + Lk - Lq seeing keys
max(0, p - left) .. min(Lk - 1, p + right) (causal: right = 0; -1: unbounded).  A square causal
sequence counts S (S + 1) / 2 pairs (the dense bench's S^2 / 2 is 1/S lower).

Our dense kernel at the same work (the issue's target: varlen within 5% of the dense rate), timed in
the same rounds as variants of the varlen row:
- ``cute_dense_eqflops``: a dense causal batch b{B'} s{S'} of (about) the same pairs and the same
  number of query tokens: S' = 2 * pairs / tokens - 1 rounded to a multiple of 128, B' = round(pairs /
  pairs(S')); its rate against ours is ``rate_vs_dense["cute / cute_dense_eqflops"]`` (the median over
  rounds of (F_varlen / t_varlen) / (F_dense / t_dense)).  FA4's dense function on the same batch
  (``fa4_dense_eqflops``) gives FA4's own varlen-to-dense ratio.
- ``cute_dense_per_seq``: the dense kernel called once per sequence (views of the packed tensors, 32
  launches back to back): the same work without packing.

Correctness before any timing: every implementation runs once; each output is compared with FA4's on
the same inputs (the full output, max |diff|), and against a float32 reference on a sample of rows
(per sequence: the first, last, middle, two random rows and the rows at the window's edge; heads 0,
Hq/2 - 1 and Hq - 1) plus the 8 (row, head) pairs where it differs most from FA4's output.  An
implementation with a sampled row off by more than ``REF_ATOL + REF_RTOL * max|ref row|`` is not timed
(an ``error`` entry says why: a wrong kernel makes no speed claim); the full-output difference to FA4
above ``MISMATCH_ATOL`` flags the entry (``mismatch``).

Timing as :mod:`.attention`: ``triton.testing.do_bench`` median, L2 flushed before every call,
``--repeats`` interleaved rounds with the order rotated; ratios per round.  The ceiling is a bf16 cuBLAS
matmul of the same FLOPs (``cublas_same_flops``).  Results: ``attention-varlen[-TAG]-DATE-COMMIT``
.json / .md in ``--out``.

``--list`` prints the cases (lengths, pairs, FLOPs, the dense batch, the call forms) without a GPU;
``--dry-run`` builds every full-size input as fake CUDA tensors and passes each call of ours through
``flash_attn``'s validation and planning (no GPU, no memory).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import statistics
import sys
import time

from ..args import OneLineParser, int_in
from . import results
# the cases, FLOP counts, inputs and the sampled reference (re-exported: one namespace for the tests)
from .attention_varlen_cases import (  # noqa: F401
    REF_ATOL, REF_RTOL, WORST_ROWS, Case, case_pairs, cases, check_rows, dense_equivalent, flops_bytes,
    log_uniform_lengths, make_inputs, max_diff, reference_rows, sample_rows, select, token_to_row, visible_pairs,
)
from .attention_varlen_calls import (  # noqa: F401
    dense_per_seq_call, fa4_calls, fa4_functions, ours_calls, paged_gate, paged_supported,
)

KIND = "attention-varlen"
TITLE = results.TITLES[KIND]
OURS, PEER, MATMUL = "cute", "fa4", "cublas_same_flops"
DENSE_EQ, DENSE_SEQ, FA4_DENSE_EQ = "cute_dense_eqflops", "cute_dense_per_seq", "fa4_dense_eqflops"
MISMATCH_ATOL = 2e-2  # full-output |diff| to FA4 that flags an entry (bf16 kernels agree to ~1e-3)
TARGET_VS_DENSE = 0.95  # issue 18: varlen within 5% of the dense kernel's rate
DEVICE = "cuda"  # where :func:`build` makes the inputs (the CPU tests run the whole row with stand-ins)



# ---------------------------------------------------------------------------------------- one case
@dataclasses.dataclass
class Impl:
    run: object
    get: object  # -> (total_q, Hq, D) output of the last run
    problem: str  # key into the problems dict (the inputs it ran on)
    role: str
    flops: float
    nbytes: float
    form: str
    first_call_s: float = 0.0


def _first_that_runs(calls, notes, label):
    """(form, run, get, first call seconds) of the first call form that runs, else None (notes say why)."""
    import torch

    for form, run, *get in calls:
        try:
            t0 = time.time()
            run()
            torch.cuda.synchronize()
            dt = time.time() - t0
        except Exception as e:  # noqa: BLE001 - this form or this implementation cannot run: a note
            notes.append(f"{label}: {form}: {type(e).__name__}: {str(e)[:200]}")
            continue
        return form, run, (get[0] if get else run), dt  # FA4's get: run it again (it returns its output)
    return None


def build(case: Case, notes: list) -> tuple:
    """({problem key: (Case, inputs)}, {name: Impl}) for one case, every implementation run once (compiled)."""
    fa4, fa4v, why = fa4_functions()
    fl, nb = flops_bytes(case)
    problems = {"main": (case, make_inputs(case, DEVICE))}
    impls: dict = {}

    def add(name, role, problem, calls, flops, nbytes):
        got = _first_that_runs(calls, notes, name)
        if got is not None:
            form, run, get, dt = got
            impls[name] = Impl(run, get, problem, role, flops, nbytes, form, dt)
        return got

    inp = problems["main"][1]
    gate = paged_gate() if case.mode == "paged" else ""
    if gate:
        notes.append(f"{OURS}: skipped: {gate}; fa4 timed alone, checked against the float32 reference")
    got = None if gate else add(OURS, "ours", "main", ours_calls(case, inp), fl, nb)
    packed = got is not None and "total_q" in got[0]
    if fa4 is None:
        notes.append(f"{PEER}: skipped, flash_attn.cute not importable ({why})")
    else:
        add(PEER, "peer", "main", fa4_calls(case, inp, fa4, fa4v, prefer_packed_q=packed), fl, nb)
    if case.mode == "varlen":
        add(DENSE_SEQ, "variant", "main", [dense_per_seq_call(case, inp)], fl, nb)
        dcase = dense_equivalent(case)
        dfl, dnb = flops_bytes(dcase)
        problems["dense"] = (dcase, make_inputs(dcase, DEVICE))
        dinp = problems["dense"][1]
        add(DENSE_EQ, "variant", "dense", ours_calls(dcase, dinp), dfl, dnb)
        if fa4 is not None:
            add(FA4_DENSE_EQ, "variant", "dense", fa4_calls(dcase, dinp, fa4, fa4v), dfl, dnb)
    return problems, impls


def check(problems: dict, impls: dict) -> dict:
    """{name: check entry}: each output against FA4's (full, max |diff|) and the float32 reference on the
    sampled rows plus the rows of largest difference to FA4; ``ok`` False: not to be timed."""
    import torch

    out: dict = {}
    for key, (case, inp) in problems.items():
        names = [n for n, im in impls.items() if im.problem == key]
        ref_name = next((n for n in names if n in (PEER, FA4_DENSE_EQ)), None)
        triples = sample_rows(case)
        diffs: dict = {}
        if ref_name is not None:
            base = impls[ref_name].get()
            for n in names:
                if n == ref_name:
                    continue
                d, worst = max_diff(impls[n].get(), base)
                diffs[n] = d
                triples += [(*token_to_row(inp["offs_q"], t), h) for t, h in worst]
            del base
        triples = sorted(set(triples))
        ref = reference_rows(case, inp, triples)
        for n in names:
            c = check_rows(impls[n].get(), inp["offs_q"], triples, ref)
            if ref_name is not None and n != ref_name:
                c[f"max_abs_diff_vs_{ref_name}"] = diffs[n]
                c["mismatch"] = not diffs[n] <= MISMATCH_ATOL
            out[n] = c
        del ref
        torch.cuda.synchronize()
    return out


def rate_ratio(a: dict, b: dict, fa: float, fb: float) -> float | None:
    """Median over rounds of (fa / t_a) / (fb / t_b) for two impl entries (their rates' ratio)."""
    ta, tb = a.get("times_us") or [], b.get("times_us") or []
    if not ta or not tb:
        return None
    if len(ta) == len(tb):
        return statistics.median((fa / x) / (fb / y) for x, y in zip(ta, tb))
    return (fa / a["median_us"]) / (fb / b["median_us"])


def run_case(case: Case, bench, repeats: int, prog) -> dict:
    """One row: build, check, time the implementations that passed, and the extra figures."""
    import torch

    from .ceiling import matmul_same_flops
    from .timing import time_rounds

    notes: list = []
    problems, impls = build(case, notes)
    checks = check(problems, impls)
    fl, nb = flops_bytes(case)
    todo = {n: im.run for n, im in impls.items() if checks[n]["ok"]}
    mm_fn, mm_flops = matmul_same_flops(fl)
    todo[MATMUL] = mm_fn
    times = time_rounds(todo, bench, repeats, tick=lambda n, s=case.name: prog.step(f"{s[:24]} {n}"))
    row = {"shape": case.name, "params": case_params(case), "lengths_q": list(case.lens_q), "lengths_k": list(case.lens_k),
           "pairs_per_head": case_pairs(case), "flops": fl, "bytes": nb, "bound": "compute",
           "reference": "float32 on sampled rows" + (f"; full output vs {PEER}" if PEER in impls else ""),
           "impls": {}, "notes": notes, "ceiling": MATMUL, "ours": OURS if OURS in impls else None}
    for n, im in impls.items():
        c = checks[n]
        extra = {"form": im.form, "first_call_s": round(im.first_call_s, 3), "check": c}
        if n in times:
            e = results.impl_entry(im.role, times[n], im.flops, im.nbytes, **extra)
            e["mismatch"] = bool(c.get("mismatch"))
        else:
            e = {"role": im.role, "error": f"wrong output, not timed (max err {c['max_abs_err']:.3g})", **extra}
            notes.append(f"{n}: WRONG OUTPUT, not timed: {c.get('rows_wrong')} of {c['rows_checked']} sampled rows off "
                         f"(max |err| {c['max_abs_err']:.3g}, worst (seq, row, head) {c.get('worst')})")
        if im.flops != fl:
            e["flops"] = im.flops
        row["impls"][n] = e
    scale = fl / mm_flops
    row["impls"][MATMUL] = results.impl_entry("ceiling", [t * scale for t in times[MATMUL]], fl, nb,
                                              matmul_n=round((mm_flops / 2) ** (1 / 3)))
    if case.mode == "varlen":
        dcase = problems["dense"][0]
        row["dense_eqflops"] = {"shape": dcase.name, "B": dcase.B, "S": dcase.max_q,
                                "pairs_per_head": case_pairs(dcase), "flops": flops_bytes(dcase)[0],
                                "flops_vs_varlen": flops_bytes(dcase)[0] / fl,
                                "method": "dense causal batch of about the same pairs and query tokens: "
                                          "S' = 2 * pairs / tokens - 1 rounded to 128, B' = round(pairs / pairs(S'))"}
        rv, ie = {}, row["impls"]
        for a, b in ((OURS, DENSE_EQ), (OURS, DENSE_SEQ), (PEER, FA4_DENSE_EQ)):
            if a in ie and b in ie and ie[a].get("median_us") and ie[b].get("median_us"):
                rv[f"{a} / {b}"] = rate_ratio(ie[a], ie[b], impls[a].flops, impls[b].flops)
        row["rate_vs_dense"] = rv
        x = rv.get(f"{OURS} / {DENSE_EQ}")
        row["meets_target_vs_dense"] = None if x is None else x >= TARGET_VS_DENSE
    for k in list(problems):
        del problems[k]
    del impls, todo, mm_fn
    torch.cuda.empty_cache()
    return row


# ---------------------------------------------------------------------------------------- run
def our_configs(case: Case) -> list:
    """The configurations of ours a case runs (what :func:`precompile` compiles): the kernel's plan for
    the case's static facts as ``flash_attn`` derives them (``check_window``), plus the dense causal
    kernel of the varlen comparisons; the paged one (q dense, its first form) where ``plan`` takes
    ``page_size``."""
    import torch

    from ...attention import forward as FW

    bf16 = torch.bfloat16
    causal, win = FW.check_window(tuple(case.window), case.causal)
    if case.mode == "varlen":
        return [FW.plan(bf16, case.D, causal, varlen=True, window=win is not None), FW.plan(bf16, case.D, case.causal)]
    if case.mode == "dense":
        return [FW.plan(bf16, case.D, causal, window=win is not None)]
    if paged_supported() and "page_size" in inspect.signature(FW.plan).parameters:
        try:
            return [FW.plan(bf16, case.D, causal, window=win is not None, page_size=case.page)]
        except Exception as e:  # noqa: BLE001 - another plan signature: compiled at the first call instead
            print(f"paged plan not precompiled: {type(e).__name__}: {str(e)[:120]}", flush=True)
    return []


def precompile(selected) -> None:
    """Our configurations of the run compiled in parallel processes (disk cache) before timing (a paged
    one that :func:`our_configs` cannot name compiles at its first call, also before timing)."""
    from ...attention import forward as FW
    from .timing import precompile_and_report

    cfgs = {cfg for c in selected if not (c.mode == "paged" and paged_gate()) for cfg in our_configs(c)}
    if cfgs:
        precompile_and_report(FW.precompile, sorted(cfgs, key=repr))


def _document(meta: dict, rows: list, roofs: dict) -> dict:
    doc = results.document(KIND, meta, [dict(r) for r in rows], roofs, notes=[
        "FLOPs: 4 * D * Hq * unmasked (query, key) pairs, counted exactly per sequence (bottom-right causal, "
        "window [p - left, p + right], p = i + Lk - Lq).",
        f"Correctness gate before timing: float32 reference on sampled rows (+ the {WORST_ROWS} rows of largest "
        f"difference to FA4); a row off by more than {REF_ATOL} + {REF_RTOL} * max|ref row| means not timed."])
    s = doc["summary"]
    s["mismatches"] = [f"{r['shape']}:{n}" for r in doc["rows"] for n, v in r["impls"].items() if v.get("mismatch")]
    s["wrong_outputs"] = [f"{r['shape']}:{n}" for r in doc["rows"] for n, v in r["impls"].items() if "error" in v]
    s["failed_cases"] = [r["shape"] for r in doc["rows"] if r.get("failed")]
    for r in doc["rows"]:
        if r.get("rate_vs_dense"):
            s["varlen_rate_vs_dense"] = r["rate_vs_dense"]
    return doc


def case_params(case: Case) -> dict:
    return {"mode": case.mode, "B": case.B, "Hq": case.Hq, "Hkv": case.Hkv, "D": case.D, "causal": case.causal,
            "window": list(case.window), "page": case.page or None, "max_seqlen_q": case.max_q,
            "max_seqlen_k": case.max_k, "total_q": sum(case.lens_q), "total_k": sum(case.lens_k)}


def run(selected, repeats: int = 3, quick: bool = False, roofs: bool = True, on_row=None) -> dict:
    """Benchmark the cases; returns the results document (kind ``attention-varlen``).  ``on_row(doc)``
    after each case with the document so far (the files are rewritten as rows finish); a case that
    raises becomes a row with ``failed`` and its error in the notes, and the run goes on."""
    import torch

    from .ceiling import measure_roofs
    from .progress import Progress
    from .timing import make_bench

    if not torch.cuda.is_available():
        raise RuntimeError("bench attention --varlen needs a CUDA device")
    bench, timer = make_bench(quick)
    meta = results.run_meta(timer, repeats, quick=quick)
    measured = {}
    if roofs:
        print("measuring the roofs (read, copy, matmul)", flush=True)
        measured = measure_roofs(bench, quick)
        print(f"roofs: {results.roof_words(measured)}", flush=True)
    precompile(selected)
    rows = []
    per_case = {"varlen": 6, "paged": 3, "dense": 3}
    with Progress(sum(per_case.get(c.mode, 3) for c in selected) * repeats, "bench attention varlen") as prog:
        for case in selected:
            t0 = time.time()
            try:
                row = run_case(case, bench, repeats, prog)
            except Exception as e:  # noqa: BLE001 - one case failing (even a device fault) must not lose the others
                row = {"shape": case.name, "params": case_params(case), "flops": flops_bytes(case)[0],
                       "bytes": flops_bytes(case)[1], "bound": "compute", "impls": {}, "failed": True,
                       "pairs_per_head": case_pairs(case), "lengths_q": list(case.lens_q),
                       "lengths_k": list(case.lens_k), "notes": [f"FAILED: {type(e).__name__}: {str(e)[:400]}"]}
            rows.append(row)
            prog.note(f"{case.name} ({time.time() - t0:.0f} s): " + "  ".join(
                f"{n}={v['median_us']:.0f}us/{v['tflops']:.0f}TF{'!' if v.get('mismatch') else ''}"
                if v.get("median_us") else f"{n}=WRONG" for n, v in row["impls"].items()))
            for k, x in (row.get("rate_vs_dense") or {}).items():
                prog.note(f"    rate {k}: {x:.3f}")
            for nt in row["notes"]:
                prog.note(f"    note: {nt}")
            if on_row is not None:
                on_row(_document(meta, rows, measured))
    return _document(meta, rows, measured)


# ---------------------------------------------------------------------------------------- output
def markdown(doc: dict) -> str:
    """The shared table (:func:`results.markdown`) with this benchmark's title and ceiling, then the
    per-case figures: lengths, the dense comparison, the correctness checks and the call forms."""
    md = results.markdown(doc)
    md = md.replace(
        "(the ceiling: none)", "(the ceiling: a bf16 cuBLAS matmul of the same FLOPs, cublas_same_flops)")
    lines = ["", "## Per case"]
    for r in doc["rows"]:
        p = r["params"]
        lines += ["", f"### {r['shape']}", "",
                  f"- {p['mode']}, B {p['B']}, hq{p['Hq']} hkv{p['Hkv']} d{p['D']}, causal {p['causal']}, "
                  f"window {tuple(p['window'])}, page {p['page']}; total_q {p['total_q']}, total_k {p['total_k']}; "
                  f"pairs per head {r['pairs_per_head']}, {r['flops'] / 1e12:.4f} TFLOP"]
        if p["mode"] == "varlen":
            lines.append(f"- lengths (q = k): {r['lengths_q']}")
        d = r.get("dense_eqflops")
        if d:
            lines.append(f"- dense at equal work: {d['shape']} ({d['flops'] / 1e12:.4f} TFLOP, "
                         f"{d['flops_vs_varlen']:.3f}x the varlen FLOPs); {d['method']}")
            lines.append(f"- {DENSE_EQ} and {FA4_DENSE_EQ} run that batch: compare their TFLOP/s, not their times; "
                         f"{DENSE_SEQ} runs the varlen row's own sequences")
        for k, x in (r.get("rate_vs_dense") or {}).items():
            lines.append(f"- rate {k}: **{x:.3f}**" + (f" (issue target >= {TARGET_VS_DENSE})"
                                                        if k == f"{OURS} / {DENSE_EQ}" else ""))
        for n, e in r["impls"].items():
            c = e.get("check")
            if not c:
                continue
            diff = next(((k[len("max_abs_diff_vs_"):], v) for k, v in c.items() if k.startswith("max_abs_diff_vs_")),
                        None)
            lines.append(f"- {n}: `{e.get('form')}`; first call {e.get('first_call_s')} s; vs float32 on "
                         f"{c['rows_checked']} rows: max |err| {c['max_abs_err']:.2e} ({'ok' if c['ok'] else 'WRONG'})"
                         + (f"; max |diff| to {diff[0]} {diff[1]:.2e}{' MISMATCH' if c.get('mismatch') else ''}" if diff else ""))
    s = doc.get("summary", {})
    if s.get("wrong_outputs") or s.get("mismatches"):
        lines += ["", f"**Wrong outputs (not timed): {s.get('wrong_outputs')}; mismatches: {s.get('mismatches')}**"]
    return md + "\n".join(lines) + "\n"


def write(doc: dict, out_dir, tag: str = "") -> tuple:
    """``attention-varlen[-TAG]-DATE-COMMIT.json`` and ``.md`` (:func:`markdown`) into ``out_dir``;
    returns their paths."""
    return results.write(doc, out_dir, tag, to_markdown=markdown)


def describe(selected) -> str:
    """``--list``: each case, its lengths, pairs, FLOPs, bytes, the dense comparison and the call forms."""
    lines = []
    for c in selected:
        fl, nb = flops_bytes(c)
        lines.append(f"{c.name}: {c.mode}, B {c.B}, hq{c.Hq} hkv{c.Hkv} d{c.D}, causal {c.causal}, "
                     f"window {c.window}, page {c.page or '-'}")
        lines.append(f"  lengths q {list(c.lens_q)}" if c.mode == "varlen" else
                     f"  Sq {c.max_q}, Sk {c.max_k} (seqused_k)" if c.mode == "paged" else f"  S {c.max_q}")
        lines.append(f"  total_q {sum(c.lens_q)}, total_k {sum(c.lens_k)}, pairs/head {case_pairs(c)}, "
                     f"{fl / 1e12:.4f} TFLOP, {nb / 1e9:.3f} GB (q, k, v, o once)")
        if c.mode == "paged":
            pps = -(-c.max_k // c.page)
            lines.append(f"  {c.B * pps} pages of {c.page} ({pps} per sequence, shuffled), "
                         f"{2 * c.B * pps * c.page * c.Hkv * c.D * 2 / 1e9:.3f} GB of K+V pages")
        if c.mode == "varlen":
            d = dense_equivalent(c)
            lines.append(f"  dense at equal work: {d.name}, {flops_bytes(d)[0] / 1e12:.4f} TFLOP "
                         f"({flops_bytes(d)[0] / fl:.3f}x); per-sequence dense: {sum(1 for x in c.lens_q if x)} calls")
        lines.append(f"  sampled reference rows: {len(sample_rows(c))} (sequence, row, head) triples")
    return "\n".join(lines)


def dry_run(selected) -> list:
    """Build each case's full-size inputs as fake CUDA tensors (no memory, no GPU) and pass every call
    form of ours through ``flash_attn`` (validation, shapes of the outputs); the configurations the
    real run precompiles.  Returns lines to print; raises for a case none of whose forms ``flash_attn`` accepts."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    lines = []
    for c in selected:
        todo = [("main", c)] + ([("dense", dense_equivalent(c))] if c.mode == "varlen" else [])
        for what, cc in todo:
            with FakeTensorMode():
                inp = make_inputs(cc, device="cuda")
                calls = ours_calls(cc, inp) + ([dense_per_seq_call(cc, inp)] if cc.mode == "varlen" else [])
                if not calls:
                    lines.append(f"{cc.name}: ours skipped (flash_attn has no block_table / seqused_k)")
                errs = []
                for form, run, get in calls:
                    try:
                        run()
                        o = get()
                    except Exception as e:  # noqa: BLE001 - reported; a case with no accepted form raises
                        errs.append(f"{form}: {type(e).__name__}: {str(e)[:160]}")
                        continue
                    assert tuple(o.shape) == (sum(cc.lens_q), cc.Hq, cc.D), (form, tuple(o.shape))
                    lines.append(f"{cc.name}: accepted: {form} -> out {tuple(o.shape)}")
                    if cc.mode == "paged":
                        break
                if calls and len(errs) == len(calls):
                    raise RuntimeError(f"{cc.name}: flash_attn accepts no call form: {errs}")
                lines += [f"{cc.name}: not accepted: {e}" for e in errs]
            for cfg in our_configs(cc) if cc is c else []:
                lines.append(f"{c.name}: precompiles head_dim={cfg.head_dim} causal={cfg.causal} varlen={cfg.varlen} "
                             f"window={cfg.window} page_size={getattr(cfg, 'page_size', 0)}")
    return lines


def build_parser(prog: str = "bench_attention.py --varlen") -> argparse.ArgumentParser:
    ap = OneLineParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller cases, one round, short do_bench")
    ap.add_argument("--repeats", type=int_in(1), default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--only", default="", help="comma-separated substrings of case names (varlen, paged, window)")
    ap.add_argument("--tag", default="", help="suffix of the file names after the kind")
    ap.add_argument("--out", "--out-dir", dest="out", default=os.path.join("profiles", "results"),
                    help="folder for the JSON and markdown (default profiles/results)")
    ap.add_argument("--no-roofs", action="store_true", help="skip measuring the device's roofs (~10 s)")
    ap.add_argument("--list", action="store_true", help="print the cases, their FLOPs and call forms; no GPU")
    ap.add_argument("--dry-run", action="store_true",
                    help="fake CUDA tensors of full size through flash_attn's validation; no GPU")
    return ap


def main(argv: list | None = None, prog: str = "bench_attention.py --varlen") -> int:
    ap = build_parser(prog)
    args = ap.parse_args(argv)
    selected = select(args.only, args.quick)
    if not selected:
        ap.error(f"--only {args.only!r} matches no case ({', '.join(c.name for c in cases(args.quick))})")
    if args.list:
        print(describe(selected))
        return 0
    if args.dry_run:
        print("\n".join(dry_run(selected)))
        return 0
    import torch

    if not torch.cuda.is_available():
        print(f"{prog}: error: needs a CUDA device (--list and --dry-run run without one)", file=sys.stderr)
        return 2
    tag = args.tag or ("quick" if args.quick else "")
    doc = run(selected, 1 if args.quick else args.repeats, args.quick, roofs=not args.no_roofs,
              on_row=lambda d: write(d, args.out, tag))
    js, md = write(doc, args.out, tag)
    print(markdown(doc))
    print(f"wrote {js} and {md}")
    return 0
