"""Shared building blocks for the Hopper kernels: TMA atoms, the TMA->wgmma pipeline, stage counts,
the persistent tile scheduler, and operand views.

Why one module: the GEMM is written first and the attention kernels reuse its pieces (the same TMA
load atoms, the same mbarrier pipeline, the same scheduler), so each piece lives here once.
All functions run inside a DSL context unless marked "pure Python".
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
from cutlass.cute.nvgpu import cpasync, warpgroup

MBARRIER_BYTES_RESERVED = 1024  # barriers + alignment slack kept out of the stage budget

#: L2 cache-policy descriptor for TMA loads of data read exactly once (CUTLASS's
#: ``CacheHintSm90::EVICT_FIRST``, the encoding ``createpolicy.fractional.L2::evict_first`` yields):
#: those lines become the first eviction candidates, so a streamed operand (split-K's B, the decode
#: KV cache) recycles its own L2 lines instead of evicting lines other kernels wrote and will read
#: (or that still need writing back).  Opt-in until measured (profiles/bench_l2hint.py).
L2_EVICT_FIRST = 0x12F0000000000000


def stage_count(smem_capacity: int, bytes_per_stage: int, fixed_bytes: int, max_stages: int = 8) -> int:
    """Pure Python: how many operand stages fit next to ``fixed_bytes`` (epilogue buffers etc.)."""
    n = (smem_capacity - MBARRIER_BYTES_RESERVED - fixed_bytes) // bytes_per_stage
    if n < 2:
        raise ValueError(
            f"only {n} pipeline stage(s) of {bytes_per_stage} B fit in {smem_capacity} B of shared memory; "
            "use a smaller tile"
        )
    return min(n, max_stages)


def make_tma_load(tensor: cute.Tensor, smem_layout_staged, tile: tuple[int, int], num_multicast: int = 1):
    """TMA load atom + its coordinate tensor for one stage of ``smem_layout_staged``.

    With ``num_multicast > 1`` one CTA's load is broadcast to the CTAs of its cluster row/column, so
    an operand tile shared by them is read from L2 once.
    """
    op = cpasync.CopyBulkTensorTileG2SOp() if num_multicast == 1 else cpasync.CopyBulkTensorTileG2SMulticastOp()
    smem_layout = cute.slice_(smem_layout_staged, (None, None, 0))
    return cpasync.make_tiled_tma_atom(op, tensor, smem_layout, tile, num_multicast=num_multicast)


def make_tma_store(tensor: cute.Tensor, epi_smem_layout_staged, epi_tile: tuple[int, int]):
    """TMA store atom for one epilogue sub-tile; out-of-bounds rows/columns are clipped by the TMA unit."""
    smem_layout = cute.slice_(epi_smem_layout_staged, (None, None, 0))
    return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), tensor, smem_layout, epi_tile)


def make_tma_pipeline(barrier_ptr, num_stages: int, tx_bytes: int, consumer_warps: int,
                      cluster_layout_mnk: cute.Layout, mcast_ctas: int, mcast_mode_mn=(1, 1)):
    """The full/empty mbarrier ring between the TMA producer warp and the wgmma consumers.

    Each consumer warp arrives once per stage on the empty barrier of every CTA that multicast into it,
    hence ``consumer_warps * mcast_ctas`` arrivals.  ``mcast_mode_mn``: which cluster modes multicast
    ((1, 0): only the CTAs of one "m" row share loads, as in split-K where mode 0 is the K slice).
    """
    producer = pipeline.CooperativeGroup(pipeline.Agent.Thread)
    consumer = pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_warps * mcast_ctas)
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=barrier_ptr,
        num_stages=num_stages,
        producer_group=producer,
        consumer_group=consumer,
        tx_count=tx_bytes,
        cta_layout_vmnk=cute.make_layout((1, *cluster_layout_mnk.shape)),
        mcast_mode_mn=mcast_mode_mn,
        defer_sync=True,
    )


def persistent_scheduler_params(num_tiles_mnl, cluster_mn: tuple[int, int], raster_swizzle: int,
                                raster_along_m: bool, max_active_clusters: int):
    """Scheduler parameters and grid for a persistent launch (grid = min(tiles, SMs))."""
    params = utils.PersistentTileSchedulerParams(num_tiles_mnl, (*cluster_mn, 1), raster_swizzle, raster_along_m)
    grid = utils.StaticPersistentTileScheduler.get_grid_shape(params, max_active_clusters)
    return params, grid


def as_mkl(t: cute.Tensor, order: tuple[int, ...]) -> cute.Tensor:
    """View a torch-ordered tensor as the kernel's (rows, cols, batch) without moving data.

    ``order`` lists which torch modes become (rows, cols[, batch]); a rank-2 input gets a batch mode
    of size 1 and stride 0.  Doing this inside the compiled function keeps ``permute`` calls (about
    1.5 us each) off the host path.
    """
    lay = cute.select(t.layout, mode=list(order))
    if cutlass.const_expr(len(order) == 2):
        lay = cute.append(lay, cute.make_layout(1, stride=0))
    return cute.make_tensor(t.iterator, lay)


def gemm_views(a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor, rank: int):
    """Torch-ordered GEMM operands as the kernels' (M,K,L), (N,K,L), (M,N,L), (M,N,L) views."""
    if rank == 3:
        return as_mkl(a, (1, 2, 0)), as_mkl(b, (2, 1, 0)), as_mkl(d, (1, 2, 0)), as_mkl(c, (1, 2, 0))
    return as_mkl(a, (0, 1)), as_mkl(b, (1, 0)), as_mkl(d, (0, 1)), as_mkl(c, (0, 1))


def gemm_host_setup(tiles, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor, rank: int):
    """What every GEMM kernel's host entry starts with: operand views, the tiled MMA and the staged
    shared-memory layouts of A, B and the epilogue, all from :mod:`layouts.tiles`."""
    from layouts import tiles as T

    mA, mB, mD, mC = gemm_views(a, b, d, c, rank)
    return (mA, mB, mD, mC, T.make_tiled_mma(tiles.mma), T.make_smem_layout_a(tiles),
            T.make_smem_layout_b(tiles), T.make_smem_layout_epi(tiles))


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


@cute.jit
def tma_load(atom: cute.CopyAtom, src: cute.Tensor, dst: cute.Tensor, bar, mask=None, policy=None):
    """One TMA tile load signalling ``bar``: multicast to ``mask``'s CTAs (multicast atoms only) and / or
    with the L2 cache hint ``policy`` (a Python int such as :data:`L2_EVICT_FIRST`), or plain."""
    if cutlass.const_expr(mask is None and policy is None):
        cute.copy(atom, src, dst, tma_bar_ptr=bar)
    elif cutlass.const_expr(mask is None):
        cute.copy(atom, src, dst, tma_bar_ptr=bar, cache_policy=cutlass.Int64(policy))
    elif cutlass.const_expr(policy is None):
        cute.copy(atom, src, dst, tma_bar_ptr=bar, mcast_mask=mask)
    else:  # a multicast weight tile that must not evict activations (the swapped skinny plan)
        cute.copy(atom, src, dst, tma_bar_ptr=bar, mcast_mask=mask, cache_policy=cutlass.Int64(policy))


@cute.jit
def tma_produce_k_tiles(ab_pipe, state, tma_a: cute.CopyAtom, tAgA: cute.Tensor, tAsA: cute.Tensor,
                        tma_b: cute.CopyAtom, tBgB: cute.Tensor, tBsB: cute.Tensor, k_begin, k_count,
                        a_mask=None, b_mask=None, b_policy=None, a_policy=None):
    """The producer warp's side of the ring for one output tile: k-tiles ``k_begin .. k_begin+k_count``
    of A and B (``tAgA``/``tBgB`` already sliced to the tile: (TMA, k)) into the next stages, both
    copies signalling the stage's full barrier.  Multicast masks only for multicast TMA atoms;
    ``b_policy`` (a Python int such as :data:`L2_EVICT_FIRST`, or None): L2 cache hint of B's loads
    (``a_policy``: of A's, e.g. a weight streamed as A by a swapped skinny GEMM).
    Returns the advanced producer state (rebind it, as for :func:`wgmma_mainloop`)."""
    for i in range(k_count):
        ab_pipe.producer_acquire(state)
        bar = ab_pipe.producer_get_barrier(state)
        tma_load(tma_a, tAgA[(None, k_begin + i)], tAsA[(None, state.index)], bar, a_mask, a_policy)
        tma_load(tma_b, tBgB[(None, k_begin + i)], tBsB[(None, state.index)], bar, b_mask, b_policy)
        ab_pipe.producer_commit(state)
        state.advance()
    return state


# ---------------------------------------------------------------- split-K partials (fixup)
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

    Memory order: partial stores -> fence.acq_rel.gpu (every thread) -> barrier of the ``nthr``
    threads -> one thread's atom.add.acq_rel.gpu -> its result through shared memory (``sFlag``) and a
    second barrier.  The last CTA then fences again (acquire) before reading the other partials and
    resets the counter to 0, ready for the next launch or graph replay.  Nobody waits for anybody, so
    any residency works (no deadlock)."""
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
