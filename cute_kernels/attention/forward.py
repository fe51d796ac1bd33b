"""``flash_attn``: the FlashAttention forward (prefill attention) on Hopper, host side.

``O = softmax(Q K^T * scale) V`` for q (B, Sq, Hq, D) against k/v (B, Sk, Hkv, D), never materializing
the scores; the kernel (:mod:`.forward_kernel`) also writes the natural-log LSE of every row, which
:func:`cute_kernels.merge_states` combines exactly across key splits.  Packed (variable-length)
sequences: q (total_q, Hq, D) and k/v (total_k, Hkv, D) with ``cu_seqlens_q`` / ``cu_seqlens_k`` on the
device and host ints ``max_seqlen_q`` / ``max_seqlen_k`` that size the grid.  Sliding windows
``window_size=(left, right)``, dense or packed.  Paged K/V: page pools (num_pages, page_size, Hkv, D)
with ``block_table`` and ``seqused_k`` on the device (the ``decode_attn`` conventions), q dense or
packed.  Device values (lengths, pages) never reach the host unless checked mode is on, so CUDA
graphs replay for any lengths up to the captured maxima.

Here: validation (:mod:`.forward_validate`: every error names its argument, shape errors before
device errors, nothing launched); empty problems without a launch; the plan (the compile key is the
dtype, head dim, causal, packed, windowed and the page size: never lengths, batch or heads); the
launches; ``torch.library`` custom ops with fake implementations for ``torch.compile`` (eager calls
skip the dispatcher); and the host fast paths (:mod:`.forward_host`): a launcher per call metadata,
made after a call with that metadata passed the checks and launched.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..common import jit
from ..common.dtypes import HALF_TORCH, TORCH_TO_NAME, name_of
from ..common.scheduler import tile_counter  # (FW.tile_counter: the benches pass it to bare launches)
from ..common.softmax import LOG2_E
from ..testing import LAUNCHES
from . import forward_host as fh
from . import forward_kernel
from .decode_plan import check_flag, checked_default
from .forward_validate import (HEAD_DIMS, PAGE_SIZE_RULE, _check_ptrs, _err, _scale, check_cu_seqlens,  # noqa: F401
                               check_paged_values, check_unsupported, check_window, page_size_ok, validate,
                               validate_paged, validate_varlen)

__all__ = ["flash_attn", "validate", "validate_varlen", "check_window", "check_cu_seqlens", "plan", "get_forward_kernel", "warmup_flash_attn", "precompile", "HEAD_DIMS"]



# ------------------------------------------------------------------------------------------------
# plan and compiled kernels
# ------------------------------------------------------------------------------------------------
_PLANS: dict = {}


def plan(dtype: torch.dtype, head_dim: int, causal: bool, varlen: bool = False, window: bool = False,
         page_size: int = 0):
    """The kernel configuration (``FlashFwdConfig``) for these static facts (and the SM count of the
    device, the persistent grid's size); memoized.  Lengths, batch, heads, max_seqlen and the window's
    sides are not part of it: they are run-time values of the compiled kernel (a window config has
    ``causal`` False: causal is its right side).  Paged K/V: the page size is (the TMA box height)."""
    key = (dtype, head_dim, causal, varlen, window, page_size)
    cfg = _PLANS.get(key)
    if cfg is None:
        cfg = _PLANS[key] = forward_kernel.fwd_config(name_of(dtype), head_dim, causal and not window, _num_sms(),
                                                      varlen=varlen, window=window, page_size=page_size)
    return cfg


def _num_sms() -> int:
    """SMs of the current CUDA device (the persistent grid), 132 (H100 / H200 SXM) without one."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return 132


def get_forward_kernel(cfg):
    """The compiled TVM-FFI function for ``cfg`` (memory / disk cache, or compiled now; None under
    :class:`jit.dry_run`)."""
    return jit.get_compiled("flash_attn_fwd", cfg, forward_kernel.forward_builder(cfg))


def warmup_flash_attn(spec) -> None:
    """Compile (or load) the kernel a call would run, without a GPU: ``spec`` is a ``FlashFwdConfig``
    or ``dict(dtype=torch.bfloat16 | "bfloat16", head_dim=64 | 96 | 128 | 256, causal=bool, varlen=bool,
    window=bool, page_size=int)`` (``window``: a sliding window of any sides; it takes causal in;
    ``page_size``: paged K/V, 0 for none)."""
    if isinstance(spec, dict):
        extra = set(spec) - {"dtype", "head_dim", "causal", "varlen", "window", "page_size"}
        if extra:
            raise ValueError(f"warmup flash_attn: unknown keys {sorted(extra)} "
                             "(dtype, head_dim, causal, varlen, window, page_size)")
        dtype = spec.get("dtype", torch.bfloat16)
        if isinstance(dtype, str):
            dtype = next((t for t, n in TORCH_TO_NAME.items() if n == dtype), dtype)
        if dtype not in HALF_TORCH:
            raise ValueError(f"warmup flash_attn: dtype must be float16 or bfloat16, got {dtype}")
        head_dim = int(spec.get("head_dim", 128))
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"warmup flash_attn: head_dim must be one of {HEAD_DIMS}, got {head_dim}")
        page_size = int(spec.get("page_size", 0))
        if page_size and not page_size_ok(page_size):
            raise ValueError(f"warmup flash_attn: page_size must be 0 or {PAGE_SIZE_RULE}, got {page_size}")
        spec = plan(dtype, head_dim, bool(spec.get("causal", False)), bool(spec.get("varlen", False)),
                    bool(spec.get("window", False)), page_size)
    get_forward_kernel(spec)


jit.register_warmup("flash_attn", warmup_flash_attn)


def precompile(configs, processes: Optional[int] = None) -> list[str]:
    """Compile forward configs into the disk cache in parallel processes (later calls load them in
    ~1 ms); returns error strings."""
    return jit.precompile_configs(get_forward_kernel, configs, processes)


def _launch(q, k, v, out, lse, causal: bool, scale: float, window_left: int = -1, window_right: int = -1) -> None:
    """Write out (B, Sq, Hq, D) and lse (B, Hq, Sq) float32 for validated CUDA tensors; a window
    ``(window_left, window_right)`` other than (-1, -1) as :func:`check_window` returns it."""
    B, Sq, Hq, D = q.shape
    if B == 0 or Sq == 0 or Hq == 0:
        return
    if k.shape[1] == 0:  # no key at all: every row is empty
        out.zero_()
        lse.fill_(float("-inf"))
        return
    window = window_left != -1 or window_right != -1
    cfg = plan(q.dtype, D, causal, window=window)
    fn = get_forward_kernel(cfg)
    if fn is None:  # jit.dry_run: planned, nothing compiled or launched
        return
    LAUNCHES["flash_attn"] += 1
    if window:
        fn(q, k, v, out, lse, tile_counter(q.device, cfg.tile.dynamic), scale * LOG2_E,
           *fh.window_args(window_left, window_right))
    else:
        fn(q, k, v, out, lse, tile_counter(q.device, cfg.tile.dynamic), scale * LOG2_E)


def _launch_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, out, lse,
                   causal: bool, scale: float, window_left: int = -1, window_right: int = -1) -> None:
    """Write the rows of every packed sequence of out (total_q, Hq, D) and lse (Hq, total_q) for
    validated CUDA tensors (rows outside every sequence are not written).  Nothing here reads the
    cu_seqlens values: a CUDA graph captured with given max_seqlen replays for any shorter lengths."""
    total_q, Hq, D = q.shape
    if cu_seqlens_q.shape[0] < 2 or total_q == 0 or Hq == 0 or max_seqlen_q == 0:
        return  # no query row in any sequence
    if k.shape[0] == 0:  # no key rows at all: a one-row stand-in (every length clamps to 0: O = 0, LSE = -inf)
        k = v = k.new_zeros((1,) + tuple(k.shape[1:]))
        max_seqlen_k = 0
    window = window_left != -1 or window_right != -1
    cfg = plan(q.dtype, D, causal, varlen=True, window=window)
    fn = get_forward_kernel(cfg)
    if fn is None:
        return
    LAUNCHES["flash_attn"] += 1
    wl, wr = fh.window_args(window_left, window_right)
    fn(q, k, v, out, lse, tile_counter(q.device, cfg.tile.dynamic), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
       scale * LOG2_E, wl, wr)


def _launch_paged(q, k, v, block_table, seqused_k, cu_seqlens_q, max_seqlen_q: int, out, lse, causal: bool,
                  scale: float, window_left: int = -1, window_right: int = -1) -> None:
    """Paged K/V (:mod:`.forward_paged`) for validated CUDA tensors: out / lse as the dense call's
    (q dense) or the packed one's (``cu_seqlens_q`` given).  Nothing here reads block_table,
    seqused_k or cu_seqlens_q: graphs replay for any lengths and pages."""
    varlen = cu_seqlens_q is not None
    if varlen:
        total_q, Hq, D = q.shape
        if cu_seqlens_q.shape[0] < 2 or total_q == 0 or Hq == 0 or max_seqlen_q == 0:
            return
    else:
        B, Sq, Hq, D = q.shape
        if B == 0 or Sq == 0 or Hq == 0:
            return
    window = window_left != -1 or window_right != -1
    cfg = plan(q.dtype, D, causal, varlen=varlen, window=window, page_size=k.shape[1])
    fn = get_forward_kernel(cfg)
    if fn is None:
        return
    LAUNCHES["flash_attn"] += 1
    wl, wr = fh.window_args(window_left, window_right)
    counter = tile_counter(q.device, cfg.tile.dynamic)
    if varlen:
        fn(q, k, v, out, lse, counter, cu_seqlens_q, max_seqlen_q, block_table, seqused_k, scale * LOG2_E, wl, wr)
    else:
        fn(q, k, v, out, lse, counter, block_table, seqused_k, scale * LOG2_E, wl, wr)




# ------------------------------------------------------------------------------------------------
# torch.library ops
# ------------------------------------------------------------------------------------------------
@torch.library.custom_op("cute_kernels::flash_attn_", mutates_args=("out", "lse"), device_types=None)
def _flash_attn_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                       causal: bool, softmax_scale: float, window_left: int = -1, window_right: int = -1) -> None:
    _check_ptrs(q, k, v, out)  # traced calls validated everything else on fake tensors
    _launch(q, k, v, out, lse, causal, softmax_scale, window_left, window_right)


@_flash_attn_out_op.register_fake
def _(q, k, v, out, lse, causal, softmax_scale, window_left=-1, window_right=-1):
    return None


def _new_lse(q):
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def _new_outputs(q):
    """A contiguous (B, Sq, Hq, D) output (whatever q's strides) and the (B, Hq, Sq) float32 LSE."""
    return q.new_empty(q.shape), _new_lse(q)


@torch.library.custom_op("cute_kernels::flash_attn", mutates_args=())
def _flash_attn_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   softmax_scale: float, window_left: int = -1, window_right: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = _new_outputs(q)
    _check_ptrs(q, k, v)
    _launch(q, k, v, out, lse, causal, softmax_scale, window_left, window_right)
    return out, lse


@_flash_attn_op.register_fake
def _(q, k, v, causal, softmax_scale, window_left=-1, window_right=-1):
    return _new_outputs(q)


def _new_varlen_lse(q):
    total_q, Hq, _ = q.shape
    return q.new_empty((Hq, total_q), dtype=torch.float32)


@torch.library.custom_op("cute_kernels::flash_attn_varlen_", mutates_args=("out", "lse"), device_types=None)
def _flash_attn_varlen_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                              cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, out: torch.Tensor,
                              lse: torch.Tensor, causal: bool, softmax_scale: float, window_left: int = -1,
                              window_right: int = -1) -> None:
    _check_ptrs(q, k, v, out)
    _launch_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse, causal,
                   softmax_scale, window_left, window_right)


@_flash_attn_varlen_out_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse, causal, softmax_scale,
      window_left=-1, window_right=-1):
    return None


@torch.library.custom_op("cute_kernels::flash_attn_varlen", mutates_args=())
def _flash_attn_varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                          cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                          softmax_scale: float, window_left: int = -1,
                          window_right: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = q.new_empty(q.shape), _new_varlen_lse(q)
    _check_ptrs(q, k, v)
    _launch_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse, causal,
                   softmax_scale, window_left, window_right)
    return out, lse


@_flash_attn_varlen_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_left=-1,
      window_right=-1):
    return q.new_empty(q.shape), _new_varlen_lse(q)


@torch.library.custom_op("cute_kernels::flash_attn_paged_", mutates_args=("out", "lse"), device_types=None)
def _flash_attn_paged_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_table: torch.Tensor,
                             seqused_k: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor], max_seqlen_q: int,
                             out: torch.Tensor, lse: torch.Tensor, causal: bool, softmax_scale: float,
                             window_left: int = -1, window_right: int = -1) -> None:
    _check_ptrs(q, k, v, out)
    _launch_paged(q, k, v, block_table, seqused_k, cu_seqlens_q, max_seqlen_q, out, lse, causal, softmax_scale,
                  window_left, window_right)


@_flash_attn_paged_out_op.register_fake
def _(q, k, v, block_table, seqused_k, cu_seqlens_q, max_seqlen_q, out, lse, causal, softmax_scale,
      window_left=-1, window_right=-1):
    return None


# ------------------------------------------------------------------------------------------------
# the host fast path (:mod:`.forward_host`): launchers made after a call launched the kernel
# ------------------------------------------------------------------------------------------------
_is_compiling = torch.compiler.is_compiling
_FAST = fh.FAST_TYPES
#: call metadata (the ``forward_host`` keys) -> launcher (:func:`.forward_host.make_launcher`)
_launchers: dict = {}


def _prepare(key, q, k, causal: bool, window_left: int, window_right: int) -> None:
    """Cache a launcher for ``key`` after a dense call with that metadata launched the kernel (calls
    :func:`_launch` handles without one -- no query row, no key -- keep the checked path)."""
    B, Sq, Hq, D = q.shape
    if B == 0 or Sq == 0 or Hq == 0 or k.shape[1] == 0:
        return
    window = (window_left, window_right)
    cfg = plan(q.dtype, D, causal, window=window != (-1, -1))
    fn = get_forward_kernel(cfg)
    if fn is not None:
        _launchers[key] = fh.make_launcher(fn, q, (B, Hq, Sq), cfg.tile.dynamic, "dense", window)


def _prepare_varlen(key, q, k, cu_seqlens_q, max_seqlen_q: int, max_seqlen_k: int, causal: bool, window_left: int,
                    window_right: int) -> None:
    """:func:`_prepare` of a packed call (``causal`` and the window as :func:`check_window` returned them)."""
    total_q, Hq, D = q.shape
    if cu_seqlens_q.shape[0] < 2 or total_q == 0 or Hq == 0 or max_seqlen_q == 0 or k.shape[0] == 0:
        return
    window = (window_left, window_right)
    cfg = plan(q.dtype, D, causal, varlen=True, window=window != (-1, -1))
    fn = get_forward_kernel(cfg)
    if fn is not None:
        _launchers[key] = fh.make_launcher(fn, q, (Hq, total_q), cfg.tile.dynamic, "packed", window,
                                           (max_seqlen_q, max_seqlen_k))


def _prepare_paged(key, q, k, cu_seqlens_q, max_seqlen_q: int, causal: bool, window_left: int,
                   window_right: int) -> None:
    """:func:`_prepare` of a paged call, q dense or packed."""
    varlen = cu_seqlens_q is not None
    if varlen:
        total_q, Hq, D = q.shape
        if cu_seqlens_q.shape[0] < 2 or total_q == 0 or Hq == 0 or max_seqlen_q == 0:
            return
        lshape = (Hq, total_q)
    else:
        B, Sq, Hq, D = q.shape
        if B == 0 or Sq == 0 or Hq == 0:
            return
        lshape = (B, Hq, Sq)
    window = (window_left, window_right)
    cfg = plan(q.dtype, D, causal, varlen=varlen, window=window != (-1, -1), page_size=k.shape[1])
    fn = get_forward_kernel(cfg)
    if fn is not None:
        _launchers[key] = fh.make_launcher(fn, q, lshape, cfg.tile.dynamic, "paged_packed" if varlen else "paged",
                                           window, (max_seqlen_q,) if varlen else ())


# ------------------------------------------------------------------------------------------------
# the public function
# ------------------------------------------------------------------------------------------------
def flash_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    return_lse: bool = False,
    out: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    window_size: tuple[int, int] = (-1, -1),
    checked: Optional[bool] = None,
    block_table: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
):
    """Attention forward ``softmax(q k^T * softmax_scale) v`` (FlashAttention: scores never stored).

    Args:
        q: (B, Sq, Hq, D) float16/bfloat16 CUDA tensor, D in {64, 96, 128, 256}.
        k, v: (B, Sk, Hkv, D), q's dtype and device; Hq a multiple of Hkv (GQA/MQA: query head h
            reads k/v head h // (Hq / Hkv)).
            Any strides with stride(-1) == 1 and every other stride a multiple of 8 elements
            (16 bytes), data pointers 16-byte aligned: (B, H, S, D) tensors viewed as (B, S, H, D)
            with ``.transpose(1, 2)`` run as they are, without a copy.
        causal: bottom-right aligned mask when Sq != Sk (FlashAttention >= 2.1): query i sees keys
            j <= i + Sk - Sq.  Rows that see no key give O = 0 and LSE = -inf.
        softmax_scale: default 1 / sqrt(D).
        return_lse: also return the (B, Hq, Sq) float32 natural-log LSE of each row
            (``merge_states(o_parts, lse_parts.transpose(-1, -2))`` merges key splits).
        out: optional (B, Sq, Hq, D) output buffer of q's dtype and device, same stride rules as q.
        cu_seqlens_q, cu_seqlens_k: packed (variable-length) sequences: q / out (total_q, Hq, D),
            k / v (total_k, Hkv, D), sequence b its rows ``cu_seqlens[b] .. cu_seqlens[b + 1] - 1``;
            (B + 1,) int32 tensors on q's device, both or neither.  Zero-length sequences are fine;
            rows outside every sequence are not written (garbage in a returned ``out``).  The LSE is
            (Hq, total_q).  Causal and the window apply per sequence (bottom-right aligned).
            K/V rows outside the sequences must be finite (a tile may read past a sequence's end;
            those keys are masked, but a NaN value would still reach O through a zero weight).
        max_seqlen_q, max_seqlen_k: with cu_seqlens, host ints >= the longest query / key sequence:
            they size the grid (never the compile key).  A longer sequence is cut to max_seqlen (no
            out-of-bounds access); ``checked`` raises instead.
        window_size: ``(left, right)`` sliding window, -1 unbounded: query i (at position
            ``p = i + Sk - Sq``) sees keys ``p - left <= j <= p + right``; KV tiles outside every
            row's window are skipped.  ``causal`` is ``(-1, 0)``: with ``causal=True`` the right side
            is 0 (a right side > 0 raises).
        checked: with cu_seqlens, read them on the host and raise ValueError for a negative start, a
            decreasing entry, a last entry past total, or a sequence longer than max_seqlen; with
            block_table, a seqused_k outside [0, max_pages * page_size] or a used page id outside
            [0, num_pages) (this synchronizes; not CUDA-graph capturable).  Default: env
            ``CUTE_KERNELS_CHECKED``.
        block_table, seqused_k: paged K/V (the ``decode_attn`` conventions): k / v are page pools
            (num_pages, page_size, Hkv, D), page_size a multiple of 16 from 16 to 256; block_table
            (B, max_pages) int32 lists each sequence's pages (key j of sequence b is row
            ``j % page_size`` of page ``block_table[b, j // page_size]``); seqused_k (B,) int32 the
            number of keys of each sequence (the cached tokens, the new ones included).  q dense
            (B, Sq, Hq, D) or packed with cu_seqlens_q / max_seqlen_q (cu_seqlens_k / max_seqlen_k
            not allowed).  Causal and windows are bottom-right aligned per sequence (query i of Lq
            sees keys j <= i + seqused_k - Lq), so chunked prefill attends to the cache and itself.
            Out-of-range lengths and page ids are clamped on the device (wrong numbers, no
            out-of-bounds access; ``checked`` raises).  Rows of a sequence's last page past its
            length are read and masked: they must be finite, as the rows around packed sequences.
        dropout_p, softcap, alibi_slopes: FlashAttention's; only 0 / 0 / None (a ValueError otherwise).

    Returns ``out`` or ``(out, lse)``.  Bad input raises ``TypeError``/``ValueError`` naming the
    argument before any launch; nothing synchronizes with the device (unless ``checked``); results are
    bitwise repeatable.  Unchecked calls never read cu_seqlens on the host: a CUDA graph captured
    with given max_seqlen replays correctly for any lengths up to them.
    """
    if alibi_slopes is not None or type(dropout_p) is not float or type(softcap) is not float or dropout_p or softcap:
        check_unsupported(dropout_p, softcap, alibi_slopes)
    if block_table is not None or seqused_k is not None:
        return _flash_attn_paged(q, k, v, causal, softmax_scale, return_lse, out, cu_seqlens_q, cu_seqlens_k,
                                 max_seqlen_q, max_seqlen_k, window_size, checked, block_table, seqused_k)
    if (cu_seqlens_q is not None or cu_seqlens_k is not None or max_seqlen_q is not None
            or max_seqlen_k is not None):
        return _flash_attn_varlen(q, k, v, causal, softmax_scale, return_lse, out, cu_seqlens_q, cu_seqlens_k,
                                  max_seqlen_q, max_seqlen_k, window_size, checked)
    key = None
    if not _is_compiling():  # the fast path (forward_host); anything unusual takes the checks below
        try:
            if type(q) in _FAST and type(k) in _FAST and type(v) in _FAST:
                key = fh.dense_key(q, k, v, out, causal, window_size)
                hit = _launchers.get(key)
            else:
                hit = None
        except (AttributeError, TypeError):  # a non-tensor, an unhashable argument: the checks say what
            key = hit = None
        scale = None if hit is None else fh.fast_scale(hit, softmax_scale)
        if scale is not None:
            try:
                o, lse = hit(q, k, v, out, scale, return_lse)
            except Exception:  # the compiled function refused an argument: the checks below name it
                pass
            else:
                return (o, lse) if return_lse else o
    tracing = torch.compiler.is_compiling() or isinstance(q, FakeTensor)
    causal, window = check_window(window_size, causal)
    check_flag(checked, "checked", "flash_attn", allow_none=True)
    scale = validate(q, k, v, out, softmax_scale, check_ptrs=not tracing)
    wl, wr = window if window is not None else (-1, -1)
    if tracing:  # torch.compile / fake tensors: the custom ops (their fake implementations trace)
        if out is None:
            out, lse = _flash_attn_op(q, k, v, causal, scale, wl, wr)
        else:
            lse = _new_lse(q)
            _flash_attn_out_op(q, k, v, out, lse, causal, scale, wl, wr)
        return (out, lse) if return_lse else out
    if out is None:
        out, lse = _new_outputs(q)
    else:
        lse = _new_lse(q)
    _launch(q, k, v, out, lse, causal, scale, wl, wr)  # eager: no dispatcher
    if key is not None:
        _prepare(key, q, k, causal, wl, wr)
    return (out, lse) if return_lse else out


def _flash_attn_varlen(q, k, v, causal, softmax_scale, return_lse, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                       max_seqlen_k, window_size, checked):
    """:func:`flash_attn` with cu_seqlens: the fast path (:func:`.forward_host.packed_key`; unchecked calls only),
    else the checks below, the launch, and a launcher for the call's metadata."""
    key = None
    if (checked is None or checked is False) and not _is_compiling():
        key, hit = fh.lookup(_launchers, fh.packed_key, (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                             max_seqlen_k, out, causal, window_size), (q, k, v, cu_seqlens_q, cu_seqlens_k))
        res = fh.run_hit(hit, checked, softmax_scale, return_lse, q, k, v, out, cu_seqlens_q, cu_seqlens_k)
        if res is not None:
            return res
    if cu_seqlens_q is None or cu_seqlens_k is None:
        given, missing = ("cu_seqlens_q", "cu_seqlens_k") if cu_seqlens_k is None else ("cu_seqlens_k", "cu_seqlens_q")
        if cu_seqlens_q is None and cu_seqlens_k is None:
            given = "max_seqlen_q" if max_seqlen_q is not None else "max_seqlen_k"
            _err(ValueError, f"{given} is given without cu_seqlens_q / cu_seqlens_k (packed sequences need all four)")
        _err(ValueError, f"{given} is given without {missing} (packed sequences need both)")
    tracing = torch.compiler.is_compiling() or isinstance(q, FakeTensor)
    causal, window = check_window(window_size, causal)
    scale, mq, mk = validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out,
                                    softmax_scale, check_ptrs=not tracing)
    wl, wr = window if window is not None else (-1, -1)
    if not tracing and checked_default(checked, "flash_attn"):
        check_cu_seqlens(cu_seqlens_q, q.shape[0], mq, "cu_seqlens_q")
        check_cu_seqlens(cu_seqlens_k, k.shape[0], mk, "cu_seqlens_k")
    if tracing:
        if out is None:
            out, lse = _flash_attn_varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, mq, mk, causal, scale, wl, wr)
        else:
            lse = _new_varlen_lse(q)
            _flash_attn_varlen_out_op(q, k, v, cu_seqlens_q, cu_seqlens_k, mq, mk, out, lse, causal, scale, wl, wr)
        return (out, lse) if return_lse else out
    if out is None:
        out = q.new_empty(q.shape)
    lse = _new_varlen_lse(q)
    _launch_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, mq, mk, out, lse, causal, scale, wl, wr)
    if key is not None:
        _prepare_varlen(key, q, k, cu_seqlens_q, mq, mk, causal, wl, wr)
    return (out, lse) if return_lse else out


def _flash_attn_paged(q, k, v, causal, softmax_scale, return_lse, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                      max_seqlen_k, window_size, checked, block_table, seqused_k):
    """:func:`flash_attn` with block_table / seqused_k (paged K/V): the fast path
    (:func:`.forward_host.paged_key`; unchecked calls only), else the checks below, the launch, and a
    launcher for the call's metadata."""
    key = None
    if (checked is None or checked is False) and not _is_compiling() and cu_seqlens_k is None and max_seqlen_k is None:
        key, hit = fh.lookup(_launchers, fh.paged_key, (q, k, v, block_table, seqused_k, cu_seqlens_q, max_seqlen_q,
                             out, causal, window_size), (q, k, v, block_table, seqused_k))
        tensors = (block_table, seqused_k) if cu_seqlens_q is None else (cu_seqlens_q, block_table, seqused_k)
        res = fh.run_hit(hit, checked, softmax_scale, return_lse, q, k, v, out, *tensors)
        if res is not None:
            return res
    if block_table is None:
        _err(ValueError, "seqused_k is given without block_table (paged K/V needs both)")
    if seqused_k is None:
        _err(ValueError, "block_table is given without seqused_k (paged K/V needs both: the keys per sequence)")
    if cu_seqlens_k is not None:
        _err(ValueError, "cu_seqlens_k cannot be used with block_table (paged K/V lengths are seqused_k)")
    if max_seqlen_k is not None:
        _err(ValueError, "max_seqlen_k cannot be used with block_table (the capacity is block_table width x page_size)")
    if cu_seqlens_q is None and max_seqlen_q is not None:
        _err(ValueError, "max_seqlen_q is given without cu_seqlens_q (packed queries need both)")
    tracing = torch.compiler.is_compiling() or isinstance(q, FakeTensor)
    causal, window = check_window(window_size, causal)
    scale, mq = validate_paged(q, k, v, block_table, seqused_k, cu_seqlens_q, max_seqlen_q, out, softmax_scale,
                               check_ptrs=not tracing)
    wl, wr = window if window is not None else (-1, -1)
    if not tracing and checked_default(checked, "flash_attn"):
        if cu_seqlens_q is not None:
            check_cu_seqlens(cu_seqlens_q, q.shape[0], mq, "cu_seqlens_q")
        check_paged_values(k, block_table, seqused_k)
    if out is None:
        out = q.new_empty(q.shape)
    lse = _new_varlen_lse(q) if cu_seqlens_q is not None else _new_lse(q)
    if tracing:
        _flash_attn_paged_out_op(q, k, v, block_table, seqused_k, cu_seqlens_q, mq, out, lse, causal, scale, wl, wr)
    else:
        _launch_paged(q, k, v, block_table, seqused_k, cu_seqlens_q, mq, out, lse, causal, scale, wl, wr)
        if key is not None:
            _prepare_paged(key, q, k, cu_seqlens_q, mq, causal, wl, wr)
    return (out, lse) if return_lse else out

