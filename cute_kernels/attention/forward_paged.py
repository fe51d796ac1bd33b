"""Paged K/V for the attention forward kernel (:mod:`cute_kernels.attention.forward_kernel`): the
TMA atoms, the partitions and the producer's K / V tile loads when k / v are a page pool (the
kernel's KV walk calls :func:`produce_paged_tile` per tile).

Layout (the ``decode_attn`` conventions): k / v are (num_pages, page_size, Hkv, D); ``block_table``
(B, max_pages) int32 lists each sequence's pages in order, so key ``j`` of sequence ``b`` is row
``j % page_size`` of page ``block_table[b, j // page_size]``; ``seqused_k`` (B,) int32 is the number
of keys of each sequence.  Causal masks and windows are bottom-right aligned per sequence, as for
dense and packed inputs (:mod:`.forward_softmax`).

Loads: the kernel views the pool as (page_size, D, Hkv, num_pages), the dense (S, D, H, B) with a page
for a batch, and loads a KV tile of ``tile_n`` rows with ``tile_n / g`` TMA boxes of ``g =
gcd(page_size, tile_n)`` rows each, all into the same ring slot under one mbarrier (its transaction
count stays the whole tile).  A box never crosses a page (``g`` divides the page size) and lands at
row ``i * g`` of the slot, a multiple of 16 rows: the 8-row swizzle atoms of the slot's layout are
never split, so the consumers read the slot exactly as a dense tile.  Why TMA rather than a cp.async
gather: the producer stays one warp at 24 registers, the ring and the consumers are unchanged, and
each box is one instruction.  The box height is a compile-time constant of the TMA atom, so
``page_size`` is part of the compile key (:class:`~.forward_kernel.FlashFwdConfig`); page sizes are
multiples of 16 from 16 to 256 (``g`` >= 16).

Device values are never trusted: the length is clamped to ``[0, max_pages * page_size]``
(:func:`~.forward_seqlen.sequence_bounds`) and every page id to ``[0, num_pages)``, so bad values give
wrong numbers, never an access outside the pool or the block table.  Block-table entries past a
sequence's last used page are never read: a box wholly past the length is addressed one page past
the pool, which the TMA unit zero-fills.  Rows of a sequence's last page past its length are loaded
(a box is ``g`` rows) and masked; like the rows past a packed sequence (:mod:`.forward_seqlen`),
they must hold finite values, since a zero weight times a NaN value is NaN.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync

from . import forward_seqlen as fsl
from .forward_validate import page_size_ok  # noqa: F401  (the page sizes the forward takes)


def box_rows(page_size: int, tile_n: int) -> int:
    """Rows of one TMA box: ``gcd(page_size, tile_n)`` (a multiple of 16 that divides both)."""
    return math.gcd(page_size, tile_n)


def make_paged_tma_load(mKV: cute.Tensor, sKV_layout, tile_n: int, head_dim: int, rows: int):
    """The TMA load atom of one ``rows``-row box of a (page_size, D, Hkv, num_pages) pool into a
    (tile_n, D) ring slot: its shared-memory layout is the slot's first ``rows`` rows (the slot's
    own strides and swizzle; a box at row ``i * rows`` of the slot has the same layout shifted)."""
    slot = cute.slice_(sKV_layout, (None, None, 0))
    box = cute.composition(slot, cute.make_layout((rows, head_dim), stride=(1, tile_n)))
    return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mKV, box, (rows, head_dim))


def partition_paged(atom: cute.CopyAtom, mKV: cute.Tensor, sKV: cute.Tensor, head_kv, rows: int,
                    head_dim: int):
    """``(tXsX, tXgX)``: the ring ``sKV`` (tile_n, D, stages) as (TMA, box, 1, stage) and the KV head's
    pool as (TMA, box within the page, 1, page)."""
    s_boxes = cute.flat_divide(sKV, (rows, head_dim))  # (rows, D, tile_n / rows, 1, stages)
    g_boxes = cute.flat_divide(mKV[None, None, head_kv, None], (rows, head_dim))  # (rows, D, page/rows, 1, pages)
    return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s_boxes, 0, 2),
                                 cute.group_modes(g_boxes, 0, 2))


@cute.jit
def produce_paged_tile(pipe, state, atom: cute.CopyAtom, tXgX: cute.Tensor, tXsX: cute.Tensor,
                       mBlockTable: cute.Tensor, batch, n_block, len_k, num_pages,
                       tile_n: cutlass.Constexpr[int], rows: cutlass.Constexpr[int],
                       page_size: cutlass.Constexpr[int]):
    """KV tile ``n_block`` of sequence ``batch`` into the ring's next slot: ``tile_n / rows`` boxes
    signalling the slot's barrier (armed for the whole tile by ``producer_acquire``).  A box at or
    past ``len_k`` reads no block-table entry and is addressed at page ``num_pages``, one past the
    pool, which the TMA unit zero-fills (the same transaction bytes).  Not one box past the end of a
    page: when a box is the whole page, the box mode has extent 1 and stride 0, so box index 1 would
    alias row 0 of the page.  Returns the advanced state."""
    pipe.producer_acquire(state)
    bar = pipe.producer_get_barrier(state)
    # one box at a time: unrolled, the block-table loads of every box are hoisted and live together,
    # more than the producer's 24 registers hold
    for i in cutlass.range(tile_n // rows, unroll=1):
        row = n_block * tile_n + i * rows
        page = Int32(num_pages)  # one page past the pool: the TMA unit zero-fills the whole box
        box = Int32(0)
        if row < len_k:
            page_idx = row // page_size
            page = cutlass.min(cutlass.max(mBlockTable[batch, page_idx], 0), num_pages - 1)
            box = (row - page_idx * page_size) // rows
        cute.copy(atom, tXgX[(None, box, 0, page)], tXsX[(None, i, 0, state.index)], tma_bar_ptr=bar)
    pipe.producer_commit(state)
    state.advance()
    return state


def paged_fake_args(kernel, cfg, dt, mSched, stream):
    """``(entry, fake args)`` of a paged config: ``kernel.call_paged`` ``(q, k, v, out, lse, counter,
    block_table, seqused_k, scale_log2, window_left, window_right)`` for dense q, or
    ``kernel.call_paged_varlen`` ``(q, k, v, out, lse, counter, cu_seqlens_q, max_seqlen_q, block_table,
    seqused_k, scale_log2, window_left, window_right)``.  Pools (num_pages, page_size, Hkv, D) with
    symbolic strides, block_table (B, max_pages) with a symbolic row stride, seqused_k (B,)."""
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_tensor

    D = cfg.head_dim
    B, P, Hq, Hkv, S, MP = (cute.sym_int() for _ in range(6))

    mK, mV = fsl.fake_rows(dt, (P, cfg.page_size, Hkv, D)), fsl.fake_rows(dt, (P, cfg.page_size, Hkv, D))
    mBT = make_fake_tensor(cutlass.Int32, (B, MP), (cute.sym_int64(), 1), assumed_align=4)
    mSeqUsedK = make_fake_compact_tensor(cutlass.Int32, (B,), assumed_align=4)
    if cfg.varlen:
        mQ, mO = fsl.fake_rows(dt, (S, Hq, D)), fsl.fake_rows(dt, (S, Hq, D))
        mLSE = make_fake_compact_tensor(cutlass.Float32, (Hq, S), stride_order=(1, 0), assumed_align=4)
        mCuQ = make_fake_compact_tensor(cutlass.Int32, (cute.sym_int(),), assumed_align=4)
    else:
        mQ, mO = fsl.fake_rows(dt, (B, S, Hq, D)), fsl.fake_rows(dt, (B, S, Hq, D))
        mLSE = make_fake_compact_tensor(cutlass.Float32, (B, Hq, S), stride_order=(2, 1, 0), assumed_align=4)
        mCuQ = None
    tail = (mBT, mSeqUsedK, Float32(1.0), Int32(0), Int32(0), stream)
    if cfg.varlen:
        return kernel.call_paged_varlen, (mQ, mK, mV, mO, mLSE, mSched, mCuQ, Int32(1)) + tail
    return kernel.call_paged, (mQ, mK, mV, mO, mLSE, mSched) + tail
