"""One call of each GEMM implementation under Nsight Compute: where does the energy per FLOP go?

Why: at 8192^3 every implementation runs at the board's ~630 W cap, and ours gets the lowest clock
(session 4: ours 1455 MHz, cuBLAS 1522, quack 1590) although it issues the most TFLOP/s per GHz.
Board power counts HBM, L2 and shared-memory traffic and every issued instruction (a spinning
mbarrier wait included), so this script gives ncu one warm call of each implementation to count
them: DRAM bytes, L2 bytes, shared-memory wavefronts, instructions issued, tensor-pipe activity.

    ncu --profile-from-start off --clock-control none --set full -o rep \\
        python3 profiles/ncu_gemm.py [--shape 8192x8192x8192] [--configs 256x128:1x2:8n:swap,...]

Everything is compiled / autotuned and run once before ``cudaProfilerStart``, so ncu sees exactly one
launch per implementation, in the order printed on stdout (``order: ...``).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8192x8192x8192")
    ap.add_argument("--configs", default="256x128:1x2:8m,256x128:1x2:8n:swap")
    args = ap.parse_args()

    from bench_power import gemm_impls

    impls = gemm_impls(args.configs)
    m, n, k = (int(x) for x in args.shape.split("x"))
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    outs = {}
    for name, fn in impls.items():
        fn(a, b)  # compile / autotune outside the profiled range
        outs[name] = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    print("order:", " | ".join(impls), flush=True)
    torch.cuda.profiler.start()
    for name, fn in impls.items():
        outs[name] = fn(a, b)
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    ref = outs["cuBLAS"].float()
    for name, o in outs.items():
        err = ((o.float() - ref).norm() / ref.norm()).item()
        print(f"{name}: relative difference to cuBLAS {err:.2e}")


if __name__ == "__main__":
    main()
