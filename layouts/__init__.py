"""Tile descriptions of the kernels (:mod:`layouts.tiles`, :mod:`layouts.attention`) and a CPU explorer
for them: :mod:`layouts.explore` (fragments, shared memory, banks) and :mod:`layouts.raster` (the
scheduler's tile order), drawn by :mod:`layouts.render`, reachable as ``cute-kernels layouts``.
``layouts`` never imports ``cute_kernels``; :mod:`layouts.target` sets the compile target.
"""

from .explore import (
    BankTable,
    Grid,
    LayoutTable,
    OwnershipTable,
    evaluate,
    in_dsl,
    mma_fragment_ownership,
    smem_bank_pattern,
)
from .raster import RasterTable, cta_raster_order, num_tiles, scheduler_cluster_order, tile_coord
from .render import SvgImage, save, to_png, to_svg, to_text
from .tiles import GemmTiles, MmaTile

__all__ = [
    "BankTable",
    "GemmTiles",
    "Grid",
    "LayoutTable",
    "MmaTile",
    "OwnershipTable",
    "RasterTable",
    "SvgImage",
    "cta_raster_order",
    "evaluate",
    "in_dsl",
    "mma_fragment_ownership",
    "num_tiles",
    "save",
    "scheduler_cluster_order",
    "smem_bank_pattern",
    "tile_coord",
    "to_png",
    "to_svg",
    "to_text",
]
