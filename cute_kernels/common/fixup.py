"""The split-K fixup protocols: partial tiles published to an fp32 workspace and counted per tile,
then summed in slot order either by whichever contributor counts last (no CTA waits for another, so
any residency works) or, part by part, by every contributor that claims a part (the shared finish
below: bounded polling, the last contributor finishing what nobody claimed)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

from .host import MAX_PARTS, PARTIAL_VEC  # noqa: E402,F401  (the planner reads them without the DSL)


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
def store_partial(acc: cute.Tensor, ws: cute.Tensor, thr, slot, barrier_id: int, nthr: int):
    """This thread's fragment of a partial tile into ``ws`` slot ``slot`` (16-byte stores), then a
    gpu-scope fence in every thread and a barrier of the ``nthr`` threads: the partial is complete and
    visible before any of them counts it."""
    V = PARTIAL_VEC
    for j in cutlass.range_constexpr(cute.size(acc) // V):
        part = cute.make_rmem_tensor((V,), cutlass.Float32)
        for e in cutlass.range_constexpr(V):
            part[e] = acc[j * V + e]
        cute.autovec_copy(part, ws[(None, thr, j, slot)])
    cute.arch.fence_acq_rel_gpu()
    pipeline.NamedBarrier(barrier_id=barrier_id, num_threads=nthr).arrive_and_wait()


@cute.jit
def publish_partial(acc: cute.Tensor, ws: cute.Tensor, thr, slot, mCnt: cute.Tensor, tile_id, sFlag: cute.Tensor,
                    barrier_id: int, nthr: int, splits: int):
    """Store this thread's fragment of a partial tile into ``ws`` slot ``slot``, then count it on the
    tile's int32 counter ``mCnt[tile_id]``; returns True in every thread of the CTA that counted last.

    Memory order: partial stores -> fence.acq_rel.gpu (every thread) -> barrier of the ``nthr`` threads
    -> one thread's atom.add.acq_rel.gpu -> its result through ``sFlag`` and a second barrier; the last
    CTA fences again before reading the other partials and resets the counter for the next launch."""
    store_partial(acc, ws, thr, slot, barrier_id, nthr)
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
        sum_slots(acc, ws, thr, 0, cute.size(acc) // PARTIAL_VEC, slot0, count)
    return last


@cute.jit
def sum_slots(acc: cute.Tensor, ws: cute.Tensor, thr, first: cutlass.Constexpr[int], chunks: cutlass.Constexpr[int],
              slot0, count):
    """``acc`` chunks ``first .. first + chunks - 1`` become the sum of this thread's chunks of slots
    ``slot0 .. slot0 + count - 1``, in slot order (bitwise the same whoever sums)."""
    for jj in cutlass.range_constexpr(chunks):
        for v in cutlass.range_constexpr(PARTIAL_VEC):
            acc[(first + jj) * PARTIAL_VEC + v] = cutlass.Float32(0.0)
    for q in cutlass.range(count, unroll=1):  # fixed slot order: bitwise reproducible
        for jj in cutlass.range_constexpr(chunks):
            add_partial(acc, ws, thr, first + jj, slot0 + q)


# ---------------------------------------------------------------------------------------------------
# Shared finish: every contributor sums and stores a part of the tile (``GemmConfig.fixup_parts``).
#
# The last-CTA protocol above leaves one CTA per tile to read all S partials and store the whole tile
# while the other S - 1 have exited: with one wave of units, the tail of the kernel is a quarter of
# the SMs (S = 4) each reading S whole partials.  Here the tile's sub-tiles are cut into S parts;
# each contributor, once every partial is published, claims its own part (the one of its slice
# index), sums that part's S slots in slot order and stores it, so S CTAs share the tail.  Nobody
# waits without a bound: the CTA that publishes last claims every part still unclaimed at that moment
# and finishes them itself, and a contributor that sees the others' partials late (a unit not yet
# resident, another wave) stops polling after SPIN_POLLS tries, its part then being the last one's.
# Whoever sums a part sums it in slot order, so the bits never depend on who did it.
#
# The tile's int32 counter word: bits 0-7 the partials published, 8-23 one claim bit per part, 24-31
# the parts stored.  A claim is a compare-and-swap of the whole word that needs the count at S, so a
# claim can never land after the word was reset (the last part stored resets it to 0 for the next
# launch): a poller that reads 0 knows its part was stored by another CTA.

COUNT_MASK = 0xFF
CLAIM_SHIFT = 8
DONE_SHIFT = 24
SPIN_POLLS = 64  # acquire loads (~0.5 us each) a contributor polls for the others' partials


def part_of(e: int, n_sub: int, parts: int) -> int:
    """The part sub-tile ``e`` of ``n_sub`` belongs to (contiguous runs of sub-tiles; a part may be
    empty when there are fewer sub-tiles than parts)."""
    return e * parts // n_sub


@cute.jit
def publish_and_claim(acc: cute.Tensor, ws: cute.Tensor, thr, own_slot, part, mCnt: cute.Tensor, tile_id,
                      sFlag: cute.Tensor, barrier_id: int, nthr: int, splits: int):
    """Store this thread's fragment of its partial tile into ``ws`` slot ``own_slot``, count it on the
    tile's word ``mCnt[tile_id]`` and claim parts (see above): the last to publish every part still
    unclaimed, the others their own ``part`` once the count is ``splits``.  Returns the claimed parts
    as a bit mask (0: nothing to do), the same in every thread of the CTA.

    Memory order: partial stores -> fence.acq_rel.gpu -> barrier -> one thread's atom.add.acq_rel.gpu ->
    (polls by ld.acquire.gpu, claims by atom.cas.acq_rel.gpu) -> the mask through ``sFlag[1]`` and a
    barrier -> a fence in every thread of a CTA with parts, before it reads the other partials."""
    store_partial(acc, ws, thr, own_slot, barrier_id, nthr)
    if thr == 0:
        word = mCnt.iterator + tile_id
        full = (1 << splits) - 1
        mask = cutlass.Int32(0)
        old = cute.arch.atomic_add(word, cutlass.Int32(1), sem="acq_rel", scope="gpu")
        if (old & COUNT_MASK) == splits - 1:  # the last partial: every part nobody claimed yet is ours
            prev = cute.arch.atomic_or(word, cutlass.Int32(full << CLAIM_SHIFT), sem="acq_rel", scope="gpu")
            mask = full ^ ((prev >> CLAIM_SHIFT) & full)
        else:  # our own part, once every partial is published, unless the last one took it first
            own = cutlass.Int32(1) << part
            polls = cutlass.Int32(0)
            while polls < SPIN_POLLS:
                w = cute.arch.load(word, cutlass.Int32, sem="acquire", scope="gpu")
                count = w & COUNT_MASK
                polls = polls + 1
                if count == 0 or ((w >> CLAIM_SHIFT) & own) != 0:  # stored by another CTA / taken
                    polls = cutlass.Int32(SPIN_POLLS)
                elif count == splits:
                    prev = cute.arch.atomic_cas(word, cmp=w, val=w | (own << CLAIM_SHIFT), sem="acq_rel",
                                                scope="gpu")
                    if prev == w:
                        mask = own
                        polls = cutlass.Int32(SPIN_POLLS)
        sFlag[1] = mask
    pipeline.NamedBarrier(barrier_id=barrier_id, num_threads=nthr).arrive_and_wait()
    mask = sFlag[1]
    if mask != 0:
        cute.arch.fence_acq_rel_gpu()
    return mask


@cute.jit
def sum_parts(acc: cute.Tensor, ws: cute.Tensor, thr, slot0, mask, n_sub: int, parts: int):
    """For every part in ``mask``: the elements of ``acc`` in its sub-tiles (``acc`` in sub-tile order:
    sub-tile e is elements ``[e * size / n_sub, (e + 1) * size / n_sub)``) become the sum of slots
    ``slot0 .. slot0 + parts - 1`` in slot order (each slot one contributor's partial)."""
    sub_chunks = cute.size(acc) // PARTIAL_VEC // n_sub
    for e in cutlass.range_constexpr(n_sub):
        if (mask >> part_of(e, n_sub, parts)) & 1 != 0:
            sum_slots(acc, ws, thr, e * sub_chunks, sub_chunks, slot0, parts)


@cute.jit
def finish_parts(mCnt: cute.Tensor, tile_id, mask, thr, splits: int):
    """Count the parts in ``mask`` as stored (one thread of the CTA); the CTA that stores the tile's
    last part resets its word to 0 for the next launch."""
    if thr == 0:
        n = cutlass.Int32(0)
        for q in cutlass.range_constexpr(splits):
            n = n + ((mask >> q) & 1)
        word = mCnt.iterator + tile_id
        prev = cute.arch.atomic_add(word, n << DONE_SHIFT, sem="acq_rel", scope="gpu")
        if ((prev >> DONE_SHIFT) & 0xFF) + n == splits:
            cute.arch.atomic_exch(word, cutlass.Int32(0), sem="relaxed", scope="gpu")
