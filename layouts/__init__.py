"""Tile descriptions of the kernels (:mod:`layouts.tiles`) and a CPU explorer for them.

The explorer evaluates layouts with the DSL's own algebra (:mod:`layouts.explore`: fragments, shared
memory and banks; :mod:`layouts.raster`: the persistent scheduler's tile order), draws them as
text/SVG/PNG (:mod:`layouts.render`) and is reachable as ``cute-kernels layouts``
(:mod:`cute_kernels.tools.layouts_cli`).  ``layouts`` never imports ``cute_kernels``; the compile target
is set by :mod:`layouts.target`.
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
