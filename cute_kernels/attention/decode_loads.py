"""The decode kernel's K/V tile loads (a mixin of :class:`~.decode_kernel.DecodeAttnKernel`): per-thread
``cp.async`` rows (contiguous or gathered through the block table, clamped into the visible range) and
warp 0's TMA loads with the L2 evict-first hint."""

from __future__ import annotations

from typing import Optional

from ..common import tma
from ..common.ring import TxRing

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Int32, const_expr  # noqa: E402


class DecodeLoads:
    """Mixin: needs ``self.n_tile``, ``paged``, ``page_size``, ``vec`` and ``tile`` (the decode tile)."""

    @cute.jit
    def _load_tile(
        self,
        gmem_tiled_copy: cute.TiledCopy,
        tKsK: cute.Tensor,
        tVsV: cute.Tensor,
        tKVc: cute.Tensor,
        kv_head_K: cute.Tensor,
        kv_head_V: cute.Tensor,
        mBT: Optional[cute.Tensor],
        b: Int32,
        seqlen: Int32,
        k_lo,
        tile: Int32,
        stage: Int32,
    ):
        """cp.async this thread's rows of K/V tile `tile` into ring slot `stage`.

        Rows past the length are clamped to the last valid row (masked later), and with ``k_lo`` (keys
        bounded below; None otherwise) rows below it to the first visible one: only the visible range
        ``[k_lo, seqlen)`` is ever read.  Paged rows are looked up in the block table one by one and
        page ids clamped to [0, num_pages)."""
        for m in cutlass.range_constexpr(cute.size(tKsK, mode=[1])):
            if const_expr(k_lo is not None):
                pos = cutlass.min(cutlass.max(tile * self.n_tile + tKVc[0, m, 0][0], k_lo), seqlen - 1)
            else:
                pos = cutlass.min(tile * self.n_tile + tKVc[0, m, 0][0], seqlen - 1)
            if const_expr(self.paged):
                page_idx = pos // self.page_size
                page = mBT[b, page_idx]
                page = cutlass.min(cutlass.max(page, 0), kv_head_K.shape[0] - 1)
                off = pos - page_idx * self.page_size
                gKrow = cute.tiled_divide(kv_head_K[page, off, None], (self.vec,))
                gVrow = cute.tiled_divide(kv_head_V[page, off, None], (self.vec,))
            else:
                gKrow = cute.tiled_divide(kv_head_K[b, pos, None], (self.vec,))
                gVrow = cute.tiled_divide(kv_head_V[b, pos, None], (self.vec,))
            for k in cutlass.range_constexpr(cute.size(tKsK, mode=[2])):
                c = tKVc[0, m, k][1] // self.vec
                dK = tKsK[None, m, k, stage]
                srcK = gKrow[None, c]
                cute.copy(gmem_tiled_copy, cute.make_tensor(srcK.iterator, dK.layout), dK)
                dV = tVsV[None, m, k, stage]
                srcV = gVrow[None, c]
                cute.copy(gmem_tiled_copy, cute.make_tensor(srcV.iterator, dV.layout), dV)

    @cute.jit
    def _tma_load_tile(
        self,
        atom_K: cute.CopyAtom,
        atom_V: cute.CopyAtom,
        tKsK: cute.Tensor,  # (TMA, stages)
        tKgK: cute.Tensor,  # (TMA, tiles)
        tVsV: cute.Tensor,
        tVgV: cute.Tensor,
        ring: TxRing,
        warp_id: Int32,
        tile: Int32,
        stage: Int32,
    ):
        """Warp 0: K and V tile `tile` -> ring slot `stage`, L2 evict-first (read once).

        Called by all 32 lanes of warp 0 (warp_id is warp-uniform): the DSL wraps every TMA copy in
        ``elect.sync 0xffffffff`` itself, so issuing it from one thread (``if tidx == 0``) would leave
        that lane in a warp-collective ELECT waiting for 31 lanes that wait at the next bar.sync (a
        hang).  The arrive + expect_tx (barrier count 1) is done by one elected lane."""
        if warp_id == 0:
            ring.arm(stage, self.tile.kv_stage_bytes)
            bar = ring.barrier(stage)
            tma.tma_load(atom_K, tKgK[None, tile], tKsK[None, stage], bar, policy=tma.L2_EVICT_FIRST)
            tma.tma_load(atom_V, tVgV[None, tile], tVsV[None, stage], bar, policy=tma.L2_EVICT_FIRST)
