"""Attention backward benchmark (issue 32): ``flash_attn``'s gradients vs cuDNN SDPA, FlashAttention-2
SDPA (torch's flash backend) and FlashAttention-4 (``flash_attn.cute``), one process, one timer.

Each side's timed call is ``torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)``, ``out``
from one untimed forward of that side on inputs with ``requires_grad=True``: ours
``cute_kernels.flash_attn(q, k, v, causal=...)``; FA4 ``flash_attn.cute.flash_attn_func`` (its
``(out, lse)`` -> out); cuDNN and FA2 ``scaled_dot_product_attention`` under ``sdpa_kernel(backend)``
on contiguous (B, H, S, D) copies, ``dout`` given the strides of that side's output, GQA with
``enable_gqa=True`` where the backend takes it, else K/V heads expanded inside the graph (then the
timed backward also sums dK / dV over the copies; noted).  So every side pays what a training step
pays: its launches, its buffers (zeroed accumulators included), its pre- and post-passes.

Timing as ``cute-kernels bench attention``: ``triton.testing.do_bench`` median, L2 flushed before
every call; ``--repeats`` interleaved rounds (every side once per round, the order rotated); every
ratio is taken within the run.  Shapes: the forward bench's (:data:`.attention_shapes.SHAPES`).

FLOPs: 2.5x the forward's (:func:`.attention_shapes.flops_bytes`: 4 * B * Hq * Sq * Sk * D, halved for causal
square problems) -- the five GEMMs of the backward (S = Q K^T again, dP = dO V^T, dV += P^T dO,
dQ += dS K, dK += dS^T Q) against the forward's two.  Bytes: q, k, v, out, dout read once, dq, dk,
dv written once (bf16).

``mma_bound`` beside each shape: our backward's main kernel compiled with ``mma_only=True``
(``FlashBwdConfig.mma_only``: the same tiles, loads and five GEMMs, the elementwise work compiled
out), timed alone on buffers prepared once (the pre-pass and the post-passes not run): what
the elementwise work's overlap can at best reach.  A configuration without the field: a note.

Correctness, once before timing: each side's dq, dk, dv against cuDNN's (else the first peer that
ran); a row is flagged when, for any of the three, max |diff| > ``GRAD_RTOL`` x max |reference|.
Our backward runs head dims :data:`layouts.attention_backward.BWD_HEAD_DIMS`; another skips ours and
``mma_bound`` with a note, the peers still timed.  Peers that are not installed: a note.

The target (issue 32): a geomean of at least 1.0x cuDNN over the shapes, none below 0.9x
(``summary``: ``geomean_vs_cudnn_sdpa``, ``min_vs_cudnn_sdpa``, ``cudnn_target_met``).

    cute-kernels bench attention --backward [--quick] [--shapes NAMES] [--only SUBSTR] [--repeats N]
                                            [--tag T] [--out DIR]

``--varlen``: the packed (variable-length) backward instead, ours vs FlashAttention-4's varlen backward
(issue 33; :mod:`.attention_backward_varlen`, its own options: ``--backward --varlen --help``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from ..args import OneLineParser, int_in
from . import results
from .attention_shapes import QUICK, SHAPES, parse_shape, select  # noqa: F401 - the forward bench's shapes
from .attention_shapes import flops_bytes as forward_flops_bytes

KIND = "attention-backward"
OURS, BOUND = "cute", "mma_bound"
PEERS = ("cudnn_sdpa", "fa2_sdpa", "fa4")
REFERENCE = "cudnn_sdpa"
#: FLOPs of the backward over the forward's: five GEMMs of the same size against two
FLOP_FACTOR = 2.5
#: a side's dq / dk / dv is flagged when max |diff| against the reference's exceeds this fraction of
#: the reference's max |value|.  bf16 gradients of randn inputs (scale 1/sqrt(D)): two honest
#: implementations (fp32 accumulation; P and dS rounded to bf16 before their GEMMs, or a bf16 math
#: path) differ by at most ~1% of that max (CPU emulations at S 1024-2048, D 64/96/128, causal and
#: full: 0.25-0.9%; a correctly rounded float64 result itself is up to 0.33% off), while one KV tile
#: of 128 keys dropped from every row moves a gradient by 7.6-74% of it: 3% separates the two.
GRAD_RTOL = 3e-2
CUDNN_TARGET = (1.0, 0.9)  # (geomean at least, no shape below)
GRADS = ("dq", "dk", "dv")


def flops_bytes(B, Hq, Hkv, S, D, causal) -> tuple[float, float]:
    """The backward's FLOPs (2.5x the forward's unmasked ones); bf16 bytes of q, k, v, out, dout read
    once and dq, dk, dv written once."""
    f, _ = forward_flops_bytes(B, Hq, Hkv, S, D, causal)
    return FLOP_FACTOR * f, 2.0 * B * S * D * (4 * Hq + 4 * Hkv)


def bound_supported() -> bool:
    """Whether ``FlashBwdConfig`` has the ``mma_only`` field (the MMA bound's configuration)."""
    from ...attention import backward_kernel as bk

    return "mma_only" in {f.name for f in dataclasses.fields(bk.FlashBwdConfig)}


def _grad_of(out, inputs, dout, view=None):
    """(run, grads getter in (B, S, H, D)): ``run`` is the timed ``autograd.grad`` call; ``view`` maps
    each gradient to (B, S, H, D) for the comparison."""
    import torch

    def run():
        return torch.autograd.grad(out, inputs, dout, retain_graph=True)

    def grads():
        return tuple(run()) if view is None else tuple(view(g) for g in run())

    return run, grads


def _first_grad(impls, notes, name, run, grads, errors=(Exception,)) -> bool:
    """Run one side's backward once (compile, check it runs); a failure becomes a note."""
    import torch

    try:
        run()
        torch.cuda.synchronize()
    except errors as e:
        notes.append(f"{name}: backward: {type(e).__name__}: {str(e)[:140]}")
        return False
    impls[name] = (run, grads)
    return True


def _ours(impls, notes, q, k, v, dout, causal):
    """Ours and its MMA bound into ``impls``; a head dim the forward or backward rejects (ValueError):
    a note instead."""
    import cute_kernels

    try:
        out = cute_kernels.flash_attn(q, k, v, causal=causal)
        run, grads = _grad_of(out, (q, k, v), dout)
        _first_grad(impls, [], OURS, run, grads, errors=())
    except ValueError as e:
        notes.append(f"{OURS} and {BOUND}: skipped, flash_attn rejects the shape ({str(e)[:140]})")
        return
    try:  # the MMA bound: the main kernel with the elementwise work compiled out, its buffers prepared once
        if bound_supported():  # else: the document's note
            impls[BOUND] = (_bound(q, k, v, out.detach(), dout, causal), None)
    except Exception as e:  # noqa: BLE001 - the bound is a measurement aid: a note, the row still runs
        notes.append(f"{BOUND}: {type(e).__name__}: {str(e)[:140]}")


def _bound(q, k, v, out, dout, causal):
    """The main kernel of ``mma_only=True`` called as :func:`flash_attn_backward` calls it, on lse2 /
    delta / dq_acc / dk_acc / dv_acc buffers prepared once (the pre-pass run once, untimed)."""
    if not bound_supported():
        raise RuntimeError("FlashBwdConfig has no mma_only field in this version: no MMA bound")
    return main_kernel_call(q, k, v, out, dout, causal, lambda cfg: dataclasses.replace(cfg, mma_only=True))[0]


def main_kernel_call(q, k, v, out, dout, causal, variant=None):
    """``(run, buffers)``: the backward's main kernel alone, as :func:`flash_attn_backward` calls it,
    on lse2 / delta / dq_acc / dk / dv buffers prepared once (the pre-pass run once, untimed);
    ``variant(cfg) -> cfg`` changes the planned configuration (the MMA bound, an A/B candidate).
    ``buffers``: ``(dq_acc, dk, dv)`` the kernel writes (dk, dv fp32 accumulators with GQA)."""
    import math

    import torch

    from layouts import attention_backward as LB

    from ...attention import backward as BW
    from ...attention import forward as FW
    from ...common.softmax import LOG2_E

    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    q_, k_, v_ = (t.detach() for t in (q, k, v))
    gqa = Hq != Hkv
    main_cfg, pre_cfg, *_ = BW.bwd_plan(q.dtype, D, causal, gqa=gqa)
    main = BW._get_any(main_cfg if variant is None else variant(main_cfg))
    pre = BW._get_any(pre_cfg)
    with torch.no_grad():
        _, lse = FW.flash_attn(q_, k_, v_, causal=causal, return_lse=True)
    Sp = (S + LB.BWD_ROW_PAD - 1) // LB.BWD_ROW_PAD * LB.BWD_ROW_PAD
    f32 = dict(dtype=torch.float32, device=q.device)
    lse2, delta = torch.empty(B, Hq, Sp, **f32), torch.empty(B, Hq, Sp, **f32)
    dq_acc = torch.empty(B, Hq, Sp, D, **f32)
    if gqa:  # fp32 accumulators (as flash_attn_backward zeroes them per call: not timed here)
        dk_acc, dv_acc = torch.zeros(B, S, Hkv, D, **f32), torch.zeros(B, S, Hkv, D, **f32)
    else:  # the kernel stores dk, dv in the input dtype
        dk_acc, dv_acc = torch.empty_like(k_), torch.empty_like(v_)
    pre(out, dout, lse, lse, lse2, delta, dq_acc)
    scale2 = LOG2_E / math.sqrt(D)

    def run():
        main(q_, k_, v_, dout, lse2, delta, dq_acc, dk_acc, dv_acc, scale2)

    run()
    torch.cuda.synchronize()
    return run, (dq_acc, dk_acc, dv_acc)


def _sdpa(impls, notes, backend, name, q, k, v, dout, causal, Hq, Hkv):
    """One SDPA backend's side on contiguous (B, H, S, D) leaf copies of q, k, v."""
    import torch
    from torch.nn.attention import sdpa_kernel

    F = torch.nn.functional.scaled_dot_product_attention
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    variants = [(Hq != Hkv, "")]
    if Hq != Hkv:
        variants.append((False, "K/V heads expanded in the graph (reads Hq/Hkv x more K/V; the backward also "
                                "sums dK/dV over the copies)"))
    for gqa, what in variants:
        try:
            with sdpa_kernel(backend):
                kk, vv = (kt, vt) if gqa or Hq == Hkv else (t.repeat_interleave(Hq // Hkv, 1) for t in (kt, vt))
                out = F(qt, kk, vv, is_causal=causal, enable_gqa=gqa)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - the peer cannot run this shape: a note
            notes.append(f"{name}{' (enable_gqa)' if gqa else ''}: {type(e).__name__}: {str(e)[:140]}")
            continue
        g = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device)
        g.copy_(dout.transpose(1, 2))  # the output's own layout: no copy in the peer's backward
        run, grads = _grad_of(out, (qt, kt, vt), g, view=lambda t: t.transpose(1, 2))
        if _first_grad(impls, notes, name, run, grads):
            if what:
                notes.append(f"{name}: {what}")
            return


def _fa4(impls, notes, q, k, v, dout, causal):
    import torch

    fa4, why = None, ""
    for mod in ("flash_attn.cute.interface", "flash_attn.cute"):
        try:
            fa4 = __import__(mod, fromlist=["flash_attn_func"]).flash_attn_func
            break
        except Exception as e:  # noqa: BLE001 - not installed (or broken)
            why = f"{type(e).__name__}: {str(e)[:100]}"
    if fa4 is None:
        notes.append(f"fa4: skipped, flash_attn.cute.interface.flash_attn_func not importable ({why})")
        return
    try:
        r = fa4(q, k, v, causal=causal)
        out = r[0] if isinstance(r, tuple) else r
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - the peer cannot run this shape: a note
        notes.append(f"fa4: {type(e).__name__}: {str(e)[:160]}")
        return
    _first_grad(impls, notes, "fa4", *_grad_of(out, (q, k, v), dout))


def build_impls(B, Hq, Hkv, S, D, causal, notes):
    """{name: (run, grads getter -> (dq, dk, dv) in (B, S, H, D), or None for the bound)}: inputs
    allocated and every forward run once, untimed."""
    import torch
    from torch.nn.attention import SDPBackend

    torch.manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(B, S, Hq, D, device="cuda", dtype=dt, requires_grad=True)
    k = torch.randn(B, S, Hkv, D, device="cuda", dtype=dt, requires_grad=True)
    v = torch.randn(B, S, Hkv, D, device="cuda", dtype=dt, requires_grad=True)
    dout = torch.randn(B, S, Hq, D, device="cuda", dtype=dt)
    impls: dict = {}
    _ours(impls, notes, q, k, v, dout, causal)
    _sdpa(impls, notes, SDPBackend.CUDNN_ATTENTION, "cudnn_sdpa", q, k, v, dout, causal, Hq, Hkv)
    _sdpa(impls, notes, SDPBackend.FLASH_ATTENTION, "fa2_sdpa", q, k, v, dout, causal, Hq, Hkv)
    _fa4(impls, notes, q, k, v, dout, causal)
    return impls


def compare(impls) -> tuple[str | None, dict]:
    """(reference, {name: {"dq": rel, ...}}): each side's max |diff| per gradient over the reference's
    max |value|, the reference cuDNN's (else the first peer that ran)."""
    ref = REFERENCE if REFERENCE in impls else next((n for n in impls if n not in (OURS, BOUND)), None)
    if ref is None:
        return None, {}
    base = [g.float() for g in impls[ref][1]()]
    scale = [b.abs().max().item() for b in base]
    out = {}
    for n, (_, grads) in impls.items():
        if n in (ref, BOUND):
            continue
        out[n] = {g: (x.float() - b).abs().max().item() / max(s, 1e-30)
                  for g, x, b, s in zip(GRADS, grads(), base, scale)}
    return ref, out


def make_row(name, B, Hq, Hkv, S, D, causal, times, reference, diffs, notes) -> dict:
    """One results row from the per-round times (microseconds) and the gradient comparison."""
    fl, nb = flops_bytes(B, Hq, Hkv, S, D, causal)
    row = {"shape": name, "params": {"B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "causal": causal},
           "direction": "backward", "flops": fl, "bytes": nb, "bound": "compute", "reference": reference,
           "impls": {}, "notes": notes, "ceiling": BOUND if BOUND in times else None}
    for n, ts in times.items():
        role = "ours" if n == OURS else "ceiling" if n == BOUND else "peer"
        e = results.impl_entry(role, ts, fl, nb)
        if n in diffs:
            rel = diffs[n]
            e["rel_diff_vs_ref"] = rel
            e["max_rel_diff_vs_ref"] = max(rel.values())
            e["mismatch"] = not all(x <= GRAD_RTOL for x in rel.values())  # NaN: a mismatch too
        row["impls"][n] = e
    return row


def cudnn_summary(rows) -> dict:
    """Our ratio to cuDNN: its geomean, its minimum, and whether the issue's target is met."""
    xs = [r["ratio_vs"][REFERENCE] for r in rows if REFERENCE in r.get("ratio_vs", {})]
    if not xs:
        return {"cudnn_target_met": None}
    g = results.geomean(xs)
    return {"min_vs_cudnn_sdpa": min(xs), "cudnn_shapes": len(xs),
            "cudnn_target_met": bool(g and g >= CUDNN_TARGET[0] and min(xs) >= CUDNN_TARGET[1])}


def document(meta, rows, roofs=None, notes=None) -> dict:
    doc = results.document(KIND, meta, rows, roofs, notes, direction="backward")
    doc["summary"].update(cudnn_summary(doc["rows"]))
    doc["summary"]["mismatches"] = [f"{r['shape']}:{n}" for r in doc["rows"] for n, v in r["impls"].items()
                                    if v.get("mismatch")]
    return doc


def markdown(doc: dict) -> str:
    """The shared table, then our ratio to cuDNN per shape against the issue's target and the
    gradient check."""
    md = results.markdown(doc).rstrip("\n")
    s = doc["summary"]
    lines = ["", f"Ours vs cuDNN SDPA (cuDNN's time / ours; target: geomean >= {CUDNN_TARGET[0]:.1f}x, "
                 f"none below {CUDNN_TARGET[1]:.1f}x):", "",
             "| shape | x cudnn_sdpa | gradients vs reference (max abs diff / max abs ref, per dq dk dv) |",
             "|---|---|---|"]
    for r in doc["rows"]:
        x = r.get("ratio_vs", {}).get(REFERENCE)
        checks = "; ".join(f"{n} " + " ".join(f"{v:.4f}" for v in e["rel_diff_vs_ref"].values())
                           + (" MISMATCH" if e.get("mismatch") else "")
                           for n, e in r["impls"].items() if e.get("rel_diff_vs_ref"))
        ratio = "-" if x is None else f"{x:.2f}x"
        ref = f" (ref {r['reference']})" if r.get("reference") else ""
        lines.append(f"| {r['shape']} | {ratio} | {checks or '-'}{ref} |")
    g, lo, met = s.get(f"geomean_vs_{REFERENCE}"), s.get("min_vs_cudnn_sdpa"), s.get("cudnn_target_met")
    lines += ["", "cuDNN: " + ("not timed." if met is None else
                               f"geomean {g:.3f}x, lowest {lo:.3f}x over {s['cudnn_shapes']} shape(s): target "
                               + ("met." if met else "NOT met.")),
              f"Gradients flagged (> {GRAD_RTOL:g} of the reference's max |value|): "
              + (", ".join(s["mismatches"]) or "none") + "."]
    return md + "\n" + "\n".join(lines) + "\n"


def write(doc: dict, out_dir, tag: str = "") -> tuple:
    """JSON + markdown (:func:`markdown`) of a run into ``out_dir``."""
    return results.write(doc, out_dir, tag, to_markdown=markdown)


def precompile(shapes) -> None:
    """Compile the forward and backward configurations the run needs (and the bound's) in parallel
    processes (disk cache), before timing."""
    import torch

    from layouts import attention_backward as LB

    from ...attention import backward as BW
    from ...attention import forward as FW
    from .timing import precompile_and_report

    dims = [(D, causal, Hq != Hkv) for _, _, Hq, Hkv, _, D, causal in shapes if D in LB.BWD_HEAD_DIMS]
    fwd = [FW.plan(torch.bfloat16, D, causal) for D, causal, _ in dims]
    bwd = [c for D, causal, gqa in dims for c in BW.bwd_plan(torch.bfloat16, D, causal, gqa=gqa)]
    if bound_supported():
        bwd += [dataclasses.replace(BW.bwd_plan(torch.bfloat16, D, causal, gqa=gqa)[0], mma_only=True)
                for D, causal, gqa in dims]
    if fwd:
        precompile_and_report(FW.precompile, fwd)
        precompile_and_report(lambda cfgs: BW.precompile([cfgs]), list(dict.fromkeys(bwd)))


def run(shapes, repeats: int = 3, quick: bool = False) -> dict:
    """Benchmark the backward on ``shapes`` (tuples of :data:`SHAPES`); returns the results document."""
    import torch

    from .ceiling import start_run
    from .progress import Progress
    from .timing import time_rounds

    bench, timer, roofs = start_run("bench attention --backward", quick)
    precompile(shapes)
    rows, doc_notes = [], []
    try:
        if not bound_supported():
            doc_notes.append(f"{BOUND}: skipped, FlashBwdConfig has no mma_only field in this version")
    except Exception as e:  # noqa: BLE001 - the kernel module cannot load: each row says more
        doc_notes.append(f"{BOUND}: {type(e).__name__}: {str(e)[:140]}")
    with Progress(len(shapes) * repeats * 5, "bench attention --backward") as prog:
        for name, B, Hq, Hkv, S, D, causal in shapes:
            notes: list[str] = []
            impls = build_impls(B, Hq, Hkv, S, D, causal, notes)
            reference, diffs = compare(impls)
            torch.cuda.empty_cache()
            times = time_rounds({n: fn for n, (fn, _) in impls.items()}, bench, repeats,
                                tick=lambda n, s=name: prog.step(f"{s} {n}"))
            row = make_row(name, B, Hq, Hkv, S, D, causal, times, reference, diffs, notes)
            rows.append(row)
            line = "  ".join(f"{n}={v['median_us']:.0f}us/{v['tflops']:.0f}TF{'!' if v.get('mismatch') else ''}"
                             for n, v in row["impls"].items())
            prog.note(f"{name:32s} {line}")
            for nt in notes:
                prog.note(f"    note: {nt}")
            del impls
            torch.cuda.empty_cache()
    return document(results.run_meta(timer, repeats, quick=quick, direction="backward"), rows, roofs, doc_notes)


def build_parser(prog: str = "cute-kernels bench attention --backward") -> argparse.ArgumentParser:
    ap = OneLineParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"two small shapes ({', '.join(s[0] for s in QUICK)}), one round, short do_bench")
    ap.add_argument("--repeats", type=int_in(1), default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--shapes", default="",
                    help="comma-separated b<B>_h<H>_s<S>_d<D>_(full|causal) or b<B>_hq<Hq>_hkv<Hkv>_s<S>_d<D>_..."
                         " (default: the forward bench's shapes)")
    ap.add_argument("--only", default="", help="substring filter on shape names")
    ap.add_argument("--tag", default="", help=f"suffix of the file names after the kind ({KIND})")
    ap.add_argument("--out", "--out-dir", dest="out", default=os.path.join("profiles", "results"),
                    help="folder for the JSON and markdown (default profiles/results)")
    ap.add_argument("--varlen", action="store_true",
                    help="the packed (variable-length) backward vs FA4's varlen backward instead: see --varlen --help")
    return ap


def main(argv: list[str] | None = None, prog: str = "cute-kernels bench attention --backward") -> int:
    ap = build_parser(prog)
    args = ap.parse_args(argv)
    if args.varlen:  # cute-kernels bench attention and profiles/bench_attention.py send it to its own module
        ap.error("--varlen: run it as cute-kernels bench attention --backward --varlen")
    try:
        shapes = select(args.shapes, args.only, args.quick)
    except ValueError as e:
        ap.error(str(e))
    if not shapes:
        ap.error(f"--only {args.only!r} matches no shape")
    if results.cuda_missing(prog):
        return 2
    doc = run(shapes, 1 if args.quick else args.repeats, args.quick)
    return results.publish(doc, args.out, args.tag or ("quick" if args.quick else ""), to_markdown=markdown)

