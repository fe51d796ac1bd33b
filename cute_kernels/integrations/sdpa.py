"""``sdpa``: a drop-in for ``torch.nn.functional.scaled_dot_product_attention`` on the kernels.

Same signature, (B, H, S, D) layout and semantics as torch's function.  The (B, H, S, D) tensors are
viewed as (B, S, H, D) with ``.transpose(1, 2)`` (no copy: the kernels take any 16-byte-aligned
strides) and the (B, S, H, D) result comes back as a (B, H, S, D) view.

Routing (:func:`route`, pure: shapes, dtypes, strides and flags, never tensor values):

=====================================================  =============================================
case                                                   runs
=====================================================  =============================================
not causal, 1 <= Sq <= 16 and Sq < Sk, no grad        ``decode_attn`` (lengths = Sk), D 64/128/256
not causal, any other Sq, Sk                           ``flash_attn``, D 64/96/128/256
causal, Sq == Sk                                       ``flash_attn(causal=True)`` (top-left = bottom-right)
causal, Sq < Sk                                        ``flash_attn(causal=True)`` on the first Sq keys
causal, Sq > Sk                                        torch (top-left mask; the kernels are bottom-right)
=====================================================  =============================================

An input that requires grad (grad enabled) runs on ``flash_attn``, which is differentiable (the
backward kernels: D 64/96/128/256), never on ``decode_attn``; under ``torch.use_deterministic_algorithms(True)``
its backward runs in the deterministic mode (bitwise repeatable gradients).

torch's ``is_causal`` is top-left aligned: query i sees keys j <= i.  With Sq < Sk no query sees a
key past Sq - 1, so it equals the bottom-right mask over the first Sq keys (a slice, no copy).  With
Sq > Sk the rows past Sk see every key, which no single bottom-right call gives: torch runs it.

Everything else falls back to torch's own function (one warning per distinct reason, the first time
it occurs; the result is torch's, including its errors): any ``attn_mask`` (its values are never
read), ``dropout_p != 0``, tensors that are not 4-d, not on one CUDA device, on a GPU other than Hopper, not all float16 or all
bfloat16, key/value shapes that differ or do not match the query's batch and head dim, Hq != Hkv
without ``enable_gqa`` (torch raises), Hq not a multiple of Hkv, empty inputs, a scale that is not a
positive finite number, a head dim the chosen kernel lacks, strides the kernels cannot take (head dim
not contiguous, other strides not multiples of 8 elements, broadcast (zero) strides, data pointers not
16-byte aligned).  ``sdpa_stats`` counts the eager calls each way (calls under torch.compile are not
counted: a traced count would make dynamo guard on it and recompile every call).

Under ``torch.compile`` the routing runs at trace time on fake tensors (data pointers are not
checked there; the custom ops check them when they run) and the kernels trace as their custom ops.
"""

from __future__ import annotations

import math
import warnings
from typing import Optional

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from ..attention.decode import decode_attn
from ..attention.forward import HEAD_DIMS as FLASH_HEAD_DIMS
from ..attention.forward import flash_attn
from ..attention.forward_autograd import BWD_HEAD_DIMS
from ..attention.forward_validate import MAX_SOFTMAX_SCALE

__all__ = ["sdpa", "route", "sdpa_stats", "DECODE_MAX_Q", "DECODE_HEAD_DIMS"]

#: Query lengths that route to ``decode_attn`` (against a longer K/V, not causal).
DECODE_MAX_Q = 16
DECODE_HEAD_DIMS = (64, 128, 256)
_HALF = (torch.float16, torch.bfloat16)
_ALIGN_ELEMS = 8  # 16 bytes of a 16-bit element

#: Eager calls per path since import (calls under torch.compile are not counted: a traced ``+= 1``
#: would make dynamo guard on the count, so a compiled caller would recompile on every call).
sdpa_stats = {"flash_attn": 0, "decode_attn": 0, "torch": 0}
_WARNED: set = set()
#: Device types the kernels take ("meta": planning and tests, as if on the GPU).
_KERNEL_DEVICES = ("cuda", "meta")
_HOPPER: dict = {}

# fallback reasons (stable strings: one warning per reason)
R_MASK = "attn_mask is given (its values are never inspected)"
R_DROPOUT = "dropout_p != 0"
R_GRAD_HEAD_DIM = "an input requires grad and the head dim has no backward (64/96/128/256)"
R_RANK = "inputs are not 4-d (batch, heads, seq, head_dim) tensors"
R_NESTED = "an input is a nested tensor"
R_DEVICE = "inputs are not all on one CUDA device"
R_ARCH = "the GPU is not Hopper (sm_90)"
R_DTYPE = "inputs are not all float16 or all bfloat16"
R_SHAPE = "key/value shapes differ or do not match the query's batch / head dim"
R_GQA_FLAG = "heads of query and key/value differ without enable_gqa (torch's error)"
R_GQA_DIV = "query heads are not a multiple of key/value heads"
R_EMPTY = "an input has a zero-size dimension"
R_CAUSAL = "is_causal with Sq > Sk (torch's mask is top-left aligned; the kernels' is bottom-right)"
R_SCALE = "scale is not a positive finite number the kernels take (at most float32 max / log2(e))"
R_HEAD_DIM = "head dim not supported by the kernel (flash_attn: 64/96/128/256; decode_attn: 64/128/256)"
R_STRIDES = ("strides the kernels cannot take (head dim not contiguous, other strides not multiples of "
             "8 elements, zero strides, or data pointers not 16-byte aligned)")


def _is_hopper(device: torch.device) -> bool:
    """The device is sm_90 (the kernels are sm_90a).  Without a usable CUDA runtime (fake CUDA tensors
    on a CPU machine) the tensors are taken as Hopper's: nothing is launched there.  A device already
    found to be Hopper's answers from the cache first: callers run this per call (every patched linear)."""
    if _HOPPER.get(device.index):  # (True only once found so; a CPU or meta device has index None)
        return True
    if device.type == "meta" or torch.compiler.is_compiling() or not torch.cuda.is_available():
        return True
    idx = device.index if device.index is not None else torch.cuda.current_device()
    ok = _HOPPER.get(idx)
    if ok is None:
        ok = _HOPPER[idx] = torch.cuda.get_device_capability(idx) == (9, 0)
    return ok


def _strides_ok(t: torch.Tensor, pointer: bool = True) -> bool:
    """Strides (and, with ``pointer``, the data pointer) the kernels take; 4-d tensors (route's
    callers), written out: it runs for q, k and v of every call."""
    s0, s1, s2, s3 = t.stride()
    # every stride, size-1 dims too (as the kernels' checks); no zero (broadcast) strides at all
    if s3 != 1 or s0 % _ALIGN_ELEMS or s1 % _ALIGN_ELEMS or s2 % _ALIGN_ELEMS or not (s0 and s1 and s2):
        return False
    return not pointer or t.data_ptr() % 16 == 0


def route(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False,
          scale=None) -> tuple[str, str]:
    """Where ``sdpa`` with these arguments runs: ``("flash_attn" | "decode_attn" | "torch", reason)``.

    Pure: reads shapes, dtypes, devices, strides, flags and data-pointer alignment, never values.  Meta
    tensors count as tensors on a Hopper GPU (for planning and tests; :func:`sdpa` gives them torch's
    meta result).  For the kernels, ``reason``
    says which case applies; for ``"torch"`` it is the fallback reason.
    """
    if attn_mask is not None:
        return "torch", R_MASK
    if dropout_p != 0.0:
        return "torch", R_DROPOUT
    T = torch.Tensor
    if not (isinstance(query, T) and isinstance(key, T) and isinstance(value, T)) or not (
            query.dim() == key.dim() == value.dim() == 4):
        return "torch", R_RANK
    if query.is_nested or key.is_nested or value.is_nested:  # (their sizes are not ints; sparse ones fail the strides)
        return "torch", R_NESTED
    # flash_attn has the backward
    grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    dev = query.device
    if dev.type not in _KERNEL_DEVICES or key.device != dev or value.device != dev:
        return "torch", R_DEVICE
    if not _is_hopper(dev):
        return "torch", R_ARCH
    if query.dtype not in _HALF or key.dtype != query.dtype or value.dtype != query.dtype:
        return "torch", R_DTYPE
    B, Hq, Sq, D = query.shape
    _, Hkv, Sk, _ = key.shape
    if value.shape != key.shape or key.shape[0] != B or key.shape[3] != D:
        return "torch", R_SHAPE
    if Hq != Hkv and not enable_gqa:
        return "torch", R_GQA_FLAG
    if Hkv == 0 or Hq % Hkv:
        return "torch", R_GQA_DIV
    if B == 0 or Hq == 0 or Sq == 0 or Sk == 0 or D == 0:
        return "torch", R_EMPTY
    if is_causal and Sq > Sk:
        return "torch", R_CAUSAL
    # (a comparison, not float(): 10**400 would overflow; the kernels' bound on scale * log2(e))
    if scale is not None and not (isinstance(scale, (int, float)) and 0 < scale <= MAX_SOFTMAX_SCALE):
        return "torch", R_SCALE
    # no data pointer to check when tracing or on fake / meta tensors (the custom ops check it when they run)
    pointer = not (torch.compiler.is_compiling() or isinstance(query, FakeTensor) or dev.type == "meta")
    if not (_strides_ok(query, pointer) and _strides_ok(key, pointer) and _strides_ok(value, pointer)):
        return "torch", R_STRIDES
    if not is_causal and 1 <= Sq <= DECODE_MAX_Q and Sq < Sk and not grad:
        if D not in DECODE_HEAD_DIMS:
            return "torch", R_HEAD_DIM
        return "decode_attn", f"Sq <= {DECODE_MAX_Q} against a longer K/V, not causal"
    if D not in FLASH_HEAD_DIMS:
        return "torch", R_HEAD_DIM
    if grad and D not in BWD_HEAD_DIMS:
        return "torch", R_GRAD_HEAD_DIM
    if is_causal and Sq < Sk:
        return "flash_attn", "causal with Sq < Sk: top-left mask = bottom-right over the first Sq keys"
    return "flash_attn", "causal, Sq == Sk" if is_causal else "prefill, not causal"


def count_eager(stats: dict, path: str) -> None:
    """One call more on ``path`` in ``stats`` (:data:`sdpa_stats`, ``hf.hf_stats``), outside torch.compile
    only: a traced ``+= 1`` on a module's dict makes dynamo guard on the count it read, so every call
    would recompile."""
    if not torch.compiler.is_compiling():
        stats[path] += 1


def _fallback(reason: str, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    if not torch.compiler.is_compiling() and reason not in _WARNED:  # eager calls warn
        _WARNED.add(reason)
        warnings.warn(f"cute_kernels.sdpa: running torch's scaled_dot_product_attention: {reason}",
                      stacklevel=3)
    count_eager(sdpa_stats, "torch")
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on the kernels where they compute exactly
    the same function (routing and fallbacks: module doc, :func:`route`).

    Args:
        query: (B, Hq, Sq, D); key, value: (B, Hkv, Sk, D); torch's layout and meaning throughout.
        attn_mask, dropout_p: anything but None / 0 runs torch (one warning per reason).
        is_causal: torch's top-left aligned causal mask.
        scale: softmax scale, default 1 / sqrt(D).
        enable_gqa: Hq a multiple of Hkv; query head h reads key/value head h // (Hq / Hkv).

    Returns (B, Hq, Sq, D) in the input dtype: on the kernels a transposed view of a contiguous
    (B, Sq, Hq, D) tensor (``.transpose(1, 2).contiguous()`` of it is free).  ``is_causal`` and
    ``enable_gqa`` must be bools (TypeError otherwise, as torch's function).
    """
    for name, flag in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):
        if type(flag) is not bool:  # torch's function takes only a bool (an int or a string raises there too)
            raise TypeError(f"sdpa: {name} must be bool, not {type(flag).__name__}")
    where, reason = route(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, scale)
    if where == "torch":
        return _fallback(reason, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if query.device.type == "meta":
        # meta tensors route as a GPU's (planning), but nothing runs on them: torch's function gives
        # its meta result (shape, dtype, autograd) as on any device, where the kernels' device checks raise
        count_eager(sdpa_stats, "torch")
        return F.scaled_dot_product_attention(query, key, value, dropout_p=dropout_p, is_causal=is_causal,
                                              scale=scale, enable_gqa=enable_gqa)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    count_eager(sdpa_stats, where)
    if scale is None:  # torch's default 1 / sqrt(D), a Python float also when D is symbolic (torch.compile)
        scale = next(1.0 / math.sqrt(d) for d in set(FLASH_HEAD_DIMS + DECODE_HEAD_DIMS) if q.shape[-1] == d)
    if where == "decode_attn":
        B, Sk = k.shape[0], k.shape[1]
        lens = torch.full((B,), Sk, dtype=torch.int32, device=q.device)
        if isinstance(q, FakeTensor) and not torch.compiler.is_compiling():
            # decode_attn takes the traced path only under torch.compile; fake tensors (make_fx,
            # FakeTensorMode) go through its custom op, whose fake implementation gives the shapes
            out = torch.ops.cute_kernels.decode_attn(q, k, v, lens, None, None, False, scale)[0]
        else:
            out = decode_attn(q, k, v, cache_seqlens=lens, causal=False, softmax_scale=scale)
    else:
        Sq = q.shape[1]
        if is_causal and Sq < k.shape[1]:  # top-left: no query sees a key past Sq - 1
            k, v = k.narrow(1, 0, Sq), v.narrow(1, 0, Sq)
        out = flash_attn(q, k, v, causal=bool(is_causal), softmax_scale=scale,
                         deterministic=torch.are_deterministic_algorithms_enabled())
    return out.transpose(1, 2)
