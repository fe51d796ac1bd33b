"""The split-KV decode-attention kernel (:class:`DecodeAttnKernel`); the host side, configuration and
public API are in :mod:`cute_kernels.attention.decode`, which describes the design.  The tile and its
shared-memory layouts come from :mod:`layouts.attention`, the softmax arithmetic from
:mod:`cute_kernels.common.softmax`, the TMA ring from :mod:`cute_kernels.common.ring`.
"""

from __future__ import annotations

from typing import Optional

from layouts.attention import DecodeTile, make_decode_kv_tma_layout, make_decode_smem_layouts

from ..common import softmax as sm
from ..common import tma
from ..common.dtypes import to_cutlass
from ..common.ring import TxRing
from .decode_loads import DecodeLoads
from .merge_kernel import MergeStatesKernel

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32, Int32, const_expr  # noqa: E402
from cutlass.cute.nvgpu import cpasync, warp  # noqa: E402


class DecodeAttnKernel(DecodeLoads):
    """One CTA per (split, KV head x row block, batch); ``split``: write fp32 partial states and launch
    the merge kernel after, else write the output directly.  K/V loads (``load``): "cpasync" (every
    thread, rows clamped to the length) or "tma" (warp 0, one load per K/V tile, completion on a
    :class:`TxRing`; V rows between the length and the capacity zeroed before use); same bits.
    ``softcap``: scores softcapped before the mask (:meth:`~..common.softmax.OnlineSoftmax.softcap`);
    ``sink``: a per-query-head sink logit in the denominator, entering once (split 0's state: the
    merge then counts it once, :func:`~..common.softmax.finalize_with_sink`).  Both are compile-time
    flags whose run-time values (``softcap_scale``, the sink tensor) follow ``scale_log2``.

    ``window``: a sliding window, its sides run-time Int32 values (``window_left`` / ``window_right``,
    :data:`~.forward_softmax.WINDOW_UNBOUNDED` for an unbounded side; causal is folded into the right
    side, so ``causal`` is False); ``leftpad``: a (B,) int32 ``cache_leftpad`` tensor, sequence b's keys
    being cache positions ``[cache_leftpad[b], seqlen_b)``.  Both bound the keys from below: the CTA walks
    only the KV tiles of the visible range ``[k_lo, seqlen)`` (split over the splits), loads clamp rows
    to it (cp.async) or zero the V rows below it (TMA), and each row masks its own lower bound.  Also
    compile-time flags, their values trailing the softcap / sink ones.
    """

    def __init__(self, tile: DecodeTile, paged: bool, page_size: int, causal: bool, split: bool, load: str,
                 softcap: bool = False, sink: bool = False, window: bool = False, leftpad: bool = False):
        assert load in ("cpasync", "tma") and not (load == "tma" and paged), "tma loads: contiguous caches only"
        assert not (window and causal), "a window config folds causal into its right side"
        self.tile = tile
        self.dtype = to_cutlass(tile.dtype)
        self.D = tile.head_dim
        self.m_tile = tile.m_tile
        self.n_tile = tile.n_tile
        self.stages = tile.stages
        self.num_threads = tile.num_threads
        self.warps_m = tile.warps_m
        self.warps_n = tile.warps_n
        self.n_warp = tile.n_warp
        self.q_in_regs = tile.q_in_regs
        self.paged = paged
        self.page_size = page_size
        self.causal = causal
        self.split = split
        self.load = load
        self.softcap = softcap
        self.sink = sink
        self.window = window
        self.leftpad = leftpad
        #: keys bounded from below (a window's left side, or a left padding): the visible-range walk
        self.bounded_below = window or leftpad
        self.vec = 8  # 16-byte chunks of 16-bit elements

    # ---- host side (traced) ----------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (B, Sq, Hq, D)
        mK: cute.Tensor,  # (B, Lmax, Hkv, D) | (num_pages, page_size, Hkv, D)
        mV: cute.Tensor,
        mSeqlens: cute.Tensor,  # (B,) int32
        mBT: Optional[cute.Tensor],  # (B, pages_per_seq) int32 | None
        mO: cute.Tensor,  # (B, Sq, Hq, D) out dtype
        mLSE: cute.Tensor,  # (B, Hq, Sq) fp32
        mOp: Optional[cute.Tensor],  # (P, B, Sq, Hq, D) fp32 | None (direct)
        mLSEp: Optional[cute.Tensor],  # (P, B, Sq, Hq) fp32 | None
        scale_log2: Float32,
        stream,
        *variant,  # softcap_scale (softcap configs), the (Hq,) float32 sink (sink configs), window_left and
        # window_right (window configs), the (B,) int32 cache_leftpad (leftpad configs)
    ):
        n_sc, n_sk, n_w, n_lp = int(self.softcap), int(self.sink), 2 * int(self.window), int(self.leftpad)
        if const_expr(len(variant) != n_sc + n_sk + n_w + n_lp):
            raise TypeError(f"DecodeAttnKernel: softcap={self.softcap} sink={self.sink} window={self.window} "
                            f"leftpad={self.leftpad} take {n_sc + n_sk + n_w + n_lp} trailing arguments, "
                            f"got {len(variant)}")
        softcap_scale = variant[0] if const_expr(self.softcap) else None
        mSink = variant[n_sc] if const_expr(self.sink) else None
        window_left = variant[n_sc + n_sk] if const_expr(self.window) else None
        window_right = variant[n_sc + n_sk + 1] if const_expr(self.window) else None
        mLeftpad = variant[n_sc + n_sk + n_w] if const_expr(self.leftpad) else None
        sQ_layout, sKV_layout = make_decode_smem_layouts(self.tile)
        kv_elems = cute.cosize(sKV_layout)

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[self.dtype, 2 * kv_elems], 1024]
            sM: cute.struct.Align[cute.struct.MemRange[Float32, self.warps_n * self.m_tile], 16]
            sL: cute.struct.Align[cute.struct.MemRange[Float32, self.warps_n * self.m_tile], 16]
            mbar: cute.struct.Align[cute.struct.MemRange[cutlass.Int64, self.stages], 8]

        atom_async = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype, num_bits_per_copy=128
        )
        thr_layout = cute.make_layout((self.num_threads // 8, 8), stride=(8, 1))
        gmem_tiled_copy = cute.make_tiled_copy_tv(atom_async, thr_layout, cute.make_layout((1, 8)))
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16)), (1, 1, 1), permutation_mnk=(16, 16, 16)
        )

        tma_atom_K = tma_atom_V = tma_K = tma_V = sKV_tma = None
        if const_expr(self.load == "tma"):
            sKV_tma = make_decode_kv_tma_layout(self.tile)
            # (Lmax, D, Hkv, B) views: one TMA copy = one (n_tile, D) ring slot of one (batch, KV head)
            mK_t = cute.make_tensor(mK.iterator, cute.select(mK.layout, mode=[1, 3, 2, 0]))
            mV_t = cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[1, 3, 2, 0]))
            tma_atom_K, tma_K = tma.make_tma_load(mK_t, sKV_tma, (self.n_tile, self.D))
            tma_atom_V, tma_V = tma.make_tma_load(mV_t, sKV_tma, (self.n_tile, self.D))

        B = mQ.shape[0]
        Sq = mQ.shape[1]
        Hq = mQ.shape[2]
        Hkv = mK.shape[2]
        G = Hq // Hkv
        n_rb = (G * Sq + self.m_tile - 1) // self.m_tile
        num_splits = 1
        if const_expr(self.split):
            num_splits = mOp.shape[0]
        self.kernel(
            mQ, mK, mV, mSeqlens, mBT, mO, mLSE, mOp, mLSEp, scale_log2,
            sQ_layout, sKV_layout, gmem_tiled_copy, tiled_mma, SharedStorage,
            tma_atom_K, tma_K, tma_atom_V, tma_V, sKV_tma, softcap_scale, mSink, window_left, window_right,
            mLeftpad,
        ).launch(
            grid=[num_splits, Hkv * n_rb, B],
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
            # a programmatic dependent of the previous kernel: its prologue overlaps that kernel's tail
            use_pdl=True,
        )
        if const_expr(self.split):
            # the merge, launched as a programmatic dependent of this kernel:
            # (P, B, Sq, Hq, D) -> (B, Sq, Hq, D); the LSE out viewed as (B, Sq, Hq)
            mLSE_bsh = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[0, 2, 1]))
            MergeStatesKernel(Float32, self.dtype, self.D, pdl=True)(mOp, mLSEp, mO, mLSE_bsh, stream)

    # ---- device side -----------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mSeqlens: cute.Tensor,
        mBT: Optional[cute.Tensor],
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mOp: Optional[cute.Tensor],
        mLSEp: Optional[cute.Tensor],
        scale_log2: Float32,
        sQ_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        gmem_tiled_copy: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
        tma_atom_K: Optional[cute.CopyAtom],
        tma_K: Optional[cute.Tensor],
        tma_atom_V: Optional[cute.CopyAtom],
        tma_V: Optional[cute.Tensor],
        sKV_tma: Optional[cute.ComposedLayout],
        softcap_scale,
        mSink: Optional[cute.Tensor],
        window_left,
        window_right,
        mLeftpad: Optional[cute.Tensor],
    ):
        tidx, _, _ = cute.arch.thread_idx()
        split, hrb, b = cute.arch.block_idx()
        num_splits, _, _ = cute.arch.grid_dim()
        if const_expr(self.split):
            # let the merge kernel's CTAs launch now (they wait for this grid before reading)
            cute.arch.griddepcontrol_launch_dependents()
        warp_id = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        wm = warp_id % self.warps_m
        wn = warp_id // self.warps_m

        Sq = mQ.shape[1]
        Hq = mQ.shape[2]
        Hkv = mK.shape[2]
        G = Hq // Hkv
        R = G * Sq
        n_rb = (R + self.m_tile - 1) // self.m_tile
        hkv = hrb // n_rb
        rb = hrb - hkv * n_rb

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        ring = TxRing(storage.mbar.data_ptr(), self.stages)
        if const_expr(self.load == "tma"):
            if tidx == 0:
                cpasync.prefetch_descriptor(tma_atom_K)
                cpasync.prefetch_descriptor(tma_atom_V)
                ring.init()
            cute.arch.mbarrier_init_fence()
            cute.arch.barrier()
        # everything above overlaps the previous kernel's tail; its outputs (q, lengths, caches) are
        # read only below
        cute.arch.griddepcontrol_wait()

        # ---- this CTA's range of KV tiles (lengths on the device, clamped to the capacity) ----
        if const_expr(self.paged):
            cap = mBT.shape[1] * self.page_size
        else:
            cap = mK.shape[1]
        seqlen = cutlass.min(cutlass.max(mSeqlens[b], 0), cap)
        seq_lo = k_lo = None
        if const_expr(self.bounded_below):
            # the visible keys of the sequence: [k_lo, seqlen), k_lo the lowest row's lower bound
            # (positions are cache positions: the left padding and the window's left side bound them);
            # the tiles [t_lo, t_hi) holding them are split over the splits, none if the range is empty
            seq_lo = Int32(0)
            if const_expr(self.leftpad):
                seq_lo = cutlass.min(cutlass.max(mLeftpad[b], 0), seqlen)
            k_lo = seq_lo
            if const_expr(self.window):
                # the first new token sits at seqlen - Sq (window_left <= 2**30: no int32 overflow)
                k_lo = cutlass.max(seqlen - mQ.shape[1] - window_left, seq_lo)
            t_lo = k_lo // self.n_tile
            n_tiles = ((seqlen + self.n_tile - 1) // self.n_tile - t_lo) * cutlass.min(seqlen - k_lo, 1)
        else:
            t_lo = 0
            n_tiles = (seqlen + self.n_tile - 1) // self.n_tile
        # the tiles [t_lo, t_lo + n_tiles) split over the splits
        tiles_per_split = (n_tiles + num_splits - 1) // num_splits
        t_begin = t_lo + split * tiles_per_split
        t_end = cutlass.min(t_begin + tiles_per_split, t_lo + n_tiles)
        n_iter = cutlass.max(t_end - t_begin, 0)

        sQ = storage.sQ.get_tensor(sQ_layout)
        kv_ptr = storage.sKV.data_ptr()
        kv_elems = cute.cosize(sKV_layout)
        sK = cute.make_tensor(kv_ptr, sKV_layout)
        sV = cute.make_tensor(kv_ptr + kv_elems, sKV_layout)
        sM = storage.sM.get_tensor(cute.make_layout((self.m_tile, self.warps_n), stride=(1, self.m_tile)))
        sL = storage.sL.get_tensor(cute.make_layout((self.m_tile, self.warps_n), stride=(1, self.m_tile)))
        # the fp32 warp-merge buffer reuses the K/V ring after the main loop
        acc_stride = self.tile.acc_stride
        sAcc = cute.make_tensor(
            cute.recast_ptr(kv_ptr, dtype=Float32),
            cute.make_layout((self.m_tile, self.D, self.warps_n),
                             stride=(acc_stride, 1, self.m_tile * acc_stride)),
        )

        # per-warp state: O accumulator and the online softmax of this thread's rows
        thr_mma = tiled_mma.get_slice(lane)
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((16, self.D)), Float32)
        acc_O.fill(0.0)
        acc_O_mn = self._mn_view(acc_O)
        n_rows_thr = cute.size(acc_O_mn, mode=[0])  # 2 rows per thread
        softmax = sm.OnlineSoftmax.create(scale_log2, n_rows_thr, softcap_scale)

        if n_iter > 0:
            gmem_thr_copy = gmem_tiled_copy.get_slice(tidx)
            # ---- Q rows -> smem (zero rows past R) ----
            cQ = cute.make_identity_tensor((self.m_tile, self.D))
            tQsQ = gmem_thr_copy.partition_D(sQ)
            tQcQ = gmem_thr_copy.partition_S(cQ)
            for m in cutlass.range_constexpr(cute.size(tQsQ, mode=[1])):
                rr = rb * self.m_tile + tQcQ[0, m, 0][0]
                if rr < R:
                    t = rr // G
                    g = rr - t * G
                    gQrow = cute.tiled_divide(mQ[b, t, hkv * G + g, None], (self.vec,))
                    for k in cutlass.range_constexpr(cute.size(tQsQ, mode=[2])):
                        dst = tQsQ[None, m, k]
                        src = gQrow[None, tQcQ[0, m, k][1] // self.vec]
                        cute.copy(gmem_tiled_copy, cute.make_tensor(src.iterator, dst.layout), dst)
                else:
                    tQsQ[None, m, None].fill(0)
            cute.arch.cp_async_commit_group()

            # ---- K/V producer: each thread copies its rows of the tile (gathered per row) ----
            cKV = cute.make_identity_tensor((self.n_tile, self.D))
            tKsK = gmem_thr_copy.partition_D(sK)  # (CPY, CPY_N, CPY_K, stages)
            tVsV = gmem_thr_copy.partition_D(sV)
            tKVc = gmem_thr_copy.partition_S(cKV)
            kv_head_K = mK[None, None, hkv, None]
            kv_head_V = mV[None, None, hkv, None]

            load_args = (gmem_tiled_copy, tKsK, tVsV, tKVc, kv_head_K, kv_head_V, mBT, b, seqlen, k_lo)
            tma_args = None
            if const_expr(self.load == "tma"):
                gK = cute.local_tile(tma_K[None, None, hkv, b], (self.n_tile, self.D), (None, 0))
                gV = cute.local_tile(tma_V[None, None, hkv, b], (self.n_tile, self.D), (None, 0))
                sK_t = cute.make_tensor(cute.recast_ptr(kv_ptr, sKV_tma.inner, dtype=self.dtype), sKV_tma.outer)
                sV_t = cute.make_tensor(
                    cute.recast_ptr(kv_ptr + kv_elems, sKV_tma.inner, dtype=self.dtype), sKV_tma.outer
                )
                tKsK_t, tKgK_t = cpasync.tma_partition(
                    tma_atom_K, 0, cute.make_layout(1), cute.group_modes(sK_t, 0, 2), cute.group_modes(gK, 0, 2)
                )
                tVsV_t, tVgV_t = cpasync.tma_partition(
                    tma_atom_V, 0, cute.make_layout(1), cute.group_modes(sV_t, 0, 2), cute.group_modes(gV, 0, 2)
                )
                tma_args = (tma_atom_K, tma_atom_V, tKsK_t, tKgK_t, tVsV_t, tVgV_t, ring, warp_id)

            # prologue: stages-1 tiles in flight
            for s in cutlass.range_constexpr(self.stages - 1):
                if const_expr(self.load == "tma"):
                    if s < n_iter:
                        self._tma_load_tile(*tma_args, t_begin + s, s)
                else:
                    if s < n_iter:
                        self._load_tile(*load_args, t_begin + s, s)
                    cute.arch.cp_async_commit_group()

            # ---- consumer views for this warp ----
            sQw = cute.flat_divide(sQ, (16, self.D))[None, None, wm, 0]
            sKw = cute.flat_divide(sK, (self.n_warp, self.D))[None, None, wn, 0, None]
            sVt = cute.composition(
                sV,
                cute.make_ordered_layout((self.D, self.n_tile, self.stages), order=(1, 0, 2)),
            )
            sVtw = cute.flat_divide(sVt, (self.D, self.n_warp))[None, None, 0, wn, None]

            tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQw))
            tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sKw[None, None, 0]))
            tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVtw[None, None, 0]))
            ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
            ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype)
            s2r_Q = cute.make_tiled_copy_A(ldsm, tiled_mma).get_slice(lane)
            s2r_K = cute.make_tiled_copy_B(ldsm, tiled_mma).get_slice(lane)
            s2r_V = cute.make_tiled_copy_B(ldsm_t, tiled_mma).get_slice(lane)
            tSsQ = s2r_Q.partition_S(sQw)
            tSrQ_v = s2r_Q.retile(tSrQ)
            tSsK = s2r_K.partition_S(sKw)
            tSrK_v = s2r_K.retile(tSrK)
            tOsVt = s2r_V.partition_S(sVtw)
            tOrVt_v = s2r_V.retile(tOrVt)

            # coordinates of this thread's S elements within the warp tile (row, token)
            tScS_mn = self._mn_view(thr_mma.partition_C(cute.make_identity_tensor((16, self.n_warp))))
            # absolute positions: the first row handled by this warp and its tokens
            row0 = rb * self.m_tile + wm * 16
            # causal limit per row: pos <= seqlen - Sq + t
            row_limit = cute.make_rmem_tensor((n_rows_thr,), Int32)
            row_lo = None
            if const_expr(self.bounded_below):
                # and the lower bound per row: pos >= max(seqlen - Sq + t - window_left, leftpad)
                row_lo = cute.make_rmem_tensor((n_rows_thr,), Int32)
            for r in cutlass.range_constexpr(n_rows_thr):
                if const_expr(self.window):
                    t_row = (row0 + tScS_mn[r, 0][0]) // G
                    # pos + window_right clamped to seqlen - 1, written so that a side of 2**30 cannot
                    # overflow: seqlen - 1 - max(Sq - 1 - t - right, 0)
                    lim = seqlen - 1 - cutlass.max(Sq - 1 - t_row - window_right, 0)
                    row_limit[r] = lim
                    row_lo[r] = cutlass.max(seqlen - Sq + t_row - window_left, seq_lo)
                else:
                    lim = seqlen - 1
                    if const_expr(self.causal):
                        t_row = (row0 + tScS_mn[r, 0][0]) // G
                        lim = cutlass.min(seqlen - Sq + t_row, seqlen - 1)
                    row_limit[r] = lim
                    if const_expr(self.bounded_below):
                        row_lo[r] = seq_lo

            if const_expr(self.load == "tma"):
                cute.arch.cp_async_wait_group(0)  # Q (the only cp.async group), visible after a barrier
            if const_expr(self.q_in_regs):
                if const_expr(self.load != "tma"):
                    cute.arch.cp_async_wait_group(self.stages - 1)  # Q landed (committed first)
                cute.arch.barrier()
                cute.copy(s2r_Q, tSsQ, tSrQ_v)

            for i in cutlass.range(n_iter, unroll=1):
                tile = t_begin + i
                stage = i % self.stages
                if const_expr(self.load == "tma"):
                    ring.wait(stage, i)
                    if (tile + 1) * self.n_tile > seqlen:
                        # the sequence's last tile: V rows past the length hold whatever the cache
                        # holds there (masked P is 0, but 0 * NaN is not): zero them
                        for m in cutlass.range_constexpr(cute.size(tVsV, mode=[1])):
                            if tile * self.n_tile + tKVc[0, m, 0][0] >= seqlen:
                                tVsV[None, m, None, stage].fill(0)
                    if const_expr(self.bounded_below):
                        if tile * self.n_tile < k_lo:
                            # the first tile of the visible range: V rows below it (a left padding, keys
                            # before the window) may hold anything: zero them too
                            for m in cutlass.range_constexpr(cute.size(tVsV, mode=[1])):
                                if tile * self.n_tile + tKVc[0, m, 0][0] < k_lo:
                                    tVsV[None, m, None, stage].fill(0)
                    # every thread is done with the slot consumed in iteration i-1
                    cute.arch.barrier()
                    if i + self.stages - 1 < n_iter:
                        self._tma_load_tile(
                            *tma_args, tile + self.stages - 1, (i + self.stages - 1) % self.stages
                        )
                else:
                    # tile i landed (everything but the stages-2 newest groups), visible to all threads
                    cute.arch.cp_async_wait_group(self.stages - 2)
                    cute.arch.barrier()
                    # refill the slot consumed in iteration i-1
                    if i + self.stages - 1 < n_iter:
                        self._load_tile(*load_args, tile + self.stages - 1, (i + self.stages - 1) % self.stages)
                    cute.arch.cp_async_commit_group()

                # ---- S = Q K^T (16 x n_warp) ----
                acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((16, self.n_warp)), Float32)
                acc_S.fill(0.0)
                n_k = cute.size(tSsK, mode=[2])
                for k in cutlass.range_constexpr(n_k):
                    if const_expr(not self.q_in_regs):
                        cute.copy(s2r_Q, tSsQ[None, None, k], tSrQ_v[None, None, k])
                    cute.copy(s2r_K, tSsK[None, None, k, stage], tSrK_v[None, None, k])
                    cute.gemm(tiled_mma, acc_S, tSrQ[None, None, k], tSrK[None, None, k], acc_S)

                # ---- (softcapping,) mask + online softmax (S becomes P in place, O rescaled) ----
                softmax.softcap(acc_S)
                acc_S_mn = self._mn_view(acc_S)
                tok0 = tile * self.n_tile + wn * self.n_warp
                for r in cutlass.range_constexpr(n_rows_thr):
                    lim = row_limit[r] - tok0
                    if const_expr(self.bounded_below):
                        lo = row_lo[r] - tok0
                        for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
                            if tScS_mn[0, c][1] > lim:
                                acc_S_mn[r, c] = -Float32.inf
                            if tScS_mn[0, c][1] < lo:
                                acc_S_mn[r, c] = -Float32.inf
                    else:
                        for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
                            if tScS_mn[0, c][1] > lim:
                                acc_S_mn[r, c] = -Float32.inf
                    softmax.update_row(r, acc_S_mn[r, None], acc_O_mn[r, None])

                # ---- O += P V ----
                rP = cute.make_rmem_tensor_like(acc_S, self.dtype)
                rP.store(acc_S.load().to(self.dtype))
                tOrP = cute.make_tensor(rP.iterator, self._frgA_layout(rP.layout))
                for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                    cute.copy(s2r_V, tOsVt[None, None, k, stage], tOrVt_v[None, None, k])
                    cute.gemm(tiled_mma, acc_O, tOrP[None, None, k], tOrVt[None, None, k], acc_O)

            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()  # everyone is done with the K/V ring: reuse it as sAcc

        self._epilogue(acc_O, softmax, thr_mma, sAcc, sM, sL, mO, mLSE, mOp, mLSEp, scale_log2,
                       tidx, lane, wm, wn, rb, R, G, hkv, b, split, mSink)

    @cute.jit
    def _epilogue(self, acc_O: cute.Tensor, softmax, thr_mma, sAcc: cute.Tensor, sM: cute.Tensor,
                  sL: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mOp: Optional[cute.Tensor],
                  mLSEp: Optional[cute.Tensor], scale_log2: Float32, tidx, lane, wm, wn, rb, R, G, hkv, b,
                  split, mSink=None):
        """Merge the ``warps_n`` token warps' states of every row and write O and the LSE (the fp32
        partial state of this split, or the final output).  ``mSink`` (sink configs): the row's query
        head's sink joins the denominator of split 0's state only."""
        # ---- per-warp state -> smem (row sums reduced over the quad); this warp's 16 rows ----
        sAccw = cute.flat_divide(sAcc[None, None, wn], (16, self.D))[None, None, wm, 0]
        tAcc = thr_mma.partition_C(sAccw)
        cute.autovec_copy(acc_O, tAcc)
        tScS0 = self._mn_view(thr_mma.partition_C(cute.make_identity_tensor((16, self.D))))
        for r in cutlass.range_constexpr(softmax.n_rows):
            l = sm.quad_sum(softmax.row_sum[r])
            if lane % 4 == 0:
                rloc = wm * 16 + tScS0[r, 0][0]
                sM[rloc, wn] = softmax.row_max[r]
                sL[rloc, wn] = l
        cute.arch.barrier()

        # ---- merge the warps_n states per row and write (coalesced, 4 fp32 per thread) ----
        vec_o = 4
        chunks = self.D // vec_o
        total = self.m_tile * chunks
        for it in cutlass.range_constexpr((total + self.num_threads - 1) // self.num_threads):
            idx = tidx + it * self.num_threads
            if const_expr(total % self.num_threads == 0) or idx < total:
                r = idx // chunks
                c = idx - r * chunks
                rr = rb * self.m_tile + r
                if rr < R:
                    m_all = -Float32.inf
                    for w in cutlass.range_constexpr(self.warps_n):
                        m_all = cute.arch.fmax(m_all, sM[r, w])
                    m_all_s = sm.scaled_max(m_all, scale_log2)
                    l_all = Float32(0.0)
                    o = cute.make_rmem_tensor((vec_o,), Float32)
                    o.fill(0.0)
                    for w in cutlass.range_constexpr(self.warps_n):
                        e = sm.raw_state_weight(sM[r, w], m_all_s, scale_log2)
                        l_all += e * sL[r, w]
                        v = cute.local_tile(sAcc[r, None, w], (vec_o,), (c,)).load()
                        o.store(o.load() + e * v)
                    if const_expr(mSink is not None):
                        sink_log2 = mSink[hkv * G + rr % G] * sm.LOG2_E
                        if const_expr(self.split):
                            if split != 0:  # the merge adds the partial states' sums: one sink in all
                                sink_log2 = -Float32.inf
                        o_scale, lse = sm.finalize_with_sink(m_all, l_all, scale_log2, sink_log2)
                        o.store(o.load() * o_scale)
                    else:
                        o.store(o.load() * sm.inv_or_zero(l_all))
                        lse = sm.lse_from_scaled(m_all_s, l_all)
                    t = rr // G
                    g = rr - t * G
                    hq = hkv * G + g
                    if const_expr(self.split):
                        dst = cute.local_tile(mOp[split, b, t, hq, None], (vec_o,), (c,))
                        dst.store(o.load())
                        if c == 0:
                            mLSEp[split, b, t, hq] = lse
                    else:
                        dst = cute.local_tile(mO[b, t, hq, None], (vec_o,), (c,))
                        dst.store(o.load().to(mO.element_type))
                        if c == 0:
                            mLSE[b, hq, t] = lse

    # ---- helpers ------------------------------------------------------------------------
    @staticmethod
    def _mn_view(t: cute.Tensor) -> cute.Tensor:
        """((2,2), MMA_M, MMA_N) accumulator -> ((2, MMA_M), (2, MMA_N)) row/column view."""
        lay = cute.make_layout(t.layout.shape)
        mn = cute.make_layout(
            ((lay.shape[0][1], lay.shape[1]), (lay.shape[0][0], lay.shape[2])),
            stride=((lay.stride[0][1], lay.stride[1]), (lay.stride[0][0], lay.stride[2])),
        )
        return cute.make_tensor(t.iterator, cute.composition(t.layout, mn))

    @staticmethod
    def _frgA_layout(acc_layout):
        """(4, MMA_M, MMA_N) accumulator of m16n8 -> ((4, 2), MMA_M, MMA_N/2) A fragment of m16n8k16."""
        l = cute.logical_divide(acc_layout, (None, None, 2))
        return cute.make_layout(
            ((l.shape[0], l.shape[2][0]), l.shape[1], l.shape[2][1]),
            stride=((l.stride[0], l.stride[2][0]), l.stride[1], l.stride[2][1]),
        )
