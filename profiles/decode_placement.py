"""Is the b1 L32768 do_bench bimodality a matter of where the KV cache sits in memory?

Why: in session 4 every variant of our decode kernel read either 46-48 us or 70-73 us at b1 hq32
hkv8 L32768 under ``triton.testing.do_bench``, fixed for a whole process, while cuDNN (which reads
its own transposed copies of K/V) was unaffected in the same process.  do_bench's flush writes
256 MB before each call, leaving L2 full of dirty lines that HBM must absorb while the kernel reads
134 MB of K/V.  Hypothesis: how badly those write-backs collide with the K/V reads depends on the
physical placement of K/V (DRAM channel / bank hashing), so the mode is set at allocation.

Test: in one process, allocate ``--copies`` K/V caches at different addresses (padding allocations
in between shift them) and time our kernel and cuDNN on each copy, interleaved over ``--rounds``.
Placement-dependent: the copies split into fast and slow ones within one process, each stable over
rounds.  Process-dependent (clocks, flush buffer placement): all copies move together.  Also prints
a read-only-flush timing per copy (``timing.bench_clean``), which session 3 found free of the effect.

    python3 profiles/decode_placement.py [--copies 6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from cute_kernels.attention import decode as decode_attn
    from timing import bench_clean

    B, Hq, Hkv, L, D = 1, 32, 8, 32768, 128
    gbytes = 2 * B * L * Hkv * D * 2 / 1e9
    torch.manual_seed(0)
    q = torch.randn(B, 1, Hq, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    copies, pads = [], []
    for i in range(args.copies):
        pads.append(torch.empty((i * 7 + 3) << 20, dtype=torch.uint8, device="cuda"))  # shift the next one
        k = torch.randn(B, L, Hkv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, L, Hkv, D, device="cuda", dtype=torch.bfloat16)
        kt, vt = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        copies.append((k, v, kt, vt))
    qt = q.transpose(1, 2).contiguous()
    out = torch.empty_like(q)

    def ours(c):
        return lambda: decode_attn(q, c[0], c[1], cache_seqlens=lens, out=out)

    def cudnn(c):
        def run():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(qt, c[2], c[3], enable_gqa=True)
        return run

    ref = cudnn(copies[0])().transpose(1, 2)
    got = ours(copies[0])()
    err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
    if not err < 2e-2:
        raise RuntimeError(f"ours differs from cuDNN: {err:.3g}")
    times = {}
    for r in range(args.rounds):
        for i, c in enumerate(copies):
            for name, fn in (("ours", ours(c)), ("cudnn", cudnn(c))):
                times.setdefault((i, name), []).append(do_bench(fn, warmup=25, rep=120, return_mode="median") * 1e3)
    print(f"b1 hq32 hkv8 L32768 bf16 ({gbytes * 1e3:.0f} MB of KV), {args.rounds} rounds, do_bench median (us)")
    print("| copy | K ptr (MiB mod 1024) | ours per round | cuDNN per round | ours clean-flush |")
    print("|---|---|---|---|---|")
    for i, c in enumerate(copies):
        clean = bench_clean(ours(c))
        o = " / ".join(f"{t:.1f}" for t in times[(i, 'ours')])
        d = " / ".join(f"{t:.1f}" for t in times[(i, 'cudnn')])
        print(f"| {i} | {(c[0].data_ptr() >> 20) % 1024} | {o} | {d} | {clean:.1f} |")
    med = {i: statistics.median(times[(i, 'ours')]) for i in range(len(copies))}
    print("ours medians:", {i: round(t, 1) for i, t in med.items()})


if __name__ == "__main__":
    main()
