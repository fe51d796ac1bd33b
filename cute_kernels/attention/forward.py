"""``flash_attn``: the FlashAttention forward (prefill attention) on Hopper, host side.

``O = softmax(Q K^T * scale) V`` for q (B, Sq, Hq, D) against k/v (B, Sk, Hkv, D), never materializing
the scores; the kernel (:mod:`.forward_kernel`) also writes the natural-log LSE of every row, which
:func:`cute_kernels.merge_states` combines exactly across key splits.

This module is everything the host does around the kernel:

* validation of what the host can see, before any launch, in a fixed order (types, ranks, shapes,
  dtypes, strides, pointer alignment, devices) so that every error names its argument and shape
  errors are reported even for tensors on the wrong device;
* empty problems without a launch: B == 0 or Sq == 0 or Hq == 0 give empty results, Sk == 0 gives
  O = 0 and LSE = -inf (two fills on the current stream);
* the plan: the compile configuration depends on (dtype, head dim, causal) only, never on lengths,
  batch or heads (the kernel takes them as symbolic sizes), so a new length never recompiles;
  configurations come from :func:`~.forward_kernel.fwd_config` and compile through
  :func:`cute_kernels.common.jit.get_compiled` (memory + disk cache);
* ``torch.library`` custom ops with fake implementations (``cute_kernels::flash_attn`` returns
  (O, LSE); ``cute_kernels::flash_attn_`` writes into given buffers): eager calls skip the
  dispatcher, ``torch.compile`` traces the ops.  Nothing synchronizes with the device, so calls are
  CUDA-graph capturable (the stream is torch's current one).

The kernel module is imported at the first compile, not at ``import cute_kernels``: validation,
planning under :class:`~cute_kernels.common.jit.dry_run` and tracing need none of it.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..common import jit
from ..common.dtypes import HALF_TORCH, TORCH_TO_NAME, name_of
from ..common.softmax import LOG2_E
from ..testing import LAUNCHES
from . import forward_kernel

__all__ = ["flash_attn", "validate", "plan", "get_forward_kernel", "warmup_flash_attn", "precompile", "HEAD_DIMS"]

#: Head dims the kernel runs (``layouts.attention.FWD_HEAD_DIMS``).
HEAD_DIMS = (64, 96, 128, 256)
_ALIGN_ELEMS = 8  # 16 bytes of a 16-bit element type: TMA boxes and 16-byte vector accesses


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------
def _err(cls, msg):
    raise cls(f"flash_attn: {msg}")


def validate(q, k, v, out=None, softmax_scale=None, check_ptrs: bool = True) -> float:
    """Every check the host can make without the device's data; raises ``TypeError`` / ``ValueError``
    naming the argument, and returns the softmax scale (default 1/sqrt(D)).  ``check_ptrs=False``
    skips the data-pointer alignment (fake tensors)."""
    named = [("q", q), ("k", k), ("v", v)] + ([("out", out)] if out is not None else [])
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            _err(TypeError, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in named:
        if t.dim() != 4:
            what = "(batch, seqlen_q, heads_q, head_dim)" if name in ("q", "out") else "(batch, seqlen_k, heads_kv, head_dim)"
            _err(ValueError, f"{name} must be 4-d {what}, got shape {tuple(t.shape)}")
    B, _, Hq, D = q.shape
    if D not in HEAD_DIMS:
        _err(ValueError, f"q head_dim must be one of {HEAD_DIMS}, got {D}")
    if k.shape[0] != B:
        _err(ValueError, f"k batch ({k.shape[0]}) must equal q batch ({B})")
    if k.shape[3] != D:
        _err(ValueError, f"k head_dim ({k.shape[3]}) must equal q head_dim ({D})")
    if v.shape != k.shape:
        _err(ValueError, f"v shape {tuple(v.shape)} must equal k shape {tuple(k.shape)} (head_dim of V = head_dim of Q)")
    Hkv = k.shape[2]
    if Hkv < 1 or Hq % Hkv != 0:
        _err(ValueError, f"q heads ({Hq}) must be a multiple of k/v heads ({Hkv}) (GQA/MQA)")
    if out is not None and out.shape != q.shape:
        _err(ValueError, f"out shape {tuple(out.shape)} must equal q shape {tuple(q.shape)}")
    if q.dtype not in HALF_TORCH:
        _err(TypeError, f"q must be float16 or bfloat16, got {q.dtype}")
    for name, t in named[1:]:
        if t.dtype != q.dtype:
            _err(TypeError, f"{name} dtype {t.dtype} must equal q dtype {q.dtype}")
    for name, t in named:
        if t.stride(-1) != 1:
            _err(ValueError, f"{name} must be contiguous in the head dim (stride(-1) == 1), got strides {t.stride()}")
        if any(s % _ALIGN_ELEMS for s in t.stride()[:-1]):
            _err(ValueError, f"{name} strides must be multiples of {_ALIGN_ELEMS} elements (16 bytes), "
                             f"got strides {t.stride()}")
    if out is not None and any(s == 0 and n > 1 for s, n in zip(out.stride(), out.shape)):
        _err(ValueError, f"out has a stride of 0 (strides {out.stride()}, shape {tuple(out.shape)}): several "
                         f"elements share memory (an expanded tensor cannot be written)")
    if check_ptrs:
        _check_ptrs(*(t for _, t in named))
    scale = _scale(softmax_scale, D)
    _check_devices(named)
    return scale


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
    if isinstance(softmax_scale, torch.Tensor):  # float() of a CUDA tensor would synchronize
        _err(TypeError, "softmax_scale must be a Python number or None, not a tensor")
    if isinstance(softmax_scale, (bool, str, bytes)):  # float("0.1") / float(True) would pass
        _err(TypeError, f"softmax_scale must be a number or None, got {type(softmax_scale).__name__} {softmax_scale!r}")
    try:
        s = float(softmax_scale)
    except (TypeError, ValueError):
        _err(TypeError, f"softmax_scale must be a number or None, got {type(softmax_scale).__name__}")
    if not (math.isfinite(s) and s > 0):
        _err(ValueError, f"softmax_scale must be a positive finite number, got {softmax_scale}")
    return s


def _check_ptrs(*ts) -> None:
    for name, t in zip(("q", "k", "v", "out"), ts):
        if t.data_ptr() % 16:
            _err(ValueError, f"{name} data pointer must be 16-byte aligned (offset {t.data_ptr() % 16})")


# ------------------------------------------------------------------------------------------------
# plan and compiled kernels
# ------------------------------------------------------------------------------------------------
_PLANS: dict = {}


def plan(dtype: torch.dtype, head_dim: int, causal: bool):
    """The kernel configuration (``FlashFwdConfig``) for these static facts (and the SM count of the
    device, the persistent grid's size); memoized.  Lengths, batch and heads are not part of it: they
    are symbolic sizes of the compiled kernel."""
    key = (dtype, head_dim, causal)
    cfg = _PLANS.get(key)
    if cfg is None:
        cfg = _PLANS[key] = forward_kernel.fwd_config(name_of(dtype), head_dim, causal, _num_sms())
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
    or ``dict(dtype=torch.bfloat16 | "bfloat16", head_dim=64 | 96 | 128 | 256, causal=bool)``."""
    if isinstance(spec, dict):
        extra = set(spec) - {"dtype", "head_dim", "causal"}
        if extra:
            raise ValueError(f"warmup flash_attn: unknown keys {sorted(extra)} (dtype, head_dim, causal)")
        dtype = spec.get("dtype", torch.bfloat16)
        if isinstance(dtype, str):
            dtype = next((t for t, n in TORCH_TO_NAME.items() if n == dtype), dtype)
        if dtype not in HALF_TORCH:
            raise ValueError(f"warmup flash_attn: dtype must be float16 or bfloat16, got {dtype}")
        head_dim = int(spec.get("head_dim", 128))
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"warmup flash_attn: head_dim must be one of {HEAD_DIMS}, got {head_dim}")
        spec = plan(dtype, head_dim, bool(spec.get("causal", False)))
    get_forward_kernel(spec)


jit.register_warmup("flash_attn", warmup_flash_attn)


def precompile(configs, processes: Optional[int] = None) -> list[str]:
    """Compile forward configs into the disk cache in parallel processes (later calls load them in
    ~1 ms); returns error strings."""
    return jit.precompile_configs(get_forward_kernel, configs, processes)


def _launch(q, k, v, out, lse, causal: bool, scale: float) -> None:
    """Write out (B, Sq, Hq, D) and lse (B, Hq, Sq) float32 for validated CUDA tensors."""
    B, Sq, Hq, D = q.shape
    if B == 0 or Sq == 0 or Hq == 0:
        return
    if k.shape[1] == 0:  # no key at all: every row is empty
        out.zero_()
        lse.fill_(float("-inf"))
        return
    cfg = plan(q.dtype, D, causal)
    fn = get_forward_kernel(cfg)
    if fn is None:  # jit.dry_run: planned, nothing compiled or launched
        return
    LAUNCHES["flash_attn"] += 1
    fn(q, k, v, out, lse, tile_counter(q.device, cfg.tile.dynamic), scale * LOG2_E)


_COUNTERS: dict = {}
_capturing, _current_stream = jit.stream_query()  # (torch's C entry points: tenths of a microsecond)


def tile_counter(device: torch.device, dynamic: bool) -> torch.Tensor:
    """The dynamic schedule's two-int32 global tile counter (zero before each launch; the kernel's
    last CTA zeroes it again).  One per (device, stream), since two kernels running at once must not
    share one; a fresh zeroed one per call while a CUDA graph is being captured (the graph then
    zeroes it on every replay, and graphs replayed side by side do not share it).  Static schedules
    never touch it: they get one per device."""
    if not dynamic:
        key = (device.index, None)
    elif _capturing():
        return torch.zeros(2, dtype=torch.int32, device=device)
    else:
        key = (device.index, _current_stream(device.index))
    c = _COUNTERS.get(key)
    if c is None:
        c = _COUNTERS[key] = torch.zeros(2, dtype=torch.int32, device=device)
    return c


# ------------------------------------------------------------------------------------------------
# torch.library ops
# ------------------------------------------------------------------------------------------------
@torch.library.custom_op("cute_kernels::flash_attn_", mutates_args=("out", "lse"), device_types=None)
def _flash_attn_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                       causal: bool, softmax_scale: float) -> None:
    _check_ptrs(q, k, v, out)  # traced calls validated everything else on fake tensors
    _launch(q, k, v, out, lse, causal, softmax_scale)


@_flash_attn_out_op.register_fake
def _(q, k, v, out, lse, causal, softmax_scale):
    return None


def _new_lse(q):
    B, Sq, Hq, _ = q.shape
    return q.new_empty((B, Hq, Sq), dtype=torch.float32)


def _new_outputs(q):
    """A contiguous (B, Sq, Hq, D) output (whatever q's strides) and the (B, Hq, Sq) float32 LSE."""
    return q.new_empty(q.shape), _new_lse(q)


@torch.library.custom_op("cute_kernels::flash_attn", mutates_args=())
def _flash_attn_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = _new_outputs(q)
    _check_ptrs(q, k, v)
    _launch(q, k, v, out, lse, causal, softmax_scale)
    return out, lse


@_flash_attn_op.register_fake
def _(q, k, v, causal, softmax_scale):
    return _new_outputs(q)


# ------------------------------------------------------------------------------------------------
# the host fast path: a launcher per call metadata, made after a call with that metadata passed
# validation and launched (issue 19: host time per call)
# ------------------------------------------------------------------------------------------------
_is_compiling = torch.compiler.is_compiling
_empty = torch.empty
#: tensor types the fast path takes (subclasses such as FakeTensor always take the checked path)
_FAST_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
_launchers: dict = {}


def _key(q, k, v, out, causal) -> tuple:
    """Everything :func:`validate` and the plan read (the scale aside): shapes, strides, dtypes and
    devices (``get_device()``: -1 for every non-CUDA device, which never has a launcher), the 16-byte
    alignment of the data pointers, out's type (a fake one never hits) and causal."""
    return (q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype, k.get_device(),
            v.shape, v.stride(), v.dtype, v.get_device(),
            (q.data_ptr() | k.data_ptr() | v.data_ptr() | (0 if out is None else out.data_ptr())) & 15,
            None if out is None else (type(out), out.shape, out.stride(), out.dtype, out.get_device()), causal)


def _prepare(key, q, k, causal: bool) -> None:
    """Cache a launcher for ``key`` after a call with that metadata launched the kernel."""
    B, Sq, Hq, D = q.shape
    if B == 0 or Sq == 0 or Hq == 0 or k.shape[1] == 0:
        return
    cfg = plan(q.dtype, D, causal)
    fn = get_forward_kernel(cfg)
    if fn is None:
        return
    qshape, lshape, dtype, dev, dynamic, run = q.shape, (B, Hq, Sq), q.dtype, q.device, cfg.tile.dynamic, jit.direct(fn)
    scratch = []  # the LSE nobody asked for (never read): made by the first call without return_lse

    def launch(q, k, v, out, scale, want_lse):
        if out is None:
            out = _empty(qshape, dtype=dtype, device=dev)
        if want_lse:
            lse = _empty(lshape, dtype=torch.float32, device=dev)
        elif scratch:
            lse = scratch[0]
        else:
            lse = _empty(lshape, dtype=torch.float32, device=dev)
            scratch.append(lse)
        LAUNCHES["flash_attn"] += 1
        run(q, k, v, out, lse, tile_counter(dev, dynamic), scale * LOG2_E)
        return out, lse
    launch.default_scale, launch.keep = 1.0 / math.sqrt(D), fn  # (fn owns run's CUDA library)
    _launchers[key] = launch


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

    Returns ``out`` or ``(out, lse)``.  Bad input raises ``TypeError``/``ValueError`` naming the
    argument before any launch; nothing synchronizes with the device; results are bitwise repeatable.
    """
    key = None
    if not _is_compiling():  # the fast path (_key); anything unusual takes the checks below
        try:
            if type(q) in _FAST_TYPES and type(k) in _FAST_TYPES and type(v) in _FAST_TYPES:
                key = _key(q, k, v, out, causal)
                hit = _launchers.get(key)
            else:
                hit = None
        except (AttributeError, TypeError):  # a non-tensor, an unhashable causal: validate says what
            key = hit = None
        if hit is not None:
            ts = type(softmax_scale)
            if softmax_scale is None:
                softmax_scale = hit.default_scale
            elif not ((ts is float or ts is int) and 0.0 < softmax_scale < math.inf):
                hit = None  # _scale says what is wrong with it (or takes a numpy scalar)
            if hit is not None:
                out, lse = hit(q, k, v, out, softmax_scale, return_lse)
                return (out, lse) if return_lse else out
    tracing = torch.compiler.is_compiling() or isinstance(q, FakeTensor)
    scale = validate(q, k, v, out, softmax_scale, check_ptrs=not tracing)
    causal = bool(causal)
    if tracing:  # torch.compile / fake tensors: the custom ops (their fake implementations trace)
        if out is None:
            out, lse = _flash_attn_op(q, k, v, causal, scale)
        else:
            lse = _new_lse(q)
            _flash_attn_out_op(q, k, v, out, lse, causal, scale)
        return (out, lse) if return_lse else out
    if out is None:
        out, lse = _new_outputs(q)
    else:
        lse = _new_lse(q)
    _launch(q, k, v, out, lse, causal, scale)  # eager: no dispatcher
    if key is not None:
        _prepare(key, q, k, causal)
    return (out, lse) if return_lse else out
