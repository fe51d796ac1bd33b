"""Small GEMM smoke run for compute-sanitizer: python3 profiles/debug_gemm.py M N K [a_major b_major]."""
import sys

import torch

import cute_kernels

m, n, k = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 3 else (256, 256, 128)
am, bm = sys.argv[4:6] if len(sys.argv) > 5 else ("row", "row")
a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
if am == "col":
    a = torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t()
b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
if bm == "col":
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
out = cute_kernels.gemm(a, b)
torch.cuda.synchronize()
ref = a.float() @ b.float()
print(f"{m}x{n}x{k} {am}/{bm}: rel err", ((out.float() - ref).norm() / ref.norm()).item())
