"""Split-K GEMM reduced inside a thread-block cluster through distributed shared memory (DSMEM).

Why: for skinny problems (128 x 4096 x 4096, 1024 x 1024 x 32768) the output tiles cannot fill 132 SMs,
so K is split.  Writing fp32 partials to HBM and reducing them in a second kernel costs a write + read
of S x M x N x 4 bytes and a launch; here the S CTAs of one cluster (cluster shape (S, 1, 1)) each
compute one K slice of the same 128 x 128 output tile, park their fp32 accumulators in their own shared
memory (reusing the drained A-stage buffers), and after a cluster barrier CTA r sums rows
[r * 128/S, (r+1) * 128/S) of all S partial tiles, in rank order 0..S-1 (deterministic), applies
alpha / beta * C and stores D.  HBM traffic is the operands plus D, as in an unsplit GEMM.

Roles are those of :class:`cute_kernels.gemm_kernel.GemmSm90` (warp 0 of warpgroup 0 issues TMA, two
consumer warpgroups issue wgmma); the grid is not persistent: one cluster per output tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from layouts import tiles as T

from . import blocks

RED_PAD = 8  # fp32 words of padding per row of the reduction tile: 2-way instead of 8-way bank conflicts


@dsl_user_op
def _load_dsmem_f32(ptr, *, loc=None, ip=None):
    """ld.shared::cluster.f32 from a pointer produced by ``cute.arch.map_dsmem_ptr``."""
    return cutlass.Float32(llvm.load(cutlass.Float32.mlir_type, ptr.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip))


@dataclass(frozen=True)
class SplitKClusterConfig:
    tiles: T.GemmTiles  # tile 128 x 128 x 64, cluster_mn (1, 1): the cluster is along K here
    splits: int = 4  # CTAs per cluster = K slices (2, 4 or 8)
    a_rank: int = 2
    has_c: bool = False


class GemmSm90SplitKCluster:
    PRODUCER_REGS = 40
    CONSUMER_REGS = 232

    def __init__(self, cfg: SplitKClusterConfig):
        t = cfg.tiles
        if t.tile_mnk[:2] != (128, 128) or t.cluster_mn != (1, 1):
            raise ValueError("cluster split-K uses 128x128 tiles and no multicast cluster")
        if cfg.splits not in (2, 4, 8):
            raise ValueError(f"splits must be 2, 4 or 8, got {cfg.splits}")
        if t.ab_stages * 128 * 64 * 2 < 128 * (128 + RED_PAD) * 4:  # A stage bytes vs fp32 tile
            raise ValueError("the A stages are too small to hold the fp32 reduction tile")
        self.cfg = cfg
        self.tile_mnk = t.tile_mnk
        self.num_mma_wg = t.mma.num_warpgroups
        self.threads = 128 * (1 + self.num_mma_wg)
        self.ab_dtype = T.dtype(t.mma.ab_dtype)
        self.acc_dtype = T.dtype(t.mma.acc_dtype)
        self.d_dtype = T.dtype(t.c_dtype)

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor,
                 alpha: cutlass.Float32, beta: cutlass.Float32, stream: cuda.CUstream):
        cfg = self.cfg
        t = cfg.tiles
        mA, mB, mD, mC, tiled_mma, sA_layout, sB_layout, _ = blocks.gemm_host_setup(t, a, b, d, c, cfg.a_rank)
        m_t, n_t, k_t = self.tile_mnk
        tma_a, tma_mA = blocks.make_tma_load(mA, sA_layout, (m_t, k_t))
        tma_b, tma_mB = blocks.make_tma_load(mB, sB_layout, (n_t, k_t))

        @cute.struct
        class SharedStorage:
            ab_barriers: cute.struct.MemRange[cutlass.Int64, t.ab_stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(sB_layout)], 1024]

        self.shared_storage = SharedStorage
        m_tiles = cute.ceil_div(cute.size(mD, mode=[0]), m_t)
        n_tiles = cute.ceil_div(cute.size(mD, mode=[1]), n_t)
        grid = (cfg.splits, n_tiles, m_tiles * cute.size(mD, mode=[2]))
        self.kernel(tma_a, tma_mA, tma_b, tma_mB, mD, mC, alpha, beta, tiled_mma, sA_layout, sB_layout,
                    m_tiles).launch(grid=grid, block=[self.threads, 1, 1], cluster=(cfg.splits, 1, 1),
                                    min_blocks_per_mp=1, stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               mD: cute.Tensor, mC: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32,
               tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
               m_tiles: cutlass.Int32):
        cfg = self.cfg
        t = cfg.tiles
        S = cfg.splits
        m_t, n_t, k_t = self.tile_mnk
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        _, n_idx, ml = cute.arch.block_idx()
        m_idx = ml % m_tiles
        l_idx = ml // m_tiles

        if warp_idx == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        tx_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(sA_layout, (None, None, 0))) + cute.size_in_bytes(
            self.ab_dtype, cute.slice_(sB_layout, (None, None, 0))
        )
        ab_pipe = blocks.make_tma_pipeline(storage.ab_barriers.data_ptr(), t.ab_stages, tx_bytes,
                                           4 * self.num_mma_wg, cute.make_layout((1, 1, 1)), 1)
        pipeline_init_arrive(cluster_shape_mn=(S, 1), is_relaxed=True)

        gA = cute.local_tile(mA, (m_t, k_t), (None, None, None))  # (m_t, k_t, m, k, l)
        gB = cute.local_tile(mB, (n_t, k_t), (None, None, None))
        k_total = cute.size(gA, mode=[3])
        k_per = (k_total + S - 1) // S
        k_begin = rank * k_per
        k_end = cutlass.min(k_begin + k_per, k_total)
        k_count = cutlass.max(k_end - k_begin, 0)

        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2),
                                                      cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(tma_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2),
                                                      cute.group_modes(gB, 0, 2))
        pipeline_init_wait(cluster_shape_mn=(S, 1))

        # fp32 reduction tile, row-major with padding, over the A stages (drained by then)
        red_ptr = cute.recast_ptr(storage.sA.data_ptr(), dtype=cutlass.Float32)
        red_layout = cute.make_layout((m_t, n_t), stride=(n_t + RED_PAD, 1))
        sRed = cute.make_tensor(red_ptr, red_layout)

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.PRODUCER_REGS)
            if warp_idx == 0:
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, t.ab_stages)
                tAgA_t = tAgA[(None, m_idx, None, l_idx)]
                tBgB_t = tBgB[(None, n_idx, None, l_idx)]
                for i in range(k_count):
                    ab_pipe.producer_acquire(state)
                    bar = ab_pipe.producer_get_barrier(state)
                    cute.copy(tma_a, tAgA_t[(None, k_begin + i)], tAsA[(None, state.index)], tma_bar_ptr=bar)
                    cute.copy(tma_b, tBgB_t[(None, k_begin + i)], tBsB[(None, state.index)], tma_bar_ptr=bar)
                    ab_pipe.producer_commit(state)
                    state.advance()
                ab_pipe.producer_tail(state)
        else:
            cute.arch.setmaxregister_increase(self.CONSUMER_REGS)
            mma_tidx = tidx - 128
            thr_mma = tiled_mma.get_slice(cute.make_layout(self.num_mma_wg, stride=128)(mma_tidx // 128))
            thr_mma_c = tiled_mma.get_slice(mma_tidx)
            tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
            tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
            acc = cute.make_rmem_tensor(thr_mma_c.partition_C(sRed).shape, self.acc_dtype)
            acc.fill(0.0)
            read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, t.ab_stages)
            release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, t.ab_stages)
            read, release = blocks.wgmma_mainloop(tiled_mma, acc, tCrA, tCrB, ab_pipe, read, release, k_count)
            # every stage has been consumed: the A buffers are free for the fp32 partial tile
            pipeline.NamedBarrier(barrier_id=1, num_threads=128 * self.num_mma_wg).arrive_and_wait()
            tCsRed = thr_mma_c.partition_C(sRed)
            for i in cutlass.range_constexpr(cute.size(acc)):
                tCsRed[i] = acc[i]

        # all partial tiles of the cluster are in shared memory after this barrier
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()

        if wg_idx > 0:
            rows = m_t // S
            chunks = rows * (n_t // 4)  # 4 consecutive fp32 per chunk
            mma_tidx = tidx - 128
            for it in cutlass.range_constexpr((chunks + 128 * self.num_mma_wg - 1) // (128 * self.num_mma_wg)):
                ch = it * 128 * self.num_mma_wg + mma_tidx
                if ch < chunks:
                    r = rank * rows + ch // (n_t // 4)
                    c0 = (ch % (n_t // 4)) * 4
                    vals = cute.make_rmem_tensor((4,), cutlass.Float32)
                    vals.fill(0.0)
                    off = r * (n_t + RED_PAD) + c0
                    for q in cutlass.range_constexpr(S):  # fixed order: bitwise reproducible
                        remote = cute.arch.map_dsmem_ptr(red_ptr, q) + off
                        for j in cutlass.range_constexpr(4):
                            vals[j] = vals[j] + _load_dsmem_f32(remote + j)
                    gm = m_idx * m_t + r
                    for j in cutlass.range_constexpr(4):
                        gn = n_idx * n_t + c0 + j
                        if gm < cute.size(mD, mode=[0]) and gn < cute.size(mD, mode=[1]):
                            v = vals[j] * alpha
                            if cutlass.const_expr(cfg.has_c):
                                v = v + beta * mC[gm, gn, l_idx].to(cutlass.Float32)
                            mD[gm, gn, l_idx] = v.to(self.d_dtype)
        # nobody leaves while a peer may still read its shared memory
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
