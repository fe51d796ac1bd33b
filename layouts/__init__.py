"""Tile descriptions of the kernels (:mod:`layouts.tiles`) and a CPU explorer for them.

The explorer evaluates layouts with the DSL's own algebra (:mod:`layouts.explore`), draws them as
text/SVG/PNG (:mod:`layouts.render`) and is reachable as ``cute-kernels layouts`` (:mod:`layouts.cli`).
"""

from .explore import (
    BankTable,
    Grid,
    LayoutTable,
    OwnershipTable,
    RasterTable,
    cta_raster_order,
    evaluate,
    in_dsl,
    mma_fragment_ownership,
    num_tiles,
    scheduler_cluster_order,
    smem_bank_pattern,
    tile_coord,
)
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
