"""Pure-Python choices of the GEMM planner (CTA tiles, cluster, raster, split-K, the transposed skinny
plan) from problem sizes and dtype names, shared by the planner, the tuner and ``explain``.  The
measurements behind each threshold are in ``profiles/NOTES-gemm.md``."""

from __future__ import annotations

import math
import os
from typing import NamedTuple

from layouts import tiles as T

from ..common.arch import current_arch

#: Split-K loads of the operand read once (B; the swapped skinny plan's weight) carry the L2 evict-first
#: hint, so a streamed weight does not evict the activations around the call.  A call replayed back to
#: back with B still in L2 loses a little: CUTE_KERNELS_SPLITK_B_EVICT_FIRST=0 turns the hint off.
SPLITK_B_EVICT_FIRST = os.environ.get("CUTE_KERNELS_SPLITK_B_EVICT_FIRST", "1") not in ("0", "")

#: A (M x K) bytes above which the persistent raster must reuse A through L2 (H100/H200 L2: 50 MB).
A_STREAM_BYTES = 64 << 20
#: slices of at least this many 64-deep k-tiles go to the persistent split-K (see auto_splitk_mode)
AUTO_PERSISTENT_MIN_SLICE_KTILES = 32
#: Skinny problems (M <= SKINNY_SWAP_MAX_M rows, unbatched) run transposed: out^T = b^T a^T.
SKINNY_SWAP_MAX_M = 64
#: K slices of the skinny multicast pairs stay >= this many k-tiles
SKINNY_MCAST_MIN_SLICE_KTILES = 64


def make_gemm_tiles(tile_n: int, cluster: tuple[int, int], ab: str, a_major: str, b_major: str,
                    c_dtype: str, c_major: str = "n", tile_m: int = 128) -> T.GemmTiles:
    """:func:`layouts.tiles.gemm_tiles` in this target's shared memory."""
    return T.gemm_tiles(tile_n, cluster, ab, a_major, b_major, c_dtype, current_arch().smem_per_cta, c_major, tile_m)


def default_tiles(m: int, n: int, k: int, l: int, ab: str, a_major: str, b_major: str,
                  c_dtype: str, c_major: str, stream_tiles: bool = True) -> T.GemmTiles:
    """The tile width whose last wave is fullest, weighted by a small penalty for narrow wgmma (N=128
    re-reads A from smem twice as often per FLOP as N=256); 128-wide for split-K-sized problems.  Large
    A (:func:`takes_stream_tiles`, unless ``stream_tiles=False``): 256 x 128 tiles on an N-pair cluster
    when their waves are as full as the width choice's."""
    sms = current_arch().sm_count
    best = None
    for tile_n, eff in ((256, 1.0), (192, 0.97), (128, 0.92)):
        n_tiles = math.ceil(m / 128) * math.ceil(n / tile_n) * l
        cost = math.ceil(n_tiles / sms) * tile_n / eff
        if n_tiles * 2 <= sms:  # split-K territory: narrow tiles give more, cheaper slices
            cost = 0 if tile_n == 128 else float("inf")
        if best is None or cost < best[0]:
            best = (cost, tile_n)
    if stream_tiles and takes_stream_tiles(m, n, k, l, ab):
        # same area as a 128 x 256 tile: take it unless its waves quantize clearly (> 5%) worse than
        # the width choice's, whose cost ignores the HBM traffic of narrow tiles on these shapes
        nt = math.ceil(n / 128)
        n256 = math.ceil(m / 256) * (nt + nt % 2)  # an odd tile count pads its last cluster column
        if n256 * 2 > sms and math.ceil(n256 / sms) * 256 <= 1.05 * best[0]:
            return make_gemm_tiles(128, (1, 2), ab, a_major, b_major, c_dtype, c_major, tile_m=256)
    tile_n = best[1]
    # 2x1 multicast whenever the M tiles pair up (B loaded once per CTA pair), small problems too
    cluster = (2, 1) if math.ceil(m / 128) % 2 == 0 else (1, 1)
    if a_streams(m, k, ab):
        cluster = (1, 1)  # with the swizzled raster (default_raster): see there
    return make_gemm_tiles(tile_n, cluster, ab, a_major, b_major, c_dtype, c_major)


def a_streams(m: int, k: int, ab: str) -> bool:
    """Whether A is too large to stay in L2 between the tile columns of a plain raster."""
    return m * k * (4 if ab == "float32" else 2) >= A_STREAM_BYTES


def takes_stream_tiles(m: int, n: int, k: int, l: int, ab: str) -> bool:
    """Does the A-streaming shape take 256 x 128 tiles, 1x2 cluster, raster swizzle 8?  These shapes run
    at the power cap, so TFLOP/s follows energy per FLOP: the N-pair multicast and the swizzle-8 raster
    cut HBM and L2 reads.  An odd N-tile count wastes a CTA per cluster column: taken from 15 up."""
    nt = math.ceil(n / 128)
    return (l == 1 and a_streams(m, k, ab) and m >= 2048 and n >= 1024
            and (nt % 2 == 0 or nt >= 15) and ab != "float32")


def default_raster(m: int, n: int, k: int, ab: str, l: int = 1, tiles: T.GemmTiles | None = None) -> tuple[int, bool]:
    """(raster swizzle, along M) of the persistent tile scheduler (the plan fits it, :func:`fit_swizzle`).

    A larger than L2: swizzle 4 along M, so a wave touches ~1/4 of A and its B columns stay in L2 (8
    with the stream tiles).  A in L2, 2x1 cluster, more than one wave: swizzle 8 along N, a band of 16 M
    tiles across ~8 tile columns sharing B (``profiles/l2_model.py``).  Else swizzle 1 along M."""
    if tiles is None:
        tiles = default_tiles(m, n, k, l, ab, "k", "mn", "bfloat16", "n")
    if takes_stream_tiles(m, n, k, l, ab) and (tiles.tile_mnk[:2], tiles.cluster_mn) == ((256, 128), (1, 2)):
        return (8, True)
    if a_streams(m, k, ab):
        return (4, True)
    n_tiles = math.ceil(m / tiles.tile_mnk[0]) * math.ceil(n / tiles.tile_mnk[1]) * l
    if tiles.cluster_mn == (2, 1) and n_tiles > current_arch().sm_count:
        return (8, False)  # A fits in L2: the band raster
    return (1, True)


def fit_swizzle(swizzle: int, along_m: bool, m: int, n: int, tile_mn: tuple[int, int],
                cluster_mn: tuple[int, int]) -> int:
    """The raster swizzle to run, from swizzle//2..swizzle, padding the fewest units: the DSL's scheduler
    rounds the cluster grid up to whole strips of ``swizzle`` and each padding unit runs a full mainloop
    on zero-filled tiles (12 cluster columns: 8 pads to 16, 6 or 4 pad none).  Ties go to the wider
    strip; a strip is never wider than the grid."""
    across = math.ceil(math.ceil(n / tile_mn[1]) / cluster_mn[1]) if along_m else \
        math.ceil(math.ceil(m / tile_mn[0]) / cluster_mn[0])
    swizzle = min(swizzle, max(1, across))
    if swizzle <= 1:
        return 1
    return min(range(max(1, swizzle // 2), swizzle + 1), key=lambda s: (math.ceil(across / s) * s - across, -s))


def epi_defer_default(epi_defer_possible: bool, m: int, n: int, l: int, tile_mn: tuple[int, int]) -> bool:
    """The deferred epilogue where it can run and some CTA gets more than one tile, i.e. there is a
    next mainloop to hide the stores under (one-wave shapes gain nothing; profiles/NOTES-gemm.md)."""
    tm, tn = tile_mn
    return epi_defer_possible and math.ceil(m / tm) * math.ceil(n / tn) * l > current_arch().sm_count


# ---------------------------------------------------------------------------- split-K
def auto_splitk_mode(m: int, n: int, k: int, l: int = 1, out_row_major: bool = True) -> str:
    """The split-K kernel for a shape the heuristic splits: "persistent" (last-CTA fixup in the persistent
    kernel; unbatched, row-major output) where each slice streams >= 32 k-tiles, else "cluster" (pairs
    reduced through DSMEM)."""
    if l != 1 or not out_row_major:
        return "cluster"
    s = persistent_splitk_choice(m, n, k)[1]
    return "persistent" if s > 1 and math.ceil(k / 64) // s >= AUTO_PERSISTENT_MIN_SLICE_KTILES else "cluster"


def split_k_factor(m: int, n: int, k: int, l: int, tiles: T.GemmTiles, mode: str) -> int:
    """K slices (1: no split) for split-K ``mode`` ("cluster", "persistent" or "none"), only when the
    tiles cannot fill half the SMs.  The cluster kernel splits 128x128 problems in pairs (clusters of
    4-8 CTAs schedule worse) with >= 8 k-tiles per slice."""
    if mode == "none":
        return 1
    sms = current_arch().sm_count
    tm, tn, tk = tiles.tile_mnk
    n_tiles = math.ceil(m / tm) * math.ceil(n / tn) * l
    if l != 1 or n_tiles * 2 > sms:
        return 1
    if mode == "persistent":
        return persistent_splitk_choice(m, n, k)[1]
    if mode != "cluster":
        raise ValueError(f"split_k_factor: unknown split-K mode {mode!r}")
    if tm != 128 or tn != 128:
        return 1
    n_tiles = math.ceil(m / tm) * math.ceil(n / splitk_tile_n(m, n))
    return 2 if math.ceil(k / tk) >= 16 and n_tiles * 2 <= sms else 1


def splitk_tile_n(m: int, n: int) -> int:
    """Tile width of the cluster split-K kernel: 64-wide tiles when pairs of them still fit the SMs
    (twice the CTAs streaming B), else 128-wide."""
    return 64 if math.ceil(m / 128) * math.ceil(n / 64) * 2 <= current_arch().sm_count else 128


def persistent_splitk_choice(m: int, n: int, k: int) -> tuple[int, int]:
    """(tile_n, splits) of the persistent split-K: the most CTAs up to one per SM, slices of >= 8
    k-tiles, S <= 8; ties go to 256-wide tiles (the most efficient wgmma per SM).
    1024x1024x32768 -> 256 x S=4 (128 CTAs, 128 k-tiles each)."""
    sms = current_arch().sm_count
    k_tiles = math.ceil(k / 64)
    best = None
    for tn in (256, 128):
        n_tiles = math.ceil(m / 128) * math.ceil(n / tn)
        s = max(1, min(8, sms // n_tiles, k_tiles // 8))
        if best is None or n_tiles * s > best[0]:
            best = (n_tiles * s, tn, s)
    return best[1], best[2]


def splitk_tiles(tile_n: int, ab: str, a_major: str, b_major: str, d_dtype: str, a_mcast: int = 1) -> T.GemmTiles:
    """:func:`layouts.tiles.splitk_tiles` in this target's shared memory."""
    return T.splitk_tiles(tile_n, ab, a_major, b_major, d_dtype, current_arch().smem_per_cta, a_mcast)


# ---------------------------------------------------------------------------- the transposed skinny plan
class SkinnySwap(NamedTuple):
    """The transposed skinny plan: N tile width (holding the problem's M), K slices, and the CTAs along
    N that share each weight tile by multicast (1 or 2)."""
    tile_n: int
    splits: int
    mcast: int = 1

    @property
    def fixup(self) -> bool:
        """Slices meet in an L2 workspace (fixup kernel) rather than a cluster's shared memory: beyond
        two, or two with the weight multicast too (clusters of 4 do not all fit at once)."""
        return self.splits > 2 or (self.splits > 1 and self.mcast > 1)


def skinny_swap_choice(m: int, n: int, k: int, mcast: bool = True) -> SkinnySwap | None:
    """The swapped skinny GEMM's (tile width, K slices, weight multicast), or None when M > 64.

    Why transposed: with M <= 64 most of every 128-row A box lies past M, and TMA's zero fill costs
    as if it were read.  Swapped, the weight streams as A and M becomes the narrowest 16 / 32 / 64-wide
    N tile that holds it; K is split so tiles x slices fill the SMs (slices of >= 8 k-tiles, <= 8).
    32 < M <= 64 takes two 32-wide tiles sharing the weight by multicast where the pairs fit in one wave
    (``mcast`` False: not for this call; the planner passes False with C or an fp32 output)."""
    if m > SKINNY_SWAP_MAX_M:
        return None
    sms = current_arch().sm_count
    tiles = math.ceil(n / 128)
    k_tiles = math.ceil(k / 64)
    if mcast and m > 32 and 2 * tiles <= sms:
        return SkinnySwap(32, max(1, min(8, sms // (2 * tiles), k_tiles // SKINNY_MCAST_MIN_SLICE_KTILES)), 2)
    tn = next(t for t in (16, 32, 64) if t >= m)
    s = max(1, min(8, sms // tiles, k_tiles // 8))
    if tn == 64 and k_tiles // s < AUTO_PERSISTENT_MIN_SLICE_KTILES:
        s = min(s, 2)  # short slices of 64-wide fp32 partials cost more through L2 than the CTAs gain
    return SkinnySwap(tn, s)



def stage_misaligned(m: int, n: int, k: int, l: int, elem_bytes: int, staged_elems: int, min_vec: int) -> bool:
    """Whether a GEMM whose A or B TMA cannot describe copies them into aligned buffers first (then runs
    the TMA kernels: ``PlanChoice(stage=True)``) rather than reading them in place with the cp.async
    mainloop.  ``staged_elems``: the elements copied; ``min_vec``: the cp.async path's narrowest vector
    (bytes).  Element-wide vectors always stage (that mainloop then runs about 3x the TMA kernel's
    time); wider ones stage when the copy (a launch plus reading and writing the operands) costs less
    than 15% of the GEMM's own bound (MMA peak or one read of A, B and D), the least the cp.async
    mainloop was measured to lose with 4- and 8-byte vectors (profiles/NOTES-gemm.md)."""
    if min_vec <= elem_bytes:
        return True
    copy_us = 2.0 + 2 * staged_elems * elem_bytes / 3.0e6
    gemm_us = max(2.0 * m * n * k * l / 650e6, (m * k + k * n + m * n) * l * elem_bytes / 3.5e6)
    return copy_us < 0.15 * gemm_us
