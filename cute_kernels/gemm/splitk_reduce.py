"""Deterministic split-K reduction: ``out = alpha * sum_s ws[s] + beta * c`` in a fixed order.

Why a kernel of its own: split-K GEMM writes fp32 partial tiles to a workspace ``ws`` (S, M, N); the
sum must not depend on which CTA finished first (no atomics), and doing it with torch ops would cost
3-4 launches of host time on problems that take ~15 us on the GPU.  One thread owns ``VEC`` adjacent
columns of one row and adds the S partials in order; alpha/beta and the output cast are fused.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from ..common import jit

THREADS = 128
VEC = 4  # columns per thread


class SplitKReduce:
    def __init__(self, has_c: bool):
        self.has_c = has_c

    @cute.jit
    def __call__(self, ws: cute.Tensor, out: cute.Tensor, c: cute.Tensor, alpha: cutlass.Float32,
                 beta: cutlass.Float32, stream: cuda.CUstream):
        n = cute.size(out, mode=[1])
        m = cute.size(out, mode=[0])
        grid_x = (n + THREADS * VEC - 1) // (THREADS * VEC)
        self.kernel(ws, out, c, alpha, beta).launch(grid=[grid_x, m, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, ws: cute.Tensor, out: cute.Tensor, c: cute.Tensor, alpha: cutlass.Float32,
               beta: cutlass.Float32):
        tidx, _, _ = cute.arch.thread_idx()
        bx, row, _ = cute.arch.block_idx()
        n = cute.size(out, mode=[1])
        splits = cute.size(ws, mode=[0])
        col0 = (bx * THREADS + tidx) * VEC
        acc = cute.make_rmem_tensor((VEC,), cutlass.Float32)
        acc.fill(0.0)
        for s in range(splits):  # fixed order: bitwise reproducible
            for j in cutlass.range_constexpr(VEC):
                if col0 + j < n:
                    acc[j] = acc[j] + ws[s, row, col0 + j]
        for j in cutlass.range_constexpr(VEC):
            if col0 + j < n:
                v = acc[j] * alpha
                if cutlass.const_expr(self.has_c):
                    v = v + beta * c[row, col0 + j].to(cutlass.Float32)
                out[row, col0 + j] = v.to(out.element_type)


_DT = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}


def compiled_reduce(out_dtype: str, c_dtype: str | None):
    def build():
        S, M, N = cute.sym_int(), cute.sym_int(), cute.sym_int()
        ws = make_fake_tensor(cutlass.Float32, (S, M, N), (cute.sym_int(), cute.sym_int(), 1), assumed_align=16)
        out = make_fake_tensor(_DT[out_dtype], (M, N), (cute.sym_int(), cute.sym_int()))
        cdt = _DT[c_dtype or out_dtype]
        c = make_fake_tensor(cdt, (M, N), (cute.sym_int(), cute.sym_int()))
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        return SplitKReduce(c_dtype is not None), (ws, out, c, cutlass.Float32(1.0), cutlass.Float32(0.0), stream)

    return jit.get_compiled("splitk_reduce", (out_dtype, c_dtype), build)
