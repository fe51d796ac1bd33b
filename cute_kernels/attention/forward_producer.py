"""The attention forward kernel's producer (a mixin of
:class:`~cute_kernels.attention.forward_kernel.FlashAttnFwdSm90`): warp 0 of warpgroup 0 loads a query
tile's Q once and streams its K / V tiles into the two TMA rings, in the order the consumers read
them; paged K/V through the block table (:mod:`.forward_paged`)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import const_expr
from cutlass.cute.nvgpu import cpasync

from ..common import ring, tma
from . import forward_paged as fpg
from . import forward_seqlen as fsl


class FwdProducer:
    """Mixin: needs ``self.cfg`` (``tile``), ``tile_m``, ``tile_n``, ``D``, ``varlen``, ``paged``,
    ``box_rows``, ``page_size``."""

    @cute.jit
    def produce(self, tma_q: cute.CopyAtom, mQ: cute.Tensor, tma_k: cute.CopyAtom, mK: cute.Tensor,
                tma_v: cute.CopyAtom, mV: cute.Tensor, sQ: cute.Tensor, sK: cute.Tensor, sV: cute.Tensor,
                q_ring: ring.TxRing, pipe_k, pipe_v, k_state, v_state, m_block, head, head_kv, batch, n_max,
                off_q, off_k, n_min, len_k, mBlockTable):
        """Warp 0: Q once, then the KV tiles n = n_max - 1 down to n_min in the order the consumers read
        them: K(n_max - 1), then K(n - 1) before V(n) (the consumers issue S(n - 1) = Q K(n - 1)^T
        before O += P(n) V(n)), and V(n_min) last."""
        t = self.cfg.tile
        # Q: (tile_m, D) at query tile m_block of (head, batch); rows >= Sq are zero-filled (varlen:
        # rows past the sequence are the next one's, discarded)
        gQ = cute.local_tile(fsl.sequence_rows(mQ, head, batch, off_q, self.varlen), (self.tile_m, self.D),
                             (m_block, 0))
        tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                           cute.group_modes(gQ, 0, 2))
        q_ring.arm(0, t.q_bytes)
        cute.copy(tma_q, tQgQ, tQsQ, tma_bar_ptr=q_ring.barrier(0))

        if const_expr(self.paged):  # K / V boxes from the sequence's pages
            tKsK, tKgK = fpg.partition_paged(tma_k, mK, sK, head_kv, self.box_rows, self.D)
            tVsV, tVgV = fpg.partition_paged(tma_v, mV, sV, head_kv, self.box_rows, self.D)
        else:
            # K / V: (tile_n, D, n_tiles) of the KV head; rows >= Sk are zero-filled (varlen: the next
            # sequence's, masked)
            gK = cute.local_tile(fsl.sequence_rows(mK, head_kv, batch, off_k, self.varlen), (self.tile_n, self.D),
                                 (None, 0))
            gV = cute.local_tile(fsl.sequence_rows(mV, head_kv, batch, off_k, self.varlen), (self.tile_n, self.D),
                                 (None, 0))
            tKsK, tKgK = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                               cute.group_modes(gK, 0, 2))
            tVsV, tVgV = cpasync.tma_partition(tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                                               cute.group_modes(gV, 0, 2))
        num_pages = mK.shape[3]  # (paged: the pool's pages; dense: unused)
        if n_max > n_min:
            k_state = self.load_kv_tile(pipe_k, k_state, tma_k, tKgK, tKsK, n_max - 1, num_pages, mBlockTable, batch,
                                        len_k)
            for i in cutlass.range(n_max - n_min - 1, unroll=1):
                n_block = n_max - 2 - i
                k_state = self.load_kv_tile(pipe_k, k_state, tma_k, tKgK, tKsK, n_block, num_pages, mBlockTable,
                                            batch, len_k)
                v_state = self.load_kv_tile(pipe_v, v_state, tma_v, tVgV, tVsV, n_block + 1, num_pages,
                                            mBlockTable, batch, len_k)
            v_state = self.load_kv_tile(pipe_v, v_state, tma_v, tVgV, tVsV, n_min, num_pages, mBlockTable, batch,
                                        len_k)
        return k_state, v_state

    @cute.jit
    def load_kv_tile(self, pipe, state, atom: cute.CopyAtom, tXgX: cute.Tensor, tXsX: cute.Tensor, n_block,
                     num_pages, mBlockTable, batch, len_k):
        """KV tile ``n_block`` into the ring's next slot: one TMA copy, or (paged) a box per page slice
        (:func:`~.forward_paged.produce_paged_tile`; the last four arguments are read only then).
        Returns the advanced ring state."""
        if const_expr(self.paged):
            state = fpg.produce_paged_tile(pipe, state, atom, tXgX, tXsX, mBlockTable, batch, n_block, len_k,
                                           num_pages, self.tile_n, self.box_rows, self.page_size)
        else:
            state = tma.tma_produce_tiles(pipe, state, atom, tXgX, tXsX, n_block, 1)
        return state
