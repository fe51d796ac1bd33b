"""TMA atoms and copies: tile loads (plain, multicast, L2-hinted) and stores, and the producer loops
that fill an mbarrier ring with one tensor's tiles per stage (:func:`tma_produce_tiles`) or with the
k-tiles of two operands per stage (:func:`tma_produce_k_tiles`).  All run inside a DSL context."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

#: L2 cache-policy descriptor for TMA loads of data read exactly once (CUTLASS's
#: ``CacheHintSm90::EVICT_FIRST``, the encoding ``createpolicy.fractional.L2::evict_first`` yields):
#: those lines become the first eviction candidates, so a streamed operand (split-K's B, the decode
#: KV cache) recycles its own L2 lines instead of evicting lines other kernels wrote and will read
#: (or that still need writing back).
L2_EVICT_FIRST = 0x12F0000000000000


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
def tma_produce_tiles(pipe, state, atom: cute.CopyAtom, src: cute.Tensor, dst: cute.Tensor, begin, count,
                      mask=None, policy=None):
    """The producer side of a ring that carries ONE tensor per stage: tiles ``begin .. begin+count``
    of ``src`` ((TMA, tile) after ``tma_partition``) into the next ``count`` stages of ``dst``
    ((TMA, stage)), each load signalling its stage's full barrier.  An attention forward gives K and V
    rings of their own this way (and loads Q once, outside any ring).

    ``mask`` / ``policy`` as for :func:`tma_load`; the ring's ``tx_count`` is one tile of ``src``.
    Returns the advanced producer state (rebind it, as for :func:`wgmma.wgmma_mainloop`)."""
    for i in range(count):
        pipe.producer_acquire(state)
        tma_load(atom, src[(None, begin + i)], dst[(None, state.index)], pipe.producer_get_barrier(state), mask,
                 policy)
        pipe.producer_commit(state)
        state.advance()
    return state


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


@cute.jit
def tma_produce_stage(pipe, state, copies, tile):
    """The producer side of a ring whose stage carries tile ``tile`` of SEVERAL tensors (an attention
    backward's Q, dO, LSE and Delta rows): ``copies`` is a tuple of ``(atom, src, dst)`` with ``src``
    ((TMA, tile)) and ``dst`` ((TMA, stage)) from ``tma_partition``; every copy signals the stage's full
    barrier (the ring's ``tx_count`` is the sum of their boxes).  Returns the advanced producer state."""
    pipe.producer_acquire(state)
    bar = pipe.producer_get_barrier(state)
    for atom, src, dst in copies:
        tma_load(atom, src[(None, tile)], dst[(None, state.index)], bar)
    pipe.producer_commit(state)
    state.advance()
    return state
