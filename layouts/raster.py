"""The GEMM's persistent tile scheduler on the CPU: which output tile each work id is and which CTA of
a persistent grid runs it (the raster order that decides L2 reuse), read off the DSL's own
``PersistentTileSchedulerParams`` (what the kernels run) in a host-side trace.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .explore import Grid, _physical, _py, _size, _tuples, in_dsl

import cutlass.cute as cute  # noqa: E402  (after explore: it sets the DSL arch first)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def num_tiles(problem_mn: tuple[int, int], tile_mn: tuple[int, int]) -> tuple[int, int]:
    """Output tiles along M and N (partial edge tiles count)."""
    return ceil_div(problem_mn[0], tile_mn[0]), ceil_div(problem_mn[1], tile_mn[1])


@functools.lru_cache(maxsize=256)
def scheduler_cluster_order(
    num_tiles_mn: tuple[int, int],
    cluster_mn: tuple[int, int] = (1, 1),
    swizzle: int = 1,
    raster_along_m: bool = True,
) -> tuple[tuple[int, int], ...]:
    """Cluster coordinate ``(mc, nc)`` of every linear work unit, in the order the GEMM's persistent
    scheduler hands them out (the DSL object the kernels run, not a formula: its details matter for L2).

    With ``swizzle > 1`` the cluster grid across the raster direction is rounded up to whole strips of
    ``swizzle`` (a partial last strip has padding units, computed on zero-filled tiles), each walked
    row by row down the raster direction.  With ``swizzle == 1`` the scheduler decodes the id with
    divmods: column-major along M, row-major along N.
    """
    Mt, Nt = num_tiles_mn
    cm, cn = cluster_mn
    if swizzle < 1 or cm < 1 or cn < 1 or Mt < 1 or Nt < 1:
        raise ValueError("tile counts, swizzle and cluster sizes must be >= 1")
    if swizzle == 1:
        Mc, Nc = ceil_div(Mt, cm), ceil_div(Nt, cn)
        if raster_along_m:
            return tuple((i % Mc, i // Mc) for i in range(Mc * Nc))
        return tuple((i // Nc, i % Nc) for i in range(Mc * Nc))

    def work():
        import warnings

        from cutlass import utils

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            params = utils.PersistentTileSchedulerParams((Mt, Nt, 1), (cm, cn, 1), swizzle, raster_along_m)
        L = params.problem_layout_ncluster_mnl
        shape = _py(cute.shape(L))
        return _size(shape[0]), _physical(L, range(_size(shape)), None)

    rows, ids = in_dsl(work)
    order: list[tuple[int, int] | None] = [None] * len(ids)
    for flat, unit in enumerate(ids):  # domain point (mc, nc) in colexicographic order -> work unit id
        order[unit] = (flat % rows, flat // rows)
    return tuple(order)  # type: ignore[arg-type]


def tile_coord(
    tile_id: int,
    num_tiles_mn: tuple[int, int],
    cluster_mn: tuple[int, int] = (1, 1),
    swizzle: int = 1,
    raster_along_m: bool = True,
) -> tuple[int, int]:
    """Linear work-tile id -> output tile ``(m, n)``, as the GEMM's scheduler assigns it: cluster unit
    ``cid`` (:func:`scheduler_cluster_order`) and the CTA's column-major rank in the cluster, from
    ``cid, rank = divmod(tile_id, cm * cn)``.  Ids past the tile grid (padding) produce no output but
    still run their mainloop.  Consecutive ids sweep a band of ``swizzle`` cluster columns (rows), so
    CTAs running at the same time share A rows and B columns in L2.
    """
    cm, cn = cluster_mn
    order = scheduler_cluster_order(tuple(num_tiles_mn), tuple(cluster_mn), swizzle, raster_along_m)
    if not 0 <= tile_id < len(order) * cm * cn:
        raise ValueError(f"tile id {tile_id} out of range")
    cid, rank = divmod(tile_id, cm * cn)
    mc, nc = order[cid]
    return mc * cm + rank % cm, nc * cn + rank // cm


@dataclass(frozen=True)
class RasterTable:
    """Visit order of a persistent tile scheduler: CTA ``c`` of ``num_ctas`` takes work tiles
    ``c, c + num_ctas, c + 2 num_ctas, ...`` (its wave ``w`` handles id ``c + w * num_ctas``)."""

    num_tiles_mn: tuple[int, int]
    cluster_mn: tuple[int, int]
    swizzle: int
    raster_along_m: bool
    num_ctas: int
    order: tuple[tuple[int, int], ...]  # tile id -> (m, n), padding included
    visit: tuple[tuple[int, ...], ...]  # [m][n] -> tile id

    def in_bounds(self, tile_id: int) -> bool:
        m, n = self.order[tile_id]
        return m < self.num_tiles_mn[0] and n < self.num_tiles_mn[1]

    def cta(self, tile_id: int) -> int:
        return tile_id % self.num_ctas

    def wave(self, tile_id: int) -> int:
        return tile_id // self.num_ctas

    @property
    def num_waves(self) -> int:
        return ceil_div(len(self.order), self.num_ctas)

    def tiles_of_cta(self, cta: int) -> list[tuple[int, int]]:
        return [self.order[i] for i in range(cta, len(self.order), self.num_ctas) if self.in_bounds(i)]

    def grid(self, by: str = "cta") -> Grid:
        """Label = tile id (visit order); colour by ``'cta'``, ``'wave'`` or ``'order'``."""
        key = {"cta": self.cta, "wave": self.wave, "order": lambda i: i}[by]
        n = {"cta": self.num_ctas, "wave": self.num_waves, "order": len(self.order)}[by]
        return Grid(
            title=f"tile order {self.num_tiles_mn[0]}x{self.num_tiles_mn[1]} tiles, {self.num_ctas} CTAs, "
                  f"swizzle {self.swizzle}, along {'M' if self.raster_along_m else 'N'}, cluster "
                  f"{self.cluster_mn[0]}x{self.cluster_mn[1]}",
            labels=_tuples([[str(i) for i in row] for row in self.visit]),
            keys=_tuples([[key(i) for i in row] for row in self.visit]),
            num_keys=n,
            key_name=by,
            row_name="tile m",
            col_name="tile n",
            notes=(f"cell = tile id; CTA = id % {self.num_ctas}, wave = id // {self.num_ctas}; "
                   f"{self.num_waves} wave(s)",),
            palette="distinct" if by == "cta" else "ramp",
        )


def cta_raster_order(
    num_tiles_mn: tuple[int, int],
    cluster_mn: tuple[int, int] = (1, 1),
    swizzle: int = 1,
    raster_along_m: bool = True,
    num_ctas: int | None = None,
) -> RasterTable:
    """All work tiles in scheduler order (see :func:`tile_coord`), and which CTA of a
    persistent grid of ``num_ctas`` (default: one wave, a CTA per tile) runs each."""
    Mt, Nt = num_tiles_mn
    cm, cn = cluster_mn
    total = len(scheduler_cluster_order(tuple(num_tiles_mn), tuple(cluster_mn), swizzle, raster_along_m)) * cm * cn
    if num_ctas is None:
        num_ctas = total
    if num_ctas < 1 or num_ctas % (cm * cn):
        raise ValueError(f"num_ctas={num_ctas} must be a positive multiple of the cluster size {cm * cn}")
    order = tuple(tile_coord(i, num_tiles_mn, cluster_mn, swizzle, raster_along_m) for i in range(total))
    visit = [[-1] * Nt for _ in range(Mt)]
    for i, (m, n) in enumerate(order):
        if m < Mt and n < Nt:
            visit[m][n] = i
    return RasterTable(tuple(num_tiles_mn), tuple(cluster_mn), swizzle, raster_along_m, num_ctas, order, _tuples(visit))


__all__ = [
    "RasterTable",
    "ceil_div",
    "cta_raster_order",
    "num_tiles",
    "scheduler_cluster_order",
    "tile_coord",
]
