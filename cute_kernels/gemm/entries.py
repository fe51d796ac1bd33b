"""The GEMM kernels' host entries for the transposed problem and the fake arguments every compile goes
through (:func:`builder`, :func:`.launch.compiled`'s); DSL code, imported only when a kernel compiles."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from ..common.dtypes import to_cutlass
from .config import GemmConfig, SplitKClusterConfig, SplitKFixupConfig
from .cpasync_kernel import GemmSm90CpAsync
from .kernel import GemmSm90, GemmSm90SplitK
from .splitk_kernel import GemmSm90SplitKCluster, GemmSm90SplitKFixup


def _t(x: cute.Tensor) -> cute.Tensor:
    """The transpose of a rank-2 tensor as a layout view (inside a DSL context)."""
    return cute.make_tensor(x.iterator, cute.select(x.layout, mode=[1, 0]))


class SwappedEntry:
    """Host entry of a split-K kernel compiled for the transposed problem, taking the problem's
    torch-ordered operands: ``(a, b, d, c)`` -> the kernel's ``(b^T, a^T, d^T, c^T)`` as views."""

    def __init__(self, kernel):
        self.kernel = kernel

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor,
                 alpha: cutlass.Float32, beta: cutlass.Float32, stream: cuda.CUstream):
        self.kernel(_t(b), _t(a), _t(d), _t(c), alpha, beta, stream)


class SwappedFixupEntry(SwappedEntry):
    """:class:`SwappedEntry` of the last-CTA-fixup kernel (its workspace and counters pass through)."""

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor, ws: cute.Tensor,
                 cnt: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32, stream: cuda.CUstream):
        self.kernel(_t(b), _t(a), _t(d), _t(c), ws, cnt, alpha, beta, stream)


def fake_args(cfg, ab_dtype: str, d_dtype: str, c_dtype: str, swapped: bool = False):
    """(kernel, fake arguments) for any GEMM kernel config: fake tensors with the real ones' static facts
    (rank, unit stride, divisibility: 16 bytes for TMA, the vector bytes for cp.async, any for C and
    direct-stored D), plus the fp32 workspace and int32 counters of the last-CTA-fixup kernels.
    ``swapped`` (split-K configs, rank 2): the :class:`SwappedEntry` of the kernel, whose arguments
    are the transposes of the kernel's (the problem's a, b, d, c in torch order)."""
    M, N, K, L = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()
    t = cfg.tiles
    ab, dt, ct = to_cutlass(ab_dtype), to_cutlass(d_dtype), to_cutlass(c_dtype)
    rank3 = isinstance(cfg, GemmConfig) and cfg.a_rank == 3
    split = isinstance(cfg, (SplitKClusterConfig, SplitKFixupConfig))
    if swapped and not (split and cfg.a_rank == 2):
        raise ValueError(f"gemm: a swapped entry exists for rank-2 split-K configs only, not {type(cfg).__name__}")

    def make(spec):
        dtype, shape, stride, align = spec
        if swapped:  # the argument is the transpose of the kernel's
            shape, stride = shape[::-1], stride[::-1]
        return make_fake_tensor(dtype, shape, stride, assumed_align=align)

    def mat(dtype, rows, cols, major, align):
        """(rows, cols) with unit stride along ``major`` ("row": cols), the other stride a multiple of
        ``align`` bytes (batched: one more such stride in front)."""
        div = align // (dtype.width // 8)
        s = cute.sym_int(divisibility=div)
        stride = (s, 1) if major == "row" else (1, s)
        shape = (rows, cols)
        if rank3:
            shape, stride = (L, *shape), (cute.sym_int(divisibility=div), *stride)
        return dtype, shape, stride, align

    def any_strides(dtype):
        shape = (L, M, N) if rank3 else (M, N)
        return dtype, shape, tuple(cute.sym_int() for _ in shape), dtype.width // 8

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

    if split:
        d = mat(dt, M, N, "row", 16) if getattr(cfg, "vec_store", False) else any_strides(dt)
        c = any_strides(ct)
        # the swapped entry's arguments in its own order: the problem's a (= kernel b^T), b (= a^T), d, c
        ops = (make(b), make(a), make(d), make(c)) if swapped else (make(a), make(b), make(d), make(c))
        if isinstance(cfg, SplitKFixupConfig):
            k = GemmSm90SplitKFixup(cfg)
            return (SwappedFixupEntry(k) if swapped else k), (*ops, *workspace(), *scalars)
        k = GemmSm90SplitKCluster(cfg)
        return (SwappedEntry(k) if swapped else k), (*ops, *scalars)
    d_major = "row" if t.c_major == "n" else "col"
    d = mat(dt, M, N, d_major, 16 if cfg.tma_store else dt.width // 8)
    c = any_strides(ct) if cfg.has_c else mat(dt, M, N, d_major, dt.width // 8)
    a, b, d, c = make(a), make(b), make(d), make(c)
    if cp:
        return GemmSm90CpAsync(cfg), (a, b, d, c, *scalars)
    if cfg.splits > 1:
        return GemmSm90SplitK(cfg), (a, b, d, c, *workspace(), *scalars)
    return GemmSm90(cfg), (a, b, d, c, *scalars)


def builder(cfg, ab_dtype: str, d_dtype: str, c_dtype: str, swapped: bool = False):
    """:func:`fake_args` as a compile-cache builder."""
    return lambda: fake_args(cfg, ab_dtype, d_dtype, c_dtype, swapped)
