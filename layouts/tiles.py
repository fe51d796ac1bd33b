"""Typed tile descriptions of every kernel, and the functions that turn them into CuTe objects.

This is the single source of truth for tiling: kernels build their tiled MMAs, shared-memory layouts
and epilogue tiles only through these functions, and the explorer (:mod:`layouts.explore`) draws the
very same objects.  The algebra is the DSL's own (``cute.tile_to_shape``, ``make_tiled_mma``, ...);
nothing here re-implements it.

The descriptions are plain frozen dataclasses (hashable: they are part of compile-cache keys).  The
``make_*`` functions must run inside a DSL context (a ``@cute.jit`` function, host side or kernel).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .target import set_dsl_arch_env

set_dsl_arch_env()

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.tensor_utils import LayoutEnum  # noqa: E402
import cutlass.utils.hopper_helpers as sm90_utils  # noqa: E402
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup  # noqa: E402

#: name -> DSL numeric type, for descriptions that must stay hashable and printable.
DTYPES = {
    "float16": cutlass.Float16,
    "bfloat16": cutlass.BFloat16,
    "float32": cutlass.Float32,
}

WGMMA_M = 64  # one warpgroup's wgmma covers 64 rows
WGMMA_K_16BIT = 16  # K per wgmma instruction for 16-bit operands
THREADS_PER_WARPGROUP = 128
#: Most fp32 accumulators per consumer thread a tile may need (quack's 256 x 208 cooperative and
#: 128 x 208 ping-pong tiles; with setmaxnreg 240 the rest of the kernel gets ~30 registers).
MAX_ACC_REGS_PER_THREAD = 208


def dtype(name: str):
    return DTYPES[name]


def _major_enum(major: str, *, operand: str) -> LayoutEnum:
    """'k' or 'mn' (the operand's contiguous mode) as the DSL's LayoutEnum for A, B or C."""
    if operand == "a":
        return LayoutEnum.ROW_MAJOR if major == "k" else LayoutEnum.COL_MAJOR
    if operand == "b":  # B is viewed (N, K)
        return LayoutEnum.ROW_MAJOR if major == "k" else LayoutEnum.COL_MAJOR
    # C (M, N): 'n' contiguous is row-major
    return LayoutEnum.ROW_MAJOR if major == "n" else LayoutEnum.COL_MAJOR


@dataclass(frozen=True)
class MmaTile:
    """The warpgroup MMA: wgmma atom ``64 x atom_n x 16`` tiled over ``warpgroups_mn`` warpgroups.

    A CTA tile larger than :attr:`tile_mn` repeats the whole tiled MMA over it (CuTe's partition of
    the CTA tile by the tiled MMA): with 2x1 warpgroups and a 256-row CTA tile, warpgroup ``w`` owns
    the 64-row M-blocks at rows ``64 w`` and ``128 + 64 w`` and issues two wgmmas per k-block (as
    quack's 256 x N cooperative tiles do)."""

    ab_dtype: str = "bfloat16"
    acc_dtype: str = "float32"
    atom_n: int = 128  # N of one wgmma instruction (8..256, multiple of 8)
    warpgroups_mn: tuple[int, int] = (2, 1)  # consumer warpgroups along M and N
    a_major: str = "k"  # 'k' or 'mn'
    b_major: str = "k"

    @property
    def tile_mn(self) -> tuple[int, int]:
        return (WGMMA_M * self.warpgroups_mn[0], self.atom_n * self.warpgroups_mn[1])

    @property
    def num_warpgroups(self) -> int:
        return self.warpgroups_mn[0] * self.warpgroups_mn[1]

    @property
    def instruction_shape(self) -> tuple[int, int, int]:
        return (WGMMA_M, self.atom_n, WGMMA_K_16BIT)


@dataclass(frozen=True)
class GemmTiles:
    """Threadblock (CTA) tile, cluster, MMA and pipeline depth of the GEMM."""

    tile_mnk: tuple[int, int, int] = (128, 256, 64)
    cluster_mn: tuple[int, int] = (1, 1)
    mma: MmaTile = field(default_factory=MmaTile)
    ab_stages: int = 4
    epi_tile_mn: tuple[int, int] = (128, 32)  # M must span all consumer warpgroups' rows
    epi_stages: int = 2
    c_dtype: str = "bfloat16"
    c_major: str = "n"
    # Ping-pong consumers: two warpgroups on different output tiles, each running the whole CTA tile
    # with ``mma`` (one warpgroup, warpgroups_mn=(1, 1)), taking turns at the tensor cores so one
    # tile's epilogue overlaps the next tile's mainloop.  Each warpgroup has its own epilogue buffers.
    pingpong: bool = False

    def __post_init__(self):
        m, n, k = self.tile_mnk
        wm, wn = self.mma.tile_mn
        if self.pingpong and (self.mma.warpgroups_mn != (1, 1) or n != wn or m not in (64, 128)):
            raise ValueError(
                f"ping-pong tiles need a one-warpgroup MMA (warpgroups_mn=(1, 1)) spanning the CTA tile's N "
                f"and M of 64 or 128 (got tile {self.tile_mnk}, MMA {self.mma.warpgroups_mn} x {self.mma.tile_mn})"
            )
        if m % wm or n % wn:
            raise ValueError(f"CTA tile {self.tile_mnk} is not a multiple of the MMA tile {self.mma.tile_mn}")
        if self.epi_tile_mn[0] != wm or n % self.epi_tile_mn[1]:
            raise ValueError(
                f"epilogue tile {self.epi_tile_mn} must span the MMA tile's {wm} rows (every consumer "
                f"warpgroup stores its accumulators into it) and divide N={n}"
            )
        if k % WGMMA_K_16BIT:
            raise ValueError(f"CTA tile K={k} must be a multiple of {WGMMA_K_16BIT}")
        if self.acc_regs_per_thread > MAX_ACC_REGS_PER_THREAD:
            raise ValueError(
                f"CTA tile {self.tile_mnk} needs {self.acc_regs_per_thread} fp32 accumulator registers per "
                f"consumer thread (max {MAX_ACC_REGS_PER_THREAD})"
            )

    @property
    def m_blocks_per_warpgroup(self) -> int:
        """64-row wgmma M-blocks each consumer warpgroup computes per k-block (1, or 2 for 256-row
        cooperative and 128-row ping-pong tiles)."""
        return self.tile_mnk[0] // self.mma.tile_mn[0]

    @property
    def acc_regs_per_thread(self) -> int:
        """fp32 accumulators each consumer thread holds for one CTA tile."""
        m, n, _ = self.tile_mnk
        wgs = 1 if self.pingpong else self.mma.num_warpgroups
        return m * n // (wgs * THREADS_PER_WARPGROUP)

    @property
    def num_consumer_warpgroups(self) -> int:
        """Consumer warpgroups of the CTA: the MMA's, or two ping-pong ones."""
        return 2 if self.pingpong else self.mma.num_warpgroups

    @property
    def epi_buffers(self) -> int:
        """Epilogue sub-tile buffers in shared memory: ``epi_stages`` per storing warpgroup."""
        return self.epi_stages * (2 if self.pingpong else 1)

    def smem_bytes(self) -> int:
        """Shared memory for the A/B stages and the epilogue buffers (excluding barriers)."""
        m, n, k = self.tile_mnk
        ab = 2 * (m * k + n * k) * self.ab_stages
        c_bytes = DTYPES[self.c_dtype].width // 8
        return ab + self.epi_tile_mn[0] * self.epi_tile_mn[1] * c_bytes * self.epi_buffers


# ---- builders (call inside a DSL context) -------------------------------------------------------


def make_tiled_mma(mma: MmaTile) -> cute.TiledMma:
    """The consumer warpgroups' tiled wgmma (A and B from shared memory)."""
    a_mode = OperandMajorMode.K if mma.a_major == "k" else OperandMajorMode.MN
    b_mode = OperandMajorMode.K if mma.b_major == "k" else OperandMajorMode.MN
    return sm90_utils.make_trivial_tiled_mma(
        dtype(mma.ab_dtype),
        dtype(mma.ab_dtype),
        a_mode,
        b_mode,
        dtype(mma.acc_dtype),
        (*mma.warpgroups_mn, 1),
        tiler_mn=(WGMMA_M, mma.atom_n),
    )


def make_smem_layout_a(t: GemmTiles, stages: int | None = None):
    """Staged, swizzled (128 B where the major mode allows) shared-memory layout of A tiles."""
    return sm90_utils.make_smem_layout_a(
        _major_enum(t.mma.a_major, operand="a"), t.tile_mnk, dtype(t.mma.ab_dtype),
        t.ab_stages if stages is None else stages,
    )


def make_smem_layout_b(t: GemmTiles, stages: int | None = None):
    return sm90_utils.make_smem_layout_b(
        _major_enum(t.mma.b_major, operand="b"), t.tile_mnk, dtype(t.mma.ab_dtype),
        t.ab_stages if stages is None else stages,
    )


def make_smem_layout_epi(t: GemmTiles, stages: int | None = None):
    """Staged layout of the epilogue's output sub-tile in shared memory (source of the TMA store);
    ``t.epi_buffers`` stages by default (ping-pong: the first ``epi_stages`` belong to consumer 0)."""
    return sm90_utils.make_smem_layout_epi(
        dtype(t.c_dtype), _major_enum(t.c_major, operand="c"), t.epi_tile_mn,
        t.epi_buffers if stages is None else stages,
    )


def c_layout_enum(t: GemmTiles) -> LayoutEnum:
    return _major_enum(t.c_major, operand="c")


def make_smem_layout_atom(kind: str, dtype_name: str):
    """A single swizzle atom by name, e.g. ``'K_SW128'`` (8 rows x 64 bf16, Swizzle<3,4,3>)."""
    return warpgroup.make_smem_layout_atom(getattr(warpgroup.SmemLayoutAtomKind, kind), dtype(dtype_name))
