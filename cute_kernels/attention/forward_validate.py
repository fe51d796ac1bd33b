"""Host-side validation of :func:`cute_kernels.flash_attn`'s arguments (:mod:`.forward`): everything the
host can check without the device's data, in a fixed order (types, ranks, shapes, dtypes, strides,
pointer alignment, devices last), each error naming its argument; the window normalization; and the
checked mode's reading of cu_seqlens (the only place their values reach the host)."""

from __future__ import annotations

import math
import numbers
import operator
from typing import Optional

import torch

from ..common.args import tensor_fault
from ..common.dtypes import HALF_TORCH
from ..common.overlap import check_written

#: Head dims the kernel runs (``layouts.attention.FWD_HEAD_DIMS``).
HEAD_DIMS = (64, 96, 128, 256)
_ALIGN_ELEMS = 8  # 16 bytes of a 16-bit element type: TMA boxes and 16-byte vector accesses
#: the largest softmax_scale: the kernels take ``scale * log2(e)`` as a float32, which must stay finite
MAX_SOFTMAX_SCALE = 3.4028234663852886e38 / 1.4426950408889634
#: host ints the kernels take as Int32 (max_seqlen): below 2**31
INT32_LIMIT = 1 << 31
#: the largest window side: the kernel's "unbounded" (-1) is this value, and key positions plus a
#: side must stay within int32 (:data:`.forward_softmax.WINDOW_UNBOUNDED`)
MAX_WINDOW_SIDE = 1 << 30


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------
def _err(cls, msg):
    raise cls(f"flash_attn: {msg}")


def check_unsupported(dropout_p, alibi_slopes) -> None:
    """The FlashAttention arguments this forward does not implement: accepted at their neutral values
    (0, None), anything else a ``ValueError`` (``TypeError`` for a non-number) naming the argument."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        _err(TypeError, f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0:
        _err(ValueError, f"dropout_p={dropout_p!r}: dropout is not supported (an inference forward); pass 0")
    if alibi_slopes is not None:
        _err(ValueError, "alibi_slopes: ALiBi is not supported; pass None")


#: the largest float32 (the kernels take ``softmax_scale / softcap`` and ``softcap * log2(e)`` as float32)
FLOAT32_MAX = 3.4028234663852886e38


def check_softcap(softcap, softmax_scale: float, who: str = "flash_attn") -> float:
    """``softcap`` as the float the kernels take: a real number (Python or numpy; TypeError for a bool,
    a string, a tensor) that is finite and >= 0 (ValueError); 0 turns softcapping off.  With
    softcapping the scores are ``softcap * tanh(q.k * softmax_scale / softcap)`` (FlashAttention's
    definition), computed as ``tanh(q.k * (softmax_scale / softcap))`` with ``softcap * log2(e)`` as the
    softmax's scale: both must be finite float32 numbers."""
    if isinstance(softcap, torch.Tensor):  # float() of a CUDA tensor would synchronize
        raise TypeError(f"{who}: softcap must be a Python number, not a tensor")
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"{who}: softcap must be a real number (0: off), got {type(softcap).__name__} {shown(softcap)}")
    try:
        c = float(softcap)
    except (TypeError, ValueError):
        raise TypeError(f"{who}: softcap must be a real number (0: off), got {type(softcap).__name__}") from None
    except OverflowError:  # an int past the float range
        c = math.inf
    if not (0.0 <= c <= MAX_SOFTMAX_SCALE):  # NaN fails too
        raise ValueError(f"{who}: softcap must be a finite number >= 0 of at most {MAX_SOFTMAX_SCALE:.3g} (0: off), "
                         f"got {shown(softcap)}")
    if c and not softmax_scale / c <= FLOAT32_MAX:
        raise ValueError(f"{who}: softcap={c!r} is too small for softmax_scale={softmax_scale!r} (the kernels take "
                         "softmax_scale / softcap as a float32)")
    return c


def check_sink(learnable_sink, heads_q: int, device, who: str = "flash_attn") -> None:
    """``learnable_sink`` (FlashAttention-4's): None, or a (Hq,) float32 tensor on q's device (any
    stride), one logit per query head, checked after every other argument but devices, whose check
    is last (``device`` None: not checked here)."""
    if learnable_sink is None:
        return
    if not isinstance(learnable_sink, torch.Tensor):
        raise TypeError(f"{who}: learnable_sink must be a torch.Tensor or None, got {type(learnable_sink).__name__}")
    if tuple(learnable_sink.shape) != (heads_q,):
        raise ValueError(f"{who}: learnable_sink must be ({heads_q},) (one logit per query head), got shape "
                         f"{tuple(learnable_sink.shape)}")
    if learnable_sink.dtype != torch.float32:
        raise TypeError(f"{who}: learnable_sink must be float32, got {learnable_sink.dtype}")
    if device is not None and learnable_sink.device != device:
        raise ValueError(f"{who}: learnable_sink is on {learnable_sink.device}, q on {device}: all tensors must be "
                         "on one device")


def validate(q, k, v, out=None, softmax_scale=None, check_ptrs: bool = True, softcap=0.0,
             learnable_sink=None) -> float:
    """Every check the host can make without the device's data; raises ``TypeError`` / ``ValueError``
    naming the argument, and returns the softmax scale (default 1/sqrt(D)).  ``check_ptrs=False``
    skips the data-pointer alignment (fake tensors).  ``softcap`` / ``learnable_sink``:
    :func:`check_softcap` / :func:`check_sink`, their device with the others' (last)."""
    named = [("q", q), ("k", k), ("v", v)] + ([("out", out)] if out is not None else [])
    for name, t in named:
        if fault := tensor_fault(t):
            _err(TypeError, f"{name} {fault}")
    for name, t in named:
        if t.dim() != 4:
            what = "(batch, seqlen_q, heads_q, head_dim)" if name in ("q", "out") else "(batch, seqlen_k, heads_kv, head_dim)"
            hint = " (3-d packed sequences need cu_seqlens_q and cu_seqlens_k)" if t.dim() == 3 else ""
            _err(ValueError, f"{name} must be 4-d {what}, got shape {tuple(t.shape)}{hint}")
    B = q.shape[0]
    if q.shape[3] not in HEAD_DIMS:
        _err(ValueError, f"q head_dim must be one of {HEAD_DIMS}, got {q.shape[3]}")
    if k.shape[0] != B:
        _err(ValueError, f"k batch ({k.shape[0]}) must equal q batch ({B})")
    return _check_rest(named, softmax_scale, check_ptrs, softcap=softcap, learnable_sink=learnable_sink)


def _check_rest(named, softmax_scale, check_ptrs: bool, extra=(), ints=(), softcap=0.0, learnable_sink=None) -> float:
    """The checks dense and packed tensors share (head dim, shapes, dtypes, strides, pointers, scale,
    softcap, devices; ``extra``: more (name, tensor) pairs for the device check; ``ints``: (name, tensor)
    pairs that must be int32 and contiguous in their last dim, checked with the dtypes / strides;
    ``learnable_sink`` with the dtypes, its device with the others'); the last two modes of q / k are
    (heads, head_dim)."""
    q, k, v = (t for _, t in named[:3])
    out = named[3][1] if len(named) > 3 else None
    Hq, D = q.shape[-2:]
    if k.shape[-1] != D:
        _err(ValueError, f"k head_dim ({k.shape[-1]}) must equal q head_dim ({D})")
    if v.shape != k.shape:
        _err(ValueError, f"v shape {tuple(v.shape)} must equal k shape {tuple(k.shape)} (head_dim of V = head_dim of Q)")
    Hkv = k.shape[-2]
    if Hkv < 1 or Hq % Hkv != 0:
        _err(ValueError, f"q heads ({Hq}) must be a multiple of k/v heads ({Hkv}) (GQA/MQA)")
    if out is not None and out.shape != q.shape:
        _err(ValueError, f"out shape {tuple(out.shape)} must equal q shape {tuple(q.shape)}")
    if q.dtype not in HALF_TORCH:
        _err(TypeError, f"q must be float16 or bfloat16, got {q.dtype}")
    for name, t in named[1:]:
        if t.dtype != q.dtype:
            _err(TypeError, f"{name} dtype {t.dtype} must equal q dtype {q.dtype}")
    for name, t in ints:
        if t.dtype != torch.int32:
            _err(TypeError, f"{name} must be int32, got {t.dtype}")
    for name, t in ints:
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            _err(ValueError, f"{name} must be contiguous in its last dim, got strides {t.stride()}")
    if learnable_sink is not None:
        check_sink(learnable_sink, Hq, None)
        extra = tuple(extra) + (("learnable_sink", learnable_sink),)
    for name, t in named:
        if t.stride(-1) != 1:
            _err(ValueError, f"{name} must be contiguous in the head dim (stride(-1) == 1), got strides {t.stride()}")
        if any(s % _ALIGN_ELEMS for s in t.stride()[:-1]):
            _err(ValueError, f"{name} strides must be multiples of {_ALIGN_ELEMS} elements (16 bytes), "
                             f"got strides {t.stride()}")
    if out is not None:  # elements sharing an address (a stride of 0), or out over an input it reads
        check_written("flash_attn", "out", out, list(named[:3]) + list(extra))
    if check_ptrs:
        _check_ptrs(*(t for _, t in named))
    scale = _scale(softmax_scale, D)
    check_softcap(softcap, scale)
    _check_devices(list(named) + list(extra))
    return scale


def validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out=None,
                    softmax_scale=None, check_ptrs: bool = True, softcap=0.0,
                    learnable_sink=None) -> tuple[float, int, int]:
    """:func:`validate` for packed sequences: q / out (total_q, Hq, D), k / v (total_k, Hkv, D),
    cu_seqlens (B + 1,) contiguous int32, max_seqlen ints >= 0.  Returns (scale, max_seqlen_q,
    max_seqlen_k).  The cu_seqlens values stay on the device (:func:`check_cu_seqlens` reads them in
    checked mode)."""
    named = [("q", q), ("k", k), ("v", v)] + ([("out", out)] if out is not None else [])
    cus = [("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)]
    for name, t in named + cus:
        if fault := tensor_fault(t):
            _err(TypeError, f"{name} {fault}")
    for name, t in named:
        if t.dim() != 3:
            what = "(total_q, heads_q, head_dim)" if name in ("q", "out") else "(total_k, heads_kv, head_dim)"
            _err(ValueError, f"{name} must be 3-d {what} with cu_seqlens (packed sequences), got shape {tuple(t.shape)}")
    for name, t in cus:
        if t.dim() != 1 or t.shape[0] < 1:
            _err(ValueError, f"{name} must be 1-d (batch + 1,), got shape {tuple(t.shape)}")
    if cu_seqlens_k.shape != cu_seqlens_q.shape:
        _err(ValueError, f"cu_seqlens_k shape {tuple(cu_seqlens_k.shape)} must equal cu_seqlens_q shape "
                         f"{tuple(cu_seqlens_q.shape)} (one entry per sequence + 1)")
    for name, t in cus:
        if t.dtype != torch.int32:
            _err(TypeError, f"{name} must be int32, got {t.dtype}")
        if t.shape[0] > 1 and t.stride(0) != 1:
            _err(ValueError, f"{name} must be contiguous, got stride {t.stride(0)}")
    mq = _max_seqlen(max_seqlen_q, "max_seqlen_q")
    mk = _max_seqlen(max_seqlen_k, "max_seqlen_k")
    if q.shape[-1] not in HEAD_DIMS:
        _err(ValueError, f"q head_dim must be one of {HEAD_DIMS}, got {q.shape[-1]}")
    return _check_rest(named, softmax_scale, check_ptrs, extra=cus, softcap=softcap,
                       learnable_sink=learnable_sink), mq, mk


def _max_seqlen(value, name: str) -> int:
    """A host int >= 0 (it sizes the grid: never a tensor, whose value would need a sync)."""
    if value is None:
        _err(ValueError, f"{name} is required with cu_seqlens (a host int: the longest sequence)")
    if isinstance(value, (bool, torch.Tensor)):  # a tensor's value would need a device sync
        _err(TypeError, f"{name} must be a Python int, got {type(value).__name__}")
    try:
        value = operator.index(value)
    except TypeError:
        _err(TypeError, f"{name} must be a Python int, got {type(value).__name__} {value!r}")
    if value < 0:
        _err(ValueError, f"{name} must be >= 0, got {shown(value)}")
    if value >= INT32_LIMIT:  # the kernel takes it as an Int32 (and the op schema as an int64)
        _err(ValueError, f"{name} must be < 2**31 (the kernel takes an int32), got {shown(value)}")
    return int(value)


def check_window(window_size, causal: bool, negative: bool = False, who: str = "flash_attn") -> tuple[bool, Optional[tuple[int, int]]]:
    """``(causal, window)`` the kernel runs for the arguments: a window ``(left, right)``, each side an int
    or None, -1 and None unbounded; ``causal`` is ``(-1, 0)``, so causal with a window sets its right
    side to 0 (a right side other than None, -1 or 0 with causal raises).  ``window`` is None when it
    bounds nothing beyond causal.

    ``negative`` (``flash_attn``'s forward: FlashAttention-4's windows): a side below -1 is allowed, the
    window then ending before the diagonal (right < -1) or starting after it (left < -1), as long as
    it is not empty (``left + right >= 0`` when both are bounded: FlashAttention-4 would run an empty
    window as no window at all, this refuses it).  -1 keeps meaning unbounded (FlashAttention-2/3's
    convention; in FlashAttention-4 only None is).  Without it (the backward) sides are >= -1.  Errors
    start with ``who`` (``decode_attn`` takes FlashAttention-3's sides through this too)."""

    def _err(cls, msg):
        raise cls(f"{who}: {msg}")

    if window_size is None:
        window_size = (-1, -1)
    if isinstance(window_size, torch.Tensor) or not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        _err(TypeError, f"window_size must be a (left, right) pair of ints or None, got {window_size!r}")
    sides = []
    for side, w in zip(("left", "right"), window_size):
        if w is None:
            sides.append(-1)
            continue
        if isinstance(w, bool) or isinstance(w, torch.Tensor):
            _err(TypeError, f"window_size {side} must be an int or None, got {type(w).__name__} {w!r}")
        try:
            w = operator.index(w)
        except TypeError:
            _err(TypeError, f"window_size {side} must be an int or None, got {type(w).__name__} {w!r}")
        if w < -1 and not negative:
            _err(ValueError, f"window_size {side} must be >= -1 (-1: unbounded), got {shown(w)}")
        if w < -MAX_WINDOW_SIDE:  # the kernel takes sides as Int32 next to positions
            _err(ValueError, f"window_size {side} must be at least -2**30 (pass None or -1 for unbounded), "
                             f"got {shown(w)}")
        if w > MAX_WINDOW_SIDE:  # the kernel takes sides as Int32 next to positions (-1 runs as 2**30)
            _err(ValueError, f"window_size {side} must be at most 2**30 (pass -1 for unbounded), got {shown(w)}")
        sides.append(int(w))
    left, right = sides
    if type(causal) is not bool:  # a string or a tensor would pass as its truth value
        _err(TypeError, f"causal must be a bool, got {type(causal).__name__} {causal!r}")
    if causal:
        if right > 0 or right < -1:
            _err(ValueError, f"window_size right must be 0 or -1 with causal=True (or None; causal is (-1, 0)), got {right}")
        right = 0
    if left != -1 and right != -1 and left + right < 0:
        _err(ValueError, f"window_size {(left, right)} is empty (left + right < 0: no key in any row's window; "
                         "FlashAttention-4 would run it as no window)")
    if right == 0 and left == -1:
        return True, None
    if left == -1 and right == -1:
        return False, None
    return False, (left, right)


def check_cu_seqlens(cu_seqlens, total: int, max_seqlen: int, name: str) -> None:
    """Checked mode: ``cu_seqlens`` non-decreasing from >= 0, its last entry <= the packed length and
    no sequence longer than ``max_seqlen`` (synchronizes with the device)."""
    c = cu_seqlens.detach().to("cpu", torch.int64)
    which = "q" if name.endswith("_q") else "k"
    if int(c[0]) < 0:
        _err(ValueError, f"{name}[0] must be >= 0, got {int(c[0])}")
    lens = c[1:] - c[:-1]
    if lens.numel() and int(lens.min()) < 0:
        b = int((lens < 0).nonzero()[0])
        _err(ValueError, f"{name} must be non-decreasing: {name}[{b + 1}] = {int(c[b + 1])} < {name}[{b}] = {int(c[b])}")
    if int(c[-1]) > total:
        _err(ValueError, f"{name}[-1] = {int(c[-1])} exceeds the packed length {total} of {'q' if which == 'q' else 'k/v'}")
    if lens.numel() and int(lens.max()) > max_seqlen:
        b = int(lens.argmax())
        _err(ValueError, f"sequence {b} has {int(lens[b])} {'queries' if which == 'q' else 'keys'} > "
                         f"max_seqlen_{which} = {max_seqlen} ({name})")


def _check_devices(named) -> None:
    """Last: every other error is reported whatever the device."""
    dev = named[0][1].device
    for name, t in named:
        if t.device.type != "cuda":
            _err(ValueError, f"{name} is on {t.device}; flash_attn runs on CUDA tensors")
        if t.device != dev:
            _err(ValueError, f"{name} is on {t.device}, q on {dev}: all tensors must be on one device")


def _scale(softmax_scale, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    return check_scale(softmax_scale, "flash_attn")


def shown(value) -> str:
    """``repr(value)``, but an int too long to print in full (10**5000 would raise) by its size."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"{'a negative' if value < 0 else 'an'} int of {value.bit_length()} bits"
    return repr(value)


def check_scale(softmax_scale, who: str) -> float:
    """A given softmax scale as the float the kernels take: a real number (Python, numpy or symbolic)
    in (0, :data:`MAX_SOFTMAX_SCALE`]; TypeError for a tensor, a bool, a string or a complex number,
    ValueError for a value out of range (an int past the float range included)."""
    if isinstance(softmax_scale, torch.Tensor):  # float() of a CUDA tensor would synchronize
        raise TypeError(f"{who}: softmax_scale must be a Python number or None, not a tensor")
    # float("0.1") / float(True) would pass; float() of a complex numpy scalar drops its imaginary part
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (numbers.Real, torch.SymFloat, torch.SymInt)):
        raise TypeError(f"{who}: softmax_scale must be a real number or None, got {type(softmax_scale).__name__} "
                        f"{shown(softmax_scale)}")
    try:
        s = float(softmax_scale)
    except (TypeError, ValueError):
        raise TypeError(f"{who}: softmax_scale must be a real number or None, got "
                        f"{type(softmax_scale).__name__}") from None
    except OverflowError:  # an int past the float range (10**400)
        s = math.inf
    if not (0.0 < s <= MAX_SOFTMAX_SCALE):  # NaN fails too
        raise ValueError(f"{who}: softmax_scale must be a positive finite number of at most {MAX_SOFTMAX_SCALE:.3g} "
                         f"(the kernels take scale * log2(e) as a float32), got {shown(softmax_scale)}")
    return s


def _check_ptrs(*ts) -> None:
    for name, t in zip(("q", "k", "v", "out"), ts):
        if t.data_ptr() % 16:
            _err(ValueError, f"{name} data pointer must be 16-byte aligned (offset {t.data_ptr() % 16})")


# ------------------------------------------------------------------------------------------------
# paged K/V
# ------------------------------------------------------------------------------------------------
#: paged K/V: page sizes (k / v dim 1) the kernel takes: multiples of 16 (its TMA box, a whole number
#: of swizzle atoms; :mod:`.forward_paged`) up to 256
PAGE_SIZE_MULTIPLE = 16
MAX_PAGE_SIZE = 256
PAGE_SIZE_RULE = f"a multiple of {PAGE_SIZE_MULTIPLE} from {PAGE_SIZE_MULTIPLE} to {MAX_PAGE_SIZE}"


def page_size_ok(page_size: int) -> bool:
    return page_size % PAGE_SIZE_MULTIPLE == 0 and PAGE_SIZE_MULTIPLE <= page_size <= MAX_PAGE_SIZE
#: paged K/V: the most keys a block table may address (block_table width x page_size), so that key
#: positions plus a window side stay far from the int32 limit
MAX_PAGED_CAPACITY = 1 << 30


def validate_paged(q, k, v, block_table, seqused_k, cu_seqlens_q, max_seqlen_q, out=None, softmax_scale=None,
                   max_seqlen_k=None, check_ptrs: bool = True, softcap=0.0, learnable_sink=None) -> tuple[float, int]:
    """:func:`validate` for paged K/V: k / v (num_pages, page_size, Hkv, D), block_table (B, max_pages)
    and seqused_k (B,) int32; q / out dense (B, Sq, Hq, D), or packed (total_q, Hq, D) with
    cu_seqlens_q (B + 1,) int32 and the host int max_seqlen_q; max_seqlen_k a hint within the capacity
    (:func:`check_max_seqlen_k_paged`).  Returns (scale, max_seqlen_q or 0).  Device values (lengths, page ids) stay on the device (:func:`check_paged_values`)."""
    varlen = cu_seqlens_q is not None
    named = [("q", q), ("k", k), ("v", v)] + ([("out", out)] if out is not None else [])
    ints = [("block_table", block_table), ("seqused_k", seqused_k)] + ([("cu_seqlens_q", cu_seqlens_q)] if varlen else [])
    for name, t in named + ints:
        if fault := tensor_fault(t):
            _err(TypeError, f"{name} {fault}")
    qdims = 3 if varlen else 4
    for name, t in named:
        want = qdims if name in ("q", "out") else 4
        if t.dim() != want:
            what = {3: "(total_q, heads_q, head_dim) with cu_seqlens_q", 4: "(batch, seqlen_q, heads_q, head_dim)"}[want] \
                if name in ("q", "out") else "(num_pages, page_size, heads_kv, head_dim) with block_table"
            _err(ValueError, f"{name} must be {want}-d {what}, got shape {tuple(t.shape)}")
    for name, t, d in (("block_table", block_table, 2), ("seqused_k", seqused_k, 1), ("cu_seqlens_q", cu_seqlens_q, 1)):
        if t is not None and t.dim() != d:
            what = {"block_table": "(batch, max_pages)", "seqused_k": "(batch,)", "cu_seqlens_q": "(batch + 1,)"}[name]
            _err(ValueError, f"{name} must be {d}-d {what}, got shape {tuple(t.shape)}")
    if varlen and cu_seqlens_q.shape[0] < 1:
        _err(ValueError, "cu_seqlens_q must be 1-d (batch + 1,), got shape (0,)")
    B = cu_seqlens_q.shape[0] - 1 if varlen else q.shape[0]
    if q.shape[-1] not in HEAD_DIMS:
        _err(ValueError, f"q head_dim must be one of {HEAD_DIMS}, got {q.shape[-1]}")
    if block_table.shape[0] != B:
        _err(ValueError, f"block_table must be ({B}, max_pages) (one row per sequence), got shape "
                         f"{tuple(block_table.shape)}")
    if block_table.shape[1] < 1:
        _err(ValueError, f"block_table needs at least one page column, got shape {tuple(block_table.shape)}")
    if tuple(seqused_k.shape) != (B,):
        _err(ValueError, f"seqused_k must be ({B},) (one length per sequence), got shape {tuple(seqused_k.shape)}")
    if k.shape[0] < 1:
        _err(ValueError, f"k has no pages (shape {tuple(k.shape)}): block_table ids have nothing to index")
    page_size = k.shape[1]
    if not page_size_ok(page_size):
        _err(ValueError, f"k page_size (dim 1) must be {PAGE_SIZE_RULE}, got {page_size}")
    if block_table.shape[1] * page_size > MAX_PAGED_CAPACITY:
        _err(ValueError, f"block_table width x page_size ({block_table.shape[1]} x {page_size}) must be at most "
                         f"{MAX_PAGED_CAPACITY} keys")
    mq = _max_seqlen(max_seqlen_q, "max_seqlen_q") if varlen else 0
    check_max_seqlen_k_paged(max_seqlen_k, k, block_table)
    return _check_rest(named, softmax_scale, check_ptrs, extra=ints, ints=ints, softcap=softcap,
                       learnable_sink=learnable_sink), mq


def check_max_seqlen_k_paged(max_seqlen_k, k, block_table) -> None:
    """With a block table, ``max_seqlen_k`` is a redundant hint (FlashAttention-2/3/4 callers pass it
    with page tables): a host int in [0, capacity], capacity = block_table width x page_size; it
    changes nothing (the lengths are ``seqused_k``)."""
    if max_seqlen_k is None:
        return
    n = _max_seqlen(max_seqlen_k, "max_seqlen_k")
    cap = block_table.shape[1] * k.shape[1]
    if n > cap:
        _err(ValueError, f"max_seqlen_k ({n}) must be at most the paged capacity {cap} (block_table width x page_size)")


def check_paged_values(k, block_table, seqused_k) -> None:
    """Checked mode: every ``seqused_k`` in ``[0, max_pages * page_size]`` and the page ids a sequence
    uses (its first ``ceil(seqused_k / page_size)`` block-table entries) in ``[0, num_pages)``
    (synchronizes with the device)."""
    num_pages, page_size = k.shape[0], k.shape[1]
    cap = block_table.shape[1] * page_size
    lens = seqused_k.detach().to("cpu", torch.int64)
    for b, n in enumerate(lens.tolist()):
        if not 0 <= n <= cap:
            _err(ValueError, f"seqused_k[{b}] = {n} must be in [0, {cap}] (block_table width x page_size)")
    bt = block_table.detach().to("cpu", torch.int64)
    for b, n in enumerate(lens.tolist()):
        used = bt[b, : -(-n // page_size)]
        if used.numel() and (int(used.min()) < 0 or int(used.max()) >= num_pages):
            bad = [int(x) for x in used if not 0 <= int(x) < num_pages]
            _err(ValueError, f"block_table[{b}] has page ids outside [0, {num_pages}) among the {used.numel()} "
                             f"pages of its {n} keys: {bad[:8]}")
