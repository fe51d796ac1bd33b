"""The attention forward kernel's epilogue (a mixin of
:class:`~cute_kernels.attention.forward_kernel.FlashAttnFwdSm90`): O normalized by the row sums, the
natural-log LSE per row, O staged through shared memory (stmatrix) and stored by TMA, or, for the
partial last tile of a packed sequence, by predicated vector stores (:mod:`.forward_seqlen`)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync

from ..common.barriers import NamedBarrierId
from ..common.softmax import LOG2_E, OnlineSoftmax, finalize_with_sink, inv_or_zero, lse_from_scaled, quad_sum, scaled_max
from ..common.wgmma import store_acc_to_smem
from . import forward_seqlen as fsl


class FwdEpilogue:
    """Mixin: needs ``self.dtype``, ``tile_m``, ``D``, ``num_mma_threads``, ``varlen``."""

    @cute.jit
    def epilogue(self, tiled_mma_pv: cute.TiledMma, thr_pv, acc_O: cute.Tensor, acc_O_mn: cute.Tensor,
                 softmax: OnlineSoftmax, sO: cute.Tensor, tma_o: cute.CopyAtom, mO: cute.Tensor, mLSE: cute.Tensor,
                 tScS_mn: cute.Tensor, scale_log2: Float32, seqlen_q: Int32, m_block, head, batch, j, mma_tidx,
                 warp_idx, off_q, mO_rows, mSink=None):
        """O / l -> input dtype -> sO (the Q buffer, or O's own when persistent) -> TMA store (rows >= Sq
        clipped); LSE per row.  The storing warp waits for the store to have read sO only before the
        next tile overwrites it (and once at the end of the kernel).  Varlen: the TMA store for a tile
        wholly inside its sequence, predicated 16-byte stores from sO for the sequence's partial last
        tile (rows past it belong to the next sequence).  ``mSink`` (a sink configuration): the query
        head's sink logit enters every row's denominator (:func:`~..common.softmax.finalize_with_sink`)."""
        # ---- normalize, LSE (rows: the same per-thread rows as S, since both MMAs tile M alike)
        n_rows = cute.size(acc_O_mn, mode=[0])
        lse = cute.make_rmem_tensor((n_rows,), Float32)
        sink_log2 = None
        if const_expr(mSink is not None):
            sink_log2 = mSink[head] * LOG2_E
        for r in cutlass.range_constexpr(n_rows):
            l = quad_sum(softmax.row_sum[r])
            if const_expr(mSink is not None):
                inv, lse[r] = finalize_with_sink(softmax.row_max[r], l, scale_log2, sink_log2)
            else:
                inv = inv_or_zero(l)
                lse[r] = lse_from_scaled(scaled_max(softmax.row_max[r], scale_log2), l)
            acc_O_mn[r, None].store(acc_O_mn[r, None].load() * inv)

        # ---- LSE: the quad leader (column 0) of each row, rows < Sq
        if tScS_mn[0, 0][1] == 0:
            for r in cutlass.range_constexpr(n_rows):
                q = m_block * self.tile_m + tScS_mn[r, 0][0]
                if q < seqlen_q:
                    if const_expr(self.varlen):
                        mLSE[head, off_q + q] = lse[r]
                    else:
                        mLSE[batch, head, q] = lse[r]

        # ---- O: registers -> smem (stmatrix; this warpgroup's rows of sO) -> TMA store
        rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        if j > 0:  # the previous tile's store must have read sO
            if warp_idx == 4:
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            cute.arch.barrier(barrier_id=int(NamedBarrierId.EPILOGUE), number_of_threads=self.num_mma_threads)
        store_acc_to_smem(tiled_mma_pv, rO, sO, mma_tidx, self.dtype)
        cute.arch.fence_proxy("async.shared", space="cta")  # smem writes visible to the TMA unit
        cute.arch.barrier(barrier_id=int(NamedBarrierId.EPILOGUE), number_of_threads=self.num_mma_threads)
        if const_expr(self.varlen):
            rows = seqlen_q - m_block * self.tile_m
            if rows >= self.tile_m:
                self.store_o_tma(tma_o, mO, sO, m_block, head, batch, off_q, warp_idx)
            else:
                gO = cute.local_tile(fsl.sequence_rows(mO_rows, head, batch, off_q, True), (self.tile_m, self.D),
                                     (m_block, 0))
                fsl.store_rows_predicated(sO, gO, rows, mma_tidx, self.num_mma_threads, self.dtype)
        else:
            self.store_o_tma(tma_o, mO, sO, m_block, head, batch, off_q, warp_idx)

    @cute.jit
    def store_o_tma(self, tma_o: cute.CopyAtom, mO: cute.Tensor, sO: cute.Tensor, m_block, head, batch, off_q,
                    warp_idx):
        """One warp's TMA store of the O tile from ``sO`` (rows past the tensor clipped)."""
        if warp_idx == 4:
            gO = cute.local_tile(fsl.sequence_rows(mO, head, batch, off_q, self.varlen), (self.tile_m, self.D),
                                 (m_block, 0))
            bSG_sO, bSG_gO = cpasync.tma_partition(tma_o, 0, cute.make_layout(1), cute.group_modes(sO, 0, 2),
                                                   cute.group_modes(gO, 0, 2))
            cute.copy(tma_o, bSG_sO, bSG_gO)
            cute.arch.cp_async_bulk_commit_group()
