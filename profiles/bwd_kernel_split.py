"""Where a backward call's GPU time goes, kernel by kernel: ours against FlashAttention-4's (issue 33).

Why: the packed backward bench has ours at 0.78x FA4 on ``varlen_b32_logu1-8192`` while the dense GQA
causal shape of the same head dim is at 0.92x, and the main loop's SASS is the same for both (CPU:
424 / 558 instructions per unmasked / masked step, packed or dense).  So the difference is outside
the loop: the pre-pass (Delta, dQ zeroing), the post-passes (dQ, and dK / dV with GQA), the grid's
empty or short CTAs, or the launch gaps.  This runs each side's ``autograd.grad`` under
``torch.profiler`` and prints every kernel's mean time per call, beside the call's wall time
(CUDA events), for the packed cases and the dense shape.

    python3 profiles/bwd_kernel_split.py [--iters 10] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def cases():
    from cute_kernels.tools.bench import attention_varlen_cases as VC

    lens = tuple(VC.log_uniform_lengths(32, 1, 8192, 0))
    many = tuple(VC.log_uniform_lengths(1024, 1, 512, 0))
    return [VC.Case("varlen_b32_logu1-8192_hq32_hkv8_d128_causal", "varlen", lens, lens),
            VC.Case("manyshort_b1024_logu1-512_hq32_hkv8_d128_causal", "varlen", many, many),
            VC.Case("dense_b2_hq32_hkv8_s8192_d128_causal", "dense", (8192,) * 2, (8192,) * 2)]


def forwards(case, inp):
    """{side: forward output} for ours and (when importable) FA4."""
    import cute_kernels
    from cute_kernels.tools.bench.attention_varlen_calls import fa4_functions

    fa4d, fa4v, _ = fa4_functions()
    packed = case.mode == "varlen"
    kw = {"cu_seqlens_q": inp["cu_q"], "cu_seqlens_k": inp["cu_k"], "max_seqlen_q": max(case.lens_q),
          "max_seqlen_k": max(case.lens_k)} if packed else {}
    outs = {"cute": cute_kernels.flash_attn(inp["q"], inp["k"], inp["v"], causal=case.causal, **kw)}
    fn = fa4v if packed else fa4d
    if fn is not None:
        r = fn(inp["q"], inp["k"], inp["v"], causal=case.causal, **kw)
        outs["fa4"] = r[0] if isinstance(r, tuple) else r
    return outs


def split(run, iters: int) -> tuple:
    """(wall us per call by CUDA events, {kernel name: us per call}) of ``run``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        run()
    b.record()
    torch.cuda.synchronize()
    wall = a.elapsed_time(b) * 1e3 / iters
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            run()
        torch.cuda.synchronize()
    per = collections.Counter()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name[:90]] += ev.device_time / iters if hasattr(ev, "device_time") else ev.cuda_time / iters
    return wall, dict(per)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    import torch

    from cute_kernels.tools.bench import attention_varlen_cases as VC

    report = {}
    for case in cases():
        inp = VC.make_inputs(case, "cuda")
        leaves = tuple(inp[n].requires_grad_() for n in ("q", "k", "v"))
        dout = torch.randn_like(inp["q"])
        for side, out in forwards(case, inp).items():
            def run(out=out, leaves=leaves, dout=dout):
                return torch.autograd.grad(out, leaves, dout, retain_graph=True)

            wall, per = split(run, a.iters)
            report[f"{case.name} {side}"] = {"wall_us": wall, "kernels_us": per}
            print(f"{case.name} {side}: {wall:9.1f} us per call (events); kernels, us per call:")
            for name, us in sorted(per.items(), key=lambda kv: -kv[1]):
                if us >= 1.0:
                    print(f"    {us:9.1f}  {name}")
            print(f"    {sum(per.values()):9.1f}  (sum)", flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "bwd-kernel-split.json"), "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
