"""Hopper GEMM kernel: TMA -> 128B-swizzled smem -> wgmma, warp-specialized and persistent.

D = alpha * A @ B + beta * C, fp16/bf16 operands, fp32 accumulators.

Roles (one CTA = 1 producer warpgroup + ``num_mma_warpgroups`` consumer warpgroups):
  * producer warp 0 walks the persistent tile schedule and issues TMA loads of A/B k-tiles into an
    ``ab_stages``-deep mbarrier ring (multicast across a 2x1 / 1x2 cluster);
  * the consumer warpgroups share each CTA tile (64 rows each of a 128-row tile, two 64-row M-blocks
    each of a 256-row one), issue wgmma with one group in flight, release stages, then run the
    epilogue (:mod:`.epilogue`): registers -> smem (stmatrix) -> TMA store, or direct stores.
Tails in M/N/K come for free: TMA fills out-of-bounds reads with zeros and clips out-of-bounds writes.

Deferred epilogue (``GemmConfig.epi_defer``; the default where a CTA gets several tiles): after a
mainloop the consumers only scale and convert the accumulators into a register copy in D's type; the
next mainloop stores one sub-tile of it after each of its first k-tiles' wgmmas is committed, so the
tensor cores wait for the conversion but not for the stores (:meth:`GemmSm90.consumer_deferred`).

Split-K inside the persistent schedule (``GemmConfig.splits`` = S > 1, :class:`GemmSm90SplitK`): work
unit (m, n, l*S+s) streams k-tiles [s*ceil(K/S), ...) of tile (m, n, l), so a cluster's CTAs share
their k-range and keep the multicast; the unit that counts last sums the S partials in slice order
(:mod:`cute_kernels.common.fixup`) and runs the normal epilogue.

The tiling (CTA tile, MMA, smem layouts, epilogue tile) comes only from :mod:`layouts.tiles`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from layouts import tiles as T

from ..common import fixup, ring, scheduler, tma, wgmma
from ..common.barriers import NamedBarrierId
from . import views
from .config import EPI_DEFER_MAX_ACC, GemmConfig, epi_defer_ok, epi_sub_tiles, fixup_parts_ok  # noqa: F401
from .epilogue import ConsumerViews, EpilogueViews, GemmEpilogue


class CooperativeSetup(NamedTuple):
    """What a cooperative consumer starts with (:meth:`GemmSm90.cooperative_setup`)."""

    views: ConsumerViews  # operand fragments, D / C / coordinate tiles, accumulators
    epi_barrier: pipeline.NamedBarrier  # over the consumer warpgroups of one tile
    epi: EpilogueViews
    sched: utils.StaticPersistentTileScheduler
    read: pipeline.PipelineState  # the A/B ring's consumer states
    release: pipeline.PipelineState


class GemmSm90(GemmEpilogue):
    """The kernel for one :class:`GemmConfig`.  ``__call__`` is the ``@cute.jit`` host entry."""

    PRODUCER_REGS = 40
    CONSUMER_REGS = 232
    # Accumulator registers per consumer thread above which the split is 24/240 instead of 40/232
    # (256 x 208 tiles; 256 x 192 spills less at 232, profiles/NOTES-gemm.md).
    HEAVY_ACC_REGS = 192

    def __init__(self, cfg: GemmConfig):
        self.cfg = cfg
        t = cfg.tiles
        self.tile_mnk = t.tile_mnk
        self.cluster_mn = t.cluster_mn
        self.num_mma_wg = t.mma.num_warpgroups  # consumer warpgroups, all on one tile
        self.threads = 128 * (1 + self.num_mma_wg)
        self.num_mma_threads = 128 * self.num_mma_wg  # threads of one tile's epilogue
        heavy = t.acc_regs_per_thread > self.HEAVY_ACC_REGS
        if heavy:  # the producer gives up more: 24 * 128 + 240 * 256 = 64512 <= 65536
            self.PRODUCER_REGS, self.CONSUMER_REGS = 24, 240
        self.epi_store_warp = 4  # first consumer warp issues the TMA stores
        self.mcast_a = t.cluster_mn[1]  # A tile is shared by the CTAs of a cluster row
        self.mcast_b = t.cluster_mn[0]
        self.ab_dtype = T.dtype(t.mma.ab_dtype)
        self.acc_dtype = T.dtype(t.mma.acc_dtype)
        self.c_dtype = T.dtype(t.c_dtype)
        self.splits = cfg.splits
        self.use_pdl = cfg.pdl and cfg.mainloop == "tma"  # the cp.async subclass launches without it
        # zero-init through the MMA needs >= 1 k-tile per work unit (a split-K slice can be empty); the
        # heavy tiles keep the fill: ptxas peels the first k-tile, and 256 x 208 with C then spills 8 B
        self.mma_zero_init = cfg.lean_tile and cfg.splits == 1 and not heavy
        self.n_epi = epi_sub_tiles(t)
        if self.splits > 1 and cfg.mainloop != "tma":
            raise ValueError("GemmConfig.splits > 1: TMA mainloop only")
        if cfg.fixup_parts and not fixup_parts_ok(cfg):
            raise ValueError("GemmConfig.fixup_parts: split-K (2-16 slices), TMA mainloop and TMA-stored D, and "
                             "sub-tiles of whole 16-byte chunks per thread only")
        if cfg.epi_defer and not epi_defer_ok(cfg):
            raise ValueError("GemmConfig.epi_defer: TMA mainloop, unsplit, no C, TMA-stored 16-bit D, "
                             f"lean_tile and at most {EPI_DEFER_MAX_ACC} accumulators per thread only")

    # ---------------------------------------------------------------- host entry (traced once)
    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor,
                 alpha: cutlass.Float32, beta: cutlass.Float32, stream: cuda.CUstream):
        self.launch(a, b, d, c, None, None, alpha, beta, stream)

    def launch(self, a, b, d, c, ws, cnt, alpha, beta, stream):
        """Host side of the jit (traced inside ``__call__``): TMA atoms, schedule, shared storage, launch.
        ``ws`` / ``cnt``: the split-K workspace and counters (None without split)."""
        cfg = self.cfg
        t = cfg.tiles
        mA, mB, mD, mC, tiled_mma, sA_layout, sB_layout, sD_layout = views.gemm_host_setup(t, a, b, d, c, cfg.a_rank)
        m_t, n_t, k_t = self.tile_mnk

        tma_a, tma_mA = tma.make_tma_load(mA, sA_layout, (m_t, k_t), self.mcast_a)
        tma_b, tma_mB = tma.make_tma_load(mB, sB_layout, (n_t, k_t), self.mcast_b)
        tma_d, tma_mD = tma.make_tma_store(mD, sD_layout, t.epi_tile_mn)

        sched_params, grid = self.schedule(mD)
        self.shared_storage = views.shared_storage(self.ab_dtype, self.c_dtype, t.ab_stages, sA_layout, sB_layout,
                                                   sD_layout)
        self.kernel(
            tma_a, tma_mA, tma_b, tma_mB, tma_d, tma_mD, mD, mC, alpha, beta,
            tiled_mma, sA_layout, sB_layout, sD_layout, sched_params, ws, cnt,
        ).launch(
            grid=grid,
            block=[self.threads, 1, 1],
            cluster=(*self.cluster_mn, 1),
            min_blocks_per_mp=1,
            stream=stream,
            use_pdl=self.use_pdl,
        )

    def schedule(self, mD: cute.Tensor):
        """Persistent tile-scheduler parameters and grid for D's output tiles (host side of the jit)."""
        m_t, n_t, _ = self.tile_mnk
        num_tiles = cute.ceil_div(cute.shape(mD), (m_t, n_t, 1))
        if cutlass.const_expr(self.splits > 1):  # work units (m, n, l * S + s)
            num_tiles = (num_tiles[0], num_tiles[1], num_tiles[2] * self.splits)
        return scheduler.persistent_scheduler_params(
            num_tiles, self.cluster_mn, self.cfg.raster_swizzle, self.cfg.raster_along_m,
            self.cfg.max_active_clusters,
        )

    # ---------------------------------------------------------------- device code
    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               tma_d: cute.CopyAtom, mD_tma: cute.Tensor, mD: cute.Tensor, mC: cute.Tensor,
               alpha: cutlass.Float32, beta: cutlass.Float32, tiled_mma: cute.TiledMma,
               sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
               sD_layout: cute.ComposedLayout, sched_params: utils.PersistentTileSchedulerParams,
               mWs: Optional[cute.Tensor] = None, mCnt: Optional[cute.Tensor] = None):
        cfg = self.cfg
        t = cfg.tiles
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)

        if warp_idx == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)
            if cutlass.const_expr(cfg.tma_store):
                cute.nvgpu.cpasync.prefetch_descriptor(tma_d)

        # ---- cluster position and multicast masks
        cluster_layout = cute.make_layout((*self.cluster_mn, 1))
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord = cluster_layout.get_flat_coord(cta_rank)
        a_mask = cute.make_layout_image_mask(cluster_layout, cluster_coord, mode=1) if self.mcast_a > 1 else 0
        b_mask = cute.make_layout_image_mask(cluster_layout, cluster_coord, mode=0) if self.mcast_b > 1 else 0

        # ---- shared memory and the TMA -> wgmma pipeline
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sD = storage.sD.get_tensor(sD_layout.outer, swizzle=sD_layout.inner)
        tx_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(sA_layout, (None, None, 0))) + cute.size_in_bytes(
            self.ab_dtype, cute.slice_(sB_layout, (None, None, 0))
        )
        ab_pipe = ring.make_tma_pipeline(
            storage.ab_barriers.data_ptr(), t.ab_stages, tx_bytes, 4 * self.num_mma_wg,
            cluster_layout, self.mcast_a + self.mcast_b - 1,
        )
        pipeline_init_arrive(cluster_shape_mn=self.cluster_mn, is_relaxed=True)

        # ---- global tiles: (tile_m, tile_k, m_idx, k_idx, l) etc.
        m_t, n_t, k_t = self.tile_mnk
        gA = cute.local_tile(mA, (m_t, k_t), (None, None, None))
        gB = cute.local_tile(mB, (n_t, k_t), (None, None, None))
        k_tiles = cute.size(gA, mode=[3])

        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
            tma_a, cluster_coord[1], cute.make_layout(self.cluster_mn[1]),
            cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2),
        )
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
            tma_b, cluster_coord[0], cute.make_layout(self.cluster_mn[0]),
            cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2),
        )

        pipeline_init_wait(cluster_shape_mn=self.cluster_mn)
        if cutlass.const_expr(self.use_pdl):
            cute.arch.griddepcontrol_wait()  # the previous kernel's writes are visible from here on

        if wg_idx == 0:
            # ================= producer warpgroup: one warp issues TMA, the rest idle
            cute.arch.setmaxregister_decrease(self.PRODUCER_REGS)
            if warp_idx == 0:
                sched = utils.StaticPersistentTileScheduler.create(
                    sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
                )
                work = sched.initial_work_tile_info()
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, t.ab_stages)
                while work.is_valid_tile:
                    tile = work.tile_idx
                    l_idx, k_begin, k_count = self.k_range(tile[2], k_tiles)
                    tAgA_t = tAgA[(None, tile[0], None, l_idx)]
                    tBgB_t = tBgB[(None, tile[1], None, l_idx)]
                    state = tma.tma_produce_k_tiles(ab_pipe, state, tma_a, tAgA_t, tAsA, tma_b, tBgB_t, tBsB,
                                                       k_begin, k_count, a_mask, b_mask)
                    sched.advance_to_next_work()
                    work = sched.get_current_work()
                ab_pipe.producer_tail(state)
        else:
            # ================= consumer warpgroups: wgmma mainloop + epilogue
            cute.arch.setmaxregister_increase(self.CONSUMER_REGS)
            if cutlass.const_expr(cfg.epi_defer):
                self.consumer_deferred(tiled_mma, sA, sB, sD, ab_pipe, k_tiles, sched_params, tma_d, mD_tma, mD,
                                       alpha, tidx, warp_idx)
            else:
                sFlag = None
                if cutlass.const_expr(self.splits > 1):
                    sFlag = storage.flag.get_tensor(cute.make_layout((4,)))
                self.consumer(tiled_mma, sA, sB, sD, ab_pipe, k_tiles, sched_params, tma_d, mD_tma, mD, mC,
                              alpha, beta, tidx, warp_idx, mWs, mCnt, sFlag)

    @cute.jit
    def k_range(self, l_unit, k_tiles):
        """(batch index, first k-tile, k-tile count) of a work unit's third coordinate: the batch itself
        without split; ``l * S + s`` -> slice s of ceil(K/S) k-tiles (the last may be short or empty)."""
        if cutlass.const_expr(self.splits > 1):
            S = self.splits
            l_idx = l_unit // S
            k_per = (k_tiles + S - 1) // S
            k_begin = (l_unit - l_idx * S) * k_per
            return l_idx, k_begin, cutlass.max(cutlass.min(k_per, k_tiles - k_begin), 0)
        return l_unit, 0, k_tiles

    @cute.jit
    def consumer(self, tiled_mma: cute.TiledMma, sA: cute.Tensor, sB: cute.Tensor, sD: cute.Tensor,
                 ab_pipe, k_tiles, sched_params, tma_d: cute.CopyAtom, mD_tma: cute.Tensor,
                 mD: cute.Tensor, mC: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32,
                 tidx, warp_idx, mWs: Optional[cute.Tensor] = None, mCnt: Optional[cute.Tensor] = None,
                 sFlag: Optional[cute.Tensor] = None):
        """Both warpgroups on every tile, then its epilogue (a 256-row tile's sub-tiles run M-block-major,
        the accumulators' order)."""
        cfg = self.cfg
        m_t, n_t, _ = self.tile_mnk
        mma_tidx = tidx - 128
        v, epi_barrier, epi, sched, read, release = self.cooperative_setup(tiled_mma, sA, sB, sD, mD, mC,
                                                                           sched_params, mma_tidx)
        thr_mma_c, tCrA, tCrB, gD, gC, cD, acc = v
        store_pipe = epi.store_pipe
        work = sched.initial_work_tile_info()
        ws = None
        if cutlass.const_expr(self.splits > 1):
            ws = fixup.partial_workspace(mWs, self.num_mma_threads, cute.size(acc), m_t * n_t)
        while work.is_valid_tile:
            tile = work.tile_idx
            l_idx, _, k_count = self.k_range(tile[2], k_tiles)
            # ---- mainloop: keep one wgmma group in flight, release the stage it no longer reads
            if cutlass.const_expr(not self.mma_zero_init):
                acc.fill(0.0)
            read, release = wgmma.wgmma_mainloop(tiled_mma, acc, tCrA, tCrB, ab_pipe, read, release, k_count,
                                                  zero_init=self.mma_zero_init)
            last = True  # split-K: only the unit that counts last runs the tile's epilogue
            parts = None  # (the shared finish: the parts of the tile this unit stores)
            if cutlass.const_expr(cfg.fixup_parts):
                parts = self.claim_parts(epi.tRS_acc, ws, tile, l_idx, mD, mCnt, sFlag, mma_tidx)
                last = parts != 0
            elif cutlass.const_expr(self.splits > 1):
                last = self.reduce_partials(acc, ws, tile, l_idx, mD, mCnt, sFlag, mma_tidx)
            if last:
                self.epilogue(acc, (tile[0], tile[1], l_idx), thr_mma_c, gD, gC, cD, sD, epi, epi_barrier,
                              sched.num_tiles_executed, tma_d, mD_tma, mD, alpha, beta, warp_idx, parts)
                if cutlass.const_expr(cfg.fixup_parts):
                    fixup.finish_parts(mCnt, self.split_tile_id(tile, l_idx, mD), parts, mma_tidx, self.splits)
            sched.advance_to_next_work()
            work = sched.get_current_work()
        if cutlass.const_expr(self.use_pdl):
            cute.arch.griddepcontrol_launch_dependents()
        if cutlass.const_expr(cfg.tma_store):
            store_pipe.producer_tail()

    @cute.jit
    def cooperative_setup(self, tiled_mma: cute.TiledMma, sA: cute.Tensor, sB: cute.Tensor, sD: cute.Tensor,
                          mD: cute.Tensor, mC: cute.Tensor, sched_params, mma_tidx):
        """What :meth:`consumer` and :meth:`consumer_deferred` start with: operand / accumulator views
        (A/B one slice per warpgroup, C per thread), the epilogue barrier and views, the tile scheduler
        and the ring's (read, release) states."""
        wg_layout = cute.make_layout(self.num_mma_wg, stride=128)
        v = self.consumer_views(tiled_mma, tiled_mma.get_slice(wg_layout(mma_tidx // 128)), mma_tidx, sA, sB, mD, mC)
        epi_barrier = pipeline.NamedBarrier(barrier_id=NamedBarrierId.EPILOGUE, num_threads=self.num_mma_threads)
        epi = self.make_epilogue(tiled_mma, sD, v.acc, mma_tidx)
        sched = utils.StaticPersistentTileScheduler.create(sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        stages = self.cfg.tiles.ab_stages
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages)
        return CooperativeSetup(v, epi_barrier, epi, sched, read, release)

    @cute.jit
    def consumer_deferred(self, tiled_mma: cute.TiledMma, sA: cute.Tensor, sB: cute.Tensor, sD: cute.Tensor,
                          ab_pipe, k_tiles, sched_params, tma_d: cute.CopyAtom, mD_tma: cute.Tensor,
                          mD: cute.Tensor, alpha: cutlass.Float32, tidx, warp_idx):
        """Consumers with the deferred epilogue (``GemmConfig.epi_defer``).  Per tile: mainloop, during
        which sub-tile ``e`` of the previous tile's ``rPend`` is stored after k-tile ``e``'s wgmmas are
        committed (``after_commit``); then the sub-tiles the mainloop had no k-tile for; then this
        tile's accumulators -> ``rPend`` (scaled, converted).  The last tile is stored after the loop;
        sub-tiles keep their running order, so the epilogue buffers rotate as in :meth:`epilogue`."""
        mma_tidx = tidx - 128
        v, epi_barrier, epi, sched, read, release = self.cooperative_setup(tiled_mma, sA, sB, sD, mD, mD,
                                                                           sched_params, mma_tidx)
        thr_mma_c, tCrA, tCrB, gD, gC, cD, acc = v
        store_pipe = epi.store_pipe
        rPend = [cute.make_rmem_tensor(epi.tRS_rD_out.shape, self.c_dtype) for _ in range(self.n_epi)]
        pend = (rPend, sD, epi, epi_barrier, tma_d, mD_tma, warp_idx)
        work = sched.initial_work_tile_info()
        has_pend = cutlass.Boolean(False)
        pend_m, pend_n, pend_l, pend_count = cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(0)
        while work.is_valid_tile:
            tile = work.tile_idx
            read, release = wgmma.wgmma_mainloop(
                tiled_mma, acc, tCrA, tCrB, ab_pipe, read, release, k_tiles, zero_init=True,
                after_commit=self.store_pending, after_commit_args=(has_pend, (pend_m, pend_n, pend_l), pend_count,
                                                                    pend))
            if has_pend:  # sub-tiles the mainloop had no k-tile for
                for e in cutlass.range_constexpr(self.n_epi):
                    if k_tiles <= e:
                        self.store_subtile(e, rPend[e], (pend_m, pend_n, pend_l), pend_count, sD, epi, epi_barrier,
                                           tma_d, mD_tma, warp_idx)
            self.scale_acc(acc, (tile[0], tile[1], tile[2]), thr_mma_c, gC, cD, mD, alpha, cutlass.Float32(0.0))
            for e in cutlass.range_constexpr(self.n_epi):
                self.convert_subtile(epi, e, rPend[e])
            has_pend = cutlass.Boolean(True)
            pend_m, pend_n, pend_l = tile[0], tile[1], tile[2]
            pend_count = sched.num_tiles_executed
            sched.advance_to_next_work()
            work = sched.get_current_work()
        if has_pend:
            for e in cutlass.range_constexpr(self.n_epi):
                self.store_subtile(e, rPend[e], (pend_m, pend_n, pend_l), pend_count, sD, epi, epi_barrier,
                                   tma_d, mD_tma, warp_idx)
        if cutlass.const_expr(self.use_pdl):
            cute.arch.griddepcontrol_launch_dependents()
        store_pipe.producer_tail()

    @cute.jit
    def store_pending(self, kt, has_pend, tile_mnl, tiles_done, pend):
        """``wgmma_mainloop`` hook of :meth:`consumer_deferred`: after k-tile ``kt``'s wgmmas are
        committed, store the previous tile's sub-tile ``kt`` (if there is one)."""
        rPend, sD, epi, epi_barrier, tma_d, mD_tma, warp_idx = pend
        if has_pend:
            for e in cutlass.range_constexpr(self.n_epi):
                if kt == e:
                    self.store_subtile(e, rPend[e], tile_mnl, tiles_done, sD, epi, epi_barrier, tma_d, mD_tma, warp_idx)


class GemmSm90SplitK(GemmSm90):
    """:class:`GemmSm90` with ``GemmConfig.splits`` > 1 (see the module doc); the host entry adds the fp32
    workspace (``tiles x S`` partial tiles) and the int32 counters (one per tile, left at zero)."""

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor, ws: cute.Tensor,
                 cnt: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32, stream: cuda.CUstream):
        self.launch(a, b, d, c, ws, cnt, alpha, beta, stream)

    @cute.jit
    def split_tile_id(self, tile, l_idx, mD: cute.Tensor):
        """The output tile's index among all tiles (its counter; its slots are ``tile_id * S + s``)."""
        m_t, n_t, _ = self.tile_mnk
        m_tiles = (cute.size(mD, mode=[0]) + m_t - 1) // m_t
        n_tiles = (cute.size(mD, mode=[1]) + n_t - 1) // n_t
        return (l_idx * n_tiles + tile[1]) * m_tiles + tile[0]

    @cute.jit
    def reduce_partials(self, acc: cute.Tensor, ws: cute.Tensor, tile, l_idx, mD: cute.Tensor, mCnt: cute.Tensor,
                        sFlag: cute.Tensor, mma_tidx):
        """Publish and count this unit's partial (slot tile_id * S + s); whether it counted last, when
        ``acc`` holds the sum of the S partials (:func:`fixup.publish_and_sum`)."""
        S = self.splits
        tile_id = self.split_tile_id(tile, l_idx, mD)
        slot0 = tile_id * S
        return fixup.publish_and_sum(acc, ws, mma_tidx, slot0 + tile[2] - l_idx * S, slot0, S, mCnt, tile_id, sFlag,
                                     NamedBarrierId.EPILOGUE, self.num_mma_threads)

    @cute.jit
    def claim_parts(self, acc_sub: cute.Tensor, ws: cute.Tensor, tile, l_idx, mD: cute.Tensor, mCnt: cute.Tensor,
                    sFlag: cute.Tensor, mma_tidx):
        """The shared finish (``GemmConfig.fixup_parts``): publish this unit's partial in sub-tile order
        (``acc_sub``, the epilogue's view of the accumulators), claim parts (its own, slice s; the last
        unit every unclaimed one) and sum them (:func:`fixup.publish_and_claim`, :func:`fixup.sum_parts`).
        Returns the claimed parts' mask (0: none, no epilogue)."""
        S = self.splits
        tile_id = self.split_tile_id(tile, l_idx, mD)
        slot0 = tile_id * S
        s = tile[2] - l_idx * S
        mask = fixup.publish_and_claim(acc_sub, ws, mma_tidx, slot0 + s, s, mCnt, tile_id, sFlag,
                                       NamedBarrierId.EPILOGUE, self.num_mma_threads, S)
        fixup.sum_parts(acc_sub, ws, mma_tidx, slot0, mask, self.n_epi, S)
        return mask
