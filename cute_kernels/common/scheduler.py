"""Tile schedulers: the persistent (grid = min(tiles, SMs)) schedule of the DSL, and a dynamic
persistent schedule (tiles handed out by a global atomic counter; :func:`~.host.tile_counter` keeps
its buffers on the host side)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils


def persistent_scheduler_params(num_tiles_mnl, cluster_mn: tuple[int, int], raster_swizzle: int,
                                raster_along_m: bool, max_active_clusters: int):
    """Scheduler parameters and grid for a persistent launch (grid = min(tiles, SMs))."""
    params = utils.PersistentTileSchedulerParams(num_tiles_mnl, (*cluster_mn, 1), raster_swizzle, raster_along_m)
    grid = utils.StaticPersistentTileScheduler.get_grid_shape(params, max_active_clusters)
    return params, grid


# ---- dynamic persistent schedule: a global tile counter ----------------------------------------
# ``mCounter`` is two Int32s in global memory, zero before the launch: [0] counts tiles handed out
# after each CTA's first (static) one, [1] counts CTAs that ran out of tiles.  The last CTA to run
# out sets both back to zero, so one buffer serves every launch on one stream without a memset.
# Two kernels running at once must not share a buffer.


@cute.jit
def next_dynamic_tile(mCounter: cute.Tensor, lane):
    """Warp-uniform: the index of the calling CTA's next tile (one atomic by lane 0, broadcast);
    an index >= the number of tiles means no work is left.  The CTA's first tile is its block index,
    so this hands out ``grid``, ``grid + 1``, ... in the order it is called."""
    nxt = cutlass.Int32(0)
    if lane == 0:
        nxt = cute.arch.atomic_add(mCounter.iterator, cutlass.Int32(1), sem="relaxed", scope="gpu")
    grid = cute.arch.grid_dim()[0]
    return cute.arch.shuffle_sync(nxt, 0) + grid


@cute.jit
def retire_dynamic_counter(mCounter: cute.Tensor, lane):
    """Called once per CTA (one warp) after :func:`next_dynamic_tile` returned no work: counts the
    CTA out, and the last CTA resets the counter for the next launch.  Every CTA's last fetch
    precedes its acq_rel count-out, so the reset cannot race a fetch."""
    if lane == 0:
        grid = cute.arch.grid_dim()[0]
        done = cute.arch.atomic_add(mCounter.iterator + 1, cutlass.Int32(1), sem="acq_rel", scope="gpu")
        if done == grid - 1:
            mCounter[0] = cutlass.Int32(0)
            mCounter[1] = cutlass.Int32(0)
