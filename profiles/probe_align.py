"""Is 16384x4400x4096 slow because its 8800-byte rows are not 128-byte aligned?  (GPU, one process)

Why: session 6 run 1 read our default at 0.85x cuBLAS on 16384x4400x4096 (0.77x after a read-only
flush), where 16384x4096x4096 reads 0.99x.  B (K, N) row-major and the (M, N) output both have rows of
N * 2 = 8800 bytes: 16-byte aligned (TMA accepts them) but 3 rows in 4 start inside a 128-byte line, so
each 128-byte TMA box row touches two lines.  This separates the suspects on the same shape:
B stored K-major (rows of K * 2 = 8192 bytes), the output in a buffer padded to 4416 columns (rows of
8832 = 69 * 128 bytes), both, and the aligned neighbours N = 4352 / 4416 as controls.  cuBLAS runs the
same variants.  do_bench median (cold L2), 3 interleaved rounds; TFLOP/s of the problem's own FLOPs.

    python3 profiles/probe_align.py [--shapes 16384x4400x4096,...] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def variants(m, n, k):
    """name -> (a, b, out): the operands of one problem in different storage."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    b_kmaj = b.t().contiguous().t()  # same values, (K, N) view of an (N, K) row-major buffer
    npad = -(-n // 64) * 64  # 128-byte rows
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    out_pad = torch.empty(m, npad, device="cuda", dtype=torch.bfloat16)[:, :n]
    return {"rowB": (a, b, out), "kmajB": (a, b_kmaj, out), "padD": (a, b, out_pad),
            "kmajB+padD": (a, b_kmaj, out_pad)}


def main():
    import triton

    import cute_kernels

    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16384x4352x4096,16384x4400x4096,16384x4416x4096")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    impls = {"cuBLAS": lambda a, b, o: torch.matmul(a, b, out=o),
             "ours": lambda a, b, o: cute_kernels.gemm(a, b, out=o)}
    print(f"# probe_align {torch.cuda.get_device_name()}  commit {os.environ.get('CK_COMMIT', '?')}")
    print("| M x N x K | storage | " + " | ".join(f"{i} TFLOP/s" for i in impls) + " | ours / cuBLAS |")
    print("|---|---|" + "---|" * (len(impls) + 1))
    for s in args.shapes.split(","):
        m, n, k = (int(x) for x in s.split("x"))
        vs = variants(m, n, k)
        ref = None
        times = {(v, i): [] for v in vs for i in impls}
        for v, (a, b, o) in vs.items():  # check + compile outside the rounds
            for name, fn in impls.items():
                fn(a, b, o)
                if ref is None:
                    ref = o.float().clone()
                err = ((o.float() - ref).norm() / ref.norm()).item()
                if not err < 2e-2:
                    raise RuntimeError(f"{s} {v} {name}: rel err {err:.3g}")
        for r in range(args.rounds):
            for v, (a, b, o) in vs.items():
                for name, fn in impls.items():
                    times[(v, name)].append(triton.testing.do_bench(lambda: fn(a, b, o), return_mode="median"))
        for v in vs:
            tf = {i: 2 * m * n * k / statistics.median(times[(v, i)]) / 1e9 for i in impls}
            print(f"| {s} | {v} | " + " | ".join(f"{tf[i]:.0f}" for i in impls)
                  + f" | {tf['ours'] / tf['cuBLAS']:.2f}x |", flush=True)
        del vs, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
