"""The last-CTA fixup protocol: partial tiles published to an fp32 workspace, counted per tile, and
summed by whichever contributor counts last (no CTA waits for another, so any residency works)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

#: fp32 per partial-tile chunk: one 16-byte store / load per thread and chunk
PARTIAL_VEC = 4


@cute.jit
def partial_workspace(mWs: cute.Tensor, nthr: int, acc_size: int, tile_elems: int) -> cute.Tensor:
    """The fp32 split-K workspace as ``ws[V, thread, chunk, slot]``: a slot holds one partial tile in
    the accumulator's fragment order, chunk-major, so a warp's 16-byte stores / loads of one chunk
    cover 512 contiguous bytes."""
    V = PARTIAL_VEC
    chunks = acc_size // V
    return cute.make_tensor(mWs.iterator, cute.make_layout((V, nthr, chunks, cute.size(mWs) // tile_elems),
                                                           stride=(1, V, V * nthr, tile_elems)))


@cute.jit
def publish_partial(acc: cute.Tensor, ws: cute.Tensor, thr, slot, mCnt: cute.Tensor, tile_id, sFlag: cute.Tensor,
                    barrier_id: int, nthr: int, splits: int):
    """Store this thread's fragment of a partial tile into ``ws`` slot ``slot``, then count it on the
    tile's int32 counter ``mCnt[tile_id]``; returns True in every thread of the CTA that counted last.

    Memory order: partial stores -> fence.acq_rel.gpu (every thread) -> barrier of the ``nthr`` threads
    -> one thread's atom.add.acq_rel.gpu -> its result through ``sFlag`` and a second barrier; the last
    CTA fences again before reading the other partials and resets the counter for the next launch."""
    V = PARTIAL_VEC
    for j in cutlass.range_constexpr(cute.size(acc) // V):
        part = cute.make_rmem_tensor((V,), cutlass.Float32)
        for e in cutlass.range_constexpr(V):
            part[e] = acc[j * V + e]
        cute.autovec_copy(part, ws[(None, thr, j, slot)])
    cute.arch.fence_acq_rel_gpu()
    pipeline.NamedBarrier(barrier_id=barrier_id, num_threads=nthr).arrive_and_wait()
    if thr == 0:
        old = cute.arch.atomic_add(mCnt.iterator + tile_id, cutlass.Int32(1), sem="acq_rel", scope="gpu")
        sFlag[0] = old
    pipeline.NamedBarrier(barrier_id=barrier_id, num_threads=nthr).arrive_and_wait()
    last = sFlag[0] == splits - 1
    if last:
        cute.arch.fence_acq_rel_gpu()
        if thr == 0:
            mCnt[tile_id] = 0
    return last


@cute.jit
def add_partial(acc: cute.Tensor, ws: cute.Tensor, thr, j: cutlass.Constexpr[int], slot,
                overwrite: cutlass.Constexpr[bool] = False):
    """``acc`` chunk ``j`` (+)= this thread's chunk ``j`` of the partial tile in ``ws`` slot ``slot``
    (one 16-byte load); ``overwrite``: assign instead of add (the first slot of a sum)."""
    V = PARTIAL_VEC
    part = cute.make_rmem_tensor((V,), cutlass.Float32)
    cute.autovec_copy(ws[(None, thr, j, slot)], part)
    for e in cutlass.range_constexpr(V):
        if cutlass.const_expr(overwrite):
            acc[j * V + e] = part[e]
        else:
            acc[j * V + e] = acc[j * V + e] + part[e]


@cute.jit
def publish_and_sum(acc: cute.Tensor, ws: cute.Tensor, thr, own_slot, slot0, count, mCnt: cute.Tensor, tile_id,
                    sFlag: cute.Tensor, barrier_id: int, nthr: int):
    """:func:`publish_partial` into ``own_slot``; in the CTA that counted last (returned), replace
    ``acc`` by the sum of slots ``slot0 .. slot0 + count - 1`` in order, its own read back too, so the
    bits do not depend on completion order.  A dynamic slot loop: unrolled, the compiler would hoist
    count x (acc size) loads and spill."""
    last = publish_partial(acc, ws, thr, own_slot, mCnt, tile_id, sFlag, barrier_id, nthr, count)
    if last:
        acc.fill(0.0)
        for q in cutlass.range(count, unroll=1):  # fixed slot order: bitwise reproducible
            for j in cutlass.range_constexpr(cute.size(acc) // PARTIAL_VEC):
                add_partial(acc, ws, thr, j, slot0 + q)
    return last
