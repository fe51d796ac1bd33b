"""The GEMM kernels' compile-time configurations (the compile-cache keys of :mod:`.kernel`,
:mod:`.splitk_kernel`, :mod:`.cpasync_kernel`) and the pure-Python rules the planner applies to them; no
DSL import here: the host path plans with it on every call (the kernel modules re-export these)."""

from __future__ import annotations

from dataclasses import dataclass

from layouts import tiles as T

from ..common.host import MAX_PARTS, PARTIAL_VEC

#: bytes per global -> shared vector the cp.async mainloop takes (2: through registers)
VEC_BYTES = (16, 8, 4, 2)


@dataclass(frozen=True)
class GemmConfig:
    """Everything a compiled GEMM specializes on (the compile-cache key).  Sizes M/N/K/L are not here."""

    tiles: T.GemmTiles
    a_rank: int = 2  # 2: (M, K); 3: (L, M, K)
    has_c: bool = False  # beta * C epilogue term
    tma_store: bool = True  # D strides 16-byte aligned -> TMA store epilogue
    raster_swizzle: int = 1
    raster_along_m: bool = True
    max_active_clusters: int = 132
    # A/B mainloop: "tma" or "cpasync" (GemmSm90CpAsync, for operands TMA cannot describe), with
    # vec_a / vec_b bytes per global->shared vector (16, 8, 4: cp.async; 2: through registers)
    mainloop: str = "tma"
    vec_a: int = 16
    vec_b: int = 16
    # K slices per output tile inside the persistent schedule (GemmSm90SplitK; 1: no split)
    splits: int = 1
    # Programmatic dependent launch (TMA mainloop): the prologue (barrier init, descriptor prefetch)
    # overlaps the previous kernel on the stream; every thread waits (griddepcontrol.wait) before any
    # global access, and the consumers signal their dependents after their last tile.
    pdl: bool = True
    # Less work between tiles: the first wgmma of a tile overwrites the accumulators (no acc.fill(0))
    # and alpha == 1 skips the multiply (a uniform run-time branch).
    lean_tile: bool = True
    # Deferred epilogue (see the module doc; conditions in epi_defer_ok)
    epi_defer: bool = False
    # Split-K: every contributor of a tile sums and stores a part of it (common.fixup's shared finish)
    # instead of the last one the whole tile; conditions in fixup_parts_ok
    fixup_parts: bool = False


#: accumulators per consumer thread up to which the deferred epilogue's converted copy of a tile
#: (half as many 32-bit registers for 16-bit D) fits next to the next tile's accumulators
EPI_DEFER_MAX_ACC = 128


def epi_defer_ok(cfg: GemmConfig) -> bool:
    """Pure Python: whether ``cfg`` can take the deferred epilogue (see ``GemmConfig.epi_defer``)."""
    t = cfg.tiles
    return (cfg.mainloop == "tma" and cfg.splits == 1 and not cfg.has_c and cfg.tma_store
            and cfg.lean_tile and t.c_dtype in ("float16", "bfloat16") and t.acc_regs_per_thread <= EPI_DEFER_MAX_ACC)


def epi_sub_tiles(t: T.GemmTiles) -> int:
    """Epilogue sub-tiles per CTA tile."""
    return (t.tile_mnk[0] // t.epi_tile_mn[0]) * (t.tile_mnk[1] // t.epi_tile_mn[1])


def fixup_parts_ok(cfg: GemmConfig) -> bool:
    """Pure Python: whether ``cfg`` can take the shared finish (``GemmConfig.fixup_parts``): split-K
    (2 to MAX_PARTS slices), the TMA-stored epilogue (a part is a run of its sub-tiles), and
    sub-tiles of whole 16-byte workspace chunks per thread."""
    t = cfg.tiles
    per_sub = t.epi_tile_mn[0] * t.epi_tile_mn[1] // (128 * t.mma.num_warpgroups)
    return (1 < cfg.splits <= MAX_PARTS and cfg.tma_store and cfg.mainloop == "tma"
            and per_sub % PARTIAL_VEC == 0 and per_sub * epi_sub_tiles(t) == t.acc_regs_per_thread)


@dataclass(frozen=True)
class SplitKClusterConfig:
    tiles: T.GemmTiles  # tile 128 x tile_n x 64, cluster_mn (1, 1): the cluster is along K here
    splits: int = 2  # CTAs per cluster = K slices (1, 2, 4 or 8)
    a_rank: int = 2
    has_c: bool = False
    vec_store: bool = False  # D row-major, rows 16-byte aligned (see module doc)
    b_evict_first: bool = False  # B's TMA loads hinted L2 evict-first (B is read once: skinny M)
    a_evict_first: bool = False  # the same for A (the weight when the host swaps a skinny problem)


def fixup_workspace_numel(m: int, n: int, tile_n: int, splits: int, l: int = 1) -> tuple[int, int]:
    """(fp32 partial elements, int32 counters) the fixup kernel needs for an (L x) M x N output."""
    tiles = -(-m // 128) * -(-n // tile_n) * l
    return tiles * splits * 128 * tile_n, tiles


@dataclass(frozen=True)
class SplitKFixupConfig:
    tiles: T.GemmTiles  # tile 128 x tile_n x 64, no cluster
    splits: int = 4  # CTAs per output tile = K slices (2..8)
    a_rank: int = 2
    has_c: bool = False
    b_evict_first: bool = False  # as SplitKClusterConfig.b_evict_first
    a_evict_first: bool = False  # as SplitKClusterConfig.a_evict_first


def choose_vec_bytes(data_ptr: int, shape, stride, elem_bytes: int, unit_dim: int) -> int:
    """Widest vector (bytes) such that every vector of ``elem_bytes``-sized elements along the unit-stride
    dimension ``unit_dim`` is aligned in global memory and lies entirely inside or entirely outside
    the tensor: the base pointer, every other stride (of a dimension longer than 1; those of size-1
    dimensions are rewritten by the host) and the contiguous extent are multiples of the vector."""
    for w in VEC_BYTES:
        if w < elem_bytes or w % elem_bytes:
            continue
        if data_ptr % w or (shape[unit_dim] * elem_bytes) % w:
            continue
        if any((s * elem_bytes) % w for i, (n, s) in enumerate(zip(shape, stride)) if i != unit_dim and n > 1):
            continue
        return w
    return elem_bytes


def cpasync_tiles(tiles: T.GemmTiles) -> T.GemmTiles:
    """The same tiles with a (1, 1) cluster (this path multicasts nothing)."""
    if tiles.cluster_mn == (1, 1):
        return tiles
    return T.GemmTiles(tile_mnk=tiles.tile_mnk, cluster_mn=(1, 1), mma=tiles.mma, ab_stages=tiles.ab_stages,
                       epi_tile_mn=tiles.epi_tile_mn, epi_stages=tiles.epi_stages, c_dtype=tiles.c_dtype,
                       c_major=tiles.c_major)
