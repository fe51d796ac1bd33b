"""Hugging Face Transformers 5.x on the kernels: ``attn_implementation="cute_kernels"`` and
:func:`patch_linear`.

``register()`` adds an attention function (``transformers.AttentionInterface``) and a mask function
(``transformers.masking_utils.AttentionMaskInterface``) under the name ``"cute_kernels"``; then
``AutoModelForCausalLM.from_config(cfg, attn_implementation="cute_kernels")`` (or
``model.set_attn_implementation("cute_kernels")``) runs attention on the kernels.  transformers is
imported only by these functions: ``import cute_kernels`` never imports it (optional extra ``[hf]``).

The mask function builds no mask (returns None) for a plain causal mask with no padding (the 2-D
``attention_mask`` absent or all ones), as the flash-attention mask path does; any other pattern
(padding, sliding window, packed sequences, or/and overlays, a mask it cannot inspect under tracing)
gets HF's dense sdpa mask, and the attention function then runs HF's sdpa (one warning).

The attention function takes HF's (B, H, S, D) tensors and views them as (B, S, H, D) with
``.transpose(1, 2)`` (no copy):

- Sq <= 16 against a longer K/V (decode, and short prompts into a ``StaticCache``): ``decode_attn``
  on the model's cache tensors in place.  The valid length of each sequence is ``position[-1] + 1``
  of the step's ``cache_position`` (where a model passes one) or ``position_ids`` (transformers 5.17
  passes these), computed on the device: no host sync, no copy, CUDA-graph friendly.  For a
  ``StaticCache`` the key tensor is the whole static buffer, so the lengths must come from there; for
  a ``DynamicCache`` they equal the key length.
- Every other shape (prefill): ``flash_attn`` (bottom-right causal, which is HF's causal mask for a
  cache holding exactly the valid keys).  When the key tensor is longer than the query (a prefill
  into a ``StaticCache``, or a chunk after earlier ones) the valid length is read from the positions
  on the host (one sync per layer of such a prefill) and the keys sliced to it.
- Falls back to HF's sdpa (``transformers.integrations.sdpa_attention``) with one warning per
  reason: a non-None mask, dropout, inputs requiring grad, CPU / non-Hopper / non-16-bit tensors,
  head dims or strides the kernels lack, softcapping, attention sinks, position biases.  A fallback
  with no mask from a longer cache gets an explicit bottom-right causal mask built on the device.

Under tracing (torch.compile, CUDA-graph capture) a given 2-D ``attention_mask`` cannot be inspected,
so the dense mask is built and HF's sdpa runs: transformers compiles ``StaticCache`` decoding on CUDA by
itself, so pass ``generate(..., disable_compile=True)`` to keep decode on the kernels.  ``hf_stats``
counts the calls each way (eager calls; under torch.compile, the traced ones).
"""

from __future__ import annotations

import types
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..gemm import gemm
from .sdpa import _is_hopper, route

__all__ = ["register", "attention_forward", "mask_function", "patch_linear", "unpatch_linear",
           "hf_stats", "reset_stats", "NAME", "DECODE_MAX_Q"]

#: The name the functions are registered under (``attn_implementation=NAME``).
NAME = "cute_kernels"
#: Query lengths that run on ``decode_attn`` against a longer K/V.
DECODE_MAX_Q = 16
#: Calls per path since import (or :func:`reset_stats`).
hf_stats = {"flash_attn": 0, "decode_attn": 0, "fallback": 0}
_WARNED: set = set()

R_MASK = "the attention mask is not purely causal (padding, sliding window, packed sequences or a custom mask)"
R_KWARG = "the layer asks for softcapping, attention sinks or a position bias"
R_POSITIONS = "query positions are inconsistent with the key length"
R_CAUSAL = "causal with more queries than keys"


def reset_stats() -> None:
    """Zero :data:`hf_stats` and forget which fallback reasons were warned about."""
    for k in hf_stats:
        hf_stats[k] = 0
    _WARNED.clear()


def _warn_once(reason: str) -> None:
    if not torch.compiler.is_compiling() and reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(f"cute_kernels attention: running transformers' sdpa attention: {reason}", stacklevel=4)


# --------------------------------------------------------------------------------------------- mask
def _no_padding(attention_mask) -> bool | None:
    """True: no 2-D mask or all ones; False: some padding; None: cannot tell (tracing)."""
    if attention_mask is None:
        return True
    from transformers.utils.import_utils import is_tracing

    if is_tracing(attention_mask):
        return None
    return bool(attention_mask.all())


def mask_function(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                  mask_function=None, attention_mask=None, local_size=None, **kwargs):
    """The ``AttentionMaskInterface`` entry: None for a plain causal mask without padding (the
    attention function applies causality and the cache length itself), otherwise HF's dense sdpa
    mask (boolean, (B, 1, q_length, kv_length)), which makes the attention function fall back."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    fn = causal_mask_function if mask_function is None else mask_function
    if fn is causal_mask_function and local_size is None and _no_padding(attention_mask):
        return None
    kwargs.pop("allow_is_causal_skip", None)
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=fn, attention_mask=attention_mask,
                     local_size=local_size, allow_is_causal_skip=False, **kwargs)


# ---------------------------------------------------------------------------------------- attention
def _valid_lengths(kwargs, batch: int, kv_len: int, device, dtype=torch.int64) -> torch.Tensor | None:
    """(batch,) contiguous device tensor of ``dtype``: keys valid per sequence after this step (last
    position + 1), from ``cache_position`` (1-D) or ``position_ids`` ((1 or B, Sq)); None when neither
    is given.  One small kernel (add with a casting ``out=``): it runs in every layer of every step."""
    cp = kwargs.get("cache_position")
    if isinstance(cp, torch.Tensor) and cp.dim() == 1 and cp.numel():
        last = cp[-1:]
    else:
        pos = kwargs.get("position_ids")
        if not (isinstance(pos, torch.Tensor) and pos.dim() == 2 and pos.shape[0] in (1, batch) and pos.numel()):
            return None
        last = pos[:, -1]
    if last.device != device:
        last = last.to(device)
    return torch.add(last.expand(batch), 1, out=torch.empty(batch, dtype=dtype, device=device))


def _is_static_buffer(t: torch.Tensor) -> bool:
    """HF's StaticCache marks its buffers with ``torch._dynamo.mark_static_address``."""
    return getattr(t, "_dynamo_static_input_type", None) is not None


def _need_lengths(key) -> None:
    if _is_static_buffer(key):
        raise ValueError("cute_kernels attention: the key tensor is a static cache buffer but the model passes "
                         "neither cache_position nor position_ids to its attention function, so the valid length "
                         "is unknown; use attn_implementation='sdpa' or a DynamicCache with this model")


def _fallback(reason, module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs):
    """HF's sdpa attention; with no mask and a causal query shorter than the keys, an explicit
    bottom-right mask over the valid keys (HF's sdpa would align it top-left / read past the end)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    _warn_once(reason)
    hf_stats["fallback"] += 1
    q_len, kv_len = query.shape[2], key.shape[2]
    if attention_mask is None and is_causal and kv_len > q_len:
        lens = _valid_lengths(kwargs, query.shape[0], kv_len, key.device)
        if lens is None:
            _need_lengths(key)
            lens = torch.full((query.shape[0],), kv_len, dtype=torch.int64, device=key.device)
        kpos = torch.arange(kv_len, device=key.device)
        qpos = torch.arange(q_len, device=key.device)
        # query i of sequence b sees keys j <= lens[b] - q_len + i
        attention_mask = kpos[None, None, None, :] <= (lens[:, None, None, None] - q_len + qpos[None, None, :, None])
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs):
    """The ``AttentionInterface`` entry (HF's signature): query (B, Hq, Sq, D), key/value
    (B, Hkv, Sk, D) (a ``StaticCache``'s whole buffer or a ``DynamicCache``'s valid keys).  Returns
    ``(attn_output (B, Sq, Hq, D), None)``; routing in the module doc."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal)
    args = (module, query, key, value, attention_mask, dropout, scaling, causal, kwargs)
    if attention_mask is not None:
        return _fallback(R_MASK, *args)
    if any(kwargs.get(k) is not None for k in ("softcap", "s_aux", "sinks", "position_bias")):
        return _fallback(R_KWARG, *args)
    where, reason = route(query, key, value, None, dropout, False, True, scaling)
    if where == "torch":
        return _fallback(reason, *args)
    B, q_len, kv_len = query.shape[0], query.shape[2], key.shape[2]
    if causal and q_len > kv_len:
        return _fallback(R_CAUSAL, *args)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    q = query.transpose(1, 2)
    if where == "decode_attn":  # Sq <= 16 < Sk: the cache in place, lengths on the device
        from ..attention.decode import decode_attn

        lens = _valid_lengths(kwargs, B, kv_len, key.device, torch.int32) if causal else None
        if lens is None:
            if causal:
                _need_lengths(key)
            lens = torch.full((B,), kv_len, dtype=torch.int32, device=key.device)
        out = decode_attn(q, key.transpose(1, 2), value.transpose(1, 2), cache_seqlens=lens, causal=causal,
                          softmax_scale=scale)
        hf_stats["decode_attn"] += 1
        return out, None
    from ..attention.forward import flash_attn

    if causal and kv_len > q_len:  # a prefill into a longer cache: slice to the valid keys (host sync)
        lens = _valid_lengths(kwargs, B, kv_len, key.device)
        if lens is None:
            _need_lengths(key)
            valid = kv_len
        else:
            valid = int(lens[0])
            if not q_len <= valid <= kv_len:
                return _fallback(R_POSITIONS, *args)
        key, value = key.narrow(2, 0, valid), value.narrow(2, 0, valid)
    out = flash_attn(q, key.transpose(1, 2), value.transpose(1, 2), causal=causal, softmax_scale=scale)
    hf_stats["flash_attn"] += 1
    return out, None


def register() -> None:
    """Register :func:`attention_forward` and :func:`mask_function` under :data:`NAME` with
    transformers (>= 5); idempotent."""
    import transformers
    from transformers.masking_utils import AttentionMaskInterface

    if int(transformers.__version__.split(".")[0]) < 5:
        raise ImportError(f"cute_kernels.integrations.hf needs transformers>=5,<6 (found {transformers.__version__}); "
                          "pip install 'cute-kernels[hf]'")
    transformers.AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, mask_function)


# ------------------------------------------------------------------------------------------- linear
_HALF = (torch.float16, torch.bfloat16)
_ORIG = "_cute_kernels_orig_forward"


def _gemm_linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` on ``cute_kernels.gemm`` (the weight read as a column-major B, no copy) for
    16-bit CUDA inputs of the weight's dtype on Hopper without grad; ``F.linear`` otherwise.  Every
    step of a decode loop runs this once per linear: the tests are the cheap ones (device indices,
    not ``torch.device`` objects, but for the Hopper check, cached per index).  The transpose view is made on
    every call: a kept one could outlive ``weight.data = ...`` (same object, same memory, new shape)."""
    w = self.weight
    dev = x.get_device()  # -1: CPU, meta
    if (dev < 0 or dev != w.get_device() or x.dtype != w.dtype or x.dim() < 1 or x.shape[-1] != w.shape[1]
            or x.numel() == 0 or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
            or not _is_hopper(x.device)):
        return F.linear(x, w, self.bias)
    out = gemm(x.reshape(-1, w.shape[1]), w.t())
    return out.view(*x.shape[:-1], w.shape[0])


def patch_linear(model: nn.Module, *, require_cuda: bool = True) -> int:
    """Route every bias-free ``nn.Linear`` with a 2-D float16/bfloat16 weight (on CUDA, unless
    ``require_cuda=False``) through ``cute_kernels.gemm``; returns how many were patched (already
    patched ones are not counted again).  The patched forward runs ``F.linear`` for inputs the GEMM
    does not take (CPU, other dtypes, grad).  :func:`unpatch_linear` restores them."""
    n = 0
    for mod in model.modules():
        w = getattr(mod, "weight", None)
        if (not isinstance(mod, nn.Linear) or mod.bias is not None or not isinstance(w, torch.Tensor)
                or w.dim() != 2 or w.dtype not in _HALF or (require_cuda and w.device.type != "cuda")
                or hasattr(mod, _ORIG)):
            continue
        setattr(mod, _ORIG, mod.__dict__.get("forward"))  # an instance-level forward, if any
        mod.forward = types.MethodType(_gemm_linear_forward, mod)
        n += 1
    return n


def unpatch_linear(model: nn.Module) -> int:
    """Undo :func:`patch_linear`; returns how many layers were restored."""
    n = 0
    for mod in model.modules():
        if not hasattr(mod, _ORIG):
            continue
        orig = mod.__dict__.pop(_ORIG)
        if orig is None:
            del mod.forward
        else:
            mod.forward = orig
        n += 1
    return n
