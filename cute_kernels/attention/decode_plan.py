"""Host-side planning of ``decode_attn``: argument validation, the kernel configuration and the split
count, all from static facts (shapes, dtypes, the cache's capacity), never from the lengths on the
device.  :func:`explain` runs the same code on meta tensors (any machine, nothing compiled)."""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass
from typing import Optional

import torch

from layouts.attention import DecodeTile, decode_tile

from ..common.args import tensor_fault
from ..common.arch import current_arch
from ..common.dtypes import HALF_TORCH, name_of
from ..common.fastpath import BoundedCache
from ..common.overlap import check_written
from .forward_validate import INT32_LIMIT, check_scale, check_sink, shown
from .forward_validate import check_window as _fa_check_window

__all__ = ["DecodeConfig", "make_config", "choose_num_splits", "workspace_numel", "explain",
           "TMA_EF_MAX_KV_BYTES", "load_for", "check_window", "window_capacity"]


@dataclass(frozen=True)
class DecodeConfig:
    """Everything the compiled decode kernel specializes on (lengths, batch, heads, splits are not)."""

    tile: DecodeTile
    paged: bool
    page_size: int  # 0 when not paged
    causal: bool
    split: bool  # False: num_splits == 1, the kernel writes the output directly
    load: str = "cpasync"  # K/V loads: "cpasync" or "tma" (contiguous caches; :func:`load_for`)
    softcap: bool = False  # score softcapping (the value a run-time argument)
    sink: bool = False  # a (Hq,) float32 sink logit per query head (learnable_sink)
    #: a sliding window (its two sides run-time values; causal is folded into it: ``causal`` is False)
    window: bool = False
    #: a (B,) int32 cache_leftpad: sequence b's keys are cache positions [cache_leftpad[b], seqlen_b)
    leftpad: bool = False

    def __post_init__(self):
        if self.load not in ("cpasync", "tma") or (self.load == "tma" and self.paged):
            raise ValueError(f"DecodeConfig: load={self.load!r} (tma: contiguous caches only)")
        if self.window and self.causal:
            raise ValueError("DecodeConfig: a window config folds causal into its right side (causal=False)")

    @property
    def variant_args(self) -> tuple[str, ...]:
        """The run-time arguments the kernel takes after ``scale_log2`` (none for plain configs)."""
        return (("softcap_scale",) * self.softcap + ("learnable_sink",) * self.sink
                + ("window_left", "window_right") * self.window + ("cache_leftpad",) * self.leftpad)

    dtype = property(lambda self: self.tile.dtype)
    head_dim = property(lambda self: self.tile.head_dim)
    m_tile = property(lambda self: self.tile.m_tile)
    n_tile = property(lambda self: self.tile.n_tile)
    stages = property(lambda self: self.tile.stages)
    num_threads = property(lambda self: self.tile.num_threads)


#: Contiguous caches of at most this many K + V bytes (static capacity) load through TMA with the L2
#: evict-first hint, larger ones with cp.async: the hint spares the dirty lines a previous kernel left
#: in L2 a write-back (a roughly fixed few microseconds) but slows the stream itself by a few percent;
#: break-even lies between 128 and 256 MiB (profiles/NOTES-decode.md).
TMA_EF_MAX_KV_BYTES = 192 << 20


def load_for(paged: bool, kv_bytes: int) -> str:
    """Pure Python: the K/V load path for a cache of ``kv_bytes`` (K + V, static capacity)."""
    return "tma" if not paged and 0 < kv_bytes <= TMA_EF_MAX_KV_BYTES else "cpasync"


def make_config(dtype: torch.dtype, head_dim: int, rows: int, paged: bool, page_size: int, causal: bool,
                split: bool, kv_bytes: int = 0, softcap: bool = False, sink: bool = False, window: bool = False,
                leftpad: bool = False) -> DecodeConfig:
    """The configuration from static facts only.  ``rows`` = (Hq/Hkv) * Sq; ``kv_bytes`` = K + V bytes
    of the cache's static capacity (picks the load path, :func:`load_for`; 0: cp.async); ``softcap`` /
    ``sink``: the call softcaps / has sinks; ``window`` / ``leftpad``: a sliding window (``causal`` then
    False, folded into the window's right side) / a ``cache_leftpad`` (the same tile)."""
    return DecodeConfig(tile=decode_tile(name_of(dtype), head_dim, rows), paged=paged,
                        page_size=page_size if paged else 0, causal=causal, split=split,
                        load=load_for(paged, kv_bytes), softcap=bool(softcap), sink=bool(sink),
                        window=bool(window), leftpad=bool(leftpad))


def window_capacity(capacity: int, seqlen_q: int, window, n_tile: int) -> int:
    """The keys a call can see at most, for the split count: the static capacity, or with a window's
    left side ``w`` (a host int) the ``w + Sq`` keys of its widest span rounded out to the tiles they
    can straddle (one more than they fill).  The lengths and the left padding stay on the device."""
    if window is None or window[0] < 0:
        return capacity
    return min(capacity, (-(-(window[0] + seqlen_q) // n_tile) + 1) * n_tile)


def choose_num_splits(
    batch: int, heads_kv: int, row_blocks: int, capacity: int, n_tile: int, sm_count: int, per_sm: int
) -> int:
    """Split count from static sizes: fill the SMs with whole waves, keep chunks long.

    Model: time(s) = waves(s) * (tiles per split + fixed cost of a CTA) + (s > 1) * combine cost,
    waves(s) = ceil(batch*heads_kv*row_blocks*s / (SMs * CTAs per SM)); costs in tiles."""
    tiles = max(1, -(-capacity // n_tile))
    base = batch * heads_kv * row_blocks
    slots = sm_count * per_sm
    cta_cost, combine_cost = 3.0, 3.0
    best, best_t = 1, None
    max_s = min(256, tiles, max(1, 4 * -(-slots // base)))
    for s in range(1, max_s + 1):
        waves = -(-(base * s) // slots)
        t = waves * (-(-tiles // s) + cta_cost) + (combine_cost if s > 1 else 0.0)
        if best_t is None or t < best_t - 1e-9:
            best, best_t = s, t
    return best


def workspace_numel(num_splits: int, batch: int, seqlen_q: int, heads_q: int, head_dim: int) -> int:
    """float32 elements of a decode workspace: the partial outputs and LSEs of every split."""
    if num_splits <= 1:
        return 1
    return num_splits * batch * seqlen_q * heads_q * (head_dim + 1)


def check_flag(value, name: str, who: str, allow_none: bool = False) -> None:
    """TypeError unless ``value`` is a bool (or None with ``allow_none``): a string or a tensor would
    otherwise pass as its truth value, and a tensor would enter a compile key by its identity."""
    if not (type(value) is bool or (allow_none and value is None)):
        what = "a bool or None" if allow_none else "a bool"
        raise TypeError(f"{who}: {name} must be {what}, got {type(value).__name__} {value!r}")


def checked_default(checked: Optional[bool], who: str = "decode_attn") -> bool:
    """``checked`` (a bool or None: TypeError otherwise), or env ``CUTE_KERNELS_CHECKED`` when None
    (decode_attn and flash_attn alike)."""
    if checked is not None:
        check_flag(checked, "checked", who, allow_none=True)
        return checked
    return os.environ.get("CUTE_KERNELS_CHECKED", "0") not in ("0", "", "false", "off")


# CUTE_KERNELS_CHECKED is read on every call (tests set it mid-process), from os.environ's backing
# dict: os.environ.get encodes the key on each call (~0.5 us).  ``ENV_CHECKED not in ENV``: it is unset
# (without that backing dict never true, and checked_default reads the variable)
ENV = getattr(os.environ, "_data", None)
ENV_CHECKED = os.environ.encodekey("CUTE_KERNELS_CHECKED") if ENV is not None and hasattr(
    os.environ, "encodekey") else None
if ENV_CHECKED is None:
    ENV = {None: None}


def checked_env() -> bool:
    """``checked_default(None)`` for the host fast paths: the variable is usually unset, which one
    dict lookup tells (a fast path writes that test out: ``ENV_CHECKED not in ENV``)."""
    if ENV_CHECKED not in ENV:
        return False
    return checked_default(None)


def check_num_splits(num_splits, who: str = "decode_attn") -> Optional[int]:
    """None, or an int >= 1 (TypeError for a non-integer such as "four" or 2.5, ValueError below 1)."""
    if num_splits is None:
        return None
    if isinstance(num_splits, bool):
        raise TypeError(f"{who}: num_splits must be an int or None, got {num_splits!r}")
    try:
        n = operator.index(num_splits)
    except TypeError:
        raise TypeError(f"{who}: num_splits must be an int or None, got {type(num_splits).__name__} "
                        f"{num_splits!r}") from None
    if n < 1:
        raise ValueError(f"{who}: num_splits must be >= 1, got {shown(n)}")
    if n >= INT32_LIMIT:  # the kernel's grid x and the op schema's int
        raise ValueError(f"{who}: num_splits must be < 2**31, got {shown(n)}")
    return n


def check_window(window_size, causal: bool, who: str = "decode_attn"):
    """``(causal, window)`` the kernel runs for ``window_size`` (FlashAttention-3's sides: ints or None,
    -1 or None unbounded, nothing below -1; with causal the right side must be 0 or -1 and becomes 0):
    :func:`~.forward_validate.check_window` without negative sides, its errors starting with ``who``.  A
    window that bounds nothing beyond causal is None (the plain configuration)."""
    return _fa_check_window(window_size, causal, who=who)


def resolve_scale(softmax_scale, head_dim):
    """The softmax scale (default ``head_dim ** -0.5``); a plain number must be positive and finite.
    A symbolic one (torch.compile's SymFloat / SymInt) is passed through unchecked: the check is a
    host convenience, and tracing must not specialize on the value."""
    if softmax_scale is None:
        return head_dim ** -0.5  # head_dim is validated (64 / 128 / 256): positive and finite
    if isinstance(softmax_scale, (torch.SymFloat, torch.SymInt)):
        return softmax_scale
    return check_scale(softmax_scale, "decode_attn")  # flash_attn's rule: a real number in (0, max]


def validate(q, k_cache, v_cache, cache_seqlens, block_table, out, workspace, check_ptrs=True, devices=True,
             learnable_sink=None, cache_leftpad=None):
    """Every check the host can make without reading device data, in a fixed order: types, ranks,
    shapes, dtypes, strides, pointers, devices (last, so a shape fault on a tensor of the wrong device
    gets the shape's message).  Each message starts with the argument it is about.  ``check_ptrs=False``
    skips the data-pointer alignment (fake tensors); ``devices=False`` leaves the device check to the
    caller (:func:`check_devices`, after its scalar checks).  ``learnable_sink``: checked with the dtypes
    (:func:`~.forward_validate.check_sink`); ``cache_leftpad``: a (B,) int32 contiguous tensor like
    ``cache_seqlens``."""
    def err(cls, msg):
        raise cls(f"decode_attn: {msg}")

    named = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", cache_seqlens),
             ("block_table", block_table), ("out", out), ("workspace", workspace), ("cache_leftpad", cache_leftpad)]
    for name, t in named:
        if (t is not None or name in ("q", "k_cache", "v_cache", "cache_seqlens")) and (fault := tensor_fault(t)):
            err(TypeError, f"{name} {fault}")
    named = [(n, t) for n, t in named if t is not None]
    # ranks
    if q.dim() != 4:
        err(ValueError, f"q must be (batch, seqlen_q, heads_q, head_dim), got shape {tuple(q.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            err(ValueError, f"{name} must be 4-d (batch, Lmax, heads_kv, head_dim) or paged (num_pages, page_size, "
                            f"heads_kv, head_dim), got shape {tuple(t.shape)}")
    B, Sq, Hq, D = q.shape
    if cache_seqlens.dim() != 1:
        err(ValueError, f"cache_seqlens must be ({B},), got shape {tuple(cache_seqlens.shape)}")
    if cache_leftpad is not None and cache_leftpad.dim() != 1:
        err(ValueError, f"cache_leftpad must be ({B},), got shape {tuple(cache_leftpad.shape)}")
    if block_table is not None and block_table.dim() != 2:
        err(ValueError, f"block_table must be ({B}, pages_per_seq), got shape {tuple(block_table.shape)}")
    # shapes
    if not 1 <= Sq <= 16:
        err(ValueError, f"q seqlen_q (dim 1) must be in 1..16 (decode / speculative verification), got {Sq}")
    if D not in (64, 128, 256):
        err(ValueError, f"q head_dim must be 64, 128 or 256, got {D}")
    if k_cache.shape != v_cache.shape:
        err(ValueError, f"k_cache and v_cache shapes differ: {tuple(k_cache.shape)} vs {tuple(v_cache.shape)}")
    Hkv = k_cache.shape[2]
    if k_cache.shape[3] != D:
        err(ValueError, f"k_cache head_dim {k_cache.shape[3]} != q head_dim {D}")
    if Hkv < 1 or Hq < 1 or Hq % Hkv != 0:
        err(ValueError, f"q heads_q ({Hq}) must be a multiple of heads_kv ({Hkv}) of k_cache/v_cache (GQA/MQA)")
    if cache_seqlens.shape[0] != B:
        err(ValueError, f"cache_seqlens must be ({B},) (q's batch), got {tuple(cache_seqlens.shape)}")
    if cache_leftpad is not None and cache_leftpad.shape[0] != B:
        err(ValueError, f"cache_leftpad must be ({B},) (q's batch), got {tuple(cache_leftpad.shape)}")
    if block_table is None:
        if k_cache.shape[0] != B:
            err(ValueError, f"k_cache: contiguous cache batch ({k_cache.shape[0]}) != q batch ({B})")
    else:
        if block_table.shape[0] != B:
            err(ValueError, f"block_table must be ({B}, pages_per_seq), got {tuple(block_table.shape)}")
        if block_table.shape[1] < 1:
            err(ValueError, "block_table needs at least one page column")
        if not 1 <= k_cache.shape[1] <= 1024:
            err(ValueError, f"k_cache page_size (dim 1) must be in 1..1024, got {k_cache.shape[1]}")
        if k_cache.shape[0] < 1:
            err(ValueError, "k_cache (paged) has no pages: block_table ids have nothing to index")
    if out is not None and out.shape != q.shape:
        err(ValueError, f"out must be a contiguous {q.dtype} tensor of shape {tuple(q.shape)}, got shape {tuple(out.shape)}")
    # dtypes
    if q.dtype not in HALF_TORCH:
        err(TypeError, f"q must be float16 or bfloat16, got {q.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            err(TypeError, f"{name} dtype ({t.dtype}) must equal q's dtype ({q.dtype})")
    if cache_seqlens.dtype != torch.int32:
        err(TypeError, f"cache_seqlens must be int32, got {cache_seqlens.dtype}")
    if block_table is not None and block_table.dtype != torch.int32:
        err(TypeError, f"block_table must be int32, got {block_table.dtype}")
    if cache_leftpad is not None and cache_leftpad.dtype != torch.int32:
        err(TypeError, f"cache_leftpad must be int32, got {cache_leftpad.dtype}")
    if out is not None and out.dtype != q.dtype:
        err(ValueError, f"out must be a contiguous {q.dtype} tensor of shape {tuple(q.shape)}, got dtype {out.dtype}")
    if workspace is not None and workspace.dtype != torch.float32:
        err(ValueError, f"workspace must be a contiguous float32 tensor, got dtype {workspace.dtype}")
    check_sink(learnable_sink, Hq, None, "decode_attn")
    # strides
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            err(ValueError, f"{name} must be contiguous in the head dim (stride(-1) == 1), got stride {t.stride()}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if any(s % 8 != 0 for s in t.stride()[:-1]):
            err(ValueError, f"{name} rows must be 16-byte aligned (strides multiple of 8 elements), got {t.stride()}")
    if not cache_seqlens.is_contiguous():
        err(ValueError, f"cache_seqlens must be contiguous, got stride {cache_seqlens.stride()}")
    if cache_leftpad is not None and not cache_leftpad.is_contiguous():
        err(ValueError, f"cache_leftpad must be contiguous, got stride {cache_leftpad.stride()}")
    if block_table is not None and block_table.stride(-1) != 1:
        err(ValueError, f"block_table must be contiguous along pages, got stride {block_table.stride()}")
    for name, t in (("out", out), ("workspace", workspace)):
        if t is not None and not t.is_contiguous():
            err(ValueError, f"{name} must be contiguous, got shape {tuple(t.shape)} and stride {t.stride()}")
    # overlap: what the kernels write (out; split, workspace) over what they read, or over each other
    ins = (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", cache_seqlens),
           ("block_table", block_table), ("learnable_sink", learnable_sink), ("cache_leftpad", cache_leftpad))
    if out is not None:
        check_written("decode_attn", "out", out, ins + (("workspace", workspace),))
    if workspace is not None:
        check_written("decode_attn", "workspace", workspace, ins)
    # pointers
    if check_ptrs:
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("out", out), ("workspace", workspace)):
            if t is not None and t.data_ptr() % 16 != 0:
                err(ValueError, f"{name} must be 16-byte aligned (data pointer offset {t.data_ptr() % 16})")
    if devices:
        check_devices(q, k_cache, v_cache, cache_seqlens, block_table, out, workspace, learnable_sink, cache_leftpad)


def check_devices(q, k_cache, v_cache, cache_seqlens, block_table, out, workspace, learnable_sink=None,
                  cache_leftpad=None) -> None:
    """The last check of :func:`validate`: one device, CUDA or CPU (the torch reference)."""
    dev = q.device
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"decode_attn: q is on {dev}; decode_attn runs on CUDA tensors (CPU tensors: the torch "
                         f"reference)")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", cache_seqlens),
                    ("block_table", block_table), ("out", out), ("workspace", workspace),
                    ("learnable_sink", learnable_sink), ("cache_leftpad", cache_leftpad)):
        if t is not None and t.device != dev:
            raise ValueError(f"decode_attn: {name} is on {t.device}, q on {dev}: all tensors must be on one device")


def capacity(k_cache, block_table) -> int:
    return k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]


def kv_bytes(batch: int, k_cache, block_table) -> int:
    """K + V bytes of the cache's static capacity (what :func:`load_for` decides on)."""
    _, _, Hkv, D = k_cache.shape
    return 2 * batch * capacity(k_cache, block_table) * Hkv * D * k_cache.element_size()


def check_device_values(k_cache, cache_seqlens, block_table, cache_leftpad=None, window=None, seqlen_q=1):
    """Checked mode: validate lengths, left paddings (in [0, length]) and the page ids of the pages the
    kernel reads (synchronizes with the device).  With a left padding or a window's left side
    (``window``, normalized: :func:`check_window`) the pages wholly below the first visible key are
    never read (sliding-window servers may have freed them), and not checked."""
    cap = capacity(k_cache, block_table)
    lens = cache_seqlens.detach().to("cpu", torch.int64)
    if lens.numel() and int(lens.min()) < 0:
        raise ValueError(f"decode_attn: negative cache_seqlens: {lens.tolist()}")
    if lens.numel() and int(lens.max()) > cap:
        what = "Lmax" if block_table is None else "block_table width x page_size"
        raise ValueError(
            f"decode_attn: cache_seqlens (max {int(lens.max())}) exceed the cache capacity {cap} ({what})"
        )
    first = [0] * lens.numel()  # the first key the kernel reads, per sequence
    if cache_leftpad is not None:
        pads = cache_leftpad.detach().to("cpu", torch.int64)
        bad = ((pads < 0) | (pads > lens)).nonzero()
        if bad.numel():
            b = int(bad[0])
            raise ValueError(f"decode_attn: cache_leftpad[{b}] = {int(pads[b])} is outside [0, cache_seqlens[{b}]] "
                             f"= [0, {int(lens[b])}]")
        first = pads.tolist()
    if window is not None and window[0] >= 0:
        first = [max(f, L - seqlen_q - window[0], 0) for f, L in zip(first, lens.tolist())]
    if block_table is not None:
        ps = k_cache.shape[1]
        bt = block_table.detach().to("cpu", torch.int64)
        for b, L in enumerate(lens.tolist()):
            p0 = min(first[b], L) // ps
            used = bt[b, p0: -(-L // ps)] if first[b] < L else bt[b, :0]
            if used.numel() and (int(used.min()) < 0 or int(used.max()) >= k_cache.shape[0]):
                which = f"among its first {used.numel()} pages" if p0 == 0 else \
                    f"among the {used.numel()} pages it reads (from page {p0})"
                raise ValueError(
                    f"decode_attn: block_table[{b}] has page ids outside [0, {k_cache.shape[0]}) "
                    f"{which}: {used.tolist()}"
                )


_PLANS = BoundedCache()  # (a growing cache's every length is a key)


def plan(q, k_cache, block_table, num_splits, causal, softcap=False, sink=False, window=None, leftpad=False):
    """(DecodeConfig, num_splits) from static facts only; memoized (host overhead per call).  ``causal``
    and ``window`` normalized (:func:`check_window`: a window config has ``causal`` False)."""
    key = (tuple(q.shape), q.dtype, k_cache.shape[2], k_cache.shape[1], block_table is not None,
           capacity(k_cache, block_table), num_splits, causal, softcap, sink, window, leftpad)
    hit = _PLANS.get(key)
    if hit is None:
        hit = _PLANS[key] = plan_uncached(q, k_cache, block_table, num_splits, causal, softcap, sink, window,
                                          leftpad)
    return hit


def plan_uncached(q, k_cache, block_table, num_splits, causal, softcap=False, sink=False, window=None,
                  leftpad=False):
    B, Sq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    rows = (Hq // Hkv) * Sq
    paged = block_table is not None
    page_size = k_cache.shape[1] if paged else 0
    nbytes = kv_bytes(B, k_cache, block_table)
    win = window is not None
    cfg1 = make_config(q.dtype, D, rows, paged, page_size, causal and not win, split=False, kv_bytes=nbytes,
                       softcap=softcap, sink=sink, window=win, leftpad=leftpad)
    if num_splits is None:
        row_blocks = -(-rows // cfg1.m_tile)
        # One CTA per SM per wave although two fit: a bandwidth-bound second CTA adds no bandwidth,
        # and fewer splits mean less to merge.  Except pages no larger than a KV tile: each tile's
        # gather waits on block-table reads, which a second resident CTA per SM hides.
        small_pages = paged and page_size <= cfg1.n_tile
        # (a window's left side bounds the keys any sequence can see: splits over that, not the capacity)
        num_splits = choose_num_splits(
            B, Hkv, row_blocks, window_capacity(capacity(k_cache, block_table), Sq, window, cfg1.n_tile),
            cfg1.n_tile, current_arch().sm_count, 2 if small_pages else 1,
        )
    num_splits = check_num_splits(num_splits)
    cfg = cfg1 if num_splits == 1 else make_config(q.dtype, D, rows, paged, page_size, causal and not win,
                                                   split=True, kv_bytes=nbytes, softcap=softcap, sink=sink,
                                                   window=win, leftpad=leftpad)
    return cfg, num_splits


def explain(batch: int, heads_q: int, heads_kv: int, capacity: int, *, head_dim: int = 128, sq: int = 1,
            page_size: int | None = None, dtype=torch.bfloat16, num_splits: int | None = None,
            causal: bool = True, softcap: bool = False, sink: bool = False, window_size=(-1, -1),
            leftpad: bool = False) -> dict:
    """What ``decode_attn`` would run, on any machine (no GPU, nothing compiled): the real planning
    code (:func:`plan_uncached`) on meta tensors.  ``capacity`` = Lmax of a contiguous cache, or the
    block-table width x ``page_size`` of a paged one (rounded up to whole pages); ``window_size`` and
    ``leftpad`` (a ``cache_leftpad`` is given) as ``decode_attn``'s."""
    for name, v in (("batch", batch), ("heads_q", heads_q), ("heads_kv", heads_kv), ("capacity", capacity),
                    ("head_dim", head_dim), ("sq", sq)):
        if v < 1:
            raise ValueError(f"explain: {name} must be >= 1, got {v}")
    if head_dim not in (64, 128, 256):
        raise ValueError(f"explain: head_dim must be 64, 128 or 256, got {head_dim}")
    if sq > 16:
        raise ValueError(f"explain: sq must be in 1..16, got {sq}")
    q = torch.empty(batch, sq, heads_q, head_dim, dtype=dtype, device="meta")
    bt = None
    if page_size:
        pages = -(-capacity // page_size)
        k = torch.empty(batch * pages, page_size, heads_kv, head_dim, dtype=dtype, device="meta")
        bt = torch.empty(batch, pages, dtype=torch.int32, device="meta")
    else:
        k = torch.empty(batch, capacity, heads_kv, head_dim, dtype=dtype, device="meta")
    if heads_q % heads_kv:
        raise ValueError(f"explain: heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv})")
    causal, window = check_window(window_size, causal)
    cfg, splits = plan_uncached(q, k, bt, num_splits, causal, bool(softcap), bool(sink), window, bool(leftpad))
    row_blocks = -(-((heads_q // heads_kv) * sq) // cfg.m_tile)
    ctas = batch * heads_kv * row_blocks * splits
    return {"config": cfg, "num_splits": splits, "load": "tma+evict_first" if cfg.load == "tma" else cfg.load,
            "kv_bytes": kv_bytes(batch, k, bt), "ctas": ctas,
            "ctas_per_sm": round(ctas / current_arch().sm_count, 2), "merge": "pdl" if splits > 1 else "none"}


def _check_workspace(workspace, P, B, Sq, Hq, D):
    need = workspace_numel(P, B, Sq, Hq, D)
    if workspace.numel() < need:
        raise ValueError(f"decode_attn: workspace has {workspace.numel()} float32 elements, needs {need} "
                         f"(num_splits={P}); see decode_attn_workspace()")


def decode_attn_workspace(q: torch.Tensor, num_splits: int) -> torch.Tensor:
    """A workspace for ``decode_attn(..., num_splits=num_splits, workspace=ws)`` (CUDA-graph friendly):
    the partial outputs and LSEs of every split.  Reuse it only for calls of the same or smaller sizes."""
    B, Sq, Hq, D = q.shape
    return torch.empty(workspace_numel(num_splits, B, Sq, Hq, D), dtype=torch.float32, device=q.device)
