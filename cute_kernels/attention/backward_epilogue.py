"""The attention backward kernel's dK / dV epilogue (a mixin of
:class:`~.backward_kernel.FlashAttnBwdSm90`): with one query head per KV head, dK and dV through the K /
V buffers and TMA stores; with GQA, each thread's rows added into the fp32 accumulators."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.cute.nvgpu import cpasync

from ..common.wgmma import store_acc_to_smem


class BwdKvEpilogue:
    """Mixin: needs ``self.dtype``, ``tile_n``, ``D``, ``num_mma_threads`` and ``epilogue_barrier`` (a
    named barrier of the consumer warpgroups, free once their query-tile loop is done)."""

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
    def store_kv_tma(self, tiled_mma_dkv, acc_dK: cute.Tensor, acc_dV: cute.Tensor, sK, sV, tma_dk, mdK: cute.Tensor,
                     tma_dv, mdV: cute.Tensor, k_scale: Float32, n_block, head_kv, batch, mma_tidx):
        """``direct_kv``: dK (times ``k_scale``) and dV in the input dtype into the K and V buffers (once
        both warpgroups' last wgmma read them), then one warp's TMA stores (rows past Sk clipped)."""
        rdK = cute.make_rmem_tensor_like(acc_dK, self.dtype)
        rdK.store((acc_dK.load() * k_scale).to(self.dtype))
        rdV = cute.make_rmem_tensor_like(acc_dV, self.dtype)
        rdV.store(acc_dV.load().to(self.dtype))
        cute.arch.barrier(barrier_id=self.epilogue_barrier, number_of_threads=self.num_mma_threads)
        store_acc_to_smem(tiled_mma_dkv, rdK, sK, mma_tidx, self.dtype)
        store_acc_to_smem(tiled_mma_dkv, rdV, sV, mma_tidx, self.dtype)
        cute.arch.fence_proxy("async.shared", space="cta")  # visible to the TMA unit (async proxy)
        cute.arch.barrier(barrier_id=self.epilogue_barrier, number_of_threads=self.num_mma_threads)
        if mma_tidx // 32 == 0:  # the whole warp: the TMA copy elects its issuing thread itself
            one = cute.make_layout(1)
            for atom, s_src, m_dst in ((tma_dk, sK, mdK), (tma_dv, sV, mdV)):
                g_dst = cute.local_tile(m_dst[None, None, head_kv, batch], (self.tile_n, self.D), (n_block, 0))
                t_s, t_g = cpasync.tma_partition(atom, 0, one, cute.group_modes(s_src, 0, 2),
                                                 cute.group_modes(g_dst, 0, 2))
                cute.copy(atom, t_s, t_g)
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)  # the buffers stay until the stores read them
