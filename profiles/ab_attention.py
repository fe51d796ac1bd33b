"""A/B of the attention forward's schedule and tile variants on the benchmark shapes, one process.

Each variant is a :class:`layouts.attention.FwdTile` (overlap / ping-pong / tile shape / stages) built
into its own compiled kernel; every variant of a shape and the peers (cuDNN SDPA, FlashAttention-4)
are timed by the same ``triton.testing.do_bench`` (cold L2, median), in interleaved rounds with the
order rotated per round.  Each variant's output is compared with cuDNN's (max |diff|) before timing.

    python3 profiles/ab_attention.py [--rounds 3] [--only d128] [--shapes NAME,...] [--out results.json] [--softcap 30]

``--shapes``: shape names instead of the bench's set (``b3_hq24_hkv8_s5000_d96_full``: issue 36's D 96 row).

Variants per head dim are in :data:`VARIANTS`; ``default`` is what ``flash_attn`` runs.  ``--softcap S``
(issue 34: softcapping costs the forward 11-39%, MUFU-bound): the softcap configuration (``default``)
and :data:`SOFTCAP_VARIANTS` (a share of its exp2s by polynomial on the FMA pipes), each output compared
with ``default``'s, beside the plain kernel (``plain``), the peers without softcapping, and the bounds:
``mma_only`` (plain's tensor-core work alone) and ``softmax_only`` / ``plain_softmax_only`` (each
configuration's softmax, softcapping included, with no wgmma: ``FlashFwdConfig.softmax_only``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cute_kernels.attention import forward as FW  # noqa: E402
from cute_kernels.tools.bench.attention import flops_bytes, select  # noqa: E402

DTYPE = torch.bfloat16

#: name -> FwdTile field overrides on top of the default tile of the head dim
VARIANTS = {
    64: {"default": {}, "psmem": dict(p_smem=True), "mma_only": "mma_only", "prefetch": dict(prefetch_tile=True)},
    # P through shared memory (p_smem): three 64-row warpgroups at D = 96 (FlashAttention-3 / -4's 192 x
    # 128 / 144 tiles there), and what the shared-memory P alone costs on the 128-row tile
    96: {"default": {}, "m192_psmem": dict(tile_m=192, p_smem=True),
         "m192_n144_psmem": dict(tile_m=192, tile_n=144, p_smem=True, persistent=False, dynamic=False),
         "psmem": dict(p_smem=True), "prefetch": dict(prefetch_tile=True)},
    128: {"default": {}, "hw_sched": dict(persistent=False, dynamic=False), "dynamic": dict(dynamic=True),
          "mma_only": "mma_only",
          # the dynamic schedule's next tile claimed before the current one's loads (causal: dynamic by default)
          "prefetch": dict(prefetch_tile=True), "dynamic_prefetch": dict(dynamic=True, prefetch_tile=True)},
    256: {"default": {}, "mma_only": "mma_only"},
}


#: ``--softcap``: name -> FwdTile overrides on the softcap configuration
SOFTCAP_VARIANTS = {"default": {}, "poly1": dict(exp2_poly_share=1), "poly2": dict(exp2_poly_share=2),
                    "poly4": dict(exp2_poly_share=4),
                    # P in shared memory frees the registers that cut D 64's softcap tile to 112 keys
                    "psmem": dict(p_smem=True), "psmem_n128": dict(p_smem=True, tile_n=128)}


def variant_configs(D, causal, softcap=False):
    if softcap:
        base = FW.plan(DTYPE, D, causal, softcap=True)
        out = {"plain": FW.plan(DTYPE, D, causal)}
        for name, kw in SOFTCAP_VARIANTS.items():
            try:
                out[name] = dataclasses.replace(base, tile=dataclasses.replace(base.tile, **kw))
            except ValueError as e:
                print(f"  skip {name} (D={D}): {e}")
        # the bounds beside them: the tensor cores alone (plain's MMA bound), and each softmax alone (no
        # wgmma: its MUFU / FMA work and the loads), so a softcap time can be read against what bounds it
        out["mma_only"] = dataclasses.replace(out["plain"], mma_only=True)
        out["softmax_only"] = dataclasses.replace(base, softmax_only=True)
        out["plain_softmax_only"] = dataclasses.replace(out["plain"], softmax_only=True)
        return out
    base = FW.plan(DTYPE, D, causal)
    out = {}
    for name, kw in VARIANTS[D].items():
        try:
            if kw == "mma_only":  # the MMA bound: mask and softmax compiled out, same tiles and loads
                out[name] = dataclasses.replace(base, mma_only=True)
            else:
                out[name] = dataclasses.replace(base, tile=dataclasses.replace(base.tile, **kw))
        except ValueError as e:  # a variant that does not fit this head dim
            print(f"  skip {name} (D={D}): {e}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="substring of the shape names to run")
    ap.add_argument("--shapes", default="", help="comma-separated shape names (default: the bench's set)")
    ap.add_argument("--out", default="", help="write the results as JSON here")
    ap.add_argument("--softcap", type=float, default=0.0, help="> 0: the softcap configuration's variants")
    args = ap.parse_args(argv)
    from triton.testing import do_bench

    shapes = select(args.shapes, args.only)
    cfgs = {(D, c): variant_configs(D, c, args.softcap > 0) for _, _, _, _, _, D, c in shapes}
    errors = FW.precompile([cfg for vs in cfgs.values() for cfg in vs.values()], processes=8)
    for e in errors:
        print("precompile:", e)

    fa4 = None
    try:
        from flash_attn.cute.interface import flash_attn_func as fa4
    except Exception as e:  # noqa: BLE001
        print(f"fa4 not importable: {type(e).__name__}: {e}")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    results = []
    for name, B, Hq, Hkv, S, D, causal in shapes:
        torch.manual_seed(0)
        q = torch.randn(B, S, Hq, D, device="cuda", dtype=DTYPE)
        k = torch.randn(B, S, Hkv, D, device="cuda", dtype=DTYPE)
        v = torch.randn(B, S, Hkv, D, device="cuda", dtype=DTYPE)
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        scale_log2 = D ** -0.5 * math.log2(math.e)
        impls, outs = {}, {}
        for vname, cfg in cfgs[(D, causal)].items():
            fn = FW.get_forward_kernel(cfg)
            o, lse = torch.empty_like(q), torch.empty(B, Hq, S, device="cuda", dtype=torch.float32)
            ctr = FW.tile_counter(q.device, cfg.tile.dynamic)
            if cfg.softcap:  # the launcher's convention: softmax scale softcap * log2(e), scores scaled by scale / softcap
                sc = args.softcap
                impls[vname] = (lambda fn=fn, o=o, lse=lse, ctr=ctr, q=q, k=k, v=v, sc=sc:
                                fn(q, k, v, o, lse, ctr, sc * math.log2(math.e), D ** -0.5 / sc))
            else:
                impls[vname] = lambda fn=fn, o=o, lse=lse, ctr=ctr, q=q, k=k, v=v: fn(q, k, v, o, lse, ctr, scale_log2)
            outs[vname] = o

        def cudnn(qt=qt, kt=kt, vt=vt):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                                        enable_gqa=Hq != Hkv)

        impls["cudnn"] = cudnn
        if fa4 is not None:
            impls["fa4"] = lambda q=q, k=k, v=v: fa4(q, k, v, causal=causal)
        ref = cudnn().transpose(1, 2).float()
        diffs = {}
        for vname in outs:
            outs[vname].fill_(float("nan"))
            impls[vname]()
            torch.cuda.synchronize()
        for vname in outs:  # softcap variants against the softcap default (cuDNN has no softcapping)
            cfg = cfgs[(D, causal)][vname]
            if not (cfg.mma_only or cfg.softmax_only):  # a bound's output is not attention
                base = outs["default"].float() if cfg.softcap and vname != "default" else ref
                diffs[vname] = (outs[vname].float() - base).abs().max().item()
        times = {n: [] for n in impls}
        names = list(impls)
        for r in range(args.rounds):
            for n in names[r % len(names):] + names[: r % len(names)]:
                times[n].append(do_bench(impls[n], warmup=25, rep=100))
        fl = flops_bytes(B, Hq, Hkv, S, D, causal)[0]
        row = {"shape": name, "tflops": {}, "max_diff_vs_cudnn": diffs}
        for n, ts in times.items():
            row["tflops"][n] = fl / (statistics.median(ts) * 1e-3) / 1e12
        best_peer = max((row["tflops"][p] for p in ("cudnn", "fa4") if p in row["tflops"]), default=None)
        cells = "  ".join(f"{n} {tf:.0f}" for n, tf in row["tflops"].items())
        ratio = f"default/fa4 {row['tflops']['default'] / row['tflops']['fa4']:.3f}" if "fa4" in row["tflops"] else ""
        print(f"{name}: {cells}  | {ratio}  best peer {best_peer:.0f}  diffs "
              + " ".join(f"{n}={d:.1e}" for n, d in diffs.items()), flush=True)
        tf = row["tflops"]
        if "softmax_only" in tf:  # softcap: its time against plain's, and the best its bounds allow
            # (a time is FLOPs / rate, the same FLOPs for every side: plain / x = rate x / rate plain)
            row["plain_over_softcap"] = tf["default"] / tf["plain"]
            row["plain_over_bound"] = min(tf["mma_only"], tf["softmax_only"]) / tf["plain"]
            print(f"  plain / softcap {row['plain_over_softcap']:.3f}; plain / max(MMA bound, softcap softmax "
                  f"bound) {row['plain_over_bound']:.3f} (the most perfect overlap allows; issue 34's bar 0.95)",
                  flush=True)
        results.append(row)
        del q, k, v, qt, kt, vt, impls, outs, ref
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
