"""Hopper GEMM whose A/B mainloop loads with predicated ``cp.async`` instead of TMA.

Why: TMA needs a 16-byte aligned base and 16-byte multiples for every non-unit stride; an operand
that breaks that (row-major A with K = 4100) is read where it is rather than copied behind the
caller's back.

Only the producer differs from :class:`GemmSm90`: the consumers run ``GemmSm90.consumer`` unchanged
(same tiled wgmma, smem stages from :mod:`layouts.tiles`, same epilogue).

Producer: the whole producer warpgroup copies each A/B k-tile global -> shared with ``cp.async``
vectors of ``cfg.vec_a`` / ``cfg.vec_b`` bytes (16: ``cp.async.cg``, 8 or 4: ``cp.async.ca``), chosen
on the host so that every vector lies entirely inside or outside the matrix: one predicate per vector
is exact, and a predicated-off vector (src-size 0) zero-fills its destination.  2-byte vectors (odd
element alignment) go through registers (predicated ``ld.global``, then ``st.shared``).

Synchronization (:class:`CpAsyncAbPipeline`):
  * full barrier, 128 arrivals per stage: ``cp.async.mbarrier.arrive.noinc`` fires when the thread's
    earlier copies have landed; on the 2-byte path a plain ``mbarrier.arrive`` (preceded by
    ``cp.async.wait_group 0`` if the other operand used cp.async).
  * cp.async / ``st.shared`` write through the generic proxy, wgmma reads through the async proxy:
    after its full-barrier wait every consumer thread executes ``fence.proxy.async.shared::cta``
    before its wgmma on that stage, on the causality path write -> mbarrier -> thread -> wgmma that
    the PTX memory model asks for (CUTLASS's cp.async + GMMA mainloops omit it; it is cheap).
  * empty barrier: one arrival per consumer warp, as in the TMA pipeline.

Cluster shape must be (1, 1): nothing is multicast.  Split-K is not used on this path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
from cutlass._mlir import ir
from cutlass.cute.nvgpu import LoadCacheMode, cpasync
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.pipeline import Agent, CooperativeGroup, PipelineOp, pipeline_init_arrive, pipeline_init_wait

from ..common import tma
from . import views
from .config import VEC_BYTES, choose_vec_bytes, cpasync_tiles  # noqa: F401  (re-exported)
from .kernel import GemmConfig, GemmSm90

LOAD_THREADS = 128  # the producer warpgroup


# ---------------------------------------------------------------------------- the A/B pipeline
@dataclass(frozen=True)
class CpAsyncAbPipeline(pipeline.PipelineAsync):
    """Full/empty mbarrier ring between the cp.async producer warpgroup and the wgmma consumers; its
    ``consumer_wait`` includes the generic -> async proxy fence, so consumers written for TMA-filled
    stages stay correct unchanged."""

    @staticmethod
    def create(barrier_storage: cute.Pointer, num_stages: int, producer_threads: int, consumer_warps: int,
               cp_async_arrive: bool) -> "CpAsyncAbPipeline":
        full_op = PipelineOp.AsyncLoad if cp_async_arrive else PipelineOp.AsyncThread
        full = pipeline.PipelineAsync._make_sync_object(
            barrier_storage.align(min_align=8), num_stages,
            (full_op, CooperativeGroup(Agent.Thread, producer_threads)), phase="full",
        )
        empty = pipeline.PipelineAsync._make_sync_object(
            barrier_storage.align(min_align=8) + num_stages, num_stages,
            (PipelineOp.AsyncThread, CooperativeGroup(Agent.Thread, consumer_warps)), phase="empty",
        )
        return CpAsyncAbPipeline(full, empty, num_stages, None, None)

    @dsl_user_op
    def consumer_wait(self, state: pipeline.PipelineState, try_wait_token: Optional[cutlass.Boolean] = None, *,
                      loc: Optional[ir.Location] = None, ip: Optional[ir.InsertionPoint] = None) -> None:
        super().consumer_wait(state, try_wait_token, loc=loc, ip=ip)
        # generic-proxy writes (cp.async / st.shared), now visible to this thread -> wgmma (async proxy)
        cute.arch.fence_proxy("async.shared", space="cta", loc=loc, ip=ip)

    @dsl_user_op
    def consumer_release(self, state: pipeline.PipelineState, *, loc: Optional[ir.Location] = None,
                         ip: Optional[ir.InsertionPoint] = None) -> None:
        with cute.arch.elect_one(loc=loc, ip=ip):  # one arrival per consumer warp
            self.sync_object_empty.arrive(state.index, None, loc=loc, ip=ip)


# ---------------------------------------------------------------------------- the kernel
class GemmSm90CpAsync(GemmSm90):
    """:class:`GemmSm90` with a 128-thread predicated cp.async producer instead of TMA.  Registers:
    168 x 384 threads at launch; the producer drops to 72, the consumers rise to 216 (72*128 + 216*256)."""

    PRODUCER_REGS = 72
    CONSUMER_REGS = 216
    UNROLL_COPIES = 16  # vectors per operand and thread issued back to back without a loop

    def __init__(self, cfg: GemmConfig):
        if cfg.mainloop != "cpasync":
            raise ValueError(f"GemmSm90CpAsync needs cfg.mainloop == 'cpasync', got {cfg.mainloop!r}")
        if cfg.tiles.cluster_mn != (1, 1):
            raise ValueError(f"the cp.async mainloop needs a (1, 1) cluster, got {cfg.tiles.cluster_mn}")
        for name, v in (("vec_a", cfg.vec_a), ("vec_b", cfg.vec_b)):
            if v not in VEC_BYTES:
                raise ValueError(f"{name} must be one of {VEC_BYTES} bytes, got {v}")
        super().__init__(cfg)
        launch_regs = min(255, 65536 // self.threads) // 8 * 8  # what ptxas gives a 1-CTA/SM kernel: 168
        if self.num_mma_threads * self.CONSUMER_REGS + LOAD_THREADS * self.PRODUCER_REGS > launch_regs * self.threads:
            raise ValueError("setmaxnreg split exceeds the CTA's launch register allocation")

    # ---------------------------------------------------------------- host entry (traced once)
    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor,
                 alpha: cutlass.Float32, beta: cutlass.Float32, stream: cuda.CUstream):
        cfg = self.cfg
        t = cfg.tiles
        mA, mB, mD, mC, tiled_mma, sA_layout, sB_layout, sD_layout = views.gemm_host_setup(t, a, b, d, c, cfg.a_rank)
        tma_d, tma_mD = tma.make_tma_store(mD, sD_layout, t.epi_tile_mn)

        sched_params, grid = self.schedule(mD)  # cluster (1, 1) on this path (checked in __init__)
        self.shared_storage = views.shared_storage(self.ab_dtype, self.c_dtype, t.ab_stages, sA_layout, sB_layout,
                                                   sD_layout)
        self.kernel(
            mA, mB, tma_d, tma_mD, mD, mC, alpha, beta, tiled_mma, sA_layout, sB_layout, sD_layout, sched_params,
        ).launch(
            grid=grid,
            block=[self.threads, 1, 1],
            cluster=(1, 1, 1),
            min_blocks_per_mp=1,
            stream=stream,
        )

    # ---------------------------------------------------------------- device code
    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, tma_d: cute.CopyAtom, mD_tma: cute.Tensor,
               mD: cute.Tensor, mC: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32,
               tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
               sD_layout: cute.ComposedLayout, sched_params: utils.PersistentTileSchedulerParams):
        cfg = self.cfg
        t = cfg.tiles
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)

        if cutlass.const_expr(cfg.tma_store):
            if warp_idx == 0:
                cpasync.prefetch_descriptor(tma_d)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sD = storage.sD.get_tensor(sD_layout.outer, swizzle=sD_layout.inner)
        ab_pipe = CpAsyncAbPipeline.create(
            storage.ab_barriers.data_ptr(), t.ab_stages, LOAD_THREADS, 4 * self.num_mma_wg,
            cp_async_arrive=cfg.vec_a >= 4 and cfg.vec_b >= 4,
        )
        pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)
        k_tiles = cute.ceil_div(mA.shape[1], self.tile_mnk[2])
        pipeline_init_wait(cluster_shape_mn=(1, 1))

        if wg_idx == 0:
            # ================= producer warpgroup: all 128 threads load with cp.async
            cute.arch.setmaxregister_decrease(self.PRODUCER_REGS)
            self.producer(mA, mB, sA, sB, ab_pipe, k_tiles, sched_params, tidx)
        else:
            # ================= consumer warpgroups: GemmSm90's wgmma mainloop + epilogue (states carried)
            cute.arch.setmaxregister_increase(self.CONSUMER_REGS)
            self.consumer(tiled_mma, sA, sB, sD, ab_pipe, k_tiles, sched_params, tma_d, mD_tma, mD, mC,
                          alpha, beta, tidx, warp_idx)

    def _g2s_copy(self, vec_bytes: int, rows: int, k_major: bool) -> cute.TiledCopy:
        """128-thread tiled copy of one (rows, tile_k) stage, ``vec_bytes`` per thread and instruction,
        consecutive threads along the contiguous mode (coalesced global reads)."""
        k_t = self.tile_mnk[2]
        ebytes = self.ab_dtype.width // 8
        v = vec_bytes // ebytes
        if vec_bytes >= 4:
            op = cpasync.CopyG2SOp(cache_mode=LoadCacheMode.GLOBAL if vec_bytes == 16 else LoadCacheMode.ALWAYS)
        else:
            op = cute.nvgpu.CopyUniversalOp()
        atom = cute.make_copy_atom(op, self.ab_dtype, num_bits_per_copy=vec_bytes * 8)
        if k_major:
            tk = k_t // v
            thr = cute.make_ordered_layout((LOAD_THREADS // tk, tk), order=(1, 0))
            val = cute.make_layout((1, v))
        else:
            tm = math.gcd(rows // v, LOAD_THREADS)  # e.g. 192 rows of 8-element vectors: 8 x 16 threads
            thr = cute.make_layout((tm, LOAD_THREADS // tm))
            val = cute.make_layout((v, 1))
        return cute.make_tiled_copy_tv(atom, thr, val)

    @cute.jit
    def load_stage(self, tiled_copy: cute.TiledCopy, src: cute.Tensor, dst: cute.Tensor, coords: cute.Tensor,
                   res_rows: cutlass.Int32, res_k: cutlass.Int32, vec_bytes: cutlass.Constexpr):
        """One operand's k-tile from this thread's (CPY, CPY_ROWS, CPY_K) partitions (``coords``: in-tile
        (row, k); ``res_*``: what remains of the matrix from the tile's origin); out-of-bounds vectors
        become zeros.  Beyond ``UNROLL_COPIES`` vectors the longer mode is a run-time loop, so ptxas
        cannot hoist dozens of 64-bit addresses out of the k loop (they would spill)."""
        n_r = cute.size(coords, mode=[1])
        n_k = cute.size(coords, mode=[2])
        if cutlass.const_expr(n_r * n_k <= self.UNROLL_COPIES):
            self.load_vectors(tiled_copy, src, dst, coords, res_rows, res_k, vec_bytes)
        elif cutlass.const_expr(n_r >= n_k):
            for r in cutlass.range(n_r, unroll=max(1, self.UNROLL_COPIES // n_k)):
                self.load_vectors(tiled_copy, src[(None, r, None)], dst[(None, r, None)], coords[(None, r, None)],
                                  res_rows, res_k, vec_bytes)
        else:
            for k in cutlass.range(n_k, unroll=max(1, self.UNROLL_COPIES // n_r)):
                self.load_vectors(tiled_copy, src[(None, None, k)], dst[(None, None, k)], coords[(None, None, k)],
                                  res_rows, res_k, vec_bytes)

    @cute.jit
    def load_vectors(self, tiled_copy: cute.TiledCopy, src: cute.Tensor, dst: cute.Tensor, coords: cute.Tensor,
                     res_rows: cutlass.Int32, res_k: cutlass.Int32, vec_bytes: cutlass.Constexpr):
        """(CPY, rest...) partitions: one vector per rest index, predicated on its first element."""
        rest = cute.size(coords) // cute.size(coords, mode=[0])
        pred = cute.make_rmem_tensor(cute.make_layout((1, rest)), cutlass.Boolean)
        src = cute.group_modes(src, 1, cute.rank(src))
        dst = cute.group_modes(dst, 1, cute.rank(dst))
        coords = cute.group_modes(coords, 1, cute.rank(coords))
        for i in cutlass.range_constexpr(rest):
            pred[0, i] = cute.elem_less(coords[0, i], (res_rows, res_k))
        if cutlass.const_expr(vec_bytes >= 4):
            cute.copy(tiled_copy, src, dst, pred=pred)  # src-size 0 when predicated off: zero fill
        else:
            for i in cutlass.range_constexpr(rest):
                x = self.ab_dtype(0)
                if pred[0, i]:
                    x = src[0, i]
                dst[0, i] = x

    @cute.jit
    def producer(self, mA: cute.Tensor, mB: cute.Tensor, sA: cute.Tensor, sB: cute.Tensor, ab_pipe,
                 k_tiles, sched_params, tidx):
        cfg = self.cfg
        t = cfg.tiles
        m_t, n_t, k_t = self.tile_mnk
        copy_a = self._g2s_copy(cfg.vec_a, m_t, t.mma.a_major == "k")
        copy_b = self._g2s_copy(cfg.vec_b, n_t, t.mma.b_major == "k")
        thr_a = copy_a.get_slice(tidx)
        thr_b = copy_b.get_slice(tidx)
        tAsA = thr_a.partition_D(sA)  # (CPY, CPY_M, CPY_K, stages)
        tBsB = thr_b.partition_D(sB)
        tAcA = thr_a.partition_S(cute.make_identity_tensor((m_t, k_t)))  # in-tile (m, k) of each element
        tBcB = thr_b.partition_S(cute.make_identity_tensor((n_t, k_t)))
        gA = cute.local_tile(mA, (m_t, k_t), (None, None, None))  # (m_t, k_t, tiles_m, tiles_k, l)
        gB = cute.local_tile(mB, (n_t, k_t), (None, None, None))
        size_m, size_k = mA.shape[0], mA.shape[1]
        size_n = mB.shape[0]

        sched = utils.StaticPersistentTileScheduler.create(sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = sched.initial_work_tile_info()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, t.ab_stages)
        while work.is_valid_tile:
            tile = work.tile_idx
            tAgA = thr_a.partition_S(gA[(None, None, tile[0], None, tile[2])])  # (CPY, CPY_M, CPY_K, k_tiles)
            tBgB = thr_b.partition_S(gB[(None, None, tile[1], None, tile[2])])
            res_m = size_m - tile[0] * m_t
            res_n = size_n - tile[1] * n_t
            for kt in range(k_tiles):
                res_k = size_k - kt * k_t
                ab_pipe.producer_acquire(state)
                self.load_stage(copy_a, tAgA[(None, None, None, kt)], tAsA[(None, None, None, state.index)],
                                tAcA, res_m, res_k, cfg.vec_a)
                self.load_stage(copy_b, tBgB[(None, None, None, kt)], tBsB[(None, None, None, state.index)],
                                tBcB, res_n, res_k, cfg.vec_b)
                if cutlass.const_expr(min(cfg.vec_a, cfg.vec_b) < 4 and max(cfg.vec_a, cfg.vec_b) >= 4):
                    # plain arrive below: this thread's cp.async copies must have landed first
                    cute.arch.cp_async_commit_group()
                    cute.arch.cp_async_wait_group(0)
                ab_pipe.producer_commit(state)
                state.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        ab_pipe.producer_tail(state)
