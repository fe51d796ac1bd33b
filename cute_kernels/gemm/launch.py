"""Compiled GEMM kernels and how a plan calls them: the fake-argument builder every compile goes
through, the compile-cache getters, and the launchers that add a workspace or transpose operands."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from ..common import jit
from ..common.dtypes import to_cutlass
from .cpasync_kernel import GemmSm90CpAsync
from .kernel import GemmConfig, GemmSm90, GemmSm90SplitK
from .splitk_kernel import GemmSm90SplitKCluster, GemmSm90SplitKFixup, SplitKClusterConfig, SplitKFixupConfig


def fake_args(cfg, ab_dtype: str, d_dtype: str, c_dtype: str):
    """(kernel, fake arguments) for any GEMM kernel config: fake tensors with the real ones' static facts
    (rank, unit stride, divisibility: 16 bytes for TMA, the vector bytes for cp.async, any for C and
    direct-stored D), plus the fp32 workspace and int32 counters of the last-CTA-fixup kernels."""
    M, N, K, L = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()
    t = cfg.tiles
    ab, dt, ct = to_cutlass(ab_dtype), to_cutlass(d_dtype), to_cutlass(c_dtype)
    rank3 = isinstance(cfg, GemmConfig) and cfg.a_rank == 3

    def mat(dtype, rows, cols, major, align):
        """(rows, cols) with unit stride along ``major`` ("row": cols), the other stride a multiple of
        ``align`` bytes (batched: one more such stride in front)."""
        div = align // (dtype.width // 8)
        s = cute.sym_int(divisibility=div)
        stride = (s, 1) if major == "row" else (1, s)
        shape = (rows, cols)
        if rank3:
            shape, stride = (L, *shape), (cute.sym_int(divisibility=div), *stride)
        return make_fake_tensor(dtype, shape, stride, assumed_align=align)

    def any_strides(dtype):
        shape = (L, M, N) if rank3 else (M, N)
        return make_fake_tensor(dtype, shape, tuple(cute.sym_int() for _ in shape), assumed_align=dtype.width // 8)

    a_major = "row" if t.mma.a_major == "k" else "col"
    b_major = "col" if t.mma.b_major == "k" else "row"
    cp = isinstance(cfg, GemmConfig) and cfg.mainloop == "cpasync"
    a = mat(ab, M, K, a_major, cfg.vec_a if cp else 16)
    b = mat(ab, K, N, b_major, cfg.vec_b if cp else 16)
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)  # torch's current stream at call time
    scalars = (cutlass.Float32(1.0), cutlass.Float32(0.0), stream)

    def workspace():
        return (make_fake_tensor(cutlass.Float32, (cute.sym_int(),), (1,), assumed_align=16),
                make_fake_tensor(cutlass.Int32, (cute.sym_int(),), (1,), assumed_align=4))

    if isinstance(cfg, (SplitKClusterConfig, SplitKFixupConfig)):
        d = mat(dt, M, N, "row", 16) if getattr(cfg, "vec_store", False) else any_strides(dt)
        c = any_strides(ct)
        if isinstance(cfg, SplitKFixupConfig):
            return GemmSm90SplitKFixup(cfg), (a, b, d, c, *workspace(), *scalars)
        return GemmSm90SplitKCluster(cfg), (a, b, d, c, *scalars)
    d_major = "row" if t.c_major == "n" else "col"
    d = mat(dt, M, N, d_major, 16 if cfg.tma_store else dt.width // 8)
    c = any_strides(ct) if cfg.has_c else mat(dt, M, N, d_major, dt.width // 8)
    if cp:
        return GemmSm90CpAsync(cfg), (a, b, d, c, *scalars)
    if cfg.splits > 1:
        return GemmSm90SplitK(cfg), (a, b, d, c, *workspace(), *scalars)
    return GemmSm90(cfg), (a, b, d, c, *scalars)


#: compile-cache family (the kernel's name in ``explain``) of each config type
FAMILY = {GemmConfig: "gemm_sm90", SplitKClusterConfig: "gemm_sm90_splitk_cluster",
          SplitKFixupConfig: "gemm_sm90_splitk_fixup"}


def compiled(cfg, ab_dtype: str, d_dtype: str, c_dtype: str):
    """The compiled kernel for ``cfg`` (memory / disk cache, else compile): a TVM-FFI function taking
    torch tensors, ``fn(a, b, d, c[, ws, cnt], alpha, beta)``."""
    return jit.get_compiled(FAMILY[type(cfg)], (cfg, ab_dtype, d_dtype, c_dtype),
                            lambda: fake_args(cfg, ab_dtype, d_dtype, c_dtype))


class WorkspaceLauncher:
    """Calls a last-CTA-fixup kernel like the others, adding its workspace (fp32 partials + int32
    counters), cached per (device, stream): the kernel leaves the counters at 0 and launches on one
    stream are ordered.  During CUDA-graph capture a fresh pair is allocated (zeroing captured)."""

    def __init__(self, fn, ws_numel: int, n_counters: int):
        self.fn, self.ws_numel, self.n_counters, self.cache = fn, ws_numel, n_counters, {}

    def workspace(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.cuda.is_current_stream_capturing():
            return (torch.empty(self.ws_numel, dtype=torch.float32, device=device),
                    torch.zeros(self.n_counters, dtype=torch.int32, device=device))
        key = (device, torch.cuda.current_stream(device).cuda_stream)
        buf = self.cache.get(key)
        if buf is None:
            buf = self.cache[key] = (torch.empty(self.ws_numel, dtype=torch.float32, device=device),
                                     torch.zeros(self.n_counters, dtype=torch.int32, device=device))
        return buf

    def __call__(self, a, b, d, c, alpha, beta):
        ws, cnt = self.workspace(a.device)
        self.fn(a, b, d, c, ws, cnt, alpha, beta)


class SwappedLauncher:
    """Calls a kernel compiled for the transposed problem: (a, b, d, c) -> (b^T, a^T, d^T, c^T), all views."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, a, b, d, c, alpha, beta):
        self.fn(b.mT, a.mT, d.mT, c.mT, alpha, beta)
