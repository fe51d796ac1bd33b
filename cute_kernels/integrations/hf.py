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
- Everything else falls back, with one warning per reason, to a path that honours every argument the
  layer passes (:func:`fallback_path` says which):

  - HF's sdpa (``transformers.integrations.sdpa_attention``) when the layer's keywords are ones it
    honours: a non-None mask, dropout, inputs requiring grad, CPU / non-Hopper / non-16-bit tensors,
    head dims or strides the kernels lack, ``position_bias``;
  - the model's own eager attention (``eager_attention_forward`` of the layer's modeling module) for
    anything HF's sdpa ignores or refuses: softcapping (``softcap``), attention sinks (``s_aux``,
    ``sinks``), ``output_attentions=True`` (it returns the weights), and any keyword not in the list
    below.  A boolean mask is turned into the additive form eager attention adds to the scores.

  Either fallback with no mask gets an explicit mask where the kernels' own would differ from the
  fallback's: bottom-right causal over the valid keys (a query shorter than the keys; eager attention
  always, as it applies no causality of its own), block-diagonal for packed sequences.

Keywords the attention function receives (transformers 5.17-5.24, every modeling file's call of the
attention interface) and the path that honours each:

- ``scaling``, ``is_causal``: every path.
- ``dropout`` (> 0): HF's sdpa (``dropout_p``).
- ``position_ids``, ``cache_position``: read for the valid key lengths; no other effect.
- ``sliding_window``: the mask (HF's mask function builds the window into it); with no mask and more
  keys than the window, ValueError.
- ``cu_seq_lens_q/k``, ``max_length_q/k``: the fallback, with an explicit block-diagonal mask (batch 1).
- ``position_bias``: HF's sdpa (added to the scores).
- ``softcap``, ``s_aux``, ``sinks``: the model's eager attention.
- ``output_attentions=True``: the model's eager attention (it returns the weights).
- ``use_cache``, ``output_hidden_states``, ``output_router_logits``, ``num_items_in_batch``,
  ``seq_idx``, ``deterministic``: no effect on attention.
- anything else (``indices``, ``block_indices``, ...): the model's eager attention, with a warning
  naming it.

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

__all__ = ["register", "attention_forward", "mask_function", "fallback_path", "patch_linear", "unpatch_linear",
           "hf_stats", "reset_stats", "NAME", "DECODE_MAX_Q"]

#: The name the functions are registered under (``attn_implementation=NAME``).
NAME = "cute_kernels"
#: Query lengths that run on ``decode_attn`` against a longer K/V.
DECODE_MAX_Q = 16
#: Calls per path since import (or :func:`reset_stats`).
hf_stats = {"flash_attn": 0, "decode_attn": 0, "fallback": 0}
_WARNED: set = set()

R_MASK = "the attention mask is not purely causal (padding, sliding window, packed sequences or a custom mask)"
R_POSITION_BIAS = "the layer passes a position bias"
R_PACKED = "packed sequences (cu_seq_lens_q / cu_seq_lens_k)"
R_POSITIONS = "query positions are inconsistent with the key length"
R_CAUSAL = "causal with more queries than keys"


def reset_stats() -> None:
    """Zero :data:`hf_stats` and forget which fallback reasons were warned about."""
    for k in hf_stats:
        hf_stats[k] = 0
    _WARNED.clear()


#: Keywords that do not change the attention output (``position_ids`` / ``cache_position`` are read
#: for the valid lengths).
NO_EFFECT = frozenset({"position_ids", "cache_position", "use_cache", "output_hidden_states",
                       "output_router_logits", "num_items_in_batch", "seq_idx", "deterministic"})
#: Keywords HF's sdpa honours beyond the mask, dropout, scaling and is_causal arguments.
SDPA_HONOURS = frozenset({"position_bias"})
#: Packed-sequence keywords: honoured by an explicit block-diagonal mask on either fallback.
PACKED = frozenset({"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"})
#: Handled here: the window is in the mask (see :func:`attention_forward`).
WINDOW = "sliding_window"
SDPA, EAGER = "sdpa", "eager"
_FALLBACK_NAMES = {SDPA: "transformers' sdpa attention", EAGER: "the model's eager attention"}


def _warn_once(path: str, reason: str) -> None:
    if not torch.compiler.is_compiling() and (path, reason) not in _WARNED:
        _WARNED.add((path, reason))
        warnings.warn(f"cute_kernels attention: running {_FALLBACK_NAMES[path]}: {reason}", stacklevel=4)


def fallback_path(kwargs: dict) -> tuple[str, str] | None:
    """The fallback a layer's keywords need: ``(EAGER, reason)`` when one of them is something HF's sdpa
    does not honour (softcapping, sinks, ``output_attentions=True``, any keyword not listed in the
    module doc), ``(SDPA, reason)`` for a position bias or packed sequences, None when the kernels
    can honour them all.  Keywords whose value is None (or False) ask for nothing."""
    sdpa_reason = None
    for name, val in kwargs.items():
        if val is None or val is False or name in NO_EFFECT or name == WINDOW:
            continue
        if name in SDPA_HONOURS:
            sdpa_reason = R_POSITION_BIAS
        elif name in PACKED:
            sdpa_reason = sdpa_reason or R_PACKED
        elif name == "softcap":
            return EAGER, "the layer asks for softcapping (softcap)"
        elif name in ("s_aux", "sinks"):
            return EAGER, f"the layer passes attention sinks ({name})"
        elif name == "output_attentions":
            return EAGER, "output_attentions=True (eager attention returns the weights)"
        else:
            return EAGER, f"the layer passes {name!r}, which the kernels and HF's sdpa do not implement"
    return None if sdpa_reason is None else (SDPA, sdpa_reason)


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

    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):  # .all() would raise AttributeError
        raise TypeError(f"mask_function: attention_mask must be a torch.Tensor or None, got "
                        f"{type(attention_mask).__name__}")
    if mask_function is not None and not callable(mask_function):
        raise TypeError(f"mask_function: mask_function must be callable or None, got {type(mask_function).__name__}")
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


def _packed_mask(kwargs, q_len: int, kv_len: int, causal: bool, device) -> torch.Tensor:
    """(1, 1, q_len, kv_len) boolean mask of packed sequences: query i of sequence s sees the keys of
    sequence s (bottom-right causal when ``causal``); rows past the last sequence see nothing."""
    cu_q = kwargs.get("cu_seq_lens_q")
    cu_k = kwargs.get("cu_seq_lens_k", cu_q)
    cu_q = cu_k if cu_q is None else cu_q
    cu_q, cu_k = cu_q.to(device=device, dtype=torch.int64), cu_k.to(device=device, dtype=torch.int64)
    qi, kj = torch.arange(q_len, device=device), torch.arange(kv_len, device=device)
    sq = torch.bucketize(qi, cu_q[1:], right=True)  # the sequence of each row (n: past the last)
    sk = torch.bucketize(kj, cu_k[1:], right=True)
    n = cu_q.numel() - 1
    sqc, skc = sq.clamp(max=max(n - 1, 0)), sk.clamp(max=max(n - 1, 0))
    mask = (sq[:, None] == sk[None, :]) & (sq[:, None] < n)
    if causal:  # key offset <= query offset + (len_k - len_q) of the sequence
        shift = (cu_k[1:] - cu_k[:-1]) - (cu_q[1:] - cu_q[:-1])
        mask &= (kj - cu_k[skc])[None, :] <= (qi - cu_q[sqc] + shift[sqc])[:, None]
    return mask[None, None]


def _causal_mask(kwargs, key, batch: int, q_len: int, kv_len: int) -> torch.Tensor:
    """(batch, 1, q_len, kv_len) boolean bottom-right causal mask over each sequence's valid keys
    (the last position + 1, else all ``kv_len``): query i of sequence b sees keys j <= len_b - q_len + i."""
    lens = _valid_lengths(kwargs, batch, kv_len, key.device)
    if lens is None:
        _need_lengths(key)
        lens = torch.full((batch,), kv_len, dtype=torch.int64, device=key.device)
    kpos = torch.arange(kv_len, device=key.device)
    qpos = torch.arange(q_len, device=key.device)
    return kpos[None, None, None, :] <= (lens[:, None, None, None] - q_len + qpos[None, None, :, None])


def _eager_function(module):
    """The ``eager_attention_forward`` of the layer's modeling module (it implements what the model's
    layers pass: softcapping, sinks, ...)."""
    import sys

    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if fn is None:
        raise ValueError(f"cute_kernels attention: {type(module).__qualname__} passes arguments that neither the "
                         f"kernels nor HF's sdpa implement, and its module {type(module).__module__} has no "
                         "eager_attention_forward to fall back to; load the model with attn_implementation='eager'")
    return fn


def _fallback(path, reason, module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs):
    """Run ``path`` (HF's sdpa or the model's eager attention) with every argument the layer passed.
    With no mask: an explicit block-diagonal mask for packed sequences; a bottom-right causal one
    where the fallback's own causality would differ (HF's sdpa aligns a shorter query top-left and
    reads past a static buffer's valid keys; eager attention applies none)."""
    _warn_once(path, reason)
    hf_stats["fallback"] += 1
    q_len, kv_len = query.shape[2], key.shape[2]
    if attention_mask is None:
        if any(kwargs.get(k) is not None for k in ("cu_seq_lens_q", "cu_seq_lens_k")):
            attention_mask = _packed_mask(kwargs, q_len, kv_len, is_causal, query.device)
        elif is_causal and (kv_len > q_len or (path == EAGER and q_len > 1)):
            attention_mask = _causal_mask(kwargs, key, query.shape[0], q_len, kv_len)
    if path == SDPA:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    fn = _eager_function(module)
    if attention_mask is not None and attention_mask.dtype == torch.bool:  # eager adds the mask to the scores
        attention_mask = torch.where(attention_mask, 0.0, torch.finfo(query.dtype).min).to(query.dtype)
    return fn(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs):
    """The ``AttentionInterface`` entry (HF's signature): query (B, Hq, Sq, D), key/value
    (B, Hkv, Sk, D) (a ``StaticCache``'s whole buffer or a ``DynamicCache``'s valid keys).  Returns
    ``(attn_output (B, Sq, Hq, D), weights or None)``; routing in the module doc."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal)
    args = (module, query, key, value, attention_mask, dropout, scaling, causal, kwargs)
    window = kwargs.get(WINDOW)
    if window is not None and attention_mask is None and key.shape[2] > window:
        raise ValueError(f"cute_kernels attention: a sliding-window layer (sliding_window={window}) got no attention "
                         f"mask for {key.shape[2]} keys; its mask must come from cute_kernels' mask function "
                         "(register() and attn_implementation='cute_kernels') or be passed explicitly")
    need = fallback_path(kwargs)
    if need is not None:
        return _fallback(*need, *args)
    if attention_mask is not None:
        return _fallback(SDPA, R_MASK, *args)
    where, reason = route(query, key, value, None, dropout, False, True, scaling)
    if where == "torch":
        return _fallback(SDPA, reason, *args)
    B, q_len, kv_len = query.shape[0], query.shape[2], key.shape[2]
    if causal and q_len > kv_len:
        return _fallback(SDPA, R_CAUSAL, *args)
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
                return _fallback(SDPA, R_POSITIONS, *args)
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
    16-bit CUDA inputs of the weight's dtype on Hopper, with grad too (gemm is differentiable: the
    backward's two GEMMs run on it); ``F.linear`` otherwise.  Every
    step of a decode loop runs this once per linear: the tests are the cheap ones (device indices,
    not ``torch.device`` objects, but for the Hopper check, cached per index).  The transpose view is made on
    every call: a kept one could outlive ``weight.data = ...`` (same object, same memory, new shape)."""
    w = self.weight
    dev = x.get_device()  # -1: CPU, meta
    if (dev < 0 or dev != w.get_device() or x.dtype != w.dtype or x.dim() < 1 or x.shape[-1] != w.shape[1]
            or x.numel() == 0 or not _is_hopper(x.device)):
        return F.linear(x, w, self.bias)
    out = gemm(x.reshape(-1, w.shape[1]), w.t())
    return out.view(*x.shape[:-1], w.shape[0])


def _check_model(who: str, model) -> None:
    """TypeError naming ``model`` unless it is an ``nn.Module`` (``model.modules()`` would raise
    AttributeError)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"{who}: model must be a torch.nn.Module, got {type(model).__name__}")


def patch_linear(model: nn.Module, *, require_cuda: bool = True) -> int:
    """Route every bias-free ``nn.Linear`` with a 2-D float16/bfloat16 weight (on CUDA, unless
    ``require_cuda=False``) through ``cute_kernels.gemm``; returns how many were patched (already
    patched ones are not counted again).  The patched forward runs ``F.linear`` for inputs the GEMM
    does not take (CPU, other dtypes).  :func:`unpatch_linear` restores them."""
    _check_model("patch_linear", model)
    if type(require_cuda) is not bool:  # a string would pass as its truth value
        raise TypeError(f"patch_linear: require_cuda must be a bool, got {type(require_cuda).__name__} {require_cuda!r}")
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
    _check_model("unpatch_linear", model)
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
