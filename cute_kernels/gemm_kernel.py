"""Hopper GEMM kernel: TMA -> 128B-swizzled smem -> wgmma, warp-specialized and persistent.

D = alpha * A @ B + beta * C, fp16/bf16 operands, fp32 accumulators.

Roles (one CTA = 1 producer warpgroup + ``num_mma_warpgroups`` consumer warpgroups):
  * producer warp 0 walks the persistent tile schedule and issues TMA loads of A/B k-tiles into a
    ``ab_stages``-deep mbarrier ring (multicast across the cluster when the cluster is 2x1 / 1x2);
  * consumer warpgroups wait on the ring, issue wgmma with one group in flight, release stages, then run
    the epilogue: alpha/beta in registers, registers -> smem (stmatrix) -> TMA store, sub-tile by
    sub-tile, or predicated direct stores when D's strides are not TMA-compatible.
Tails in M/N/K come for free: TMA fills out-of-bounds reads with zeros and clips out-of-bounds writes.

The tiling (CTA tile, MMA, smem layouts, epilogue tile) comes only from :mod:`layouts.tiles`.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from layouts import tiles as T

from . import blocks


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
    # A/B mainloop: "tma" (GemmSm90) or "cpasync" (gemm_cpasync_kernel.GemmSm90CpAsync, for operands
    # whose strides/base break TMA); vec_a / vec_b: bytes per global->shared vector on that path
    # (16, 8, 4: cp.async; 2: synchronous loads through registers).
    mainloop: str = "tma"
    vec_a: int = 16
    vec_b: int = 16

    @property
    def a_major(self):
        return self.tiles.mma.a_major

    @property
    def b_major(self):
        return self.tiles.mma.b_major


class GemmSm90:
    """The kernel for one :class:`GemmConfig`.  ``__call__`` is the ``@cute.jit`` host entry."""

    PRODUCER_REGS = 40
    CONSUMER_REGS = 232

    def __init__(self, cfg: GemmConfig):
        self.cfg = cfg
        t = cfg.tiles
        self.tile_mnk = t.tile_mnk
        self.cluster_mn = t.cluster_mn
        self.num_mma_wg = t.mma.num_warpgroups
        self.threads = 128 * (1 + self.num_mma_wg)
        self.num_mma_threads = 128 * self.num_mma_wg
        self.epi_store_warp = 4  # first consumer warp issues the TMA stores
        self.mcast_a = t.cluster_mn[1]  # A tile is shared by the CTAs of a cluster row
        self.mcast_b = t.cluster_mn[0]
        self.ab_dtype = T.dtype(t.mma.ab_dtype)
        self.acc_dtype = T.dtype(t.mma.acc_dtype)
        self.c_dtype = T.dtype(t.c_dtype)

    # ---------------------------------------------------------------- host entry (traced once)
    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor,
                 alpha: cutlass.Float32, beta: cutlass.Float32, stream: cuda.CUstream):
        cfg = self.cfg
        t = cfg.tiles
        mA, mB, mD, mC, tiled_mma, sA_layout, sB_layout, sD_layout = blocks.gemm_host_setup(t, a, b, d, c, cfg.a_rank)
        m_t, n_t, k_t = self.tile_mnk

        tma_a, tma_mA = blocks.make_tma_load(mA, sA_layout, (m_t, k_t), self.mcast_a)
        tma_b, tma_mB = blocks.make_tma_load(mB, sB_layout, (n_t, k_t), self.mcast_b)
        tma_d, tma_mD = blocks.make_tma_store(mD, sD_layout, t.epi_tile_mn)

        sched_params, grid = self.schedule(mD)
        self.shared_storage = self.make_shared_storage(sA_layout, sB_layout, sD_layout)
        self.kernel(
            tma_a, tma_mA, tma_b, tma_mB, tma_d, tma_mD, mD, mC, alpha, beta,
            tiled_mma, sA_layout, sB_layout, sD_layout, sched_params,
        ).launch(
            grid=grid,
            block=[self.threads, 1, 1],
            cluster=(*self.cluster_mn, 1),
            min_blocks_per_mp=1,
            stream=stream,
        )

    def schedule(self, mD: cute.Tensor):
        """Persistent tile-scheduler parameters and grid for D's output tiles (host side of the jit)."""
        m_t, n_t, _ = self.tile_mnk
        num_tiles = cute.ceil_div(cute.shape(mD), (m_t, n_t, 1))
        return blocks.persistent_scheduler_params(
            num_tiles, self.cluster_mn, self.cfg.raster_swizzle, self.cfg.raster_along_m,
            self.cfg.max_active_clusters,
        )

    @cute.jit  # traced like __call__, so the struct's (string) annotations get evaluated
    def make_shared_storage(self, sA_layout, sB_layout, sD_layout):
        """Barriers of the A/B ring, the A/B stages and the epilogue buffers, 1024-byte aligned
        (the 128-byte swizzle repeats every 1024 bytes)."""
        stages = self.cfg.tiles.ab_stages

        @cute.struct
        class SharedStorage:
            ab_barriers: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(sB_layout)], 1024]
            sD: cute.struct.Align[cute.struct.MemRange[self.c_dtype, cute.cosize(sD_layout)], 1024]

        return SharedStorage

    # ---------------------------------------------------------------- device code
    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               tma_d: cute.CopyAtom, mD_tma: cute.Tensor, mD: cute.Tensor, mC: cute.Tensor,
               alpha: cutlass.Float32, beta: cutlass.Float32, tiled_mma: cute.TiledMma,
               sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
               sD_layout: cute.ComposedLayout, sched_params: utils.PersistentTileSchedulerParams):
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
        ab_pipe = blocks.make_tma_pipeline(
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
                    tAgA_t = tAgA[(None, tile[0], None, tile[2])]
                    tBgB_t = tBgB[(None, tile[1], None, tile[2])]
                    for kt in range(k_tiles):
                        ab_pipe.producer_acquire(state)
                        bar = ab_pipe.producer_get_barrier(state)
                        cute.copy(tma_a, tAgA_t[(None, kt)], tAsA[(None, state.index)], tma_bar_ptr=bar, mcast_mask=a_mask)
                        cute.copy(tma_b, tBgB_t[(None, kt)], tBsB[(None, state.index)], tma_bar_ptr=bar, mcast_mask=b_mask)
                        ab_pipe.producer_commit(state)
                        state.advance()
                    sched.advance_to_next_work()
                    work = sched.get_current_work()
                ab_pipe.producer_tail(state)
        else:
            # ================= consumer warpgroups: wgmma mainloop + epilogue
            cute.arch.setmaxregister_increase(self.CONSUMER_REGS)
            self.consumer(tiled_mma, sA, sB, sD, ab_pipe, k_tiles, sched_params, tma_d, mD_tma, mD, mC,
                          alpha, beta, tidx, warp_idx)

    @cute.jit
    def consumer(self, tiled_mma: cute.TiledMma, sA: cute.Tensor, sB: cute.Tensor, sD: cute.Tensor,
                 ab_pipe, k_tiles, sched_params, tma_d: cute.CopyAtom, mD_tma: cute.Tensor,
                 mD: cute.Tensor, mC: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32,
                 tidx, warp_idx):
        cfg = self.cfg
        t = cfg.tiles
        m_t, n_t, _ = self.tile_mnk
        mma_tidx = tidx - 128
        wg_layout = cute.make_layout(self.num_mma_wg, stride=128)
        thr_mma = tiled_mma.get_slice(wg_layout(mma_tidx // 128))  # A/B: one slice per warpgroup
        thr_mma_c = tiled_mma.get_slice(mma_tidx)  # C: each thread's own accumulator fragment
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))

        gD = cute.local_tile(mD, (m_t, n_t), (None, None, None))  # (m_t, n_t, tm, tn, l)
        gC = cute.local_tile(mC, (m_t, n_t), (None, None, None))
        cD = cute.local_tile(cute.make_identity_tensor(mD.shape), (m_t, n_t), (None, None, None))
        acc = cute.make_rmem_tensor(thr_mma.partition_C(gD[(None, None, 0, 0, 0)]).shape, self.acc_dtype)

        # epilogue: registers -> smem (stmatrix for 16-bit D) -> TMA store
        epi_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=self.num_mma_threads)
        c_layout = T.c_layout_enum(t)
        # The thread->element map of the copy comes from a 16-bit stmatrix atom over the MMA's C layout
        # (for any D width); the store op itself is stmatrix for 16-bit D, plain stores for fp32.
        c_atom = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(c_layout.is_m_major_c(), 4), cutlass.Float16
        )
        r2s_atom = sm90_utils.get_smem_store_op(c_layout, self.c_dtype, self.acc_dtype)
        tiled_r2s = cute.make_tiled_copy_S(r2s_atom, cute.make_tiled_copy_C_atom(c_atom, tiled_mma))
        thr_r2s = tiled_r2s.get_slice(mma_tidx)
        tRS_sD = thr_r2s.partition_D(sD)
        tRS_acc = tiled_r2s.retile(acc)
        rD_shape = cute.shape(thr_r2s.partition_S(sD))[:3]
        tRS_rD = cute.make_rmem_tensor(rD_shape, self.acc_dtype)
        tRS_rD_out = cute.make_rmem_tensor(rD_shape, self.c_dtype)
        n_rD = cute.size(tRS_rD)
        store_pipe = pipeline.PipelineTmaStore.create(
            num_stages=t.epi_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_threads),
        )

        sched = utils.StaticPersistentTileScheduler.create(sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = sched.initial_work_tile_info()
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, t.ab_stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, t.ab_stages)
        while work.is_valid_tile:
            tile = work.tile_idx
            # ---- mainloop: keep one wgmma group in flight, release the stage it no longer reads
            acc.fill(0.0)
            read, release = blocks.wgmma_mainloop(tiled_mma, acc, tCrA, tCrB, ab_pipe, read, release, k_tiles)

            # ---- alpha / beta in registers (C read with predicates: any strides, ragged tiles)
            tile_mnl = (tile[0], tile[1], tile[2])
            tCcD = thr_mma_c.partition_C(cD[(None, None, *tile_mnl)])
            if cutlass.const_expr(cfg.has_c):
                tCgC = thr_mma_c.partition_C(gC[(None, None, *tile_mnl)])
                for i in cutlass.range_constexpr(cute.size(acc)):
                    v = acc[i] * alpha
                    if cute.elem_less(tCcD[i], mD.shape):
                        v = v + beta * tCgC[i].to(cutlass.Float32)
                    acc[i] = v
            else:
                for i in cutlass.range_constexpr(cute.size(acc)):
                    acc[i] = acc[i] * alpha

            if cutlass.const_expr(cfg.tma_store):
                gD_tile = cute.local_tile(mD_tma, (m_t, n_t), (None, None, None))[(None, None, *tile_mnl)]
                gD_epi = cute.zipped_divide(gD_tile, t.epi_tile_mn)
                bSG_sD, bSG_gD = cute.nvgpu.cpasync.tma_partition(
                    tma_d, 0, cute.make_layout(1), cute.group_modes(sD, 0, 2), gD_epi,
                )
                epi_shape = gD_epi.shape[1]
                epi_order = cute.make_layout(epi_shape, stride=(epi_shape[1], 1))
                n_epi = cute.size(gD_epi, mode=[1])
                prev = sched.num_tiles_executed * n_epi
                for e in cutlass.range_constexpr(n_epi):
                    for v in cutlass.range_constexpr(n_rD):
                        tRS_rD[v] = tRS_acc[e * n_rD + v]
                    tRS_rD_out.store(tRS_rD.load().to(self.c_dtype))
                    buf = (prev + e) % t.epi_stages
                    cute.copy(tiled_r2s, tRS_rD_out, tRS_sD[(None, None, None, buf)])
                    cute.arch.fence_proxy("async.shared", space="cta")
                    epi_barrier.arrive_and_wait()
                    if warp_idx == self.epi_store_warp:
                        cute.copy(tma_d, bSG_sD[(None, buf)], bSG_gD[(None, epi_order.get_hier_coord(e))])
                        store_pipe.producer_commit()
                        store_pipe.producer_acquire()
                    epi_barrier.arrive_and_wait()
            else:
                tCgD = thr_mma_c.partition_C(gD[(None, None, *tile_mnl)])
                for i in cutlass.range_constexpr(cute.size(acc)):
                    if cute.elem_less(tCcD[i], mD.shape):
                        tCgD[i] = acc[i].to(self.c_dtype)
            sched.advance_to_next_work()
            work = sched.get_current_work()
        if cutlass.const_expr(cfg.tma_store):
            store_pipe.producer_tail()
