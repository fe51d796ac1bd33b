"""Attention forward (prefill) benchmark: ``flash_attn`` vs cuDNN SDPA, FlashAttention-2 SDPA (torch's
flash backend) and FlashAttention-4 (``flash_attn.cute``), one process, one timer.

Timing: ``triton.testing.do_bench`` median with its L2 flush before every call (cold L2).  Each shape
runs ``--repeats`` interleaved rounds (every implementation once per round, the order rotated); the
figure is the median over the rounds and every ratio is taken within the run.

FLOPs count only the unmasked (q, k) pairs: 4 * B * Hq * Sq * Sk * D (two GEMMs of 2 flops per
multiply-add), halved for causal square problems.  bf16 throughout.  Each implementation's output is
compared once, before timing, with the first one that ran (ours where it runs); a difference above
``MISMATCH_ATOL`` flags the row.

Inputs: ours and FA4 take (B, S, H, D) contiguous tensors; the SDPA backends get contiguous
(B, H, S, D) copies (made once, untimed).  GQA: SDPA with ``enable_gqa=True``, else K/V heads expanded
(noted).  Every shape is square, so SDPA's top-left ``is_causal`` is our bottom-right mask.

Ceilings beside the figures, in the same rounds:
- ``mma_bound``: our kernel compiled with ``mma_only=True`` (mask and softmax removed, P = S; the same
  tiles, loads and two GEMMs): what the softmax's overlap can at best reach.  Not a peer, not compared.
- ``cublas_same_flops``: a bf16 cuBLAS matmul of the same FLOPs (:func:`.ceiling.matmul_same_flops`),
  its time scaled to exactly the attention's FLOPs.
A head dim our kernel does not support yet (``flash_attn`` raises ValueError) skips ours and
``mma_bound`` with a note; the peers are still timed.  Peers that are not installed are skipped with a note.

    cute-kernels bench attention [--quick] [--shapes b4_h32_s4096_d128_full,...] [--out DIR]

``--backward``: the backward instead (issue 32; :mod:`.attention_backward`): each side's
``torch.autograd.grad`` of one forward's output on these shapes, FLOPs 2.5x the forward's, its own
``mma_bound``, the gradients checked against cuDNN's, the ratio to cuDNN against the issue's target;
results of kind ``attention-backward``.

    cute-kernels bench attention --backward [--quick] [--shapes ...] [--out DIR]

``--backward --varlen``: the packed (variable-length) backward instead (issue 33;
:mod:`.attention_backward_varlen`): ours vs FlashAttention-4's varlen backward on the forward varlen
bench's packed cases, paired timer.

    cute-kernels bench attention --backward --varlen [--quick] [--only SUBSTR] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from ..args import OneLineParser, int_in
from . import results
from .attention_shapes import QUICK, SHAPES, _NAME, flops_bytes, parse_shape, select  # noqa: F401 - re-exported

OURS, BOUND, MATMUL = "cute", "mma_bound", "cublas_same_flops"
PEERS = ("cudnn_sdpa", "fa2_sdpa", "fa4")
MISMATCH_ATOL = 2e-2  # bf16 outputs of randn inputs are O(0.1); kernels agree to ~1e-3


def _supported_head_dims() -> tuple:
    from ...attention import forward as FW

    return tuple(getattr(FW, "HEAD_DIMS", (64, 128)))


def _ours(impls, notes, q, k, v, causal, bound=True):
    """Ours and (``bound``) its MMA bound into ``impls``; a head dim the kernel rejects: a note instead."""
    import torch

    from ...attention import forward as FW

    out = torch.empty_like(q)
    try:
        FW.flash_attn(q, k, v, causal=causal, out=out)
        torch.cuda.synchronize()
    except ValueError as e:
        notes.append(f"{OURS}{f' and {BOUND}' if bound else ''}: skipped, flash_attn rejects the shape "
                     f"({str(e)[:140]})")
        return
    impls[OURS] = (lambda: FW.flash_attn(q, k, v, causal=causal, out=out), lambda: out)
    if not bound:
        return
    B, S, Hq, D = q.shape
    try:  # the MMA bound: the same kernel with the mask and softmax compiled out (P = S)
        cfg = dataclasses.replace(FW.plan(q.dtype, D, causal), mma_only=True)
        fn = FW.get_forward_kernel(cfg)
        b_out, b_lse = torch.empty_like(q), torch.empty(B, Hq, S, device="cuda", dtype=torch.float32)
        ctr = FW.tile_counter(q.device, cfg.tile.dynamic)
        fn(q, k, v, b_out, b_lse, ctr, 1.0)
        torch.cuda.synchronize()
        impls[BOUND] = (lambda: fn(q, k, v, b_out, b_lse, ctr, 1.0), lambda: b_out)
    except Exception as e:  # noqa: BLE001 - the bound is a measurement aid: a note, the row still runs
        notes.append(f"{BOUND}: {type(e).__name__}: {str(e)[:140]}")


def _sdpa(impls, notes, backend, name, qt, kt, vt, causal, Hq, Hkv):
    import torch
    from torch.nn.attention import sdpa_kernel

    F = torch.nn.functional.scaled_dot_product_attention

    def make(kk, vv, gqa):
        def run():
            with sdpa_kernel(backend):
                return F(qt, kk, vv, is_causal=causal, enable_gqa=gqa)

        return run

    variants = [(kt, vt, Hq != Hkv, "")]
    if Hq != Hkv:
        variants.append((kt.repeat_interleave(Hq // Hkv, 1), vt.repeat_interleave(Hq // Hkv, 1), False,
                         "K/V heads expanded (reads Hq/Hkv x more K/V)"))
    for kk, vv, gqa, what in variants:
        run = make(kk, vv, gqa)
        try:
            run()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - the peer cannot run this shape: a note
            notes.append(f"{name}{' (enable_gqa)' if gqa else ''}: {type(e).__name__}: {str(e)[:140]}")
            continue
        if what:
            notes.append(f"{name}: {what}")
        impls[name] = (run, lambda run=run: run().transpose(1, 2))
        return


def build_impls(B, Hq, Hkv, S, D, causal, notes, bound=True):
    """{name: (run, output getter (B, S, Hq, D))}, inputs allocated once; ``bound``: with our MMA
    bound (a second compiled kernel)."""
    import torch
    from torch.nn.attention import SDPBackend

    torch.manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(B, S, Hq, D, device="cuda", dtype=dt)
    k = torch.randn(B, S, Hkv, D, device="cuda", dtype=dt)
    v = torch.randn(B, S, Hkv, D, device="cuda", dtype=dt)
    impls: dict = {}
    _ours(impls, notes, q, k, v, causal, bound)
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    _sdpa(impls, notes, SDPBackend.CUDNN_ATTENTION, "cudnn_sdpa", qt, kt, vt, causal, Hq, Hkv)
    _sdpa(impls, notes, SDPBackend.FLASH_ATTENTION, "fa2_sdpa", qt, kt, vt, causal, Hq, Hkv)
    fa4, why = None, ""
    for mod in ("flash_attn.cute.interface", "flash_attn.cute"):
        try:
            fa4 = __import__(mod, fromlist=["flash_attn_func"]).flash_attn_func
            break
        except Exception as e:  # noqa: BLE001 - not installed (or broken)
            why = f"{type(e).__name__}: {str(e)[:100]}"
    if fa4 is None:
        notes.append(f"fa4: skipped, flash_attn.cute.interface.flash_attn_func not importable ({why})")
        return impls

    def run_fa4():
        r = fa4(q, k, v, causal=causal)
        return r[0] if isinstance(r, tuple) else r

    try:
        run_fa4()
        torch.cuda.synchronize()
        impls["fa4"] = (run_fa4, run_fa4)
    except Exception as e:  # noqa: BLE001 - the peer cannot run this shape: a note
        notes.append(f"fa4: {type(e).__name__}: {str(e)[:160]}")
    return impls


def precompile(shapes) -> None:
    """Compile the configurations the run needs in parallel processes (disk cache), before timing."""
    import torch

    from ...attention import forward as FW
    from .timing import precompile_and_report

    dims = _supported_head_dims()
    cfgs = [FW.plan(torch.bfloat16, D, causal) for *_, D, causal in shapes if D in dims]
    cfgs += [dataclasses.replace(c, mma_only=True) for c in cfgs]
    if cfgs:
        precompile_and_report(FW.precompile, cfgs)


def run(shapes, repeats: int = 3, quick: bool = False) -> dict:
    """Benchmark ``shapes`` (tuples of :data:`SHAPES`); returns the results document."""
    import torch

    from .ceiling import matmul_same_flops, start_run
    from .progress import Progress
    from .timing import time_rounds

    bench, timer, roofs = start_run("bench attention", quick)
    precompile(shapes)
    rows = []
    with Progress(len(shapes) * repeats * 6, "bench attention") as prog:
        for name, B, Hq, Hkv, S, D, causal in shapes:
            notes: list[str] = []
            impls = build_impls(B, Hq, Hkv, S, D, causal, notes)
            for fn, _ in impls.values():
                fn()
            torch.cuda.synchronize()
            first = next((n for n in impls if n != BOUND), None)
            diffs = {}
            if first is not None:
                base = impls[first][1]().float()
                diffs = {n: (get().float() - base).abs().max().item() for n, (_, get) in impls.items() if n != BOUND}
                del base
            fl, nb = flops_bytes(B, Hq, Hkv, S, D, causal)
            mm_fn, mm_flops = matmul_same_flops(fl)
            todo = {n: fn for n, (fn, _) in impls.items()}
            todo[MATMUL] = mm_fn
            times = time_rounds(todo, bench, repeats, tick=lambda n, s=name: prog.step(f"{s} {n}"))
            row = {"shape": name, "params": {"B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "causal": causal},
                   "flops": fl, "bytes": nb, "bound": "compute", "reference": first, "impls": {}, "notes": notes,
                   "ceiling": BOUND if BOUND in times else MATMUL}
            for n, ts in times.items():
                if n == MATMUL:  # scaled to the attention's FLOPs; its rate is the matmul's own
                    scale = fl / mm_flops
                    row["impls"][n] = results.impl_entry("ceiling", [t * scale for t in ts], fl, nb,
                                                         matmul_n=round((mm_flops / 2) ** (1 / 3)))
                    continue
                role = "ours" if n == OURS else "ceiling" if n == BOUND else "peer"
                e = results.impl_entry(role, ts, fl, nb)
                if n != BOUND:
                    e["max_abs_diff_vs_ref"] = diffs.get(n)
                    e["mismatch"] = (diffs.get(n) or 0.0) > MISMATCH_ATOL
                row["impls"][n] = e
            rows.append(row)
            line = "  ".join(f"{n}={v['median_us']:.0f}us/{v['tflops']:.0f}TF{'!' if v.get('mismatch') else ''}"
                             for n, v in row["impls"].items())
            prog.note(f"{name:32s} {line}")
            for nt in notes:
                prog.note(f"    note: {nt}")
            del impls, todo, mm_fn
            torch.cuda.empty_cache()
    doc = results.document("attention", results.run_meta(timer, repeats, quick=quick), rows, roofs)
    doc["summary"]["mismatches"] = [f"{r['shape']}:{n}" for r in doc["rows"] for n, v in r["impls"].items()
                                    if v.get("mismatch")]
    return doc


def build_parser(prog: str = "cute-kernels bench attention") -> argparse.ArgumentParser:
    ap = OneLineParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"two small shapes ({', '.join(s[0] for s in QUICK)}), one round, short do_bench")
    ap.add_argument("--repeats", type=int_in(1), default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--shapes", default="",
                    help="comma-separated b<B>_h<H>_s<S>_d<D>_(full|causal) or b<B>_hq<Hq>_hkv<Hkv>_s<S>_d<D>_..."
                         " (default: the issue shapes)")
    ap.add_argument("--only", default="", help="substring filter on shape names")
    ap.add_argument("--tag", default="", help="suffix of the file names after the kind")
    ap.add_argument("--out", "--out-dir", dest="out", default=os.path.join("profiles", "results"),
                    help="folder for the JSON and markdown (default profiles/results)")
    ap.add_argument("--backward", action="store_true",
                    help="benchmark the backward (dq, dk, dv) instead: see --backward --help")
    return ap


def main(argv: list[str] | None = None, prog: str = "cute-kernels bench attention") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--backward" in argv and "--varlen" in argv:  # the packed backward benchmark, its own options
        from . import attention_backward_varlen

        return attention_backward_varlen.main([a for a in argv if a not in ("--backward", "--varlen")],
                                              prog=f"{prog} --backward --varlen")
    if "--backward" in argv:  # the backward benchmark, its own options
        from . import attention_backward

        return attention_backward.main([a for a in argv if a != "--backward"], prog=f"{prog} --backward")
    ap = build_parser(prog)
    args = ap.parse_args(argv)
    try:
        shapes = select(args.shapes, args.only, args.quick)
    except ValueError as e:
        ap.error(str(e))
    if not shapes:
        ap.error(f"--only {args.only!r} matches no shape")
    if results.cuda_missing(prog):
        return 2
    doc = run(shapes, 1 if args.quick else args.repeats, args.quick)
    return results.publish(doc, args.out, args.tag or ("quick" if args.quick else ""))
