"""Tile schedulers: the persistent (grid = min(tiles, SMs)) schedule of the DSL."""

from __future__ import annotations

import cutlass.utils as utils


def persistent_scheduler_params(num_tiles_mnl, cluster_mn: tuple[int, int], raster_swizzle: int,
                                raster_along_m: bool, max_active_clusters: int):
    """Scheduler parameters and grid for a persistent launch (grid = min(tiles, SMs))."""
    params = utils.PersistentTileSchedulerParams(num_tiles_mnl, (*cluster_mn, 1), raster_swizzle, raster_along_m)
    grid = utils.StaticPersistentTileScheduler.get_grid_shape(params, max_active_clusters)
    return params, grid
