"""Index math of the attention backward kernel (:mod:`.backward_kernel`): which query tiles a KV
tile meets and which of them need a mask, and the mask of the transposed scores S^T (rows: keys,
columns: queries) -- dense (key-length tail, bottom-right causal) and sliding windows.  The
conventions are the forward's (:mod:`.forward_softmax`): query ``q`` at position ``p = q + Sk - Sq``
sees key ``k`` iff ``k < Sk`` and, causal, ``k <= p``; with a window ``(left, right)``, iff
``p - left <= k <= p + right``.  The ``@cute.jit`` functions run inside a kernel trace; the ``_py``
ones are the same ranges in plain Python, for tests.  :class:`BwdTileOrder` (a mixin of the kernel)
puts them together per CTA: its sequence (dense or packed), its query-tile range and the order it
walks it (the deterministic mode's rotated start on dense ranges, :func:`dense_rotation` /
:func:`dense_turn`; from the top on causal and windowed ones, :func:`n_block_last`)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from . import forward_seqlen as fsl
from . import forward_softmax as fs
from .backward_config import LPT_TOKEN_BYTES_PER_D, det_wait_span, padded_first_row  # noqa: F401  (host ints too)


@cute.jit
def m_block_range(n_block: Int32, seqlen_q: Int32, seqlen_k: Int32, tile_m: cutlass.Constexpr[int],
                  tile_n: cutlass.Constexpr[int], causal: cutlass.Constexpr[bool]):
    """``(m_min, m_max, m_mask)`` for KV tile ``n_block``: it meets query tiles ``m_min .. m_max - 1``;
    tiles ``m_min .. m_mask - 1`` need a mask (the causal diagonal), and all of them when the KV tile
    holds the key-length tail.  The producer and the consumers call this with the same arguments."""
    m_max = (seqlen_q + tile_m - 1) // tile_m
    m_min = Int32(0)
    m_mask = Int32(0)
    if const_expr(causal):
        first_q = n_block * tile_n + seqlen_q - seqlen_k  # the first query that sees the tile's first key
        m_min = cutlass.min(cutlass.max(first_q, 0) // tile_m, m_max)
        # every row of query tile m sees every key of the tile iff m * tile_m >= first_q + tile_n - 1
        m_mask = cutlass.min(cutlass.max((cutlass.max(first_q + tile_n - 1, 0) + tile_m - 1) // tile_m, m_min), m_max)
    if (n_block + 1) * tile_n > seqlen_k:
        m_mask = m_max
    return m_min, m_max, m_mask


def m_block_range_py(n_block: int, seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int, causal: bool):
    """:func:`m_block_range` in plain Python (tests check it against brute force)."""
    m_max = -(-seqlen_q // tile_m)
    m_min, m_mask = 0, 0
    if causal:
        first_q = n_block * tile_n + seqlen_q - seqlen_k
        m_min = min(max(first_q, 0) // tile_m, m_max)
        m_mask = min(max(-(-max(first_q + tile_n - 1, 0) // tile_m), m_min), m_max)
    if (n_block + 1) * tile_n > seqlen_k:
        m_mask = m_max
    return m_min, m_max, m_mask


@cute.jit
def m_block_range_window(n_block: Int32, seqlen_q: Int32, seqlen_k: Int32, tile_m: cutlass.Constexpr[int],
                         tile_n: cutlass.Constexpr[int], window_left: Int32, window_right: Int32):
    """``(m_min, m_max, m_lo, m_hi)`` for KV tile ``n_block`` under a sliding window (query ``q`` at
    position ``p = q + Sk - Sq`` sees keys ``p - window_left <= k <= p + window_right``, ``k < Sk``; sides
    >= 0, :data:`~.forward_softmax.WINDOW_UNBOUNDED` for none): it meets query tiles ``m_min .. m_max - 1``;
    tiles ``m_lo .. m_hi - 1`` need no mask, the others do.  ``m_min <= m_lo <= m_hi <= m_max``."""
    off = seqlen_k - seqlen_q
    k_first = n_block * tile_n
    k_last = k_first + tile_n - 1
    # rows whose position lies in [k_first - window_right, k_last + window_left]
    m_max = cutlass.min((seqlen_q + tile_m - 1) // tile_m,
                        (cutlass.max(k_last + window_left - off + 1, 0) + tile_m - 1) // tile_m)
    m_min = cutlass.min(cutlass.max(k_first - window_right - off, 0) // tile_m, m_max)
    # unmasked: the tile's first row sees k_last (p_first + right >= k_last), its last row k_first
    # (p_last - left <= k_first), and the KV tile holds no key >= Sk
    m_lo = (cutlass.max(k_last - window_right - off, 0) + tile_m - 1) // tile_m
    m_hi = cutlass.max(k_first + window_left - off + 1, 0) // tile_m
    if (n_block + 1) * tile_n > seqlen_k:
        m_hi = m_lo
    m_lo = cutlass.max(cutlass.min(m_lo, m_max), m_min)
    m_hi = cutlass.max(cutlass.min(m_hi, m_max), m_lo)
    return m_min, m_max, m_lo, m_hi


def m_block_range_window_py(n_block: int, seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int, window_left: int,
                            window_right: int):
    """:func:`m_block_range_window` in plain Python; sides of -1 mean unbounded, as at the API."""
    wl = fs.WINDOW_UNBOUNDED if window_left < 0 else window_left
    wr = fs.WINDOW_UNBOUNDED if window_right < 0 else window_right
    off = seqlen_k - seqlen_q
    k_first, k_last = n_block * tile_n, n_block * tile_n + tile_n - 1
    m_max = min(-(-seqlen_q // tile_m), -(-max(k_last + wl - off + 1, 0) // tile_m))
    m_min = min(max(k_first - wr - off, 0) // tile_m, m_max)
    m_lo = -(-max(k_last - wr - off, 0) // tile_m)
    m_hi = max(k_first + wl - off + 1, 0) // tile_m
    if (n_block + 1) * tile_n > seqlen_k:
        m_hi = m_lo
    m_lo = max(min(m_lo, m_max), m_min)
    m_hi = max(min(m_hi, m_max), m_lo)
    return m_min, m_max, m_lo, m_hi


@cute.jit
def n_block_last(m_block: Int32, seqlen_q: Int32, seqlen_k: Int32, tile_m: cutlass.Constexpr[int],
                 tile_n: cutlass.Constexpr[int], window_right: Int32):
    """The last KV tile whose query-tile range (:func:`m_block_range`, :func:`m_block_range_window`) holds
    query tile ``m_block``: the one holding the highest key the tile's last row reaches, ``p +
    window_right`` (causal: a right side of 0; dense: :data:`~.forward_softmax.WINDOW_UNBOUNDED`), or
    the last tile.  The tiles that hold ``m_block`` are this one and the ones below it down to the first
    (their ranges' bounds rise with the tile), so ``n_block_last - n_block`` numbers them from the top:
    the deterministic mode's turns, in the order the tiles reach a query tile (a causal or windowed KV
    tile's first query tile is the diagonal's, so the highest tile gets there first)."""
    reach = cutlass.min(window_right, seqlen_q + seqlen_k)  # past every key: no overflow
    last = ((m_block + 1) * tile_m + reach + seqlen_k - seqlen_q - 1) // tile_n
    return cutlass.min(last, (seqlen_k + tile_n - 1) // tile_n - 1)


def n_block_last_py(m_block: int, seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int, window_right: int) -> int:
    """:func:`n_block_last` in plain Python; a right side of -1 means unbounded, as at the API."""
    wr = fs.WINDOW_UNBOUNDED if window_right < 0 else window_right
    reach = min(wr, seqlen_q + seqlen_k)
    return min(((m_block + 1) * tile_m + reach + seqlen_k - seqlen_q - 1) // tile_n, -(-seqlen_k // tile_n) - 1)


@cute.jit
def dense_rotation(n_block: Int32, seqlen_q: Int32, seqlen_k: Int32, tile_m: cutlass.Constexpr[int],
                   tile_n: cutlass.Constexpr[int]):
    """The deterministic mode's start on dense ranges: KV tile ``n_block`` walks the query tiles from
    ``floor(n_block * M / N)`` on (M query tiles, N KV tiles), so when N <= M the CTAs of a head start
    spread evenly over the query tiles and reach each one M / N steps apart (:func:`dense_turn`): one
    tile's turn passes on while the next KV tile is still that many steps away, instead of all starting
    at tile 0 and queueing for its adds; 0 (in order) when N > M."""
    num_m = (seqlen_q + tile_m - 1) // tile_m
    num_n = (seqlen_k + tile_n - 1) // tile_n
    shift = Int32(0)
    if num_n <= num_m:
        shift = n_block * num_m // num_n
    return shift


@cute.jit
def dense_turn(n_block: Int32, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32, tile_m: cutlass.Constexpr[int],
               tile_n: cutlass.Constexpr[int], groups: cutlass.Constexpr[int] = 1):
    """KV tile ``n_block``'s turn at query tile ``m_block`` on dense ranges: the number of KV tiles that
    reach the query tile before it when each starts at :func:`dense_rotation` (KV tile n reaches tile m at
    step ``(m - floor(n M / N)) mod M``): with ``p`` the last KV tile starting at or before m, ``p - n``
    for n <= p, ``p - n + N`` above; launch order when N > M.  ``groups`` G > 1: among the KV tiles of
    its group (``n mod G``) only."""
    num_m = (seqlen_q + tile_m - 1) // tile_m
    num_n = (seqlen_k + tile_n - 1) // tile_n
    turn = n_block // groups
    if num_n <= num_m:
        last = ((m_block + 1) * num_n + num_m - 1) // num_m - 1  # floor(n M / N) <= m iff n <= last
        # members n' = n (mod G) met going down from `last`: those in (n, last], or in (n, N) and [0, last]
        turn = (last - n_block) // groups
        if n_block > last:
            turn = (num_n - 1 - n_block) // groups
            if last >= n_block % groups:
                turn += (last - n_block % groups) // groups + 1
    return turn


def dense_rotation_py(n_block: int, seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int) -> int:
    """:func:`dense_rotation` in plain Python."""
    num_m, num_n = -(-seqlen_q // tile_m), -(-seqlen_k // tile_n)
    return n_block * num_m // num_n if num_n <= num_m else 0


def dense_turn_py(n_block: int, m_block: int, seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int,
                  groups: int = 1) -> int:
    """:func:`dense_turn` in plain Python."""
    num_m, num_n = -(-seqlen_q // tile_m), -(-seqlen_k // tile_n)
    if num_n > num_m:
        return n_block // groups
    last = ((m_block + 1) * num_n + num_m - 1) // num_m - 1
    r = n_block % groups
    if n_block <= last:
        return (last - n_block) // groups
    return (num_n - 1 - n_block) // groups + ((last - r) // groups + 1 if last >= r else 0)


@cute.jit
def apply_window_mask_t(s_mn: cute.Tensor, tScS_mn: cute.Tensor, n_block: Int32, m_block: Int32, seqlen_q: Int32,
                        seqlen_k: Int32, tile_n: cutlass.Constexpr[int], tile_m: cutlass.Constexpr[int],
                        window_left: Int32, window_right: Int32, t0ScS_mn: cute.Tensor = None):
    """:func:`apply_mask_t` for a sliding window: a (key, query) score stays iff ``key < Sk`` and
    ``p - window_left <= key <= p + window_right`` for the query's position ``p = q + Sk - Sq`` (a band
    of each row's queries: keep-bits as :func:`apply_mask_t`'s)."""
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        key = n_block * tile_n + tScS_mn[r, 0][0]
        if const_expr(t0ScS_mn is not None and fs.pair_columns(t0ScS_mn)):
            base = m_block * tile_m + tScS_mn[0, 0][1] + seqlen_k - seqlen_q  # thread 0's column c: p - t0 col
            n_lo = fs.pair_columns_below(key - window_right - base)  # p < key - right: masked
            n_hi = fs.pair_columns_below(key + window_left - base + 1)  # p > key + left: masked
            if key >= seqlen_k:
                n_hi = Int32(0)
            fs.mask_row_by_bits(s_mn[r, None], lambda chunk: fs.prefix_bits(n_hi, chunk) & ~fs.prefix_bits(n_lo, chunk))
        else:
            for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                p = m_block * tile_m + tScS_mn[0, c][1] + seqlen_k - seqlen_q
                visible = (key < seqlen_k) & (key >= p - window_left) & (key <= p + window_right)
                s_mn[r, c] = s_mn[r, c] if visible else -Float32.inf


@cute.jit
def apply_mask_t(s_mn: cute.Tensor, tScS_mn: cute.Tensor, n_block: Int32, m_block: Int32, seqlen_q: Int32,
                 seqlen_k: Int32, tile_n: cutlass.Constexpr[int], tile_m: cutlass.Constexpr[int],
                 causal: cutlass.Constexpr[bool], t0ScS_mn: cute.Tensor = None):
    """Set the transposed scores (rows: keys, columns: queries) of invisible pairs to -inf: key >= Sk,
    or (causal) key > query + Sk - Sq.  ``tScS_mn``: this thread's (key, query) coordinates in the tile;
    ``t0ScS_mn``: thread 0's (compile-time).  Causal, with the wgmma accumulator's columns
    (:func:`~.forward_softmax.pair_columns`): a row's visible queries are a suffix, its start a bit mask
    (:func:`~.forward_softmax.mask_row_by_bits`), instead of two compares per score."""
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        key = n_block * tile_n + tScS_mn[r, 0][0]
        if const_expr(causal and t0ScS_mn is not None and fs.pair_columns(t0ScS_mn)):
            # query m_block * tile_m + (this thread's column 0) + (thread 0's column c) sees the key iff
            # thread 0's column c >= key - (Sk - Sq) - m_block * tile_m - (this thread's column 0)
            n_lo = fs.pair_columns_below(key - seqlen_k + seqlen_q - m_block * tile_m - tScS_mn[0, 0][1])
            if key >= seqlen_k:
                n_lo = Int32(cute.size(s_mn, mode=[1]))
            fs.mask_row_by_bits(s_mn[r, None], lambda chunk: ~fs.prefix_bits(n_lo, chunk))
        else:
            for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                visible = key < seqlen_k
                if const_expr(causal):
                    q = m_block * tile_m + tScS_mn[0, c][1]
                    visible = visible & (key <= q + seqlen_k - seqlen_q)
                s_mn[r, c] = s_mn[r, c] if visible else -Float32.inf


class BwdTileOrder:
    """Mixin of :class:`~.backward_kernel.FlashAttnBwdSm90`: a CTA's sequence (dense or packed), the
    query tiles its KV tile meets and the order it walks them.  Needs ``self.cfg``, ``tile_m``,
    ``tile_n`` and ``causal``."""

    @cute.jit
    def tile_coords(self, seqlen_k, seq, seqlen_q):
        """``(n_block, head, batch)`` of this CTA (warp-wide).  Dense: the grid's, or (``lpt``) the grid's
        linear index in :func:`~.forward_softmax.tile_coords`' sections, KV tile 0 first
        (:func:`~.backward_config.lpt_tile_coords_py`).  Packed: grid x numbers
        the sequences' KV tiles, in :mod:`.forward_seqlen`'s gapped numbering (``seq[4]`` set: no CTA past
        a shorter sequence's keys, a search to find the tile; ``seqlen_k`` the packed total), or grid z
        is the sequence and x its KV tiles up to ``ceil(max_seqlen_k / tile_n)`` (the dense grid's
        order); ``n_block`` may be negative or past the sequence's keys (the kernel exits)."""
        n_block, head, batch = cute.arch.block_idx()
        if const_expr(self.cfg.lpt):
            num_n, num_heads, num_batch = cute.arch.grid_dim()
            m, head, batch = fs.tile_coords(n_block + num_n * (head + num_heads * batch), num_n, num_heads,
                                            num_batch, seqlen_q, 1, LPT_TOKEN_BYTES_PER_D * self.cfg.head_dim, True)
            n_block = num_n - 1 - m
        if const_expr(self.cfg.varlen):
            if seq[4] > 0:  # (else grid z is the sequence: a row of ceil(max_seqlen_k / tile_n) CTAs each)
                batch, n_block = fsl.gapped_tile_coords(n_block, seq[1], seq[1].shape[0] - 1, seqlen_k, self.tile_n)
        return n_block, head, batch

    @cute.jit
    def sequence(self, batch, seqlen_q, seqlen_k, seq):
        """``(len_q, len_k, off_q, off_k, off_p)`` of sequence ``batch`` (:meth:`tile_coords`): dense, the tensors' lengths and
        offsets 0; packed, sequence ``batch``'s lengths and first rows from ``seq`` (cu_seqlens_q / _k,
        max_seqlen_q / _k, clamped as :func:`.forward_seqlen.sequence_bounds` does), ``off_p`` its first
        row in the padded row buffers (LSE_log2, Delta, the dQ accumulator; :func:`padded_first_row`)."""
        if const_expr(self.cfg.varlen):
            off_q, len_q, off_k, len_k = fsl.sequence_bounds(batch, seqlen_q, seqlen_k, seq[0], seq[1], seq[2],
                                                             seq[3], True)
            return len_q, len_k, off_q, off_k, padded_first_row(off_q, batch)
        return seqlen_q, seqlen_k, Int32(0), Int32(0), Int32(0)

    def rows(self, mX: cute.Tensor, offset, head, batch) -> cute.Tensor:
        """One head's rows of an (S, D, H, B) or (S, H, B) tensor (TMA coordinates or real): the batch
        slice (dense), or the packed rows from ``offset`` on (row 0 of the result is row ``offset``)."""
        if const_expr(cute.rank(mX) == 3):
            if const_expr(self.cfg.varlen):
                return cute.domain_offset((offset,), mX[None, head, 0])
            return mX[None, head, batch]
        return fsl.sequence_rows(mX, head, batch, offset, self.cfg.varlen)

    @cute.jit
    def m_range(self, n_block, seqlen_q, seqlen_k, window_left, window_right):
        """``(m_min, m_max, m_lo, m_hi)``: the query tiles of KV tile ``n_block``, ``m_lo .. m_hi - 1``
        without a mask (dense: ``m_hi = m_max``; :func:`m_block_range`, :func:`m_block_range_window`).
        (A packed KV tile past its sequence's keys never gets here: the kernel exits first.)"""
        if const_expr(self.cfg.window):
            m_min, m_max, m_lo, m_hi = m_block_range_window(n_block, seqlen_q, seqlen_k, self.tile_m, self.tile_n,
                                                            window_left, window_right)
        else:
            m_min, m_max, m_lo = m_block_range(n_block, seqlen_q, seqlen_k, self.tile_m, self.tile_n, self.causal)
            m_hi = m_max
        return m_min, m_max, m_lo, m_hi

    @property
    def rotates(self) -> bool:
        """Whether the query tiles are walked from a rotated start (:func:`dense_rotation`): the
        deterministic mode on dense ranges (every KV tile meets every query tile)."""
        return self.cfg.deterministic and not (self.cfg.causal or self.cfg.window or self.cfg.mma_only)

    @cute.jit
    def tile_at(self, base, i, count, n_block, seqlen_q, seqlen_k):
        """The query tile of iteration ``i`` over ``base .. base + count - 1``: in order, or, when
        :attr:`rotates`, from :func:`dense_rotation` on (the producer, the consumers and the dQ warp walk
        the same order; on dense ranges one of the consumers' two loops is empty)."""
        if const_expr(self.rotates):
            return base + (i + dense_rotation(n_block, seqlen_q, seqlen_k, self.tile_m, self.tile_n)) % count
        return base + i
