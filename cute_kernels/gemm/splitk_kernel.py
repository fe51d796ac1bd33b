"""Split-K GEMMs for problems whose output tiles cannot fill the SMs: S CTAs compute K slices of one
128 x tile_n output tile and meet either in a cluster's distributed shared memory
(:class:`GemmSm90SplitKCluster`) or through an L2 workspace with a last-CTA fixup
(:class:`GemmSm90SplitKFixup`).  Roles are those of :class:`cute_kernels.gemm.kernel.GemmSm90` (warp 0
issues TMA, two consumer warpgroups issue wgmma); one CTA per (slice, output tile), not persistent.

DSMEM kernel: the S CTAs of a cluster (S, 1, 1) park their fp32 accumulators in their own shared memory
(over the drained operand stages); after a cluster barrier CTA r sums rows [r * 128/S, (r+1) * 128/S)
of all S partial tiles in rank order (deterministic), applies alpha / beta * C and stores D, so HBM
traffic is that of an unsplit GEMM (no partials written, no second launch).  Fields of
:class:`SplitKClusterConfig`: tile_n 64 / 128 (64 gives twice the CTAs streaming B); splits 1 / 2
(larger clusters schedule worse; 1 is a plain GEMM with this epilogue); vec_store (D row-major with
16-byte rows: 8 outputs per thread in one vector store).

A multicast along N (``tiles.cluster_mn = (1, 2)``): the two CTAs of one K slice and neighbouring N
tiles each load half of the shared A tile into both, for the skinny plan's pairs
(:func:`cute_kernels.gemm.heuristics.skinny_swap_choice`: the weight is the 128-row A operand).
"""

from __future__ import annotations

from typing import NamedTuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from layouts import tiles as T

from ..common import fixup, ring, tma, wgmma
from ..common.barriers import NamedBarrierId
from . import views
from .config import SplitKClusterConfig, SplitKFixupConfig, fixup_workspace_numel  # noqa: F401
from .epilogue import add_beta_c

VEC = 8  # consecutive output columns one thread reduces and stores
TILE_NS = (16, 32, 64, 128, 192, 256)  # 16 / 32: the swapped skinny GEMM (N' = the problem's M <= 32)
SPLITS = (1, 2)
A_MCAST = (1, 2)  # CTAs along N sharing each A tile (tiles.cluster_mn[1])


@dsl_user_op
def _load_dsmem_f32(ptr, *, loc=None, ip=None):
    """ld.shared::cluster.f32 from a pointer produced by ``cute.arch.map_dsmem_ptr``."""
    return cutlass.Float32(llvm.load(cutlass.Float32.mlir_type, ptr.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip))



class SplitKHost(NamedTuple):
    """What the host side of a split-K kernel sets up (:meth:`_SplitKBase._host_operands`)."""

    mD: cute.Tensor
    mC: cute.Tensor
    tiled_mma: cute.TiledMma
    sA_layout: cute.ComposedLayout
    sB_layout: cute.ComposedLayout
    tma_a: cute.CopyAtom
    tma_mA: cute.Tensor
    tma_b: cute.CopyAtom
    tma_mB: cute.Tensor
    m_tiles: object
    n_tiles: object
    grid: tuple


class _SplitKBase:
    """What both split-K kernels share: grid (S, n tiles, m tiles x L); CTA ``rank`` streams k-tiles
    [rank * ceil(K/S), ...) through a TMA ring into each consumer thread's fp32 accumulator fragment.
    Subclasses differ only in how the S partial tiles meet."""

    PRODUCER_REGS = 40
    CONSUMER_REGS = 232
    KIND = ""
    TILE_NS: tuple = ()
    SPLITS_OK: tuple = ()
    A_MCAST_OK: tuple = (1,)

    def __init__(self, cfg):
        t = cfg.tiles
        m_t, n_t, k_t = t.tile_mnk
        if m_t != 128 or n_t not in self.TILE_NS or k_t != 64 or t.cluster_mn[0] != 1 or \
                t.cluster_mn[1] not in self.A_MCAST_OK:
            raise ValueError(f"{self.KIND} split-K uses 128 x {self.TILE_NS} x 64 tiles and clusters 1 x "
                             f"{self.A_MCAST_OK} along (M, N), got {t.tile_mnk} / {t.cluster_mn}")
        if cfg.splits not in self.SPLITS_OK:
            raise ValueError(f"splits must be one of {self.SPLITS_OK}, got {cfg.splits}")
        self.cfg = cfg
        self.mcast_a = t.cluster_mn[1]  # CTAs of neighbouring N tiles (same K slice) sharing each A tile
        self.cluster_k = cfg.splits if self.KIND == "cluster" else 1  # K slices inside one cluster
        if self.cluster_k * self.mcast_a > 8:
            raise ValueError(f"a cluster holds at most 8 CTAs: {self.cluster_k} K slices x A multicast {self.mcast_a}")
        self.tile_mnk = t.tile_mnk
        self.num_mma_wg = t.mma.num_warpgroups
        self.threads = 128 * (1 + self.num_mma_wg)
        self.ab_dtype = T.dtype(t.mma.ab_dtype)
        self.acc_dtype = T.dtype(t.mma.acc_dtype)
        self.d_dtype = T.dtype(t.c_dtype)

    def _host_operands(self, a, b, d, c):
        """Host side (inside ``__call__``): views, tiled MMA, smem layouts, TMA atoms, the grid and
        ``self.shared_storage``."""
        cfg = self.cfg
        mA, mB, mD, mC, tiled_mma, sA_layout, sB_layout, _ = views.gemm_host_setup(cfg.tiles, a, b, d, c, cfg.a_rank)
        m_t, n_t, k_t = self.tile_mnk
        tma_a, tma_mA = tma.make_tma_load(mA, sA_layout, (m_t, k_t), self.mcast_a)
        tma_b, tma_mB = tma.make_tma_load(mB, sB_layout, (n_t, k_t))
        m_tiles = cute.ceil_div(cute.size(mD, mode=[0]), m_t)
        n_tiles = cute.ceil_div(cute.size(mD, mode=[1]), n_t)
        # whole clusters along N: a CTA past the last N tile still loads (and multicasts) its share of
        # A; its B box is all out of bounds (zero-filled) and its stores are predicated off
        grid = (cfg.splits, cute.ceil_div(n_tiles, self.mcast_a) * self.mcast_a, m_tiles * cute.size(mD, mode=[2]))
        self.shared_storage = views.shared_storage(self.ab_dtype, self.d_dtype, cfg.tiles.ab_stages, sA_layout,
                                                   sB_layout)
        return SplitKHost(mD, mC, tiled_mma, sA_layout, sB_layout, tma_a, tma_mA, tma_b, tma_mB, m_tiles, n_tiles, grid)

    @cute.jit
    def _ring(self, warp_idx, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
              sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout, rank, n_rank):
        """Kernel side, every thread: the shared storage, the operand ring and this CTA's K range (slice
        ``rank``).

        Without A multicast the ring is CTA-local.  With it (c = ``mcast_a`` > 1, cluster (cluster_k, c,
        1)), CTA ``n_rank`` of the c CTAs sharing K slice ``rank`` loads 1/c of each A tile into all c,
        so a consumer releases a stage to the empty barriers of those c CTAs (only the K-slice row
        multicasts) and the inits are published to the whole cluster.  No CTA leaves while a peer may
        still signal it: ``producer_tail`` waits for every stage's release by all c consumers."""
        t = self.cfg.tiles
        S = self.cfg.splits
        c = self.mcast_a
        m_t, n_t, k_t = self.tile_mnk
        if warp_idx == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)
        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        tx_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(sA_layout, (None, None, 0))) + cute.size_in_bytes(
            self.ab_dtype, cute.slice_(sB_layout, (None, None, 0))
        )
        pipe_cluster = (self.cluster_k, c) if c > 1 else (1, 1)
        ab_pipe = ring.make_tma_pipeline(storage.ab_barriers.data_ptr(), t.ab_stages, tx_bytes,
                                           4 * self.num_mma_wg, cute.make_layout((*pipe_cluster, 1)), c,
                                           mcast_mode_mn=(1, 0) if c > 1 else (1, 1))
        pipeline_init_arrive(cluster_shape_mn=pipe_cluster, is_relaxed=True)

        gA = cute.local_tile(mA, (m_t, k_t), (None, None, None))  # (m_t, k_t, m, k, l)
        gB = cute.local_tile(mB, (n_t, k_t), (None, None, None))
        k_total = cute.size(gA, mode=[3])
        k_per = (k_total + S - 1) // S
        k_begin = rank * k_per
        k_end = cutlass.min(k_begin + k_per, k_total)
        k_count = cutlass.max(k_end - k_begin, 0)

        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(tma_a, n_rank, cute.make_layout(c), cute.group_modes(sA, 0, 2),
                                                      cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(tma_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2),
                                                      cute.group_modes(gB, 0, 2))
        pipeline_init_wait(cluster_shape_mn=pipe_cluster)
        return storage, sA, sB, ab_pipe, tAsA, tAgA, tBsB, tBgB, k_begin, k_count

    @cute.jit
    def _produce(self, ab_pipe, tma_a: cute.CopyAtom, tAgA: cute.Tensor, tAsA: cute.Tensor,
                 tma_b: cute.CopyAtom, tBgB: cute.Tensor, tBsB: cute.Tensor, m_idx, n_idx, l_idx, k_begin, k_count,
                 rank=0, n_rank=0):
        """Warp 0 of the producer warpgroup: this CTA's K range of the tile, then the ring's tail."""
        a_mask = None
        if cutlass.const_expr(self.mcast_a > 1):
            a_mask = cute.make_layout_image_mask(cute.make_layout((self.cluster_k, self.mcast_a, 1)),
                                                 (rank % self.cluster_k, n_rank, 0), mode=1)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.cfg.tiles.ab_stages)
        state = tma.tma_produce_k_tiles(ab_pipe, state, tma_a, tAgA[(None, m_idx, None, l_idx)], tAsA,
                                           tma_b, tBgB[(None, n_idx, None, l_idx)], tBsB, k_begin, k_count,
                                           a_mask=a_mask,
                                           b_policy=tma.L2_EVICT_FIRST if self.cfg.b_evict_first else None,
                                           a_policy=tma.L2_EVICT_FIRST if self.cfg.a_evict_first else None)
        ab_pipe.producer_tail(state)

    @cute.jit
    def _consume(self, tiled_mma: cute.TiledMma, sA: cute.Tensor, sB: cute.Tensor, ab_pipe, k_count, mma_tidx):
        """A consumer thread: its fp32 fragment of the CTA's partial tile (and the fragment's tile
        coordinates and MMA slice, for the reduction)."""
        m_t, n_t, _ = self.tile_mnk
        thr_mma = tiled_mma.get_slice(cute.make_layout(self.num_mma_wg, stride=128)(mma_tidx // 128))
        thr_mma_c = tiled_mma.get_slice(mma_tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        tCcD = thr_mma_c.partition_C(cute.make_identity_tensor((m_t, n_t)))
        acc = cute.make_rmem_tensor(tCcD.shape, self.acc_dtype)
        acc.fill(0.0)
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.cfg.tiles.ab_stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.cfg.tiles.ab_stages)
        read, release = wgmma.wgmma_mainloop(tiled_mma, acc, tCrA, tCrB, ab_pipe, read, release, k_count)
        return acc, tCcD, thr_mma_c


class GemmSm90SplitKCluster(_SplitKBase):
    KIND = "cluster"
    TILE_NS = TILE_NS
    SPLITS_OK = SPLITS
    A_MCAST_OK = A_MCAST

    def __init__(self, cfg: SplitKClusterConfig):
        super().__init__(cfg)
        if cfg.tiles.ab_stages * T.splitk_stage_bytes(self.tile_mnk[1]) < T.splitk_red_bytes(self.tile_mnk[1]):
            raise ValueError("the operand stages are too small to hold the fp32 reduction tile")

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor,
                 alpha: cutlass.Float32, beta: cutlass.Float32, stream: cuda.CUstream):
        h = self._host_operands(a, b, d, c)
        self.kernel(h.tma_a, h.tma_mA, h.tma_b, h.tma_mB, h.mD, h.mC, alpha, beta, h.tiled_mma, h.sA_layout,
                    h.sB_layout, h.m_tiles).launch(
            grid=h.grid, block=[self.threads, 1, 1], cluster=(self.cfg.splits, self.mcast_a, 1),
            min_blocks_per_mp=1, stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               mD: cute.Tensor, mC: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32,
               tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
               m_tiles: cutlass.Int32):
        cfg = self.cfg
        S = cfg.splits
        m_t, n_t, k_t = self.tile_mnk
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())  # rank + n_rank * S
        rank = cta_rank % S  # K slice
        n_rank = cta_rank // S  # position among the CTAs sharing A (0 without multicast)
        _, n_idx, ml = cute.arch.block_idx()
        m_idx = ml % m_tiles
        l_idx = ml // m_tiles

        # without A multicast the cluster barrier before the reduction is the first point where peers
        # touch each other; with it the ring's init already synchronises the cluster
        storage, sA, sB, ab_pipe, tAsA, tAgA, tBsB, tBgB, k_begin, k_count = self._ring(
            warp_idx, tma_a, mA, tma_b, mB, sA_layout, sB_layout, rank, n_rank)

        # fp32 reduction tile, row-major with padding, over the operand stages (drained by then)
        red_ptr = cute.recast_ptr(storage.sA.data_ptr(), dtype=cutlass.Float32)
        red_layout = cute.make_layout((m_t, n_t), stride=(n_t + T.SPLITK_RED_PAD, 1))
        sRed = cute.make_tensor(red_ptr, red_layout)

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.PRODUCER_REGS)
            if warp_idx == 0:
                self._produce(ab_pipe, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB, m_idx, n_idx, l_idx, k_begin, k_count,
                              rank, n_rank)
        else:
            cute.arch.setmaxregister_increase(self.CONSUMER_REGS)
            acc, _, thr_mma_c = self._consume(tiled_mma, sA, sB, ab_pipe, k_count, tidx - 128)
            # every stage has been consumed: the operand buffers are free for the fp32 partial tile
            pipeline.NamedBarrier(barrier_id=NamedBarrierId.EPILOGUE, num_threads=128 * self.num_mma_wg).arrive_and_wait()
            tCsRed = thr_mma_c.partition_C(sRed)
            for i in cutlass.range_constexpr(cute.size(acc)):
                tCsRed[i] = acc[i]

        # all partial tiles of the cluster are in shared memory after this barrier
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()

        if wg_idx > 0:
            rows = m_t // S
            per_row = n_t // VEC
            chunks = rows * per_row  # VEC consecutive fp32 per chunk
            nthr = 128 * self.num_mma_wg
            mma_tidx = tidx - 128
            m_size = cute.size(mD, mode=[0])
            n_size = cute.size(mD, mode=[1])
            for it in cutlass.range_constexpr((chunks + nthr - 1) // nthr):
                ch = it * nthr + mma_tidx
                if ch < chunks:
                    r = rank * rows + ch // per_row
                    c0 = (ch % per_row) * VEC
                    vals = cute.make_rmem_tensor((VEC,), cutlass.Float32)
                    vals.fill(0.0)
                    off = r * (n_t + T.SPLITK_RED_PAD) + c0
                    for q in cutlass.range_constexpr(S):  # fixed order: bitwise reproducible
                        remote = cute.arch.map_dsmem_ptr(red_ptr, q + n_rank * S) + off
                        for j in cutlass.range_constexpr(VEC):
                            vals[j] = vals[j] + _load_dsmem_f32(remote + j)
                    gm = m_idx * m_t + r
                    gn0 = n_idx * n_t + c0
                    for j in cutlass.range_constexpr(VEC):
                        vals[j] = vals[j] * alpha
                    if gm < m_size:
                        if cutlass.const_expr(cfg.has_c):
                            for j in cutlass.range_constexpr(VEC):
                                if gn0 + j < n_size:
                                    vals[j] = add_beta_c(vals[j], beta, mC[gm, gn0 + j, l_idx])
                        if cutlass.const_expr(cfg.vec_store):
                            if gn0 + VEC <= n_size:
                                outv = cute.make_rmem_tensor((1, VEC), self.d_dtype)
                                for j in cutlass.range_constexpr(VEC):
                                    outv[0, j] = vals[j].to(self.d_dtype)
                                gD = cute.local_tile(mD[None, None, l_idx], (1, VEC), (gm, gn0 // VEC))
                                cute.autovec_copy(outv, gD)
                            else:
                                for j in cutlass.range_constexpr(VEC):
                                    if gn0 + j < n_size:
                                        mD[gm, gn0 + j, l_idx] = vals[j].to(self.d_dtype)
                        else:
                            for j in cutlass.range_constexpr(VEC):
                                if gn0 + j < n_size:
                                    mD[gm, gn0 + j, l_idx] = vals[j].to(self.d_dtype)
        # nobody leaves while a peer may still read its shared memory
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()


# ==================================================================================================
# Split-K with a fixup by the last CTA ("fixup"): not limited by the cluster size
# ==================================================================================================
FIXUP_TILE_NS = (16, 32, 64, 128, 256)
FIXUP_SPLITS = (2, 3, 4, 5, 6, 7, 8)
FIXUP_LOADS_IN_FLIGHT = 16  # 16-byte partial loads per thread per group in the last CTA's sum
FIXUP_VEC = fixup.PARTIAL_VEC  # fp32 per partial-tile chunk: one 16-byte store / load per thread and chunk


class GemmSm90SplitKFixup(_SplitKBase):
    """S CTAs (no cluster) compute K slices of one output tile; each publishes its fp32 partial to a
    global workspace and bumps the tile's counter (:mod:`cute_kernels.common.fixup`); the CTA that
    counts last sums the S partials in rank order (its own read back too: bitwise deterministic),
    applies alpha / beta * C, stores D and resets the counter.  Nobody waits for anybody, so any
    residency works and the grid can be as large as tiles x S."""

    KIND = "fixup"
    TILE_NS = FIXUP_TILE_NS
    SPLITS_OK = FIXUP_SPLITS
    A_MCAST_OK = A_MCAST

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor, ws: cute.Tensor,
                 cnt: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32, stream: cuda.CUstream):
        h = self._host_operands(a, b, d, c)
        self.kernel(h.tma_a, h.tma_mA, h.tma_b, h.tma_mB, h.mD, h.mC, ws, cnt, alpha, beta, h.tiled_mma, h.sA_layout,
                    h.sB_layout, h.m_tiles, h.n_tiles).launch(
            grid=h.grid, block=[self.threads, 1, 1], cluster=(1, self.mcast_a, 1) if self.mcast_a > 1 else None,
            min_blocks_per_mp=1, stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               mD: cute.Tensor, mC: cute.Tensor, mWs: cute.Tensor, mCnt: cute.Tensor, alpha: cutlass.Float32,
               beta: cutlass.Float32, tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout,
               sB_layout: cute.ComposedLayout, m_tiles: cutlass.Int32, n_tiles: cutlass.Int32):
        cfg = self.cfg
        S = cfg.splits
        m_t, n_t, k_t = self.tile_mnk
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        rank, n_idx, ml = cute.arch.block_idx()
        n_rank = 0
        if cutlass.const_expr(self.mcast_a > 1):
            n_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())  # cluster (1, c, 1)
        m_idx = ml % m_tiles
        l_idx = ml // m_tiles
        tile_id = ml * n_tiles + n_idx

        storage, sA, sB, ab_pipe, tAsA, tAgA, tBsB, tBgB, k_begin, k_count = self._ring(
            warp_idx, tma_a, mA, tma_b, mB, sA_layout, sB_layout, rank, n_rank)
        sFlag = storage.flag.get_tensor(cute.make_layout((4,)))

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.PRODUCER_REGS)
            if warp_idx == 0:
                self._produce(ab_pipe, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB, m_idx, n_idx, l_idx, k_begin, k_count,
                              rank, n_rank)
        else:
            cute.arch.setmaxregister_increase(self.CONSUMER_REGS)
            nthr = 128 * self.num_mma_wg
            mma_tidx = tidx - 128
            acc, tCcD, _ = self._consume(tiled_mma, sA, sB, ab_pipe, k_count, mma_tidx)

            V = FIXUP_VEC
            chunks = cute.size(acc) // V
            ws = fixup.partial_workspace(mWs, nthr, cute.size(acc), m_t * n_t)  # slot = tile_id * S + rank
            slot0 = tile_id * S
            # a CTA past the last N tile (A multicast pads the grid to whole clusters) only fed its peers
            if n_idx < n_tiles:
                if fixup.publish_partial(acc, ws, mma_tidx, slot0 + rank, mCnt, tile_id, sFlag, NamedBarrierId.EPILOGUE,
                                         nthr, S):
                    # groups of G chunks: G x S 16-byte loads in flight per thread (the D stores between
                    # groups keep the compiler from hoisting more loads, which would spill), summed in rank
                    # order into acc (whose own value is in the workspace already), then stored
                    G = max(1, FIXUP_LOADS_IN_FLIGHT // S)
                    m_size = cute.size(mD, mode=[0])
                    n_size = cute.size(mD, mode=[1])
                    for g in cutlass.range_constexpr((chunks + G - 1) // G):
                        for j in cutlass.range_constexpr(g * G, min(chunks, (g + 1) * G)):
                            for q in cutlass.range_constexpr(S):  # fixed rank order: bitwise reproducible
                                fixup.add_partial(acc, ws, mma_tidx, j, slot0 + q, overwrite=q == 0)
                        for i in cutlass.range_constexpr(g * G * V, min(chunks, (g + 1) * G) * V):
                            r, cn = tCcD[i]
                            gm = m_idx * m_t + r
                            gn = n_idx * n_t + cn
                            if gm < m_size and gn < n_size:
                                v = acc[i] * alpha
                                if cutlass.const_expr(cfg.has_c):
                                    v = add_beta_c(v, beta, mC[gm, gn, l_idx])
                                mD[gm, gn, l_idx] = v.to(self.d_dtype)
