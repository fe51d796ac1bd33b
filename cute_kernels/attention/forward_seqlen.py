"""Per-sequence offsets and lengths of the attention forward kernel
(:mod:`cute_kernels.attention.forward_kernel`), and the predicated O store of packed sequences.

Dense tensors are (B, S, H, D): sequence ``b`` is batch slice ``b``, at offset 0, of length Sq / Sk.
Packed (variable-length) tensors are (total, H, D) with ``cu_seqlens`` (B + 1,) int32 on the device:
sequence ``b`` is rows ``cu_seqlens[b] .. cu_seqlens[b + 1] - 1``.  The kernel views them as
(total, D, H, 1) (the dense (S, D, H, B) with one batch) and offsets the TMA coordinates by the
sequence's first row; rows a tile reads past the sequence's end belong to the next sequence (or are
zero-filled past ``total``) and are masked (keys) or discarded (queries).

Schedule: only the query tiles that exist are numbered -- ``tile = mt * H + head`` with ``mt`` the
sequences' query tiles one after another (sequence 0's, then 1's ...; causal: the last, longest tile
of a sequence first) -- and each warp that needs a tile's coordinates finds them with a warp-wide
prefix sum of the tiles per sequence (:func:`varlen_tile_coords`, 32 sequences per step).  The host
sizes the grid by a bound it knows without reading the lengths, ``(ceil(total_q / tile_m) + B) * H``
(each sequence wastes less than one tile); the kernel counts the real tiles itself
(:func:`varlen_num_tiles`), so the persistent and dynamic schedules of the dense kernel run varlen
unchanged.  A tile wholly inside its sequence is stored by TMA, the sequence's partial last tile by
:func:`store_rows_predicated` (a TMA store clips only at the tensor's end).

The device values are never trusted: the first row is clamped to ``[0, total]``, the end to
``[start, total]`` and the length to ``max_seqlen`` (the host's grid size), so bad ``cu_seqlens``
give wrong numbers, never an access outside the tensors.
"""

from __future__ import annotations

import itertools

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr

from .forward_config import gapped_grid_bound, gapped_pays  # noqa: F401  (host ints too: no DSL there)


@cute.jit
def _clamped_sequence(cu_seqlens: cute.Tensor, batch: Int32, total: Int32, max_seqlen: Int32):
    """(first row, length) of sequence ``batch``, clamped into the tensor and to ``max_seqlen``."""
    start = cutlass.min(cutlass.max(cu_seqlens[batch], 0), total)
    end = cutlass.min(cutlass.max(cu_seqlens[batch + 1], start), total)
    return start, cutlass.min(end - start, max_seqlen)


@cute.jit
def sequence_bounds(batch: Int32, seqlen_q: Int32, seqlen_k: Int32, mCuSeqlensQ, mCuSeqlensK, max_seqlen_q,
                    max_seqlen_k, varlen: cutlass.Constexpr[bool], mSeqUsedK=None):
    """``(offset_q, len_q, offset_k, len_k)`` of sequence ``batch``.  Dense: ``(0, seqlen_q, 0,
    seqlen_k)``.  Varlen: ``seqlen_q`` / ``seqlen_k`` are the packed totals (the clamp bounds) and the
    sequence's rows come from ``cu_seqlens`` (see the module docstring).  Paged K/V (``mSeqUsedK``
    given, ``cu_seqlens_k`` unused): the keys are ``seqused_k[batch]`` clamped to ``[0, seqlen_k]``
    (``seqlen_k``: the block table's capacity), at offset 0 of the sequence's pages."""
    offset_q, len_q, offset_k, len_k = Int32(0), seqlen_q, Int32(0), seqlen_k
    if const_expr(varlen):
        offset_q, len_q = _clamped_sequence(mCuSeqlensQ, batch, seqlen_q, max_seqlen_q)
        if const_expr(mSeqUsedK is None):
            offset_k, len_k = _clamped_sequence(mCuSeqlensK, batch, seqlen_k, max_seqlen_k)
    if const_expr(mSeqUsedK is not None):
        len_k = cutlass.min(cutlass.max(mSeqUsedK[batch], 0), seqlen_k)
    return offset_q, len_q, offset_k, len_k


@cute.jit
def _query_tiles(mCuSeqlensQ: cute.Tensor, batch: Int32, num_batch: Int32, total: Int32, max_seqlen: Int32,
                 tile_m: cutlass.Constexpr[int]):
    """Query tiles of sequence ``batch`` (its clamped length over ``tile_m``); 0 past the last sequence."""
    tiles = Int32(0)
    if batch < num_batch:
        _, length = _clamped_sequence(mCuSeqlensQ, batch, total, max_seqlen)
        tiles = (length + tile_m - 1) // tile_m
    return tiles


@cute.jit
def _warp_inclusive_sum(x: Int32, lane: Int32):
    """Lane i gets x(0) + ... + x(i) over the warp (every lane must call)."""
    for i in cutlass.range_constexpr(5):
        y = cute.arch.shuffle_sync_up(x, 1 << i)
        if lane >= (1 << i):
            x = x + y
    return x


@cute.jit
def varlen_num_tiles(mCuSeqlensQ: cute.Tensor, num_batch: Int32, num_heads: Int32, total: Int32,
                     max_seqlen: Int32, tile_m: cutlass.Constexpr[int]):
    """Warp-wide (every lane calls; all get the result): the packed problem's tiles, sum over the
    sequences of their query tiles, times the heads."""
    lane = cute.arch.lane_idx()
    count = Int32(0)
    for b0 in cutlass.range(0, num_batch, 32, unroll=1):
        tiles = _query_tiles(mCuSeqlensQ, b0 + lane, num_batch, total, max_seqlen, tile_m)
        count = count + cute.arch.shuffle_sync(_warp_inclusive_sum(tiles, lane), 31)
    return count * num_heads


@cute.jit
def varlen_tile_coords(tile: Int32, mCuSeqlensQ: cute.Tensor, num_batch: Int32, num_heads: Int32, total: Int32,
                       max_seqlen: Int32, tile_m: cutlass.Constexpr[int], longest_first: cutlass.Constexpr[bool],
                       scan_b0: Int32, scan_base: Int32):
    """Warp-wide: ``(m_block, head, batch, scan_b0, scan_base)`` of tile ``tile <
    varlen_num_tiles(...)`` (the module docstring's order; ``longest_first``: a sequence's query tiles
    last to first).  Each step takes 32 sequences: lane i the tiles of one, an inclusive prefix sum,
    and the first lane whose sum passes the tile's rank is its sequence (a ballot's population count).
    The scan starts at sequence ``scan_b0`` (a multiple of 32) with ``scan_base`` query tiles before
    it, and returns where it found this tile: a CTA's tiles only grow, so it passes them back for its
    next tile and walks the sequences once in all, not once per tile (start at 0, 0)."""
    lane = cute.arch.lane_idx()
    mt = tile // num_heads
    head = tile - mt * num_heads
    m_block, batch = Int32(0), Int32(0)
    base = scan_base  # query tiles of the sequences before this step's
    b0 = scan_b0
    limit = num_batch
    while b0 < limit:
        tiles = _query_tiles(mCuSeqlensQ, b0 + lane, num_batch, total, max_seqlen, tile_m)
        incl = _warp_inclusive_sum(tiles, lane)
        step = cute.arch.shuffle_sync(incl, 31)
        rank = mt - base
        if rank < step:  # warp-uniform: the tile's sequence is in this step
            first = cute.arch.popc(cute.arch.vote_ballot_sync(incl <= rank))
            tiles_b = cute.arch.shuffle_sync(tiles, first)
            local = rank - (cute.arch.shuffle_sync(incl, first) - tiles_b)
            batch = b0 + first
            m_block = local
            if const_expr(longest_first):
                m_block = tiles_b - 1 - local
            scan_b0, scan_base = b0, base
            limit = Int32(0)
        base = base + step
        b0 = b0 + 32
    return m_block, head, batch, scan_b0, scan_base


def varlen_tile_coords_py(tile: int, lens_q: list, num_heads: int, tile_m: int, longest_first: bool,
                          scan: tuple = (0, 0)):
    """:func:`varlen_tile_coords` in plain Python, step for step (lengths already clamped): returns
    ``(m_block, head, batch, scan)``; the tests check it walks every (m_block, head, batch) of the real
    tiles exactly once, from a fresh scan and resuming one."""
    mt, head = divmod(tile, num_heads)
    b0, base = scan
    while b0 < len(lens_q):
        tiles = [-(-n // tile_m) for n in lens_q[b0:b0 + 32]]
        incl = list(itertools.accumulate(tiles))
        rank = mt - base
        if rank < incl[-1]:
            first = sum(s <= rank for s in incl)
            local = rank - (incl[first] - tiles[first])
            m_block = tiles[first] - 1 - local if longest_first else local
            return m_block, head, b0 + first, (b0, base)
        base += incl[-1]
        b0 += 32
    raise IndexError(f"tile {tile} past the {sum(-(-n // tile_m) for n in lens_q) * num_heads} tiles")


def varlen_grid_bound(total_q: int, num_batch: int, num_heads: int, tile_m: int) -> int:
    """The host's bound on the tiles of a packed problem without reading its lengths: each sequence's
    last tile is partial at most, so ``sum(ceil(L_b / tile_m)) <= ceil(total_q / tile_m) + B``.
    Python ints or the host entry's traced values alike."""
    return ((total_q + tile_m - 1) // tile_m + num_batch) * num_heads


# ---- the gapped numbering: one CTA per tile of a packed problem, found without a walk over the sequences
# Sequence b's tiles of ``tile`` rows are numbered from start(b) = floor(first_row(b) / tile) + b on.
# start grows by at least a sequence's tiles from one sequence to the next (and by at least 1), so tile t
# belongs to the last sequence whose start is <= t, at local index t - start(b); a local index past the
# sequence's tiles is a gap (at most one per sequence).  All tiles fit in ceil(total / tile) + B numbers
# (:func:`gapped_grid_bound`), and a lookup is a search over the starts (:func:`gapped_tile_coords`):
# lane i of a warp reads every stride-th start, a ballot narrows the range to one stride, two rounds
# for up to 1024 sequences -- where the exact numbering's walk (:func:`varlen_tile_coords`) reads every
# sequence before the tile's, which only a persistent CTA amortizes.


@cute.jit
def _gapped_start(mCuSeqlens: cute.Tensor, batch, total: Int32, tile: cutlass.Constexpr[int]):
    return cutlass.min(cutlass.max(mCuSeqlens[batch], 0), total) // tile + batch


@cute.jit
def gapped_tile_coords(t: Int32, mCuSeqlens: cute.Tensor, num_batch: Int32, total: Int32,
                       tile: cutlass.Constexpr[int]):
    """Warp-wide (every lane calls; all get the result): ``(batch, local)`` of tile ``t`` in the gapped
    numbering (comment above) of the sequences of ``mCuSeqlens`` (first rows clamped to ``[0, total]``;
    ``num_batch >= 1``).  The caller runs the tile only when ``0 <= local`` and ``local * tile`` is below
    the sequence's (clamped) length; bad ``cu_seqlens`` give some ``batch`` in ``[0, num_batch)``."""
    lane = cute.arch.lane_idx()
    lo, count = Int32(0), num_batch
    while count > 1:
        stride = (count + 31) // 32
        ok = Int32(0)
        if lane * stride < count:
            if _gapped_start(mCuSeqlens, lo + lane * stride, total, tile) <= t:
                ok = Int32(1)
        k = cutlass.max(cute.arch.popc(cute.arch.vote_ballot_sync(ok > 0)), 1)
        lo = lo + (k - 1) * stride
        count = cutlass.min(stride, count - (k - 1) * stride)
    return lo, t - _gapped_start(mCuSeqlens, lo, total, tile)


def gapped_tile_coords_py(t: int, cu_seqlens: list, tile: int, total: int) -> tuple:
    """:func:`gapped_tile_coords` in plain Python, step for step (the tests check it against a brute
    force): ``(batch, local)``."""
    num_batch = len(cu_seqlens) - 1

    def start(b):
        return min(max(cu_seqlens[b], 0), total) // tile + b

    lo, count = 0, num_batch
    while count > 1:
        stride = -(-count // 32)
        k = max(sum(1 for lane in range(32) if lane * stride < count and start(lo + lane * stride) <= t), 1)
        lo += (k - 1) * stride
        count = min(stride, count - (k - 1) * stride)
    return lo, t - start(lo)


def sequence_rows(mX: cute.Tensor, head, batch, offset, varlen: bool) -> cute.Tensor:
    """The (S, D) rows of one head of one sequence in an (S, D, H, B) tensor (a TMA coordinate tensor
    or a real one): the batch slice (dense), or the single batch shifted by the sequence's first row
    (varlen: row 0 of the result is row ``offset`` of the packed tensor)."""
    if const_expr(varlen):
        return cute.domain_offset((offset, 0), mX[None, None, head, 0])
    return mX[None, None, head, batch]


def q_views(mQ: cute.Tensor, mO: cute.Tensor, mCuSeqlensQ, varlen: bool):
    """The kernel's views of q / out, dense (B, Sq, Hq, D) or packed (total_q, Hq, D), as (S, D, H, B):
    ``(seqlen_q, num_heads, batch, mQ, mO, mO_rows)``, with ``seqlen_q`` the packed total (the clamp
    bound) and ``batch`` from cu_seqlens_q when packed, and ``mO_rows`` the packed out view (the
    partial last tile's predicated stores; None when dense)."""
    seqlen_q, num_heads = mQ.shape[-3], mQ.shape[-2]
    if const_expr(varlen):
        mO = thd_to_sdhb(mO)
        return seqlen_q, num_heads, mCuSeqlensQ.shape[0] - 1, thd_to_sdhb(mQ), mO, mO
    return seqlen_q, num_heads, mQ.shape[0], bshd_to_sdhb(mQ), bshd_to_sdhb(mO), None


def bshd_to_sdhb(t: cute.Tensor) -> cute.Tensor:
    """(B, S, H, D) -> (S, D, H, B): the tile modes first, as the TMA atoms and local_tile take them (a
    paged cache (num_pages, page_size, H, D) becomes (page_size, D, H, num_pages))."""
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 3, 2, 0]))


def thd_to_sdhb(t: cute.Tensor) -> cute.Tensor:
    """A packed (total, H, D) tensor as (total, D, H, 1): the dense kernel's (S, D, H, B) with one batch."""
    s, d = t.layout.shape, t.layout.stride
    return cute.make_tensor(t.iterator, cute.make_layout((s[0], s[2], s[1], 1), stride=(d[0], d[2], d[1], 0)))


def fake_rows(dt, shape: tuple) -> cute.Tensor:
    """A compile-time stand-in for a (B, S, H, D) or (T, H, D) tensor of ``dt`` as the kernels take them:
    a fresh symbolic stride per mode but the last (multiples of 8 elements: 16 bytes), stride(-1) = 1,
    16-byte-aligned data."""
    from cutlass.cute.runtime import make_fake_tensor

    strides = tuple(cute.sym_int64(divisibility=8) for _ in shape[:-1]) + (1,)
    return make_fake_tensor(dt, shape, strides, assumed_align=16)


def _threads_per_row(vectors: int) -> int:
    """Threads sharing one row of ``vectors`` 16-byte vectors: the largest power of two <= 16 dividing it."""
    cols = 16
    while vectors % cols:
        cols //= 2
    return cols


@cute.jit
def store_rows_predicated(sO: cute.Tensor, gO: cute.Tensor, rows: Int32, tidx: Int32,
                          num_threads: cutlass.Constexpr[int], dtype: cutlass.Constexpr):
    """Copy the first ``rows`` rows of the (tile_m, D) tile ``sO`` (shared memory, written and synced
    by the caller) to ``gO`` with 16-byte vector stores; rows >= ``rows`` are not written (they belong
    to the next packed sequence, which a TMA store would overwrite: it clips only at the tensor end).
    ``num_threads`` threads ``tidx = 0 ..`` share the work."""
    tile_m, D = cute.size(sO, mode=[0]), cute.size(sO, mode=[1])
    vec = 128 // dtype.width
    cols = _threads_per_row(D // vec)
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128)
    thr_layout = cute.make_ordered_layout((num_threads // cols, cols), order=(1, 0))
    tiled = cute.make_tiled_copy_tv(atom, thr_layout, cute.make_layout((1, vec)))
    thr = tiled.get_slice(tidx)
    tOsO = thr.partition_S(sO)
    tOgO = thr.partition_D(gO)
    tOcO = thr.partition_S(cute.make_identity_tensor((tile_m, D)))
    for m in cutlass.range_constexpr(cute.size(tOsO, mode=[1])):
        if tOcO[0, m, 0][0] < rows:
            cute.copy(atom, tOsO[None, m, None], tOgO[None, m, None])
