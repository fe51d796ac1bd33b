"""Split-K sweep: cluster (DSMEM) vs workspace reduction, split counts, on the skinny shapes.

    python3 profiles/sweep_splitk.py        # prints a table; JSON next to it in $OUT or profiles/results
"""
import json
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import cute_kernels  # noqa: E402
from cute_kernels import gemm_host as G  # noqa: E402

rows = []
for m, n, k in [(128, 4096, 4096), (1024, 1024, 32768), (256, 4096, 8192)]:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    fl = 2 * m * n * k
    t_cublas = do_bench(lambda: torch.matmul(a, b), return_mode="median")
    for mode, s in [("none", 1)] + [(md, s) for md in ("cluster", "workspace") for s in (2, 4, 8)]:
        G.SPLITK_MODE, G.FORCE_SPLITS = (mode if mode != "none" else "cluster"), s
        G._plans.clear()
        try:
            out = cute_kernels.gemm(a, b)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            t = do_bench(lambda: cute_kernels.gemm(a, b), return_mode="median")
            r = dict(shape=[m, n, k], mode=mode, splits=s, us=t * 1e3, tflops=fl / t / 1e9, vs_cublas=t_cublas / t, err=err)
        except Exception as e:
            r = dict(shape=[m, n, k], mode=mode, splits=s, error=str(e)[:200])
        rows.append(r)
        print(r, flush=True)
    print(f"{m}x{n}x{k} cuBLAS {fl / t_cublas / 1e9:.0f} TFLOP/s", flush=True)
out = os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "results")
with open(os.path.join(out, "splitk-sweep.json"), "w") as f:
    json.dump(rows, f, indent=1)
