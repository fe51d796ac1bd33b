"""Index math and register-level steps of the attention forward kernel
(:mod:`cute_kernels.attention.forward_kernel`): which KV tiles a query tile visits and which of them
need a mask, the mask itself, and the views that turn a wgmma accumulator into rows (softmax) and into
the register A operand of the next wgmma (P).

Index conventions (B, S, H, D tensors viewed as (S, D, H, B)):

* query row ``q`` (0-based in the sequence) sees key ``k`` iff ``k < Sk`` and, when causal,
  ``k <= q + Sk - Sq`` (bottom-right alignment, FlashAttention >= 2.1); with a sliding window
  ``(left, right)``, iff ``p - left <= k <= p + right`` for ``p = q + Sk - Sq`` (causal is
  ``(unbounded, 0)``);
* with packed (variable-length) sequences all of this holds per sequence: ``Sq``, ``Sk`` are the
  sequence's lengths and ``q``, ``k`` positions within it;
* query tile ``m`` holds rows ``m * tile_m .. m * tile_m + tile_m - 1`` (rows >= Sq are computed on
  zero-filled Q and never stored); KV tile ``n`` holds keys ``n * tile_n ..``.

The ``@cute.jit`` functions run inside a kernel trace; :func:`kv_tile_range_py` is the same range in
plain Python, for tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .forward_config import L2_KV_BYTES, _SECTION_SIZES

# ------------------------------------------------------------------------------------------------
# which KV tiles a query tile visits
# ------------------------------------------------------------------------------------------------


@cute.jit
def kv_tile_range(m_block: Int32, seqlen_q: Int32, seqlen_k: Int32, tile_m: cutlass.Constexpr[int],
                  tile_n: cutlass.Constexpr[int], causal: cutlass.Constexpr[bool]):
    """``(n_max, n_mask)`` for query tile ``m_block``: the tile visits KV tiles ``0 .. n_max - 1``;
    tiles ``n_mask .. n_max - 1`` need a mask (the key-length tail, the causal diagonal), tiles
    ``0 .. n_mask - 1`` none.  ``n_max`` is 0 when no row of the tile sees a key (causal, Sq > Sk).

    The producer and the consumers call this with the same arguments, so they agree on the count."""
    n_max = (seqlen_k + tile_n - 1) // tile_n
    n_full = seqlen_k // tile_n  # tiles entirely below Sk
    if cutlass.const_expr(causal):
        # the tile's first row sees keys <= first_lim, its last row keys <= first_lim + tile_m - 1
        first_lim = m_block * tile_m + seqlen_k - seqlen_q
        n_max = cutlass.min(n_max, (cutlass.max(first_lim + tile_m, 0) + tile_n - 1) // tile_n)
        # tile n is below the diagonal for every row iff its last key n * tile_n + tile_n - 1 <= first_lim
        n_full = cutlass.min(n_full, cutlass.max(first_lim + 1, 0) // tile_n)
    n_mask = cutlass.min(n_full, n_max)
    return n_max, n_mask


def kv_tile_range_py(m_block: int, seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int, causal: bool):
    """:func:`kv_tile_range` in plain Python (tests check it against brute force)."""
    n_max = -(-seqlen_k // tile_n)
    n_full = seqlen_k // tile_n
    if causal:
        first_lim = m_block * tile_m + seqlen_k - seqlen_q
        n_max = min(n_max, -(-max(first_lim + tile_m, 0) // tile_n))
        n_full = min(n_full, max(first_lim + 1, 0) // tile_n)
    return n_max, min(n_full, n_max)


from ..common.host import WINDOW_UNBOUNDED  # noqa: E402,F401  (a window side of -1 reaches this far)


@cute.jit
def kv_tile_range_window(m_block: Int32, seqlen_q: Int32, seqlen_k: Int32, tile_m: cutlass.Constexpr[int],
                         tile_n: cutlass.Constexpr[int], window_left: Int32, window_right: Int32):
    """``(n_min, n_max, n_lo, n_hi)`` for query tile ``m_block`` under a sliding window (row ``q`` at
    position ``p = q + Sk - Sq`` sees keys ``p - window_left <= k <= p + window_right``, ``k < Sk``;
    :data:`WINDOW_UNBOUNDED` for an unbounded side, a negative side ends the window before the diagonal
    (right) or starts it after (left)): the tile visits KV tiles
    ``n_min .. n_max - 1``; tiles ``n_lo .. n_hi - 1`` need no mask, ``n_hi .. n_max - 1`` (right edge,
    key-length tail) and ``n_min .. n_lo - 1`` (left edge) do.  ``n_min <= n_lo <= n_hi <= n_max``;
    ``n_min == n_max`` when no row of the tile sees a key.  Tiles wholly outside every row's window are
    not in the range, so neither loaded nor computed."""
    p_first = m_block * tile_m + seqlen_k - seqlen_q  # position of the tile's first row
    p_last = p_first + tile_m - 1
    n_max = cutlass.min((seqlen_k + tile_n - 1) // tile_n,
                        (cutlass.max(p_last + window_right + 1, 0) + tile_n - 1) // tile_n)
    n_min = cutlass.min(cutlass.max(p_first - window_left, 0) // tile_n, n_max)
    # unmasked: every key of the tile >= the last row's lower bound and <= the first row's upper bound
    n_hi = cutlass.min(seqlen_k // tile_n, cutlass.max(p_first + window_right + 1, 0) // tile_n)
    n_hi = cutlass.max(cutlass.min(n_hi, n_max), n_min)
    n_lo = (cutlass.max(p_last - window_left, 0) + tile_n - 1) // tile_n
    n_lo = cutlass.max(cutlass.min(n_lo, n_hi), n_min)
    return n_min, n_max, n_lo, n_hi


def kv_tile_range_window_py(m_block: int, seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int,
                            window_left: int, window_right: int):
    """:func:`kv_tile_range_window` in plain Python (tests check it against brute force); window sides
    of -1 mean unbounded, as at the API (other negative sides are FlashAttention-4's: the window ends
    before the diagonal or starts after it)."""
    wl = WINDOW_UNBOUNDED if window_left == -1 else window_left
    wr = WINDOW_UNBOUNDED if window_right == -1 else window_right
    p_first = m_block * tile_m + seqlen_k - seqlen_q
    p_last = p_first + tile_m - 1
    n_max = min(-(-seqlen_k // tile_n), -(-max(p_last + wr + 1, 0) // tile_n))
    n_min = min(max(p_first - wl, 0) // tile_n, n_max)
    n_hi = min(seqlen_k // tile_n, max(p_first + wr + 1, 0) // tile_n)
    n_hi = max(min(n_hi, n_max), n_min)
    n_lo = -(-max(p_last - wl, 0) // tile_n)
    n_lo = max(min(n_lo, n_hi), n_min)
    return n_min, n_max, n_lo, n_hi


# ------------------------------------------------------------------------------------------------
# which query tile a CTA computes
# ------------------------------------------------------------------------------------------------
# (the L2 section budget and the plain-Python twin live in the DSL-free :mod:`.forward_config`)


@cute.jit
def tile_coords(bid: Int32, num_m_blocks: Int32, num_heads: Int32, num_batch: Int32, seqlen_k: Int32,
                qhead_per_kvhead: Int32, kv_token_bytes: cutlass.Constexpr[int], causal: cutlass.Constexpr[bool]):
    """``(m_block, head, batch)`` of CTA ``bid`` of a 1-d grid of ``num_m_blocks * num_heads * num_batch``.

    Non-causal: query tiles fastest, heads, then batches -- the CTAs in flight read the K / V of the
    fewest heads.  Causal: longest query tiles first, so the short ones fill the last wave; to keep
    L2 reuse, the (batch, head) pairs are cut into sections of ``sw`` consecutive pairs (a power of
    two: as many query heads as have their K / V fit in :data:`L2_KV_BYTES` together; heads sharing
    a KV head count once per group), and within a section the query tile is the slow index (the
    last tile of every head of the section, then the one before ...)."""
    sw = Int32(1)  # non-causal: one head per section, i.e. query tiles fastest (a head's CTAs together)
    if cutlass.const_expr(causal):
        tokens_fit = L2_KV_BYTES // kv_token_bytes  # K + V tokens of one KV head that fit
        fit = tokens_fit * qhead_per_kvhead // cutlass.max(seqlen_k, 1)
        for p in _SECTION_SIZES:  # the largest power of two <= fit (at most MAX_SECTION_HEADS)
            if fit >= p:
                sw = Int32(p)
    num_hb = num_heads * num_batch
    section = bid // (sw * num_m_blocks)
    in_section = bid - section * (sw * num_m_blocks)
    full_sections = num_hb // sw
    width = sw
    if section >= full_sections:  # the last, partial section
        width = num_hb - full_sections * sw
    m_block = in_section // width
    hb = section * sw + (in_section - m_block * width)
    batch = hb // num_heads
    head = hb - batch * num_heads
    if cutlass.const_expr(causal):
        m_block = num_m_blocks - 1 - m_block
    return m_block, head, batch


# ------------------------------------------------------------------------------------------------
# accumulator views
# ------------------------------------------------------------------------------------------------


def acc_mn_layout(acc_layout: cute.Layout) -> cute.Layout:
    """A wgmma accumulator's ((2, 2, N/8), MMA_M, MMA_N) register layout as (rows, columns):
    ((2, MMA_M), (2, N/8, MMA_N)).  Mode 0 of the atom's value is the column pair, mode 1 the row
    half (+8), mode 2 the 8-column group; a thread's rows are the (row half, MMA_M) pairs."""
    s, d = acc_layout.shape, acc_layout.stride
    return cute.make_layout(
        ((s[0][1], s[1]), (s[0][0], s[0][2], s[2])),
        stride=((d[0][1], d[1]), (d[0][0], d[0][2], d[2])),
    )


def acc_mn_view(t: cute.Tensor) -> cute.Tensor:
    """:func:`acc_mn_layout` applied to an accumulator-shaped tensor (registers or coordinates)."""
    return cute.make_tensor(t.iterator, acc_mn_layout(t.layout))


def acc_to_frg_a_layout(acc_layout: cute.Layout) -> cute.Layout:
    """The 64 x N accumulator of S = Q K^T, ((2, 2, N/8), MMA_M, MMA_N), as the register A operand of
    O += P V with K = N: ((2, 2, 2), MMA_M, (N/16, MMA_N)).  For 16-bit A the wgmma's A fragment of
    one k-block (16 columns) is exactly the accumulator's two 8-column groups, so this is a
    relabelling of the same registers, no data movement."""
    l = cute.logical_divide(acc_layout, ((None, None, 2), None, None))
    return cute.make_layout(
        ((l.shape[0][0], l.shape[0][1], l.shape[0][2][0]), l.shape[1], (l.shape[0][2][1], l.shape[2])),
        stride=((l.stride[0][0], l.stride[0][1], l.stride[0][2][0]), l.stride[1], (l.stride[0][2][1], l.stride[2])),
    )


# ------------------------------------------------------------------------------------------------
# the mask
# ------------------------------------------------------------------------------------------------


#: the bits of one predicate chunk: a 32-bit keep-mask, turned into predicates by R2P (7 per instruction)
MASK_CHUNK = 32


def pair_columns(t0ScS_mn: cute.Tensor) -> bool:
    """Whether thread 0's columns (compile-time) are the wgmma accumulator's ``0, 1, 8, 9, 16, 17, ...``:
    then the columns below a limit are a prefix, counted by :func:`pair_columns_below`."""
    return all(t0ScS_mn[0, c][1] == 8 * (c // 2) + c % 2 for c in range(cute.size(t0ScS_mn, mode=[1])))


def pair_columns_below_py(limit: int) -> int:
    """:func:`pair_columns_below` in plain Python (tests)."""
    limit = max(limit, 0)
    return (limit >> 3) * 2 + min(limit & 7, 2)


def prefix_bits_py(count: int, chunk: int) -> int:
    """:func:`prefix_bits` in plain Python (tests)."""
    return (1 << min(max(count - chunk * MASK_CHUNK, 0), MASK_CHUNK)) - 1


@cute.jit
def pair_columns_below(limit: Int32) -> Int32:
    """How many of the columns ``0, 1, 8, 9, 16, 17, ...`` are ``< limit`` (0 for a negative limit)."""
    lim = cutlass.max(limit, 0)
    return (lim >> 3) * 2 + cutlass.min(lim & 7, 2)


@cute.jit
def prefix_bits(count: Int32, chunk: cutlass.Constexpr[int]) -> cutlass.Uint32:
    """The keep-mask of elements ``chunk * 32 .. chunk * 32 + 31``: bit i set iff element
    ``chunk * 32 + i < count`` (a 32-bit shift only below 32: the full chunk is a select)."""
    k = cutlass.min(cutlass.max(count - chunk * MASK_CHUNK, 0), MASK_CHUNK)
    bits = (cutlass.Uint32(1) << cutlass.Uint32(k)) - cutlass.Uint32(1)
    return cutlass.Uint32(0xFFFFFFFF) if k == MASK_CHUNK else bits


@cute.jit
def mask_row_by_bits(s_row: cute.Tensor, keep_of_chunk):
    """Scores of one row whose bit in ``keep_of_chunk(chunk)`` (32 elements per chunk) is clear become
    ``-inf``: one select per score on predicates set by R2P, instead of a compare per score."""
    n = cute.size(s_row)
    for chunk in cutlass.range_constexpr((n + MASK_CHUNK - 1) // MASK_CHUNK):
        keep = keep_of_chunk(chunk)
        for i in cutlass.range_constexpr(min(MASK_CHUNK, n - chunk * MASK_CHUNK)):
            c = chunk * MASK_CHUNK + i
            s_row[c] = s_row[c] if cutlass.Boolean(keep & cutlass.Uint32(1 << i)) else -Float32.inf


@cute.jit
def apply_mask(s_mn: cute.Tensor, tScS_mn: cute.Tensor, t0ScS_mn: cute.Tensor, m_block: Int32, n_block: Int32,
               seqlen_q: Int32, seqlen_k: Int32, tile_m: cutlass.Constexpr[int], tile_n: cutlass.Constexpr[int],
               causal: cutlass.Constexpr[bool]):
    """Set the scores of invisible keys to -inf in one KV tile (``s_mn``: the thread's (rows, cols)
    view of S).

    ``tScS_mn`` / ``t0ScS_mn``: the (row, col) coordinates within the CTA tile of this thread's and of
    thread 0's elements; thread 0's columns are compile-time constants, so the comparison is against
    a per-thread limit minus this thread's column offset.  Causal, with the wgmma accumulator's columns
    (:func:`pair_columns`): the visible ones are a prefix of each row, its length a bit mask
    (:func:`mask_row_by_bits`); otherwise one compare-select per score (without causality the limit is
    the same for every row, so each column's compare serves all of the thread's rows)."""
    col_off = tScS_mn[0, 0][1]
    key0 = n_block * tile_n + col_off  # key index of this thread's column 0
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        limit = seqlen_k - key0  # columns c with t0 col >= limit are masked
        if cutlass.const_expr(causal):
            q = m_block * tile_m + tScS_mn[r, 0][0]
            limit = cutlass.min(limit, q + seqlen_k - seqlen_q + 1 - key0)
        if cutlass.const_expr(causal and pair_columns(t0ScS_mn)):
            count = pair_columns_below(limit)
            mask_row_by_bits(s_mn[r, None], lambda chunk: prefix_bits(count, chunk))
        else:
            for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                # a select per score (a dynamic ``if`` around the store would select the whole row)
                s_mn[r, c] = -Float32.inf if t0ScS_mn[0, c][1] >= limit else s_mn[r, c]


@cute.jit
def apply_window_mask(s_mn: cute.Tensor, tScS_mn: cute.Tensor, t0ScS_mn: cute.Tensor, m_block: Int32,
                      n_block: Int32, seqlen_q: Int32, seqlen_k: Int32, tile_m: cutlass.Constexpr[int],
                      tile_n: cutlass.Constexpr[int], window_left: Int32, window_right: Int32):
    """:func:`apply_mask` for a sliding window (see :func:`kv_tile_range_window`): a score stays iff
    ``p - window_left <= key <= p + window_right`` and ``key < Sk``; columns compared against per-row
    limits as there (a band of the row: the difference of two prefixes' bit masks; else two compares
    per score)."""
    col_off = tScS_mn[0, 0][1]
    key0 = n_block * tile_n + col_off
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        p = m_block * tile_m + tScS_mn[r, 0][0] + seqlen_k - seqlen_q
        hi = cutlass.min(seqlen_k - key0, p + window_right + 1 - key0)  # columns >= hi are masked
        lo = p - window_left - key0  # columns < lo are masked
        if cutlass.const_expr(pair_columns(t0ScS_mn)):
            n_hi, n_lo = pair_columns_below(hi), pair_columns_below(lo)
            mask_row_by_bits(s_mn[r, None], lambda chunk: prefix_bits(n_hi, chunk) & ~prefix_bits(n_lo, chunk))
        else:
            for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                col = t0ScS_mn[0, c][1]
                s = -Float32.inf if col >= hi else s_mn[r, c]
                s_mn[r, c] = -Float32.inf if col < lo else s


@dataclass(frozen=True)
class TileMask:
    """:func:`apply_mask` bound to one CTA's query tile (coordinates, lengths, tile sizes)."""

    tScS_mn: cute.Tensor
    t0ScS_mn: cute.Tensor
    m_block: Int32
    seqlen_q: Int32
    seqlen_k: Int32
    tile_m: int
    tile_n: int
    causal: bool

    @cute.jit
    def apply(self, s_mn: cute.Tensor, n_block: Int32):
        apply_mask(s_mn, self.tScS_mn, self.t0ScS_mn, self.m_block, n_block, self.seqlen_q, self.seqlen_k,
                   self.tile_m, self.tile_n, self.causal)


# ------------------------------------------------------------------------------------------------
# P as an operand, O rescaling
# ------------------------------------------------------------------------------------------------


@cute.jit
def to_operand_a(acc_S: cute.Tensor, dtype: cutlass.Constexpr) -> cute.Tensor:
    """P = S converted to 16 bits, viewed as the register A operand of O += P V."""
    rP = cute.make_rmem_tensor_like(acc_S, dtype)
    rP.store(acc_S.load().to(dtype))
    return cute.make_tensor(rP.iterator, acc_to_frg_a_layout(rP.layout))


@cute.jit
def rescale_rows(acc_O_mn: cute.Tensor, corr: cute.Tensor):
    """Row r of O (the (rows, cols) view) times ``corr[r]``."""
    for r in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[0])):
        acc_O_mn[r, None].store(acc_O_mn[r, None].load() * corr[r])


@dataclass(frozen=True)
class WindowTileMask(TileMask):
    """:func:`apply_window_mask` bound to one CTA's query tile (``causal`` unused: a causal window is
    ``window_right == 0``)."""

    window_left: Int32 = None
    window_right: Int32 = None

    @cute.jit
    def apply(self, s_mn: cute.Tensor, n_block: Int32):
        apply_window_mask(s_mn, self.tScS_mn, self.t0ScS_mn, self.m_block, n_block, self.seqlen_q, self.seqlen_k,
                          self.tile_m, self.tile_n, self.window_left, self.window_right)
