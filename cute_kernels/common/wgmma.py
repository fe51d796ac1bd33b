"""wgmma steps: one tile's k-blocks (:func:`wgmma_tile`, operand A from shared memory or registers)
and the mainloop that walks the operand ring with one wgmma group in flight (:func:`wgmma_mainloop`)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum


def _k_block(frag: cute.Tensor, kb: int, stage):
    """k-block ``kb`` of a (MMA, M/N, k-blocks[, stages]) fragment, of stage ``stage`` if given.
    (Indexed in one step: slicing the stage first changes the code ptxas makes of the ring walk.)"""
    if stage is None:
        return frag[(None, None, kb)]
    return frag[(None, None, kb, stage)]


@cute.jit
def wgmma_tile(tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
               a_stage=None, b_stage=None, accumulate=None):
    """``acc += A @ B`` (or ``acc = A @ B``) over the k-blocks of one stage.

    ``tCrA`` / ``tCrB``: a thread's (MMA, M/N, k-blocks) fragments, or (MMA, M/N, k-blocks, stages)
    with ``a_stage`` / ``b_stage`` picking the stage (a ring's ``read.index``).  A comes from shared
    memory (descriptors, an ``OperandSource.SMEM`` tiled MMA) or from registers (an
    ``OperandSource.RMEM`` tiled MMA and a register fragment, e.g. softmax probabilities converted to
    16 bits); B always from shared memory.

    ``accumulate``: None -- the tiled MMA's ACCUMULATE field as the caller set it (``warpgroup.fence``,
    ``commit_group`` and ``wait_group`` stay with the caller, too); a Boolean (run-time predicate) --
    the first k-block accumulates iff it is true (``acc = A @ B`` when false: no ``acc.fill(0)``), the
    others always.  The predicate goes on a fresh atom: a field set on a loop-carried tiled MMA would
    not dominate its later uses."""
    num_k_blocks = cute.size(tCrA, mode=[2])
    if cutlass.const_expr(accumulate is None):
        for kb in cutlass.range_constexpr(num_k_blocks):
            cute.gemm(tiled_mma, acc, _k_block(tCrA, kb, a_stage), _k_block(tCrB, kb, b_stage), acc)
    else:
        mma_atom = cute.make_mma_atom(tiled_mma.op)
        mma_atom.set(warpgroup.Field.ACCUMULATE, accumulate)
        for kb in cutlass.range_constexpr(num_k_blocks):
            cute.gemm(mma_atom, acc, _k_block(tCrA, kb, a_stage), _k_block(tCrB, kb, b_stage), acc)
            mma_atom.set(warpgroup.Field.ACCUMULATE, True)


@cute.jit
def wgmma_mainloop(tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
                   ab_pipe, read, release, k_tiles, zero_init: cutlass.Constexpr[bool] = False,
                   after_commit=None, after_commit_args=()):
    """acc += A @ B over ``k_tiles`` stages of the ring (``tCrA`` / ``tCrB``: (MMA, M/N, k-blocks,
    stage) fragments), one wgmma group in flight.

    ``zero_init``: acc = A @ B instead: the first k-tile's first wgmma runs with ACCUMULATE off (the
    instruction's scale-d predicate), so the caller skips ``acc.fill(0)`` between tiles while the
    tensor cores wait (as quack and CUTLASS do).  Only when ``k_tiles >= 1`` (a split-K slice may be
    empty: those callers keep the fill).

    ``after_commit(kt, *after_commit_args)`` (traced inline) runs right after k-tile ``kt``'s wgmma
    group is committed, while it executes: the GEMM's deferred epilogue stores the previous tile there.

    A stage is released only once the wgmma group that read it has retired (``wait_group(1)`` after
    the next group was committed), so the producer can refill it while the tensor cores keep going.

    Returns the advanced ``(read, release)`` states, and callers must rebind them
    (``read, release = wgmma_mainloop(...)``): a DSL loop carries a value across iterations only if its
    body assigns it or calls a method on it, so a persistent tile loop that merely passes the states
    in would restart every tile at stage 0 / phase 0 while the producer runs on (deadlock whenever
    ``k_tiles`` is not a multiple of 2 x stages and a CTA gets more than one tile).
    """
    tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.fence()
    for kt in range(k_tiles):
        ab_pipe.consumer_wait(read)
        if cutlass.const_expr(zero_init):
            wgmma_tile(tiled_mma, acc, tCrA, tCrB, read.index, read.index, accumulate=kt != 0)
        else:
            wgmma_tile(tiled_mma, acc, tCrA, tCrB, read.index, read.index)
        warpgroup.commit_group()
        if cutlass.const_expr(after_commit is not None):
            after_commit(kt, *after_commit_args)
        warpgroup.wait_group(1)
        if kt > 0:
            ab_pipe.consumer_release(release)
            release.advance()
        read.advance()
    warpgroup.wait_group(0)
    if k_tiles > 0:
        ab_pipe.consumer_release(release)
        release.advance()
    return read, release


@cute.jit
def store_acc_to_smem(tiled_mma: cute.TiledMma, r_acc: cute.Tensor, s_dst: cute.Tensor, tidx,
                      dtype: cutlass.Constexpr):
    """A 16-bit copy ``r_acc`` of ``tiled_mma``'s accumulator (thread ``tidx`` of the MMA's threads)
    into ``s_dst`` (the C tile in shared memory, row-major-swizzled) by stmatrix; the caller fences
    (``fence_proxy("async.shared")`` before a wgmma or TMA reads it) and synchronizes."""
    c_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), dtype)
    r2s_atom = sm90_utils.get_smem_store_op(LayoutEnum.ROW_MAJOR, dtype, cutlass.Float32)
    tiled_r2s = cute.make_tiled_copy_S(r2s_atom, cute.make_tiled_copy_C_atom(c_atom, tiled_mma))
    thr_r2s = tiled_r2s.get_slice(tidx)
    t_dst = thr_r2s.partition_D(s_dst)
    # the accumulator in the copy's value order, reshaped like the copy's source (same linear order)
    t_src_acc = tiled_r2s.retile(r_acc)
    t_src = cute.make_tensor(t_src_acc.iterator, cute.composition(
        t_src_acc.layout, cute.make_layout(cute.shape(thr_r2s.partition_S(s_dst)))))
    cute.copy(tiled_r2s, t_src, t_dst)
