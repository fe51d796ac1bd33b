"""The dense attention backward kernel on Hopper (FlashAttention-2/3 work partitioning on wgmma): dK,
dV and the fp32 dQ accumulation of ``O = softmax(Q K^T * scale) V``, from the forward's natural-log
LSE and the pre-pass's ``Delta = rowsum(dO * O)`` (:mod:`.backward_prepost`).

One CTA per (KV tile of ``tile_n`` = 128 keys, query head, batch); 3 warpgroups
(:class:`layouts.attention_backward.BwdTile`):

* warpgroup 0, the producer (24 registers): warp 0 (``LOAD_WARP``) loads the K and V tiles of the
  query head's KV head once (one mbarrier, :class:`~cute_kernels.common.ring.TxRing`), then, for every
  query tile that sees one of the CTA's keys, its Q, dO and the pre-pass's LSE (base 2) and Delta rows
  into one ``stages``-deep TMA ring (:func:`~cute_kernels.common.ring.make_tma_pipeline`,
  :func:`~cute_kernels.common.tma.tma_produce_stage`); warp 1 (``DQ_WARP``) adds each consumer
  warpgroup's fp32 dQ tile into the dQ accumulator (B, Hq, Sq_pad, D) in global memory with one TMA
  reduce-add per tile (``cp.reduce.async.bulk.tensor``), so the consumers never wait on it;
* warpgroups 1 and 2, the consumers (240 registers): warpgroup w owns keys 64w .. 64w+63 of the tile
  and their dK, dV accumulators.  Per query tile m (``tile_m`` rows, ring stage s):

  1. S^T = K Q^T and dP^T = V dO^T (wgmma, both operands from shared memory; rows are keys, columns
     queries);
  2. mask (key-length tail, causal diagonal: only the tiles that need it), P^T = exp2(S^T * scale_log2
     - LSE_log2[query]) (:func:`~cute_kernels.common.softmax.probs_from_lse`), dS^T = P^T (dP^T -
     Delta[query]);
  3. dS^T to stage s's shared buffer (stmatrix) while dV += P^T dO runs (P^T in 16 bits, the
     accumulator relabelled as the forward's P, is the register A operand; dO the MN-major B operand);
  4. both warpgroups wrote their rows of dS^T (one named barrier): dQ = dS K (wgmma, the transposed dS^T
     view and the transposed K tile, both MN-major; warpgroup w computes its half of dQ's columns),
     then dK += dS^T Q (register A operand) runs while dQ goes to the warpgroup's fp32 tile in shared
     memory for the dQ warp (two named barriers per warpgroup: tile free, tile written).

  A dS^T buffer per stage: a warpgroup writes stage s's while the other may still be reading the
  previous stage's; it last read stage s's two tiles ago, before it passed the barrier of step 4 of the
  tile in between.

Epilogue: with one query head per KV head (``direct_kv``) dK (times the softmax scale) and dV go, in
the input dtype, through the K and V buffers (stmatrix, once no wgmma reads them) to two TMA stores
(rows past Sk clipped; a KV tile no query sees, under a window, stores zeros); otherwise (GQA) each
thread adds its rows, unscaled, into the fp32 accumulators (B, Sk, Hkv, D) -- the query heads of a KV
head add into the same rows -- and the post-pass scales and converts them (:mod:`.backward_prepost`).

Deterministic mode (``deterministic``): the fp32 adds into one place happen in a fixed order, so the
bits do not depend on which CTA runs first.  The dQ warp adds a query tile's dQ after the KV tiles
before it in the tile's order did: dense, launch order (``n_block``, the CTAs start together);
causal and windowed, from the top (``n_block_last - n_block``: the order in which the ranges reach
the query tile, the highest KV tile first).  It waits on the tile's int32 semaphore (B, Hq, Sq_pad /
64) until it reads that number, adds,
waits for its adds to complete and counts the semaphore up; with GQA, the query heads of a KV head add
their dK / dV rows in head order on a semaphore per KV tile (B, Hkv, KV tiles)
(:func:`~cute_kernels.common.barriers.wait_count`, :func:`~cute_kernels.common.barriers.count_up`).
With ``BwdTile.dq_warps = 2`` two dQ warps (warps 1 and 2) take the walk's query tiles by parity, each
with its own dQ barriers per warpgroup, so one add's completion wait overlaps the other warp's tile.

Query tiles of a KV tile n (:mod:`.backward_mask`): causal (bottom-right), query ``q`` sees key ``k``
iff ``k <= q + Sk - Sq``, so tile n is seen from query tile ``(n * tile_n + Sq - Sk) // tile_m`` on;
the tiles that cross the diagonal and all tiles of the key-length tail are masked, the others not.
Query rows past Sq (zero-filled by the TMA unit) have LSE_log2 = +inf in the padded pre-pass
buffers, so their P is 0 with no mask; rows that see no key likewise (their forward LSE is -inf).
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from layouts import attention_backward as LB

from ..common import ring, tma
from ..common.dtypes import to_cutlass
from . import forward_seqlen as fsl
from . import forward_softmax as fs
from .backward_config import FlashBwdConfig, bwd_config  # noqa: F401  (re-exported)
from .backward_epilogue import BwdEpilogue
from .backward_mask import BwdTileOrder
from .backward_step import BAR_DS_FULL, BwdQueryStep
#: ln 2: the softmax scale is ``scale_log2 * LN2``
LN2 = math.log(2.0)
#: the producer warpgroup's warps: the loads (Q, dO, LSE, Delta; K, V once) and the dQ reduce-adds
#: (deterministic with ``BwdTile.dq_warps = 2``: warps DQ_WARP and DQ_WARP + 1)
LOAD_WARP, DQ_WARP = 0, 1


def _rows_first(t: cute.Tensor) -> cute.Tensor:
    """(B, H, S) -> (S, H, B): the row mode first, as the TMA atom and local_tile take it."""
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=[2, 1, 0]))


class FlashAttnBwdSm90(BwdQueryStep, BwdEpilogue, BwdTileOrder):
    """The kernel for one :class:`FlashBwdConfig`; ``__call__`` is the ``@cute.jit`` host entry."""

    def __init__(self, cfg: FlashBwdConfig):
        self.cfg, t = cfg, cfg.tile
        self.dtype = to_cutlass(cfg.dtype)
        self.D, self.tile_m, self.tile_n, self.stages = t.head_dim, t.tile_m, t.tile_n, t.stages
        self.causal = cfg.causal
        self.num_mma_threads = 128 * t.consumer_warpgroups  # the consumer warpgroups' threads
        self.epilogue_barrier = BAR_DS_FULL  # the consumers' barrier, free again after the loop

    # ---------------------------------------------------------------- host entry (traced once)
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE2: cute.Tensor,
                 mDelta: cute.Tensor, mdQacc: cute.Tensor, mdKacc: cute.Tensor, mdVacc: cute.Tensor,
                 scale_log2: Float32, stream, *variant):
        """q, dout (B, Sq, Hq, D), k, v (B, Sk, Hkv, D) in the input dtype; the pre-pass's LSE_log2 and
        Delta (B, Hq, Sq_pad) fp32; the fp32 accumulators dQ (B, Hq, Sq_pad, D, zeroed by the pre-pass),
        dK and dV (B, Sk, Hkv, D, zeroed); then :attr:`FlashBwdConfig.variant_args`."""
        self.setup_and_launch(mQ, mK, mV, mdO, mLSE2, mDelta, mdQacc, mdKacc, mdVacc, scale_log2, stream,
                              variant=variant)

    @cute.jit
    def call_window(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE2: cute.Tensor,
                    mDelta: cute.Tensor, mdQacc: cute.Tensor, mdKacc: cute.Tensor, mdVacc: cute.Tensor,
                    scale_log2: Float32, window_left: Int32, window_right: Int32, stream, *variant):
        """:meth:`__call__` with a sliding window (sides >= 0, :data:`~.forward_softmax.WINDOW_UNBOUNDED`: none)."""
        self.setup_and_launch(mQ, mK, mV, mdO, mLSE2, mDelta, mdQacc, mdKacc, mdVacc, scale_log2, stream, window_left,
                              window_right, variant=variant)

    @cute.jit
    def setup_and_launch(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                         mLSE2: cute.Tensor, mDelta: cute.Tensor, mdQacc: cute.Tensor, mdKacc: cute.Tensor,
                         mdVacc: cute.Tensor, scale_log2: Float32, stream, window_left=None, window_right=None,
                         variant=()):
        """The entries' common body: TMA atoms, shared storage, grid, launch (window sides: None if dense;
        ``variant``: the trailing arguments, :meth:`variant`)."""
        t = self.cfg.tile
        named = self.variant(variant)
        softcap_scale = named.get("softcap_scale")
        mSemQ, mSemKV = named.get("dq_semaphore"), named.get("dkv_semaphore")
        seq = (named.get("cu_seqlens_q"), named.get("cu_seqlens_k"), named.get("max_seqlen_q"),
               named.get("max_seqlen_k"), named.get("gapped"))
        if const_expr(mQ.element_type != self.dtype or mK.element_type != self.dtype
                      or mV.element_type != self.dtype or mdO.element_type != self.dtype):
            raise TypeError(f"FlashAttnBwdSm90: q, k, v, dout must all be {self.dtype}")
        batch, seqlen_q, num_heads = mQ.shape[0], mQ.shape[1], mQ.shape[2]
        seqlen_k = mK.shape[1]
        qhead_per_kvhead = num_heads // mK.shape[2]
        mQ, mK, mV, mdO = (fsl.bshd_to_sdhb(x) for x in (mQ, mK, mV, mdO))
        mLSE2, mDelta = _rows_first(mLSE2), _rows_first(mDelta)
        # (B, Hq, Sq_pad, D) -> (Sq_pad, D, Hq, B): rows first, as the TMA reduce takes it
        mdQacc = cute.make_tensor(mdQacc.iterator, cute.select(mdQacc.layout, mode=[2, 3, 1, 0]))

        sQ_layout = LB.make_bwd_smem_layout_q(t)
        sK_layout = LB.make_bwd_smem_layout_k(t)
        sV_layout = LB.make_bwd_smem_layout_v(t)
        sdS_layout = LB.make_bwd_smem_layout_ds(t)
        sdQ_layout = LB.make_bwd_smem_layout_dq(t)
        sRow_layout = cute.make_layout((self.tile_m, self.stages))
        tiled_mma_sdp = LB.make_bwd_tiled_mma_sdp(t)
        tiled_mma_dkv = LB.make_bwd_tiled_mma_dkv(t)
        tiled_mma_dq = LB.make_bwd_tiled_mma_dq(t)

        tma_q, tma_mQ = tma.make_tma_load(mQ, sQ_layout, (self.tile_m, self.D))
        tma_do, tma_mdO = tma.make_tma_load(mdO, sQ_layout, (self.tile_m, self.D))
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_k, tma_mK = cpasync.make_tiled_tma_atom(g2s, mK, sK_layout, (self.tile_n, self.D))
        tma_v, tma_mV = cpasync.make_tiled_tma_atom(g2s, mV, sV_layout, (self.tile_n, self.D))
        row_box = cute.make_layout(self.tile_m)
        tma_lse, tma_mLSE = cpasync.make_tiled_tma_atom(g2s, mLSE2, row_box, (self.tile_m,))
        tma_delta, tma_mDelta = cpasync.make_tiled_tma_atom(g2s, mDelta, row_box, (self.tile_m,))
        dq_box = (t.dq_rows_per_wg, t.dq_cols_per_wg)
        tma_dq, tma_mdQ = cpasync.make_tiled_tma_atom(cpasync.CopyReduceBulkTensorTileS2GOp(), mdQacc,
                                                      cute.select(sdQ_layout, mode=[0, 1]), dq_box)
        tma_dk = tma_dv = mdK_rows = mdV_rows = None
        if const_expr(self.cfg.direct_kv):  # dk, dv in the input dtype: TMA stores from the K / V buffers
            if const_expr(self.cfg.varlen):  # and a sequence's partial last tile by predicated stores
                mdK_rows, mdV_rows = fsl.bshd_to_sdhb(mdKacc), fsl.bshd_to_sdhb(mdVacc)
            s2g = cpasync.CopyBulkTensorTileS2GOp()
            tma_dk, mdKacc = cpasync.make_tiled_tma_atom(s2g, fsl.bshd_to_sdhb(mdKacc), sK_layout, (self.tile_n, self.D))
            tma_dv, mdVacc = cpasync.make_tiled_tma_atom(s2g, fsl.bshd_to_sdhb(mdVacc), sV_layout, (self.tile_n, self.D))
        elif const_expr(self.cfg.kv_reduce):  # GQA: a warpgroup's fp32 tile reduce-added from the K / V buffers
            red, acc_box = cpasync.CopyReduceBulkTensorTileS2GOp(), (LB.BWD_WG_KEYS, self.D)
            sAcc_layout = LB.make_bwd_smem_layout_kv_acc(t)
            tma_dk, mdKacc = cpasync.make_tiled_tma_atom(red, fsl.bshd_to_sdhb(mdKacc), sAcc_layout, acc_box)
            tma_dv, mdVacc = cpasync.make_tiled_tma_atom(red, fsl.bshd_to_sdhb(mdVacc), sAcc_layout, acc_box)

        stages = self.stages

        @cute.struct
        class SharedStorage:
            kv_bar: cute.struct.MemRange[cutlass.Int64, 1]
            q_bars: cute.struct.MemRange[cutlass.Int64, 2 * stages * (1 + t.two_rings)]
            sLSE: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sRow_layout)], 128]
            sDelta: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sRow_layout)], 128]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sdS_layout)], 1024]
            sdQ: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sdQ_layout)], 1024]

        self.shared_storage = SharedStorage
        num_n_blocks = (seqlen_k + self.tile_n - 1) // self.tile_n
        if const_expr(self.cfg.varlen):  # the sequences' KV tiles, gapped or a row per sequence (tile_coords)
            nseq = seq[1].shape[0] - 1
            gapped = cutlass.min(cutlass.max(seq[4], 0), 1)
            row = (seq[3] + self.tile_n - 1) // self.tile_n
            num_n_blocks = gapped * fsl.gapped_grid_bound(seqlen_k, nseq, self.tile_n) + (1 - gapped) * row
            batch = gapped + (1 - gapped) * nseq
        self.kernel(
            tma_q, tma_mQ, tma_do, tma_mdO, tma_k, tma_mK, tma_v, tma_mV, tma_lse, tma_mLSE, tma_delta, tma_mDelta,
            tma_dq, tma_mdQ, mdKacc, mdVacc, tma_dk, tma_dv, scale_log2, Int32(seqlen_q), Int32(seqlen_k), Int32(qhead_per_kvhead),
            tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq, sQ_layout, sK_layout, sV_layout, sdS_layout, sdQ_layout,
            sRow_layout, window_left, window_right, softcap_scale, mSemQ, mSemKV, seq, mdK_rows, mdV_rows,
        ).launch(
            grid=[num_n_blocks, num_heads, batch],
            block=[t.threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=1,
        )

    # ---------------------------------------------------------------- device code
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, mQ: cute.Tensor, tma_do: cute.CopyAtom, mdO: cute.Tensor,
               tma_k: cute.CopyAtom, mK: cute.Tensor, tma_v: cute.CopyAtom, mV: cute.Tensor,
               tma_lse: cute.CopyAtom, mLSE: cute.Tensor, tma_delta: cute.CopyAtom, mDelta: cute.Tensor,
               tma_dq: cute.CopyAtom, mdQacc: cute.Tensor, mdKacc: cute.Tensor, mdVacc: cute.Tensor,
               tma_dk, tma_dv, scale_log2: Float32, seqlen_q: Int32, seqlen_k: Int32, qhead_per_kvhead: Int32,
               tiled_mma_sdp: cute.TiledMma, tiled_mma_dkv: cute.TiledMma, tiled_mma_dq: cute.TiledMma,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
               sdS_layout: cute.ComposedLayout, sdQ_layout: cute.ComposedLayout, sRow_layout: cute.Layout,
               window_left, window_right, softcap_scale, mSemQ, mSemKV, seq, mdK_rows, mdV_rows):
        tidx, _, _ = cute.arch.thread_idx()
        n_block, head, batch = self.tile_coords(seqlen_k, seq, seqlen_q)
        # this sequence's lengths and first rows (packed: in q / k / v and in the padded row buffers); the
        # kernel works in sequence-local rows from here on
        seqlen_q, seqlen_k, off_q, off_k, off_p = self.sequence(batch, seqlen_q, seqlen_k, seq)
        work = (tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, tma_lse, mLSE, tma_delta, mDelta, tma_dq, mdQacc, mdKacc,
                mdVacc, tma_dk, tma_dv, scale_log2, seqlen_q, seqlen_k, qhead_per_kvhead, tiled_mma_sdp, tiled_mma_dkv,
                tiled_mma_dq, sQ_layout, sK_layout, sV_layout, sdS_layout, sdQ_layout, sRow_layout, window_left,
                window_right, softcap_scale, mSemQ, mSemKV, seq, mdK_rows, mdV_rows, tidx, n_block, head, batch,
                off_q, off_k, off_p)
        if const_expr(self.cfg.varlen):  # a gap of the numbering: exit
            if n_block >= 0 and n_block * self.tile_n < seqlen_k:
                self.kv_tile(*work)
        else:
            self.kv_tile(*work)

    @cute.jit
    def kv_tile(self, tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, tma_lse, mLSE, tma_delta, mDelta, tma_dq, mdQacc,
                mdKacc, mdVacc, tma_dk, tma_dv, scale_log2, seqlen_q, seqlen_k, qhead_per_kvhead, tiled_mma_sdp,
                tiled_mma_dkv, tiled_mma_dq, sQ_layout, sK_layout, sV_layout, sdS_layout, sdQ_layout, sRow_layout,
                window_left, window_right, softcap_scale, mSemQ, mSemKV, seq, mdK_rows, mdV_rows, tidx, n_block,
                head, batch, off_q, off_k, off_p):
        """One CTA's work (:meth:`kernel`, lengths and offsets already the sequence's)."""
        t = self.cfg.tile
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)

        if warp_idx == LOAD_WARP:
            for atom in (tma_q, tma_do, tma_k, tma_v, tma_lse, tma_delta, tma_dq):
                cpasync.prefetch_descriptor(atom)
            if const_expr(self.cfg.direct_kv or self.cfg.kv_reduce):
                cpasync.prefetch_descriptor(tma_dk)
                cpasync.prefetch_descriptor(tma_dv)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        kv_ring = ring.TxRing(storage.kv_bar.data_ptr(), 1)
        if tidx == 0:
            kv_ring.init()
        consumer_warps = self.num_mma_threads // 32
        if const_expr(t.two_rings):  # Q + LSE and dO + Delta in rings of their own (handed back apart)
            half = t.stage_bytes // 2
            pipe_q = (ring.make_tma_pipeline(storage.q_bars.data_ptr(), self.stages, half, consumer_warps,
                                             cute.make_layout((1, 1, 1)), 1),
                      ring.make_tma_pipeline(storage.q_bars.data_ptr() + 2 * self.stages, self.stages, half,
                                             consumer_warps, cute.make_layout((1, 1, 1)), 1))
        else:
            pipe_q = ring.make_tma_pipeline(storage.q_bars.data_ptr(), self.stages, t.stage_bytes, consumer_warps,
                                            cute.make_layout((1, 1, 1)), 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sdO = storage.sdO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sdS = storage.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
        sdQ = storage.sdQ.get_tensor(sdQ_layout.outer, swizzle=sdQ_layout.inner)
        sLSE = storage.sLSE.get_tensor(sRow_layout)
        sDelta = storage.sDelta.get_tensor(sRow_layout)
        sAcc = None  # kv_reduce: warpgroup w's fp32 dK / dV tile in the K (w = 0) or V (w = 1) buffer's bytes
        if const_expr(self.cfg.kv_reduce):
            sAcc_layout = LB.make_bwd_smem_layout_kv_acc(t)
            sAcc = tuple(buf.get_tensor(sAcc_layout.outer, swizzle=sAcc_layout.inner, dtype=Float32)
                         for buf in (storage.sK, storage.sV))

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(t.producer_regs)
            m_min, m_max, _, _ = self.m_range(n_block, seqlen_q, seqlen_k, window_left, window_right)
            if warp_idx == LOAD_WARP:
                self.produce(tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, tma_lse, mLSE, tma_delta, mDelta, sQ, sdO,
                             sK, sV, sLSE, sDelta, kv_ring, pipe_q, n_block, head, head // qhead_per_kvhead, batch,
                             m_min, m_max, off_q, off_k, off_p, seqlen_q, seqlen_k)
            elif const_expr(self.cfg.deterministic and t.dq_warps == 2):  # a parity of the walk's query tiles each
                if warp_idx == DQ_WARP:
                    self.reduce_dq_turns(tma_dq, mdQacc, sdQ, head, batch, m_min, m_max, mSemQ, n_block, seqlen_q,
                                         seqlen_k, window_right, off_p, 0)
                elif warp_idx == DQ_WARP + 1:
                    self.reduce_dq_turns(tma_dq, mdQacc, sdQ, head, batch, m_min, m_max, mSemQ, n_block, seqlen_q,
                                         seqlen_k, window_right, off_p, 1)
            elif warp_idx == DQ_WARP:
                self.reduce_dq(tma_dq, mdQacc, sdQ, head, batch, m_min, m_max, mSemQ, n_block, seqlen_q, seqlen_k,
                               window_right, off_p)
        else:
            cute.arch.setmaxregister_increase(t.consumer_regs)
            m_min, m_max, m_lo, m_hi = self.m_range(n_block, seqlen_q, seqlen_k, window_left, window_right)
            self.consume(tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq, sQ, sdO, sK, sV, sdS, sdQ, sLSE, sDelta,
                         kv_ring, pipe_q, mdKacc, mdVacc, tma_dk, tma_dv, scale_log2, seqlen_q, seqlen_k, n_block,
                         qhead_per_kvhead, m_min, m_max, m_lo, m_hi, tidx - 128, window_left, window_right,
                         softcap_scale, mSemKV, seq, (head, batch, off_k) if const_expr(self.cfg.varlen) else None,
                         mdK_rows, mdV_rows, sAcc)

    def variant(self, args: tuple) -> dict:
        """An entry's trailing arguments by name (:attr:`FlashBwdConfig.variant_args`; absent: off)."""
        names = self.cfg.variant_args
        if len(args) != len(names):
            raise TypeError(f"FlashAttnBwdSm90: this configuration's entries end with {names}, got {len(args)} "
                            "trailing arguments")
        return dict(zip(names, args))

    @cute.jit
    def produce(self, tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, tma_lse, mLSE, tma_delta, mDelta, sQ, sdO, sK,
                sV, sLSE, sDelta, kv_ring: ring.TxRing, pipe_q, n_block, head, head_kv, batch, m_min, m_max, off_q,
                off_k, off_p, seqlen_q, seqlen_k):
        """The load warp: K and V once, then the query tiles ``m_min .. m_max - 1`` (Q, dO, LSE, Delta per stage)."""
        t = self.cfg.tile
        one = cute.make_layout(1)
        if m_max > m_min:
            gK = cute.local_tile(self.rows(mK, off_k, head_kv, batch), (self.tile_n, self.D), (n_block, 0))
            gV = cute.local_tile(self.rows(mV, off_k, head_kv, batch), (self.tile_n, self.D), (n_block, 0))
            tKsK, tKgK = cpasync.tma_partition(tma_k, 0, one, cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
            tVsV, tVgV = cpasync.tma_partition(tma_v, 0, one, cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
            kv_ring.arm(0, 2 * t.kv_tile_bytes)
            cute.copy(tma_k, tKgK, tKsK, tma_bar_ptr=kv_ring.barrier(0))
            cute.copy(tma_v, tVgV, tVsV, tma_bar_ptr=kv_ring.barrier(0))

            gQ = cute.local_tile(self.rows(mQ, off_q, head, batch), (self.tile_m, self.D), (None, 0))
            gdO = cute.local_tile(self.rows(mdO, off_q, head, batch), (self.tile_m, self.D), (None, 0))
            gLSE = cute.local_tile(self.rows(mLSE, off_p, head, batch), (self.tile_m,), (None,))
            gDelta = cute.local_tile(self.rows(mDelta, off_p, head, batch), (self.tile_m,), (None,))
            tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, one, cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
            tOsO, tOgO = cpasync.tma_partition(tma_do, 0, one, cute.group_modes(sdO, 0, 2),
                                               cute.group_modes(gdO, 0, 2))
            tLsL, tLgL = cpasync.tma_partition(tma_lse, 0, one, cute.group_modes(sLSE, 0, 1),
                                               cute.group_modes(gLSE, 0, 1))
            tDsD, tDgD = cpasync.tma_partition(tma_delta, 0, one, cute.group_modes(sDelta, 0, 1),
                                               cute.group_modes(gDelta, 0, 1))
            copies = ((tma_q, tQgQ, tQsQ), (tma_do, tOgO, tOsO), (tma_lse, tLgL, tLsL), (tma_delta, tDgD, tDsD))
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            if const_expr(t.two_rings):  # Q + LSE and dO + Delta on their own rings, the one the consumers'
                # first GEMM reads first: dO (dP^T) with kv_split_d, else Q (S^T)
                do_first = const_expr(t.kv_split_d)
                state_do = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                for i in cutlass.range(m_max - m_min, unroll=1):
                    m_block = self.tile_at(m_min, i, m_max - m_min, n_block, seqlen_q, seqlen_k)
                    if const_expr(do_first):
                        state_do = tma.tma_produce_stage(pipe_q[1], state_do, (copies[1], copies[3]), m_block)
                    state = tma.tma_produce_stage(pipe_q[0], state, (copies[0], copies[2]), m_block)
                    if const_expr(not do_first):
                        state_do = tma.tma_produce_stage(pipe_q[1], state_do, (copies[1], copies[3]), m_block)
            else:
                for i in cutlass.range(m_max - m_min, unroll=1):
                    state = tma.tma_produce_stage(pipe_q, state, copies,
                                                  self.tile_at(m_min, i, m_max - m_min, n_block, seqlen_q, seqlen_k))

    @cute.jit
    def consume(self, tiled_mma_sdp: cute.TiledMma, tiled_mma_dkv: cute.TiledMma, tiled_mma_dq: cute.TiledMma,
                sQ, sdO, sK, sV, sdS, sdQ, sLSE, sDelta, kv_ring: ring.TxRing, pipe_q, mdKacc: cute.Tensor,
                mdVacc: cute.Tensor, tma_dk, tma_dv, scale_log2: Float32, seqlen_q, seqlen_k, n_block, qhead_per_kvhead, m_min,
                m_max, m_lo, m_hi, mma_tidx, window_left, window_right, softcap_scale, mSemKV, seq, packed, mdK_rows,
                mdV_rows, sAcc=None):
        """Consumer warpgroups: every query tile of the KV tile (masked ones ``m_min .. m_lo - 1``,
        unmasked ``m_lo .. m_hi - 1``, a window's masked ``m_hi .. m_max - 1``), then the dK / dV epilogue."""
        wg = cute.arch.make_warp_uniform(mma_tidx // 128)
        wg_first = wg * 128
        thr_sdp = tiled_mma_sdp.get_slice(mma_tidx)
        wg_sdp = tiled_mma_sdp.get_slice(wg_first)
        thr_dkv = tiled_mma_dkv.get_slice(mma_tidx)
        wg_dkv = tiled_mma_dkv.get_slice(wg_first)
        wg_dq = tiled_mma_dq.get_slice(wg_first)

        # S^T = K Q^T, dP^T = V dO^T: A (MMA, 1, D/16), B (MMA, 1, D/16, stages)
        tSrK = tiled_mma_sdp.make_fragment_A(wg_sdp.partition_A(sK))
        tSrQ = tiled_mma_sdp.make_fragment_B(wg_sdp.partition_B(sQ))
        tPrV = tiled_mma_sdp.make_fragment_A(wg_sdp.partition_A(sV))
        tPrdO = tiled_mma_sdp.make_fragment_B(wg_sdp.partition_B(sdO))
        # dK += dS^T Q, dV += P^T dO: B = Q / dO as (D, tile_m, stages), D contiguous (MN-major)
        t_order = cute.make_ordered_layout((self.D, self.tile_m, self.stages), order=(1, 0, 2))
        tKrQt = tiled_mma_dkv.make_fragment_B(wg_dkv.partition_B(cute.composition(sQ, t_order)))
        tVrdOt = tiled_mma_dkv.make_fragment_B(wg_dkv.partition_B(cute.composition(sdO, t_order)))
        # kv_split_d: their A operands dS^T (buffer 0) and P^T (buffer 1) from shared memory
        smem_a = None
        if const_expr(self.cfg.tile.kv_split_d):
            smem_a = (tiled_mma_dkv.make_fragment_A(wg_dkv.partition_A(sdS[None, None, 0])),
                      tiled_mma_dkv.make_fragment_A(wg_dkv.partition_A(sdS[None, None, 1])))
        # dQ = dS K: A = dS as (tile_m, tile_n, stages) (the transposed dS^T), B = K as (D, tile_n)
        sdS_t = cute.composition(sdS, cute.make_ordered_layout((self.tile_m, self.tile_n, self.stages),
                                                               order=(1, 0, 2)))
        sK_t = cute.composition(sK, cute.make_ordered_layout((self.D, self.tile_n), order=(1, 0)))
        tQrdS = tiled_mma_dq.make_fragment_A(wg_dq.partition_A(sdS_t))
        tQrK = tiled_mma_dq.make_fragment_B(wg_dq.partition_B(sK_t))
        # this thread's dQ values in its warpgroup's fp32 tile: the tiled MMA's first warpgroup partitions
        # a (rows, cols) tile as warpgroup w's threads hold theirs
        tdQsdQ = tiled_mma_dq.get_slice(mma_tidx % 128).partition_C(sdQ[None, None, wg])

        acc_dK = cute.make_rmem_tensor(thr_dkv.partition_shape_C((self.tile_n, self.D)), Float32)
        acc_dV = cute.make_rmem_tensor(thr_dkv.partition_shape_C((self.tile_n, self.D)), Float32)
        acc_dK.fill(0.0)
        acc_dV.fill(0.0)

        # (key, query) coordinates of this thread's S^T elements within the tile
        cS = cute.make_identity_tensor((self.tile_n, self.tile_m))
        tScS_mn = fs.acc_mn_view(thr_sdp.partition_C(cS))

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        if const_expr(self.cfg.tile.two_rings):  # (the Q + LSE ring's state, the dO + Delta ring's)
            read = (read, pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages))
        carry = None  # dk_carry: dK's shared-memory form (tiled MMA, dS^T and Q^T fragments); read, then
        # the previous tile's state (its stage handed back in the next tile, once that tile's S^T wait
        # has seen this tile's dK finish)
        if const_expr(self.cfg.tile.dk_carry):
            tiled_mma_dk = LB.make_bwd_tiled_mma_dkv(self.cfg.tile, a_smem=True)
            wg_dk = tiled_mma_dk.get_slice(wg_first)
            carry = (tiled_mma_dk, tiled_mma_dk.make_fragment_A(wg_dk.partition_A(sdS)),
                     tiled_mma_dk.make_fragment_B(wg_dk.partition_B(cute.composition(sQ, t_order))))
            read = (read, pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages))
        if m_max > m_min:
            kv_ring.wait(0, 0)
        for i in cutlass.range(m_lo - m_min, unroll=1):
            read = self.query_tile(tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq, tSrK, tSrQ, tPrV, tPrdO, tKrQt,
                                   tVrdOt, tQrdS, tQrK, acc_dK, acc_dV, sdS, tdQsdQ, sLSE, sDelta, tScS_mn, pipe_q,
                                   read, scale_log2, seqlen_q, seqlen_k, n_block,
                                   self.tile_at(m_min, i, m_lo - m_min, n_block, seqlen_q, seqlen_k), mma_tidx, wg,
                                   True, window_left, window_right, softcap_scale, smem_a, carry, i)
        for i in cutlass.range(m_hi - m_lo, unroll=1):
            read = self.query_tile(tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq, tSrK, tSrQ, tPrV, tPrdO, tKrQt,
                                   tVrdOt, tQrdS, tQrK, acc_dK, acc_dV, sdS, tdQsdQ, sLSE, sDelta, tScS_mn, pipe_q,
                                   read, scale_log2, seqlen_q, seqlen_k, n_block,
                                   self.tile_at(m_lo, i, m_hi - m_lo, n_block, seqlen_q, seqlen_k), mma_tidx, wg,
                                   False, softcap_scale=softcap_scale, smem_a=smem_a, carry=carry,
                                   walk_index=m_lo - m_min + i)
        if const_expr(self.cfg.window):  # the window's far edge: masked again
            for i in cutlass.range(m_max - m_hi, unroll=1):
                read = self.query_tile(tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq, tSrK, tSrQ, tPrV, tPrdO, tKrQt,
                                       tVrdOt, tQrdS, tQrK, acc_dK, acc_dV, sdS, tdQsdQ, sLSE, sDelta, tScS_mn,
                                       pipe_q, read, scale_log2, seqlen_q, seqlen_k, n_block, m_hi + i, mma_tidx, wg,
                                       True, window_left, window_right, softcap_scale, smem_a, carry, m_hi - m_min + i)

        if const_expr(carry is not None):  # the last dK done, its stage handed back
            warpgroup.wait_group(0)
            if read[1].index != read[0].index or read[1].phase != read[0].phase:
                pipe_q.consumer_release(read[1])
        # dense: the tile's coordinates derived again (kept live across the loop they would spill at D = 64);
        # packed: ``packed`` (head, sequence, its first key), found by a search at the start, kept
        off_k = Int32(0)
        if const_expr(self.cfg.varlen):
            head, batch, off_k = packed
        else:
            n_block, head, batch = self.tile_coords(seqlen_k, None, seqlen_q)
        # every KV tile of the keys stores (one no query sees: zeros; packed, the kernel's early exit leaves
        # only tiles of the sequence's keys)
        if const_expr(self.cfg.direct_kv):
            k_scale = scale_log2 * LN2  # the softmax scale (softcapping: softcap * softmax_scale / softcap)
            if const_expr(self.cfg.softcap):
                k_scale = k_scale * softcap_scale
            self.store_kv(tiled_mma_dkv, acc_dK, acc_dV, sK, sV, tma_dk, mdKacc, tma_dv, mdVacc, k_scale, n_block,
                          head // qhead_per_kvhead, batch, mma_tidx, seqlen_k, off_k, mdK_rows, mdV_rows)
        elif const_expr(self.cfg.kv_reduce):
            if m_max > m_min:
                self.reduce_kv(tiled_mma_dkv, acc_dK, acc_dV, sAcc, tma_dk, mdKacc, tma_dv, mdVacc, n_block,
                               head // qhead_per_kvhead, batch, off_k, mma_tidx)
        elif m_max > m_min:
            if const_expr(self.cfg.varlen):  # one batch of packed rows, from the sequence's first key
                mdKacc = cute.domain_offset((0, off_k, 0, 0), mdKacc)
                mdVacc = cute.domain_offset((0, off_k, 0, 0), mdVacc)
            self.add_kv(thr_dkv, acc_dK, acc_dV, mdKacc, mdVacc, seqlen_k, n_block, head, qhead_per_kvhead, batch,
                        mma_tidx, mSemKV)


# ---- compile entry ------------------------------------------------------------------------------


def backward_builder(cfg: FlashBwdConfig):
    """``() -> (kernel, fake_args)`` for :func:`cute_kernels.common.jit.get_compiled`: symbolic B, Sq,
    Sk, Hq, Hkv, Sq_pad (a multiple of :data:`layouts.attention_backward.BWD_ROW_PAD`) and a fresh symbolic
    stride for every stride of q, k, v, dout (stride(-1) = 1); the fp32 buffers compact.  Arguments:
    ``(q, k, v, dout, lse_log2, delta, dq_accum, dk_accum, dv_accum, scale_log2)`` (``direct_kv``: dk, dv
    in the input dtype, any 16-byte strides, in place of the two accumulators), and a window
    config's ``window_left, window_right`` after them (:meth:`FlashAttnBwdSm90.call_window`), then a softcap
    config's ``softcap_scale`` and a deterministic one's int32 semaphores, compact (B, Hq, Sq_pad / 64)
    and (B, Hkv, KV tiles) (:attr:`FlashBwdConfig.variant_args`); a packed config's cu_seqlens and
    max_seqlens before them (the tensors then hold one batch of packed rows)."""

    def build():
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

        dt = to_cutlass(cfg.dtype)
        D = cfg.head_dim
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        B, Sq, Sk, Hq, Hkv = (cute.sym_int() for _ in range(5))
        Sp = cute.sym_int(divisibility=LB.BWD_ROW_PAD)
        mQ, mK, mV, mdO = (fsl.fake_rows(dt, s) for s in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D),
                                                           (B, Sq, Hq, D)))
        f32 = cutlass.Float32
        mLSE2 = make_fake_compact_tensor(f32, (B, Hq, Sp), stride_order=(2, 1, 0), assumed_align=16)
        mDelta = make_fake_compact_tensor(f32, (B, Hq, Sp), stride_order=(2, 1, 0), assumed_align=16)
        # (dq_groups G > 1: the G accumulators' batches, G B, a symbol of their own)
        Bq = cute.sym_int() if cfg.tile.dq_groups > 1 else B
        mdQ = make_fake_compact_tensor(f32, (Bq, Hq, Sp, D), stride_order=(3, 2, 1, 0), assumed_align=16)
        if cfg.direct_kv:  # dk, dv themselves: the input dtype, any 16-byte strides
            mdK, mdV = fsl.fake_rows(dt, (B, Sk, Hkv, D)), fsl.fake_rows(dt, (B, Sk, Hkv, D))
        else:
            mdK = make_fake_compact_tensor(f32, (B, Sk, Hkv, D), stride_order=(3, 2, 1, 0), assumed_align=16)
            mdV = make_fake_compact_tensor(f32, (B, Sk, Hkv, D), stride_order=(3, 2, 1, 0), assumed_align=16)
        k = FlashAttnBwdSm90(cfg)
        variant = ()
        if cfg.varlen:  # cu_seqlens_q / _k, max_seqlen_q / _k, gapped
            variant += (make_fake_compact_tensor(Int32, (cute.sym_int(),)),
                        make_fake_compact_tensor(Int32, (cute.sym_int(),)), Int32(0), Int32(0), Int32(0))
        variant += (Float32(1.0),) * cfg.softcap  # softcap_scale
        if cfg.deterministic:
            variant += (make_fake_compact_tensor(Int32, (Bq, Hq, cute.sym_int()), stride_order=(2, 1, 0)),)
            if not cfg.direct_kv:
                # (per sequence when packed: the tensors then hold one batch)
                nseq = cute.sym_int() if cfg.varlen else B
                variant += (make_fake_compact_tensor(Int32, (nseq, Hkv, cute.sym_int()), stride_order=(2, 1, 0)),)
        if cfg.window:
            return k.call_window, (mQ, mK, mV, mdO, mLSE2, mDelta, mdQ, mdK, mdV, Float32(1.0), Int32(0), Int32(0),
                                   stream, *variant)
        return k, (mQ, mK, mV, mdO, mLSE2, mDelta, mdQ, mdK, mdV, Float32(1.0), stream, *variant)

    return build
