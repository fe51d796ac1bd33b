"""Typed tile descriptions of the GEMM, and the functions that turn them into CuTe objects: kernels
build their tiled MMAs and shared-memory layouts only through these, and :mod:`layouts.explore` draws
the very same objects.  The descriptions are frozen dataclasses (part of compile-cache keys); the
``make_*`` functions run inside a DSL context (a ``@cute.jit`` function, host side or kernel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .target import set_dsl_arch_env

set_dsl_arch_env()

# the DSL, imported at the first read of one of its names (a compile), not with this module
from .lazy import LazyModule  # noqa: E402
cutlass = LazyModule("cutlass")
cute = LazyModule("cutlass.cute")
LayoutEnum = LazyModule("cutlass.tensor_utils", "LayoutEnum")
sm90_utils = LazyModule("cutlass.utils.hopper_helpers")
OperandMajorMode = LazyModule("cutlass.cute.nvgpu", "OperandMajorMode")
warpgroup = LazyModule("cutlass.cute.nvgpu.warpgroup")

#: name -> the DSL numeric type's name, for descriptions that must stay hashable and printable
DTYPE_NAMES = {"float16": "Float16", "bfloat16": "BFloat16", "float32": "Float32"}
#: name -> element bytes (no DSL needed)
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}

WGMMA_M = 64  # one warpgroup's wgmma covers 64 rows
WGMMA_K_16BIT = 16  # K per wgmma instruction for 16-bit operands
THREADS_PER_WARPGROUP = 128
#: Most fp32 accumulators per consumer thread a tile may need (256 x 208 tiles; with setmaxnreg 240
#: the rest of the kernel gets ~30 registers).
MAX_ACC_REGS_PER_THREAD = 208
#: shared memory kept out of every stage budget: the mbarriers and alignment slack
MBARRIER_BYTES_RESERVED = 1024
#: fp32 words of padding per row of the split-K reduction tile: 2-way instead of 8-way bank conflicts
SPLITK_RED_PAD = 8


def dtype(name: str):
    """The DSL numeric type of a dtype name (imports the DSL)."""
    return getattr(cutlass, DTYPE_NAMES[name])


def _major_enum(major: str, *, operand: str) -> LayoutEnum:
    """The operand's contiguous mode as the DSL's LayoutEnum: A (M, K) and B (viewed (N, K)) are
    row-major when 'k' is contiguous, C (M, N) when 'n' is."""
    return LayoutEnum.ROW_MAJOR if major == ("n" if operand == "c" else "k") else LayoutEnum.COL_MAJOR


@dataclass(frozen=True)
class MmaTile:
    """The warpgroup MMA: wgmma atom ``64 x atom_n x 16`` tiled over ``warpgroups_mn`` warpgroups.  A
    larger CTA tile repeats the tiled MMA: with 2x1 warpgroups and 256 rows, warpgroup ``w`` owns the
    64-row M-blocks at rows ``64 w`` and ``128 + 64 w`` (two wgmmas per k-block)."""

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
    # Ping-pong consumers, a removed variant (profiles/NOTES-pingpong.md): always False, kept so that
    # configurations print and hash as before
    pingpong: bool = False

    def __post_init__(self):
        m, n, k = self.tile_mnk
        wm, wn = self.mma.tile_mn
        if self.pingpong:
            raise ValueError("GemmTiles.pingpong: ping-pong consumers are not built (profiles/NOTES-pingpong.md)")
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
        """64-row wgmma M-blocks each consumer warpgroup computes per k-block (2 for 256-row tiles)."""
        return self.tile_mnk[0] // self.mma.tile_mn[0]

    @property
    def acc_regs_per_thread(self) -> int:
        """fp32 accumulators each consumer thread holds for one CTA tile."""
        m, n, _ = self.tile_mnk
        return m * n // (self.mma.num_warpgroups * THREADS_PER_WARPGROUP)

    def smem_bytes(self) -> int:
        """Shared memory for the A/B stages and the epilogue buffers (excluding barriers)."""
        m, n, k = self.tile_mnk
        ab = 2 * (m * k + n * k) * self.ab_stages
        c_bytes = DTYPE_BYTES[self.c_dtype]
        return ab + self.epi_tile_mn[0] * self.epi_tile_mn[1] * c_bytes * self.epi_stages


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
    """Staged layout of the epilogue's output sub-tile in shared memory (source of the TMA store)."""
    return sm90_utils.make_smem_layout_epi(
        dtype(t.c_dtype), _major_enum(t.c_major, operand="c"), t.epi_tile_mn,
        t.epi_stages if stages is None else stages,
    )


def c_layout_enum(t: GemmTiles) -> LayoutEnum:
    return _major_enum(t.c_major, operand="c")


def make_smem_layout_atom(kind: str, dtype_name: str):
    """A single swizzle atom by name, e.g. ``'K_SW128'`` (8 rows x 64 bf16, Swizzle<3,4,3>)."""
    return warpgroup.make_smem_layout_atom(getattr(warpgroup.SmemLayoutAtomKind, kind), dtype(dtype_name))


# ---------------------------------------------------------------- shared-memory budgets (pure Python)
def stage_count(smem_capacity: int, bytes_per_stage: int, fixed_bytes: int, max_stages: int = 8) -> int:
    """How many operand stages fit next to ``fixed_bytes`` (epilogue buffers etc.)."""
    n = (smem_capacity - MBARRIER_BYTES_RESERVED - fixed_bytes) // bytes_per_stage
    if n < 2:
        raise ValueError(
            f"only {n} pipeline stage(s) of {bytes_per_stage} B fit in {smem_capacity} B of shared memory; "
            "use a smaller tile"
        )
    return min(n, max_stages)


def gemm_tiles(tile_n: int, cluster: tuple[int, int], ab: str, a_major: str, b_major: str, c_dtype: str,
               smem_capacity: int, c_major: str = "n", tile_m: int = 128) -> GemmTiles:
    """The persistent GEMM's tile_m x tile_n x 64 CTA tile over two consumer warpgroups, as many operand
    stages as fit in ``smem_capacity`` bytes.

    The epilogue sub-tile spans both warpgroups' rows, 64 columns wide for 16-bit outputs (half the
    epilogue barriers of 32) when that still leaves 4 stages, else gcd(32, tile_n).  ``tile_m = 256``:
    each warpgroup owns two 64-row M-blocks (rows 64w.. and 128 + 64w..)."""
    if tile_m not in (128, 256):
        raise ValueError(f"gemm_tiles: tile_m must be 128 or 256, got {tile_m}")
    c_bytes = 4 if c_dtype == "float32" else 2
    per_stage = (tile_m + tile_n) * 64 * 2
    epi_m, bufs = 128, 2
    epi_n = math.gcd(32, tile_n)
    if c_bytes == 2 and tile_n % 64 == 0 and stage_count(smem_capacity, per_stage, epi_m * 64 * c_bytes * bufs) >= 4:
        epi_n = 64
    stages = stage_count(smem_capacity, per_stage, epi_m * epi_n * c_bytes * bufs)
    mma = MmaTile(ab_dtype=ab, atom_n=tile_n, warpgroups_mn=(2, 1), a_major=a_major, b_major=b_major)
    return GemmTiles(tile_mnk=(tile_m, tile_n, 64), cluster_mn=cluster, mma=mma, ab_stages=stages,
                     epi_tile_mn=(epi_m, epi_n), epi_stages=2, c_dtype=c_dtype, c_major=c_major)


def splitk_stage_bytes(tile_n: int) -> int:
    """One operand stage of the split-K kernels' 128 x tile_n x 64 tile (16-bit A and B)."""
    return (128 + tile_n) * 64 * 2


def splitk_red_bytes(tile_n: int) -> int:
    """The cluster split-K kernel's fp32 reduction tile (padded rows), which reuses the operand stages."""
    return 128 * (tile_n + SPLITK_RED_PAD) * 4


def splitk_tiles(tile_n: int, ab: str, a_major: str, b_major: str, d_dtype: str, smem_capacity: int,
                 a_mcast: int = 1) -> GemmTiles:
    """Tiles of the cluster / fixup split-K kernels: 128 x tile_n x 64, two consumer warpgroups, and as
    many operand stages as fit (no epilogue buffer: the cluster kernel's fp32 reduction tile reuses
    the stages).  Narrow tiles (the swapped skinny GEMM) are pure streaming: up to 12 stages.
    ``a_mcast``: CTAs along N that share each A tile (cluster 1 x a_mcast: the skinny pairs)."""
    stages = stage_count(smem_capacity, splitk_stage_bytes(tile_n), 0, max_stages=12 if tile_n <= 32 else 10)
    mma = MmaTile(ab_dtype=ab, atom_n=tile_n, warpgroups_mn=(2, 1), a_major=a_major, b_major=b_major)
    return GemmTiles(tile_mnk=(128, tile_n, 64), cluster_mn=(1, a_mcast), mma=mma, ab_stages=stages,
                     epi_tile_mn=(128, min(64, tile_n)), epi_stages=1, c_dtype=d_dtype, c_major="n")
