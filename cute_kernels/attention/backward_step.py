"""One query tile of the attention backward's consumer warpgroups (a mixin of
:class:`~.backward_kernel.FlashAttnBwdSm90`; the steps are in :mod:`.backward_kernel`'s docstring).

Two data flows, by :attr:`layouts.attention_backward.BwdTile.kv_split_d`:

* keys split (D <= 128): each warpgroup owns 64 keys; its P^T and dS^T stay in registers as the A
  operands of dV += P^T dO and dK += dS^T Q; only dS^T goes to shared memory (for dQ = dS K);
* head dims split (D = 256): both warpgroups share the CTA's 64 keys; each computes S^T and dP^T for
  half the queries and writes P^T and dS^T to shared memory, then, after the warpgroups' barrier,
  dV, dK and dQ for its half of the head dims with P^T / dS^T read from there.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr
from cutlass.cute.nvgpu import warpgroup

from ..common import wgmma
from ..common.barriers import NamedBarrierId
from ..common.softmax import probs_from_lse, softcap_probs_from_lse, softcap_scores
from . import forward_softmax as fs
from .backward_epilogue import BAR_DQ_EMPTY, BAR_DQ_FULL, DQ_PARITY_IDS
from .backward_mask import apply_mask_t, apply_window_mask_t

#: the named barrier of the consumer warpgroups: every warpgroup wrote its part of this stage's dS^T
#: (and P^T when the head dims are split, where they also meet on it before rewriting dS^T: no dQ still
#: reads it; in the ``direct_kv`` epilogue, no wgmma reads K / V any more, then dK / dV are in them)
BAR_DS_FULL = int(NamedBarrierId.FIRST_FREE)


class BwdQueryStep:
    """Mixin: needs ``self.cfg``, ``dtype``, ``D``, ``tile_m``, ``tile_n``, ``causal``, ``num_mma_threads``."""

    @cute.jit
    def query_tile(self, tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq, tSrK, tSrQ, tPrV, tPrdO, tKrQt, tVrdOt, tQrdS,
                   tQrK, acc_dK, acc_dV, sdS, tdQsdQ, sLSE, sDelta, tScS_mn, pipe_q, read, scale_log2, seqlen_q,
                   seqlen_k, n_block, m_block, mma_tidx, wg, masked: cutlass.Constexpr[bool], window_left=None,
                   window_right=None, softcap_scale=None, smem_a=None, carry=None, walk_index=None):
        """Query tile ``m_block``; ``smem_a``: the (dS^T, P^T) A operands in shared memory when the head
        dims are split, else None; then ``pipe_q`` / ``read`` are the (Q + LSE, dO + Delta) rings and
        their states, handed back apart: dO after dV, Q after dK (dQ, the last wgmma, reads neither);
        ``walk_index``: the tile's place in the KV tile's walk (deterministic with two dQ warps: its parity
        picks the dQ barriers, :data:`~.backward_epilogue.DQ_PARITY_IDS`).  Returns the advanced ring state(s)."""
        split_d = const_expr(self.cfg.tile.kv_split_d)
        qdo_rings = const_expr(self.cfg.tile.qdo_rings)
        acc_shape = tiled_mma_sdp.partition_shape_C((self.tile_n, self.tile_m))
        acc_S = cute.make_rmem_tensor(acc_shape, Float32)
        acc_dP = cute.make_rmem_tensor(acc_shape, Float32)
        if const_expr(split_d):  # dP^T first: its dO came a tile earlier than Q
            stage, stage_do = read[0].index, read[1].index
            pipe_q[1].consumer_wait(read[1])
            warpgroup.fence()
            wgmma.wgmma_tile(tiled_mma_sdp, acc_dP, tPrV, tPrdO, None, stage_do, accumulate=False)
            warpgroup.commit_group()
            pipe_q[0].consumer_wait(read[0])
            wgmma.wgmma_tile(tiled_mma_sdp, acc_S, tSrK, tSrQ, None, stage, accumulate=False)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
        else:
            rel = None
            if const_expr(carry is not None):  # (this tile's state, the previous tile's, handed back here)
                read, rel = read
            if const_expr(qdo_rings):  # S^T waits for Q alone, dP^T for dO
                stage, stage_do = read[0].index, read[1].index
                pipe_q[0].consumer_wait(read[0])
            else:
                stage = stage_do = read.index
                pipe_q.consumer_wait(read)
            warpgroup.fence()
            wgmma.wgmma_tile(tiled_mma_sdp, acc_S, tSrK, tSrQ, None, stage, accumulate=False)
            warpgroup.commit_group()
            if const_expr(qdo_rings):
                pipe_q[1].consumer_wait(read[1])
            wgmma.wgmma_tile(tiled_mma_sdp, acc_dP, tPrV, tPrdO, None, stage_do, accumulate=False)
            warpgroup.commit_group()
            warpgroup.wait_group(1)  # S^T is ready; dP^T may still run
            if const_expr(carry is not None):  # the previous tile's dK is done too: its stage goes back
                if rel.index != read.index or rel.phase != read.phase:
                    pipe_q.consumer_release(rel)
                    rel.advance()

        s_mn = fs.acc_mn_view(acc_S)
        # thread 0's (key, query) coordinates (compile-time): the masks' column pattern
        t0ScS_mn = fs.acc_mn_view(tiled_mma_sdp.get_slice(0).partition_C(cute.make_identity_tensor(
            (self.tile_n, self.tile_m))))
        if const_expr(self.cfg.softcap):  # t = tanh(s * softmax_scale / softcap), before the mask (as the forward)
            softcap_scores(acc_S, softcap_scale)
        if const_expr(self.cfg.mma_only):
            pass
        elif const_expr(masked and self.cfg.window):
            apply_window_mask_t(s_mn, tScS_mn, n_block, m_block, seqlen_q, seqlen_k, self.tile_n, self.tile_m,
                                window_left, window_right, t0ScS_mn)
        elif const_expr(masked):
            apply_mask_t(s_mn, tScS_mn, n_block, m_block, seqlen_q, seqlen_k, self.tile_n, self.tile_m, self.causal,
                         t0ScS_mn)
        # P^T in 16 bits: the A operand of dV += P^T dO (registers, or shared memory when split)
        rP = cute.make_rmem_tensor(acc_shape, self.dtype)
        if const_expr(self.cfg.softcap):  # P^T to rP; acc_S keeps P^T (1 - t^2) for dS^T
            softcap_probs_from_lse(s_mn, fs.acc_mn_view(rP), lambda c: sLSE[tScS_mn[0, c][1], stage], scale_log2,
                                   masked)
        else:
            if const_expr(not self.cfg.mma_only):
                probs_from_lse(s_mn, lambda c: sLSE[tScS_mn[0, c][1], stage], scale_log2)
            rP.store(acc_S.load().to(self.dtype))
        if const_expr(split_d):  # P^T to its buffer while dP^T finishes
            wgmma.store_acc_to_smem(tiled_mma_sdp, rP, sdS[None, None, 1], mma_tidx, self.dtype)
        dv_early = const_expr(self.cfg.tile.dv_early)
        tVrP = None
        if const_expr(not split_d):
            tVrP = cute.make_tensor(rP.iterator, fs.acc_to_frg_a_layout(rP.layout))
        if const_expr(dv_early):  # dV += P^T dO now: it runs while dS^T is computed
            warpgroup.fence()
            wgmma.wgmma_tile(tiled_mma_dkv, acc_dV, tVrP, tVrdOt, None, stage_do, accumulate=True)
            warpgroup.commit_group()
            warpgroup.wait_group(1)  # dP^T is ready; dV may still run
        else:
            warpgroup.wait_group(0)
        dp_mn = fs.acc_mn_view(acc_dP)
        if const_expr(not self.cfg.mma_only):
            for c in cutlass.range_constexpr(cute.size(dp_mn, mode=[1])):
                delta = sDelta[tScS_mn[0, c][1], stage_do]
                for r in cutlass.range_constexpr(cute.size(dp_mn, mode=[0])):
                    dp_mn[r, c] = s_mn[r, c] * (dp_mn[r, c] - delta)
        rdS = cute.make_rmem_tensor(acc_shape, self.dtype)
        rdS.store(acc_dP.load().to(self.dtype))

        # dS^T -> this stage's buffer (the other warpgroup read the previous stage's); keys split: dV += P^T dO
        # meanwhile.  Split: the other warpgroup's previous dQ (which reads all of dS) may still run after
        # it handed Q back, so both warpgroups first meet here
        if const_expr(split_d):
            cute.arch.barrier(barrier_id=BAR_DS_FULL, number_of_threads=self.num_mma_threads)
        wgmma.store_acc_to_smem(tiled_mma_sdp, rdS, sdS[None, None, stage], mma_tidx, self.dtype)
        if const_expr(not split_d and not dv_early):
            warpgroup.fence()
            wgmma.wgmma_tile(tiled_mma_dkv, acc_dV, tVrP, tVrdOt, None, stage_do, accumulate=True)
            warpgroup.commit_group()
        cute.arch.fence_proxy("async.shared", space="cta")  # visible to the wgmma (async proxy)
        cute.arch.barrier(barrier_id=BAR_DS_FULL, number_of_threads=self.num_mma_threads)
        if const_expr(split_d):  # every warpgroup's P^T and dS^T are in: dV += P^T dO, dK += dS^T Q over all queries
            warpgroup.fence()
            wgmma.wgmma_tile(tiled_mma_dkv, acc_dV, smem_a[1], tVrdOt, None, stage_do, accumulate=True)
            warpgroup.commit_group()
            wgmma.wgmma_tile(tiled_mma_dkv, acc_dK, smem_a[0], tKrQt, None, stage, accumulate=True)
            warpgroup.commit_group()

        # dQ = dS K (keys split: then dK += dS^T Q while dQ goes to shared memory)
        acc_dQ = cute.make_rmem_tensor(tiled_mma_dq.get_slice(mma_tidx).partition_shape_C(
            (self.tile_m, self.D)), Float32)
        if const_expr(dv_early):  # dK's A operand (dS^T) was written to registers after dV's fence
            warpgroup.fence()
        wgmma.wgmma_tile(tiled_mma_dq, acc_dQ, tQrdS, tQrK, stage, None, accumulate=False)
        warpgroup.commit_group()
        if const_expr(split_d):  # dO (and Delta), then Q (and LSE) handed back as their last readers finish:
            # the next tile's Q load overlaps this dQ and the next dP^T
            warpgroup.wait_group(2)
            pipe_q[1].consumer_release(read[1])
            read[1].advance()
            warpgroup.wait_group(1)
            pipe_q[0].consumer_release(read[0])
            read[0].advance()
            warpgroup.wait_group(0)
        else:
            if const_expr(carry is not None):  # dS^T from shared memory: dK runs on into the next tile
                wgmma.wgmma_tile(carry[0], acc_dK, carry[1], carry[2], stage, stage, accumulate=True)
            else:
                tKrdS = cute.make_tensor(rdS.iterator, fs.acc_to_frg_a_layout(rdS.layout))
                wgmma.wgmma_tile(tiled_mma_dkv, acc_dK, tKrdS, tKrQt, None, stage, accumulate=True)
            warpgroup.commit_group()
            warpgroup.wait_group(1)  # dQ (and dV) done; dK may still run
            if const_expr(qdo_rings):  # dO's last reader (dV) is done: its stage goes back
                pipe_q[1].consumer_release(read[1])
                read[1].advance()

        # dQ -> this warpgroup's fp32 tile once the dQ warp's previous reduce has read it; its reduce-add
        bar_empty, bar_full = BAR_DQ_EMPTY + wg, BAR_DQ_FULL + wg
        if const_expr(self.cfg.deterministic and self.cfg.tile.dq_warps == 2):
            bar_empty, bar_full = (b + DQ_PARITY_IDS * (walk_index % 2) for b in (bar_empty, bar_full))
        cute.arch.barrier(barrier_id=bar_empty, number_of_threads=128 + 32)
        cute.autovec_copy(acc_dQ, tdQsdQ)
        cute.arch.fence_proxy("async.shared", space="cta")  # visible to the TMA unit (async proxy)
        cute.arch.barrier_arrive(barrier_id=bar_full, number_of_threads=128 + 32)

        if const_expr(not split_d):
            if const_expr(carry is not None):
                read.advance()
                read = (read, rel)
            elif const_expr(qdo_rings):  # and Q's (dK)
                warpgroup.wait_group(0)
                pipe_q[0].consumer_release(read[0])
                read[0].advance()
            else:
                warpgroup.wait_group(0)
                pipe_q.consumer_release(read)
                read.advance()
        return read
