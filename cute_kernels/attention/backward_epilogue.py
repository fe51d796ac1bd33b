"""Where the attention backward kernel's gradients leave the CTA (a mixin of
:class:`~.backward_kernel.FlashAttnBwdSm90`): the dQ warp's reduce-adds of each query tile's dQ into
the fp32 accumulator; the dK / dV epilogue (with one query head per KV head, dK and dV through the K /
V buffers and TMA stores; with GQA, each thread's rows added into the fp32 accumulators).  In the
deterministic mode both add in a fixed order (:mod:`.backward_kernel`'s doc)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync

from ..common.barriers import NamedBarrierId, count_up, wait_count
from ..common.wgmma import store_acc_to_smem
from . import forward_seqlen as fsl
from .backward_mask import dense_turn, n_block_last

#: consumer warpgroup w's fp32 dQ tile in shared memory: the dQ warp's reduce of the previous one has
#: read it (``BAR_DQ_EMPTY + w``) / the warpgroup wrote it (``BAR_DQ_FULL + w``); 128 + 32 threads each
#: (ids after the kernel's ``BAR_DS_FULL``, ``NamedBarrierId.FIRST_FREE``).  Deterministic: query tile i
#: of the walk uses ids ``DQ_PARITY_IDS * (i % 2)`` further on (two dQ warps take turns, one per parity)
BAR_DQ_EMPTY = int(NamedBarrierId.FIRST_FREE) + 1
BAR_DQ_FULL = int(NamedBarrierId.FIRST_FREE) + 3
DQ_PARITY_IDS = 4


class BwdEpilogue:
    """Mixin: needs ``self.cfg``, ``dtype``, ``tile_m``, ``tile_n``, ``D``, ``num_mma_threads``, ``tile_at``
    (the order of a KV tile's query tiles),
    ``epilogue_barrier`` (a named barrier of the consumer warpgroups, free once their query-tile loop
    is done) and ``rows`` (one head's rows of a dense or packed tensor)."""

    @cute.jit
    def reduce_dq(self, tma_dq, mdQacc, sdQ, head, batch, m_min, m_max, mSemQ, n_block, seqlen_q, seqlen_k,
                  window_right, off_p):
        """The dQ warp: per query tile, each consumer warpgroup's fp32 dQ tile (shared memory) added into
        the accumulator by one TMA reduce-add, while the warpgroups go on with the next tile.  Warpgroup
        w's buffer is handed back (``BAR_DQ_EMPTY + w``) once the reduce that read it has read it.
        Deterministic: the adds of a query tile wait for their turn (:meth:`wait_dq_turn`) and complete
        before the next turn (with ``BwdTile.dq_warps = 2``: :meth:`reduce_dq_turns` instead)."""
        lane = cute.arch.lane_idx()
        nwg = self.cfg.tile.consumer_warpgroups
        tDsD, tDgD = self.dq_partition(tma_dq, mdQacc, sdQ, head, batch, off_p, n_block)
        for i in cutlass.range(m_max - m_min, unroll=1):
            m_block = self.tile_at(m_min, i, m_max - m_min, n_block, seqlen_q, seqlen_k)
            for w in cutlass.range_constexpr(nwg):
                cute.arch.cp_async_bulk_wait_group(nwg - 1 - w, read=True)
                cute.arch.barrier_arrive(barrier_id=BAR_DQ_EMPTY + w, number_of_threads=128 + 32)
            sem = None
            if const_expr(self.cfg.deterministic):
                sem = self.wait_dq_turn(mSemQ, batch, head, m_block, n_block, seqlen_q, seqlen_k, window_right,
                                        off_p)
            self.issue_dq(tma_dq, tDsD, tDgD, m_block, 0)
            if const_expr(self.cfg.deterministic):  # the adds done (not only read), then the next turn
                cute.arch.cp_async_bulk_wait_group(0, read=False)
                cute.arch.sync_warp()
                if lane == 0:
                    count_up(sem)
        # the last reduce has read its tile (the adds themselves complete before the grid does)
        cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def wait_dq_turn(self, mSemQ, batch, head, m_block, n_block, seqlen_q, seqlen_k, window_right, off_p):
        """Deterministic: wait until query tile ``m_block``'s semaphore reads this KV tile's turn among
        those meeting the query tile (dense: the order they arrive from their rotated starts; causal and
        windowed: the highest KV tile first; with ``BwdTile.dq_groups`` G > 1, among its group's, on the
        group's semaphores: batch ``batch + (n_block mod G) * B``); returns the semaphore's address."""
        groups = const_expr(self.cfg.tile.dq_groups)
        slot = self.dq_slot(batch, n_block, mSemQ.shape[0])
        sem_crd = (slot, head, m_block)
        if const_expr(self.cfg.varlen):  # one batch of padded rows (the sequence's from off_p on)
            sem_crd = (slot, head, off_p // self.tile_m + m_block)
        sem = mSemQ.iterator + cute.crd2idx(sem_crd, mSemQ.layout)
        if cute.arch.lane_idx() == 0:
            if const_expr(self.cfg.causal or self.cfg.window):  # from the top: the order ranges reach it
                reach = window_right if const_expr(self.cfg.window) else Int32(0)
                turn = (n_block_last(m_block, seqlen_q, seqlen_k, self.tile_m, self.tile_n, reach) - n_block) // groups
            else:
                turn = dense_turn(n_block, m_block, seqlen_q, seqlen_k, self.tile_m, self.tile_n, groups)
            wait_count(sem, turn)
        cute.arch.sync_warp()
        return sem

    @cute.jit
    def dq_slot(self, batch, n_block, batches):
        """The batch index of this KV tile's dQ accumulator and semaphores in buffers of ``batches``
        batches: ``batch`` (packed: 0, the one batch of padded rows), plus ``(n_block mod G) * batches /
        G`` with ``BwdTile.dq_groups`` G > 1 (group g's copy is batches ``g * B ..``)."""
        slot = 0 if const_expr(self.cfg.varlen) else batch
        if const_expr(self.cfg.tile.dq_groups > 1):
            groups = self.cfg.tile.dq_groups
            slot = slot + (n_block % groups) * (batches // groups)
        return slot

    @cute.jit
    def dq_partition(self, tma_dq, mdQacc, sdQ, head, batch, off_p, n_block):
        """The warpgroups' fp32 dQ buffers and this head's accumulator tiles (rows, cols, row tiles, col
        tiles), partitioned for the TMA reduce-add (``BwdTile.dq_groups`` G > 1: in accumulator
        ``n_block mod G``, batches ``g * B ..`` of the (G B, ...) buffer)."""
        t = self.cfg.tile
        slot = self.dq_slot(batch, n_block, mdQacc.shape[3])
        if const_expr(self.cfg.varlen):  # (rows() reads a packed tensor's batch 0; group g's copy is batch g)
            rows = cute.domain_offset((off_p, 0), mdQacc[None, None, head, slot])
        else:
            rows = self.rows(mdQacc, off_p, head, slot)
        gdQ = cute.local_tile(rows, (t.dq_rows_per_wg, t.dq_cols_per_wg), (None, None))
        return cpasync.tma_partition(tma_dq, 0, cute.make_layout(1), cute.group_modes(sdQ, 0, 2),
                                     cute.group_modes(gdQ, 0, 2))

    @cute.jit
    def issue_dq(self, tma_dq, tDsD, tDgD, m_block, bar_offset):
        """Query tile ``m_block``'s reduce-adds: each warpgroup's buffer once it is written (its FULL barrier,
        ``bar_offset`` ids on), a bulk group each."""
        t = self.cfg.tile
        wg_rows = t.tile_m // t.dq_rows_per_wg  # row tiles per query tile: nwg when dQ splits rows, else 1
        for w in cutlass.range_constexpr(t.consumer_warpgroups):
            cute.arch.barrier(barrier_id=BAR_DQ_FULL + bar_offset + w, number_of_threads=128 + 32)
            # the whole warp: the TMA copy elects its issuing thread itself (elect.sync, all lanes)
            if const_expr(t.dq_split_m):
                cute.copy(tma_dq, tDsD[None, w], tDgD[None, m_block * wg_rows + w, 0])
            else:
                cute.copy(tma_dq, tDsD[None, w], tDgD[None, m_block, w])
            cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def reduce_dq_turns(self, tma_dq, mdQacc, sdQ, head, batch, m_min, m_max, mSemQ, n_block, seqlen_q, seqlen_k,
                        window_right, off_p, parity: cutlass.Constexpr[int]):
        """Deterministic with ``BwdTile.dq_warps = 2``: one of two dQ warps (``parity`` 0 / 1), taking the
        walk's query tiles of its parity.  A tile's adds wait for their turn (:meth:`wait_dq_turn`); the
        buffer goes back once read, then the adds complete and the turn passes on -- the completion's
        latency overlaps the other warp's tile instead of lengthening one warp's cycle per tile."""
        lane = cute.arch.lane_idx()
        nwg = self.cfg.tile.consumer_warpgroups
        count = m_max - m_min
        tDsD, tDgD = self.dq_partition(tma_dq, mdQacc, sdQ, head, batch, off_p, n_block)
        if const_expr(parity == 0):
            if count > 0:  # the buffers start free
                for w in cutlass.range_constexpr(nwg):
                    cute.arch.barrier_arrive(barrier_id=BAR_DQ_EMPTY + w, number_of_threads=128 + 32)
        for j in cutlass.range((count - parity + 1) // 2, unroll=1):
            i = 2 * j + parity
            m_block = self.tile_at(m_min, i, count, n_block, seqlen_q, seqlen_k)
            sem = self.wait_dq_turn(mSemQ, batch, head, m_block, n_block, seqlen_q, seqlen_k, window_right, off_p)
            self.issue_dq(tma_dq, tDsD, tDgD, m_block, DQ_PARITY_IDS * parity)
            cute.arch.cp_async_bulk_wait_group(0, read=True)
            if i + 1 < count:  # the next tile's buffers (the other warp's parity)
                for w in cutlass.range_constexpr(nwg):
                    cute.arch.barrier_arrive(barrier_id=BAR_DQ_EMPTY + DQ_PARITY_IDS * (1 - parity) + w,
                                             number_of_threads=128 + 32)
            cute.arch.cp_async_bulk_wait_group(0, read=False)  # the adds done (not only read): the next turn
            cute.arch.sync_warp()
            if lane == 0:
                count_up(sem)

    @cute.jit
    def add_kv(self, thr_dkv, acc_dK: cute.Tensor, acc_dV: cute.Tensor, mdKacc: cute.Tensor, mdVacc: cute.Tensor,
               seqlen_k, n_block, head, qhead_per_kvhead, batch, mma_tidx, mSemKV):
        """GQA: this query head's dK and dV rows added into its KV head's fp32 accumulators; deterministic:
        in head order (a turn per KV tile on ``mSemKV``), every consumer thread's adds before the next turn."""
        head_kv = head // qhead_per_kvhead
        if const_expr(self.cfg.deterministic):
            sem = mSemKV.iterator + cute.crd2idx((batch, head_kv, n_block), mSemKV.layout)
            if mma_tidx == 0:
                wait_count(sem, head - head_kv * qhead_per_kvhead)
            cute.arch.barrier(barrier_id=self.epilogue_barrier, number_of_threads=self.num_mma_threads)
        rows_batch = 0 if const_expr(self.cfg.varlen) else batch  # packed: one batch (offset by the caller)
        self.add_kv_rows(thr_dkv, acc_dK, mdKacc, seqlen_k, n_block, head_kv, rows_batch)
        self.add_kv_rows(thr_dkv, acc_dV, mdVacc, seqlen_k, n_block, head_kv, rows_batch)
        if const_expr(self.cfg.deterministic):
            cute.arch.barrier(barrier_id=self.epilogue_barrier, number_of_threads=self.num_mma_threads)
            if mma_tidx == 0:
                count_up(sem)

    @cute.jit
    def add_kv_rows(self, thr_dkv, acc: cute.Tensor, mAcc: cute.Tensor, seqlen_k, n_block, head_kv, batch):
        """Add this thread's rows (keys < Sk) of a dK or dV accumulator into (B, Sk, Hkv, D) fp32."""
        cKD = cute.make_identity_tensor((self.tile_n, self.D))
        tc = thr_dkv.partition_C(cKD)
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            key = n_block * self.tile_n + tc[i][0]
            if key < seqlen_k:
                cute.arch.atomic_add(mAcc.iterator + cute.crd2idx((batch, key, head_kv, tc[i][1]), mAcc.layout),
                                     acc[i])

    @cute.jit
    def reduce_kv(self, tiled_mma_dkv, acc_dK: cute.Tensor, acc_dV: cute.Tensor, sAcc: tuple, tma_dk, mdK: cute.Tensor,
                  tma_dv, mdV: cute.Tensor, n_block, head_kv, batch, off_k, mma_tidx):
        """GQA, ``FlashBwdConfig.kv_reduce``: this query head's dK, then dV, added into its KV head's fp32
        accumulators (TMA coordinate tensors) -- warpgroup w's 64 x D tile into ``sAcc[w]`` (the K / V
        buffers' bytes, once both warpgroups' last wgmma read them), then one warp's TMA reduce-add of each
        warpgroup's tile.  Packed: rows from the sequence's first key ``off_k`` (a partial last tile's rows
        past the sequence add zeros: every step of that KV tile is masked)."""
        wg = mma_tidx // 128
        thr = tiled_mma_dkv.get_slice(mma_tidx % 128)  # (the first warpgroup's partition of a 64-row tile)
        one = cute.make_layout(1)
        for acc, atom, m_acc in ((acc_dK, tma_dk, mdK), (acc_dV, tma_dv, mdV)):
            m_head = self.rows(m_acc, off_k, head_kv, batch)  # (dense: the batch's rows; off_k is 0)
            # the buffers are free: every wgmma reading K / V (or, for dV, the dK reduce reading them) is done
            cute.arch.barrier(barrier_id=self.epilogue_barrier, number_of_threads=self.num_mma_threads)
            for w in cutlass.range_constexpr(2):
                if wg == w:
                    cute.autovec_copy(acc, thr.partition_C(sAcc[w]))
            cute.arch.fence_proxy("async.shared", space="cta")  # visible to the TMA unit (async proxy)
            cute.arch.barrier(barrier_id=self.epilogue_barrier, number_of_threads=self.num_mma_threads)
            if mma_tidx // 32 == 0:  # the whole warp: the TMA copy elects its issuing thread itself
                g_acc = cute.local_tile(m_head, (cute.size(sAcc[0], mode=[0]), self.D), (None, 0))
                for w in cutlass.range_constexpr(2):
                    t_s, t_g = cpasync.tma_partition(atom, 0, one, cute.group_modes(sAcc[w], 0, 2),
                                                     cute.group_modes(g_acc, 0, 2))
                    cute.copy(atom, t_s, t_g[None, 2 * n_block + w])
                cute.arch.cp_async_bulk_commit_group()
                cute.arch.cp_async_bulk_wait_group(0, read=True)  # the buffers stay until the reduce read them

    @cute.jit
    def store_kv(self, tiled_mma_dkv, acc_dK: cute.Tensor, acc_dV: cute.Tensor, sK, sV, tma_dk, mdK: cute.Tensor,
                 tma_dv, mdV: cute.Tensor, k_scale: Float32, n_block, head_kv, batch, mma_tidx, seqlen_k, off_k,
                 mdK_rows, mdV_rows):
        """``direct_kv``: dK (times ``k_scale``) and dV in the input dtype into the K and V buffers (once
        both warpgroups' last wgmma read them), then one warp's TMA stores (rows past Sk clipped).  Packed:
        from the sequence's first key ``off_k``; its partial last tile by the consumer threads' predicated
        stores into ``mdK_rows`` / ``mdV_rows`` (a TMA store would write the next sequence's rows)."""
        rdK = cute.make_rmem_tensor_like(acc_dK, self.dtype)
        rdK.store((acc_dK.load() * k_scale).to(self.dtype))
        rdV = cute.make_rmem_tensor_like(acc_dV, self.dtype)
        rdV.store(acc_dV.load().to(self.dtype))
        cute.arch.barrier(barrier_id=self.epilogue_barrier, number_of_threads=self.num_mma_threads)
        store_acc_to_smem(tiled_mma_dkv, rdK, sK, mma_tidx, self.dtype)
        store_acc_to_smem(tiled_mma_dkv, rdV, sV, mma_tidx, self.dtype)
        cute.arch.fence_proxy("async.shared", space="cta")  # visible to the TMA unit (async proxy)
        cute.arch.barrier(barrier_id=self.epilogue_barrier, number_of_threads=self.num_mma_threads)
        keys = seqlen_k - n_block * self.tile_n
        if const_expr(self.cfg.varlen):
            if keys < self.tile_n:  # the sequence's partial last tile: only its rows
                for s_src, m_rows in ((sK, mdK_rows), (sV, mdV_rows)):
                    g_dst = cute.local_tile(self.rows(m_rows, off_k, head_kv, batch), (self.tile_n, self.D),
                                            (n_block, 0))
                    fsl.store_rows_predicated(s_src, g_dst, keys, mma_tidx, self.num_mma_threads, self.dtype)
            else:
                self.store_kv_tiles(tma_dk, sK, self.rows(mdK, off_k, head_kv, batch), tma_dv, sV,
                                    self.rows(mdV, off_k, head_kv, batch), n_block, mma_tidx)
        else:
            self.store_kv_tiles(tma_dk, sK, mdK[None, None, head_kv, batch], tma_dv, sV, mdV[None, None, head_kv, batch],
                                n_block, mma_tidx)

    @cute.jit
    def store_kv_tiles(self, tma_dk, sK, mdK_head, tma_dv, sV, mdV_head, n_block, mma_tidx):
        """One warp's TMA stores of the dK and dV tiles ``n_block`` of one head's (S, D) rows."""
        if mma_tidx // 32 == 0:  # the whole warp: the TMA copy elects its issuing thread itself
            one = cute.make_layout(1)
            for atom, s_src, m_dst in ((tma_dk, sK, mdK_head), (tma_dv, sV, mdV_head)):
                g_dst = cute.local_tile(m_dst, (self.tile_n, self.D), (n_block, 0))
                t_s, t_g = cpasync.tma_partition(atom, 0, one, cute.group_modes(s_src, 0, 2),
                                                 cute.group_modes(g_dst, 0, 2))
                cute.copy(atom, t_s, t_g)
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)  # the buffers stay until the stores read them
