"""Tile descriptions of the kernels (:mod:`layouts.tiles`, :mod:`layouts.attention`,
:mod:`layouts.attention_backward`) and a CPU explorer
for them: :mod:`layouts.explore` (fragments, shared memory, banks) and :mod:`layouts.raster` (the
scheduler's tile order), drawn by :mod:`layouts.render`, reachable as ``cute-kernels layouts``.
``layouts`` never imports ``cute_kernels``; :mod:`layouts.target` sets the compile target.  The names
below load their module (and the DSL) when first read: ``import layouts`` imports no DSL.
"""

from .lazy import lazy_exports
from .target import set_dsl_arch_env

set_dsl_arch_env()  # before any layouts module imports cutlass

_EXPORTS = {
    **dict.fromkeys(["BankTable", "Grid", "LayoutTable", "OwnershipTable", "evaluate", "in_dsl",
                     "mma_fragment_ownership", "smem_bank_pattern"], ".explore"),
    **dict.fromkeys(["RasterTable", "cta_raster_order", "num_tiles", "scheduler_cluster_order", "tile_coord"], ".raster"),
    **dict.fromkeys(["SvgImage", "save", "to_png", "to_svg", "to_text"], ".render"),
    **dict.fromkeys(["GemmTiles", "MmaTile"], ".tiles"),
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

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
