"""The attention forward's KV loop with the softmax overlapped with the tensor cores (FlashAttention-3's
schedule on Hopper), a mixin of :class:`~cute_kernels.attention.forward_kernel.FlashAttnFwdSm90`.

Per consumer warpgroup, KV tiles n = n_max - 1 down to n_min (0 unless a sliding window cuts the
left; masked ones first, a window's masked left-edge tiles last):

* first tile: S = Q K^T (wait), mask, softmax, P in 16 bits -- nothing to overlap with yet;
* every further tile n: issue S(n) = Q K(n)^T, then O += P(n+1) V(n+1) (the previous tile's P, still
  in registers), wait for the QK wgmma only, mask and softmax S(n) while the PV wgmma runs, wait for
  it, rescale O by tile n's correction, convert P(n);
* last: O += P(0) V(0).

With ``pingpong`` the consumer warpgroups take turns issuing those two wgmmas
(:func:`~cute_kernels.common.barriers.wait_turn` / ``pass_turn``): warpgroup w issues, passes the turn
and runs its softmax while warpgroup w + 1's GEMMs keep the tensor cores busy.  Turn balance: the
first consumer warpgroup passes itself a turn before the loop (its first turn needs no predecessor)
and takes one more after it (the last warpgroup's final hand-over), so every arrival on a named
barrier is matched by a wait when the CTA exits, for any tile count including 0.

With ``rescale_before_pv`` (large head dims) the correction of tile n+1 is applied to O just before
O += P(n+1) V(n+1) is issued, under the QK wgmma, instead of after the PV wgmma of tile n+1 retires.

With ``p_smem`` P(n) is converted and written to the warpgroup's rows of the P buffer (stmatrix) once
the PV wgmma that read P(n+1) there has retired, then fenced for the async proxy and synchronized
across the warpgroup (its own named barrier), so the next PV wgmma reads it from shared memory.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr
from cutlass.cute.nvgpu import warpgroup

from ..common import wgmma
from ..common.barriers import THREADS_PER_WARPGROUP, NamedBarrierId, pass_turn, wait_turn
from ..common.softmax import OnlineSoftmax
from . import forward_softmax as fs


class OverlappedKVLoop:
    """Mixin: needs ``self.cfg`` (``mma_only``, ``tile.p_smem``), ``dtype``, ``tile_m``, ``tile_n``,
    ``num_wg``, ``pingpong``, ``rescale_before_pv``, ``window``."""

    @cute.jit
    def overlapped_kv_loop(self, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma, tSrQ: cute.Tensor,
                           tSrK: cute.Tensor, tOrVt: cute.Tensor, acc_O: cute.Tensor, acc_O_mn: cute.Tensor,
                           softmax: OnlineSoftmax, pipe_k, pipe_v, read_k, read_v, mask: fs.TileMask,
                           n_max, n_mask, wg, n_min, n_lo, sP=None, mma_tidx=None):
        """Every KV tile of this query tile into ``acc_O`` / ``softmax`` (see the module docstring):
        ``n_min .. n_max - 1``, tiles ``n_lo .. n_mask - 1`` without a mask (``n_min = n_lo = 0``
        unless ``self.window``); ``sP``: the P buffer (``p_smem``), ``mma_tidx`` the thread among the
        consumers.  Returns the advanced ring states."""
        acc_shape = tiled_mma_qk.partition_shape_C((self.tile_m, self.tile_n))
        rP = cute.make_rmem_tensor(acc_shape, self.dtype)  # P of the previous tile (p_smem: of this one)
        if const_expr(self.cfg.tile.p_smem):
            tOrP = tiled_mma_pv.make_fragment_A(tiled_mma_pv.get_slice(wg * THREADS_PER_WARPGROUP).partition_A(sP))
            rP = (rP, sP, mma_tidx, wg)  # what keep_p needs
        else:
            tOrP = cute.make_tensor(rP.iterator, fs.acc_to_frg_a_layout(rP.layout))
        corr = cute.make_rmem_tensor((cute.size(acc_O_mn, mode=[0]),), Float32)
        if const_expr(self.pingpong):
            if wg == 0:
                pass_turn(self.num_wg - 1, self.num_wg)  # the first turn: to warpgroup 0 from "the last"

        if n_max > n_min:
            read_k = self.first_tile(tiled_mma_qk, tSrQ, tSrK, softmax, pipe_k, read_k, mask, rP, corr, n_max - 1)
            # ---- the other masked tiles, then the unmasked ones
            for i in cutlass.range(cutlass.max(n_max - 1 - n_mask, 0), unroll=1):
                read_k, read_v = self.overlapped_tile(tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, acc_O, acc_O_mn,
                                                      softmax, pipe_k, pipe_v, read_k, read_v, mask, rP, tOrP, corr,
                                                      n_max - 2 - i, wg, True)
            n_plain = cutlass.min(n_mask, n_max - 1)
            if const_expr(self.window):
                for i in cutlass.range(cutlass.max(n_plain - n_lo, 0), unroll=1):
                    read_k, read_v = self.overlapped_tile(tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, acc_O,
                                                          acc_O_mn, softmax, pipe_k, pipe_v, read_k, read_v, mask, rP,
                                                          tOrP, corr, n_plain - 1 - i, wg, False)
                # ---- the window's left-edge tiles (masked), down to n_min
                n_edge = cutlass.min(n_lo, n_max - 1)
                for i in cutlass.range(cutlass.max(n_edge - n_min, 0), unroll=1):
                    read_k, read_v = self.overlapped_tile(tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, acc_O,
                                                          acc_O_mn, softmax, pipe_k, pipe_v, read_k, read_v, mask, rP,
                                                          tOrP, corr, n_edge - 1 - i, wg, True)
            else:
                for i in cutlass.range(n_plain, unroll=1):
                    read_k, read_v = self.overlapped_tile(tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, acc_O,
                                                          acc_O_mn, softmax, pipe_k, pipe_v, read_k, read_v, mask, rP,
                                                          tOrP, corr, n_plain - 1 - i, wg, False)
            read_v = self.last_pv(tiled_mma_pv, tOrVt, acc_O, acc_O_mn, pipe_v, read_v, tOrP, corr)

        if const_expr(self.pingpong):
            if wg == 0:
                wait_turn(0)  # the last warpgroup's final hand-over
        return read_k, read_v

    @cute.jit
    def first_tile(self, tiled_mma_qk: cute.TiledMma, tSrQ: cute.Tensor, tSrK: cute.Tensor, softmax: OnlineSoftmax,
                   pipe_k, read_k, mask: fs.TileMask, rP, corr: cute.Tensor, n_block):
        """The first (always masked: key-length tail or causal diagonal) tile: S = Q K^T, wait, softmax,
        P into ``rP`` -- nothing to overlap with yet.  Returns the advanced K ring state."""
        acc_S = cute.make_rmem_tensor(tiled_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        pipe_k.consumer_wait(read_k)
        self.issue_qk(tiled_mma_qk, acc_S, tSrQ, tSrK, read_k, n_block)
        warpgroup.wait_group(0)
        pipe_k.consumer_release(read_k)
        read_k.advance()
        self.softmax_tile(acc_S, softmax, corr, mask, n_block, True)
        self.keep_p(tiled_mma_qk, acc_S, rP)
        return read_k

    @cute.jit
    def last_pv(self, tiled_mma_pv: cute.TiledMma, tOrVt: cute.Tensor, acc_O: cute.Tensor, acc_O_mn: cute.Tensor,
                pipe_v, read_v, tOrP: cute.Tensor, corr: cute.Tensor):
        """O += P(0) V(0) for the last tile.  Returns the advanced V ring state."""
        if const_expr(self.rescale_before_pv and not self.cfg.mma_only):
            fs.rescale_rows(acc_O_mn, corr)
        pipe_v.consumer_wait(read_v)
        self.issue_pv(tiled_mma_pv, acc_O, tOrP, tOrVt, read_v)
        warpgroup.wait_group(0)
        pipe_v.consumer_release(read_v)
        read_v.advance()
        return read_v

    @cute.jit
    def overlapped_tile(self, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma, tSrQ: cute.Tensor,
                        tSrK: cute.Tensor, tOrVt: cute.Tensor, acc_O: cute.Tensor, acc_O_mn: cute.Tensor,
                        softmax: OnlineSoftmax, pipe_k, pipe_v, read_k, read_v, mask: fs.TileMask,
                        rP, tOrP: cute.Tensor, corr: cute.Tensor, n_block, wg,
                        masked: cutlass.Constexpr[bool]):
        """KV tile ``n_block``: S(n) = Q K(n)^T and O += P(n+1) V(n+1) issued together, the softmax of
        S(n) under the PV wgmma.  Returns the advanced ring states."""
        acc_S = cute.make_rmem_tensor(tiled_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        pipe_k.consumer_wait(read_k)
        if const_expr(self.pingpong):
            wait_turn(wg)
        self.issue_qk(tiled_mma_qk, acc_S, tSrQ, tSrK, read_k, n_block)
        if const_expr(self.rescale_before_pv and not self.cfg.mma_only):
            fs.rescale_rows(acc_O_mn, corr)  # tile n+1's correction, before its PV
        pipe_v.consumer_wait(read_v)
        self.issue_pv(tiled_mma_pv, acc_O, tOrP, tOrVt, read_v)
        if const_expr(self.pingpong):
            pass_turn(wg, self.num_wg)
        warpgroup.wait_group(1)  # S(n) is ready; the PV wgmma may still run
        pipe_k.consumer_release(read_k)
        read_k.advance()

        self.softmax_tile(acc_S, softmax, corr, mask, n_block, masked)

        warpgroup.wait_group(0)
        pipe_v.consumer_release(read_v)
        read_v.advance()
        if const_expr(not self.rescale_before_pv and not self.cfg.mma_only):
            fs.rescale_rows(acc_O_mn, corr)
        self.keep_p(tiled_mma_qk, acc_S, rP)
        return read_k, read_v

    @cute.jit
    def issue_qk(self, tiled_mma_qk: cute.TiledMma, acc_S: cute.Tensor, tSrQ: cute.Tensor, tSrK: cute.Tensor, read_k,
                 n_block):
        """S = Q K(n)^T as one wgmma group; ``softmax_only`` (the softmax bound): no wgmma, distinct run-time
        scores in [0, 8) instead, one multiply-add each (constants would fold the softmax away)."""
        if const_expr(self.cfg.softmax_only):
            nb = Float32(n_block)
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                acc_S[i] = nb * Float32(2.0 ** -20) + Float32((i * 37 % 251) / 32.0)
        else:
            warpgroup.fence()
            wgmma.wgmma_tile(tiled_mma_qk, acc_S, tSrQ, tSrK, None, read_k.index, accumulate=False)
            warpgroup.commit_group()

    @cute.jit
    def issue_pv(self, tiled_mma_pv: cute.TiledMma, acc_O: cute.Tensor, tOrP: cute.Tensor, tOrVt: cute.Tensor, read_v):
        """O += P V as one wgmma group (none with ``softmax_only``)."""
        if const_expr(not self.cfg.softmax_only):
            warpgroup.fence()
            wgmma.wgmma_tile(tiled_mma_pv, acc_O, tOrP, tOrVt, None, read_v.index, accumulate=True)
            warpgroup.commit_group()

    @cute.jit
    def keep_p(self, tiled_mma_qk: cute.TiledMma, acc_S: cute.Tensor, rP):
        """P (``acc_S`` after the softmax) in 16 bits for the next PV wgmma: into the register tile
        ``rP``; with ``p_smem`` (``rP`` = (register tile, P buffer, consumer thread, warpgroup)) on into
        the warpgroup's rows of the P buffer, fenced for the wgmma and synchronized across the
        warpgroup.  The caller has waited for the PV wgmma that read the previous P."""
        if const_expr(self.cfg.tile.p_smem):
            r, sP, mma_tidx, wg = rP
            r.store(acc_S.load().to(self.dtype))
            wgmma.store_acc_to_smem(tiled_mma_qk, r, sP, mma_tidx, self.dtype)
            cute.arch.fence_proxy("async.shared", space="cta")  # visible to the wgmma (async proxy)
            cute.arch.barrier(barrier_id=int(NamedBarrierId.FIRST_FREE) + wg, number_of_threads=THREADS_PER_WARPGROUP)
        else:
            rP.store(acc_S.load().to(self.dtype))

    @cute.jit
    def softmax_tile(self, acc_S: cute.Tensor, softmax: OnlineSoftmax, corr: cute.Tensor, mask: fs.TileMask,
                     n_block, masked: cutlass.Constexpr[bool]):
        """Softcapping (a softcapping configuration), mask (if ``masked``) and online softmax of one S
        tile in place (S becomes P, unconverted); each row's O correction into ``corr``."""
        if const_expr(not self.cfg.mma_only):
            softmax.softcap(acc_S)  # (softcapping configurations only: before the mask's -inf)
            acc_S_mn = fs.acc_mn_view(acc_S)
            if const_expr(masked):
                mask.apply(acc_S_mn, n_block)
            poly = 0 if const_expr(masked) else self.cfg.tile.exp2_poly_share  # -inf scores stay on MUFU
            for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
                corr[r] = softmax.step_row(r, acc_S_mn[r, None], poly)
