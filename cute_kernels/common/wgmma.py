"""wgmma steps: the mainloop that walks the operand ring, one wgmma group in flight."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup


@cute.jit
def wgmma_mainloop(tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
                   ab_pipe, read, release, k_tiles, handoff_barrier_id=None, handoff_threads: int = 0,
                   zero_init: cutlass.Constexpr[bool] = False, after_commit=None, after_commit_args=()):
    """acc += A @ B over ``k_tiles`` stages of the ring, one wgmma group in flight.

    ``zero_init``: acc = A @ B instead: the first k-tile's first wgmma runs with ACCUMULATE off (the
    instruction's scale-d predicate), so the caller skips ``acc.fill(0)``, i.e. 64 register-pair
    moves per thread between tiles while the tensor cores wait (as quack and CUTLASS do).  Only when
    ``k_tiles >= 1`` (a split-K slice may be empty: those callers keep the fill).

    ``after_commit(kt, *after_commit_args)`` (traced inline) runs right after k-tile ``kt``'s wgmma
    group is committed, while it executes: the GEMM's deferred epilogue stores the previous tile there.

    A stage is released only once the wgmma group that read it has retired (``wait_group(1)`` after
    the next group was committed), so the producer can refill it while the tensor cores keep going.

    Returns the advanced ``(read, release)`` states, and callers must rebind them
    (``read, release = wgmma_mainloop(...)``): a DSL loop carries a value across iterations only if its
    body assigns it or calls a method on it, so a persistent tile loop that merely passes the states
    in would restart every tile at stage 0 / phase 0 while the producer runs on (deadlock whenever
    ``k_tiles`` is not a multiple of 2 x stages and a CTA gets more than one tile).

    Ping-pong consumers pass ``handoff_barrier_id``: once this warpgroup has issued its last wgmma of
    the tile it arrives on that named barrier (``handoff_threads`` threads: this warpgroup's arrive +
    the other warpgroup's sync), so the other warpgroup starts issuing its tile's wgmmas while the
    tensor cores still drain these.
    """
    num_k_blocks = cute.size(tCrA, mode=[2])
    tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.fence()
    for kt in range(k_tiles):
        ab_pipe.consumer_wait(read)
        if cutlass.const_expr(zero_init):
            # a fresh atom per k-tile: its ACCUMULATE field is a run-time predicate set in this body
            # (a field set on the loop-carried tiled_mma would not dominate its later uses)
            mma_atom = cute.make_mma_atom(tiled_mma.op)
            mma_atom.set(warpgroup.Field.ACCUMULATE, kt != 0)
            for kb in cutlass.range_constexpr(num_k_blocks):
                cute.gemm(mma_atom, acc, tCrA[(None, None, kb, read.index)], tCrB[(None, None, kb, read.index)], acc)
                mma_atom.set(warpgroup.Field.ACCUMULATE, True)
        else:
            for kb in cutlass.range_constexpr(num_k_blocks):
                cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read.index)], tCrB[(None, None, kb, read.index)], acc)
        warpgroup.commit_group()
        if cutlass.const_expr(after_commit is not None):
            after_commit(kt, *after_commit_args)
        warpgroup.wait_group(1)
        if kt > 0:
            ab_pipe.consumer_release(release)
            release.advance()
        read.advance()
    if cutlass.const_expr(handoff_barrier_id is not None):
        cute.arch.barrier_arrive(barrier_id=handoff_barrier_id, number_of_threads=handoff_threads)
    warpgroup.wait_group(0)
    if k_tiles > 0:
        ab_pipe.consumer_release(release)
        release.advance()
    return read, release
