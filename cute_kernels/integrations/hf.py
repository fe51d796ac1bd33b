"""Hugging Face Transformers 5.x on the kernels: ``attn_implementation="cute_kernels"`` and
:func:`patch_linear`.

``register()`` adds an attention function (``transformers.AttentionInterface``) and a mask function
(``transformers.masking_utils.AttentionMaskInterface``) under the name ``"cute_kernels"``; then
``AutoModelForCausalLM.from_config(cfg, attn_implementation="cute_kernels")`` (or
``model.set_attn_implementation("cute_kernels")``) runs attention on the kernels.  transformers is
imported only by these functions: ``import cute_kernels`` never imports it (optional extra ``[hf]``).

Mask function (as HF's flash-attention one, ``masking_utils.flash_attention_mask``): for the two
patterns the attention function applies itself, plain causal and HF's sliding-window causal
(``sliding_window_causal_mask_function(W)``, recognised by its structure, ``local_size == W``), it
builds no dense mask.  It returns None when the 2-D ``attention_mask`` is absent or all ones over the
keys the layer sees (its last ``kv_length`` columns), and otherwise that 2-D boolean slice
(B, kv_length or fewer): which keys are padding.  Any other pattern (packed sequences detected from the
positions, or/and overlays, chunked or bidirectional masks) and any mask it cannot inspect (tracing:
torch.compile, CUDA-graph capture) gets HF's dense sdpa mask, which makes the attention function fall
back.  The window itself is not in what it returns: the attention function takes it from the layer's
``sliding_window`` keyword, as HF's flash-attention integration does (every sliding layer of
transformers 5.17-5.24 passes it).

Attention function: HF's (B, H, S, D) tensors viewed as (B, S, H, D) with ``.transpose(1, 2)`` (no
copy).  The keys a layer passes are consecutive positions ending at its last query (bottom-right
alignment), whatever the cache:

- ``DynamicCache`` full layers: every key so far.  Sliding layers (``DynamicSlidingWindowLayer``) keep
  the last W - 1 keys and pass those plus the step's new ones (a prefill: the whole prompt), so a
  decode step sees at most W keys.
- ``StaticCache`` full layers: the whole static buffer (``max_cache_len`` slots; the first
  ``position + 1`` valid).  Sliding layers (``StaticSlidingWindowLayer``, min(W, max_cache_len)
  slots): until the buffer fills, the buffer with the first ``position + 1`` slots valid; a prefill or
  chunk that overflows it, a fresh tensor of the kept and new keys (all valid); once full, a one-token
  step rolls the buffer left and writes the new key last, so the buffer holds the last W positions in
  order (all valid: ``min(position + 1, buffer length)``).

Routing, per call:

- No mask (no padding): Sq <= 16 against a longer K/V whose valid length can exceed no window
  (``sliding_window`` None or the key length <= W: always so for HF's sliding caches at one token a
  step): ``decode_attn`` on the cache tensors in place, each sequence's valid length on the device
  (``position[-1] + 1`` of ``cache_position`` or ``position_ids``, clamped to the buffer length on a
  sliding layer; no host sync, CUDA-graph friendly).  Everything else: ``flash_attn`` (bottom-right
  causal; keys sliced to the valid length read on the host when the key tensor is longer than the
  query), with ``window_size=(W - 1, 0)`` when more than W keys are valid (HF's window: key j visible
  to query i when i - W < j <= i).
- A 2-D padding mask (left or right padding, prefill and decode): unpadded to packed sequences
  (``cu_seqlens_q/k`` from the mask: its columns are a static buffer's first keys or another key
  tensor's last ones, the queries its last Sq columns; one device-to-host copy of the mask per mask
  and query length, reused by every layer given the same mask object) and one packed ``flash_attn``
  call (causal and window per sequence), its output scattered back to (B, Sq, H, D) with zeros at
  padded query rows (as HF's flash-attention integration).  Exact for any causal padding pattern;
  with a window, for masks whose valid keys form one run per sequence (left or right padding); a gap
  under a window narrower than the mask falls back.  A left-padded decode step (every new token
  valid, each sequence's keys one run ending at the last column) reads the cache in place:
  ``decode_attn`` with ``cache_leftpad`` (the first valid column) and the window in cache columns, as
  HF's mask counts them (softcap and sinks included); other padded decode steps gather each
  sequence's valid keys (a copy).
- Softcapping (``softcap``, Gemma-2) and attention sinks (``s_aux`` / ``sinks``, gpt-oss: one logit
  per query head joining the softmax denominator with no value, exactly FlashAttention-4's
  ``learnable_sink``; passed as float32) go to whichever kernel runs.
- Everything else falls back, with one warning per reason, to a path that honours every argument the
  layer passes (:func:`fallback_path` for the keywords that force one):

  - the model's own eager attention (``eager_attention_forward`` of the layer's modeling module) when
    the layer passes softcapping or sinks (HF's sdpa honours neither), ``output_attentions=True`` (it
    returns the weights) or any keyword not in the list below; a boolean mask is turned into the
    additive form eager attention adds to the scores;
  - HF's sdpa (``transformers.integrations.sdpa_attention``) otherwise.

  Reasons: a dense (4-D) mask (custom, an unrecognised pattern, or built under tracing), a padding
  mask under tracing (unpadding is data-dependent: torch.compile and CUDA-graph capture cannot run
  it), dropout, CPU / non-Hopper / non-16-bit tensors, head dims or strides the kernels lack,
  causal with more queries than keys, query positions inconsistent with a static buffer,
  ``position_bias``, packed sequences given by keywords with a mask, a batch above 1 or lengths that are
  not int32-castable tensors and ints.

  A fallback gets an explicit boolean mask where the kernels' own masking would differ from its own:
  bottom-right causal over the valid keys with the window (no mask: a query shorter than the keys, a
  window narrower than them, eager attention always), the padding mask expanded with causality and the
  window (keys cut to the mask's width), block-diagonal for packed sequences.

Keywords the attention function receives (transformers 5.17-5.24, every modeling file's call of the
attention interface) and the path that honours each:

- ``scaling``, ``is_causal``: every path.
- ``sliding_window``: the kernels (``window_size``); a fallback, in its explicit mask.  A non-causal
  layer with a window narrower than its keys needs a dense mask (ValueError without one).
- ``softcap``, ``s_aux``, ``sinks``: the kernels; a fallback, the model's eager attention.
- ``dropout`` (> 0): HF's sdpa (``dropout_p``), or eager attention with softcap / sinks.
- ``position_ids``, ``cache_position``: read for the valid key lengths; no other effect.
- ``cu_seq_lens_q/k``, ``max_length_q/k`` (a padding-free collator's batch of one): one packed
  ``flash_attn`` call (differentiable); the fallback, with an explicit block-diagonal mask, where they
  come with a mask or a batch above 1.
- ``position_bias``: HF's sdpa (added to the scores).
- ``output_attentions=True``: the model's eager attention (it returns the weights).
- ``deterministic`` (HF's flash-attention keyword): the backward's deterministic mode; when the layer
  does not pass it, on if ``FLASH_ATTENTION_DETERMINISTIC=1`` (HF's variable) or
  ``torch.use_deterministic_algorithms(True)`` is set.  The forward is deterministic either way.
- ``use_cache``, ``output_hidden_states``, ``output_router_logits``, ``num_items_in_batch``,
  ``seq_idx``: no effect on attention.
- anything else (``indices``, ``block_indices``, ...): the model's eager attention, with a warning
  naming it.

Under tracing a given 2-D ``attention_mask`` cannot be inspected, so the dense mask is built and the
fallback runs: transformers compiles ``StaticCache`` decoding on CUDA by itself, so pass
``generate(..., disable_compile=True)`` to keep decode on the kernels.  ``hf_stats`` counts the eager
calls each way (calls under torch.compile are not counted: a traced count would make dynamo guard on
it and recompile every call): ``flash_attn`` (dense or packed), ``decode_attn``, ``fallback``.

Host cost of a decode step (eager): the layers of one step pass tensors of the same metadata and the
same keywords, so a call with no mask whose key matches an earlier call that reached the kernels takes
that call's decision without its checks (:mod:`.hf_step` lists the key and why it is complete: the
same kernel with the same arguments, and every fallback, reason and error from the full checks as
before), and the valid lengths (and a sliding layer's clamp of them) are computed once per step.
"""

from __future__ import annotations

import math
import os
import numbers
import warnings

import torch
import torch.nn as nn

from ..attention import decode as _decode, forward as _forward  # (imported by .sdpa; kernels looked up per call)
from . import hf_step as _step
from .hf_masks import (  # noqa: F401  (mask_function, Unpad, unpad_metadata: this module's API)
    _UNPAD_CACHE, Unpad, _causal_band, _cu_seq_lens, _fit_padding, _packed_mask, _padding_dense, _padding_mask,
    _unpad_cached, mask_function, unpad_metadata,
)
from .hf_linear import patch_linear, unpatch_linear  # noqa: F401  (this module's API)
from .hf_step import _clamp_lengths, _need_lengths, _valid_lengths
from .sdpa import count_eager, route

__all__ = ["register", "attention_forward", "mask_function", "fallback_path", "unpad_metadata", "Unpad",
           "patch_linear", "unpatch_linear", "hf_stats", "reset_stats", "NAME", "DECODE_MAX_Q"]

#: The name the functions are registered under (``attn_implementation=NAME``).
NAME = "cute_kernels"
#: Query lengths that run on ``decode_attn`` against a longer K/V.
DECODE_MAX_Q = 16
#: Calls per path since import (or :func:`reset_stats`).
hf_stats = {"flash_attn": 0, "decode_attn": 0, "fallback": 0}
_WARNED: set = set()

R_MASK = ("the attention mask is one the kernels do not take (a dense mask: custom, packed sequences, "
          "an overlay, or built under tracing)")
R_POSITION_BIAS = "the layer passes a position bias"
R_PACKED = "packed sequences (cu_seq_lens_q / cu_seq_lens_k)"
R_POSITIONS = "query positions are inconsistent with the key length"
R_CAUSAL = "causal with more queries than keys"
R_TRACED_PADDING = "a padding mask under tracing (torch.compile / CUDA-graph capture cannot unpad: data-dependent)"
R_GAPS = "a padding mask with gaps inside a sequence under a sliding window"
R_SOFTCAP = "the softcap is not a finite number >= 0"
R_SINKS = "the sinks are not one logit per query head"


def reset_stats() -> None:
    """Zero :data:`hf_stats` and forget which fallback reasons were warned about (and the cached
    unpadding and call-site decisions)."""
    for k in hf_stats:
        hf_stats[k] = 0
    _WARNED.clear()
    _UNPAD_CACHE.clear()
    _step.clear()


#: Keywords that do not change the attention output (``position_ids`` / ``cache_position`` are read
#: for the valid lengths).
NO_EFFECT = frozenset({"position_ids", "cache_position", "use_cache", "output_hidden_states",
                       "output_router_logits", "num_items_in_batch", "seq_idx"})
#: Keywords HF's sdpa honours beyond the mask, dropout, scaling and is_causal arguments.
SDPA_HONOURS = frozenset({"position_bias"})
#: Packed-sequence keywords: honoured by an explicit block-diagonal mask on either fallback.
PACKED = frozenset({"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"})
#: The kernels apply these (``window_size``, ``softcap``, ``learnable_sink``); a fallback takes the
#: model's eager attention for the last three (HF's sdpa honours neither).
WINDOW = "sliding_window"
SINKS = ("s_aux", "sinks")
KERNEL_HONOURS = frozenset({WINDOW, "softcap", *SINKS, "deterministic"})
SDPA, EAGER = "sdpa", "eager"
_FALLBACK_NAMES = {SDPA: "transformers' sdpa attention", EAGER: "the model's eager attention"}


def _warn_once(path: str, reason: str) -> None:
    if not torch.compiler.is_compiling() and (path, reason) not in _WARNED:
        _WARNED.add((path, reason))
        warnings.warn(f"cute_kernels attention: running {_FALLBACK_NAMES[path]}: {reason}", stacklevel=4)


def fallback_path(kwargs: dict) -> tuple[str, str] | None:
    """The fallback a layer's keywords force: ``(EAGER, reason)`` for ``output_attentions=True`` or a
    keyword not listed in the module doc, ``(SDPA, reason)`` for a position bias or packed sequences,
    None when the kernels honour them all (softcapping, sinks and the window included).  Keywords whose
    value is None (or False) ask for nothing."""
    sdpa_reason = None
    for name, val in kwargs.items():
        if val is None or val is False or name in NO_EFFECT or name in KERNEL_HONOURS:
            continue
        if name in SDPA_HONOURS:
            sdpa_reason = R_POSITION_BIAS
        elif name in PACKED:
            sdpa_reason = sdpa_reason or R_PACKED
        elif name == "output_attentions":
            return EAGER, "output_attentions=True (eager attention returns the weights)"
        else:
            return EAGER, f"the layer passes {name!r}, which the kernels and HF's sdpa do not implement"
    return None if sdpa_reason is None else (SDPA, sdpa_reason)


def _eager_needed(kwargs: dict) -> bool:
    """The layer passes softcapping or sinks: only its eager attention honours them off the kernels."""
    return kwargs.get("softcap") is not None or any(kwargs.get(n) is not None for n in SINKS)


# ---------------------------------------------------------------------------------------- fallbacks
def _causal_mask(kwargs, key, batch: int, q_len: int, kv_len: int, window=None) -> torch.Tensor:
    """(batch, 1, q_len, kv_len) boolean bottom-right causal mask over each sequence's valid keys
    (the last position + 1, at most ``kv_len``; else all ``kv_len``): query i of sequence b sees keys
    len_b - q_len + i - window < j <= len_b - q_len + i."""
    lens = _valid_lengths(kwargs, batch, kv_len, key.device)
    if lens is None:
        _need_lengths(key)
        lens = torch.full((batch,), kv_len, dtype=torch.int64, device=key.device)
    lens = lens.clamp(max=kv_len)
    kpos = torch.arange(kv_len, device=key.device)[None, None, None, :]
    last = lens[:, None, None, None] - q_len + torch.arange(q_len, device=key.device)[None, None, :, None]
    return _causal_band(kpos, last, window)


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
    """Run ``path`` (HF's sdpa or the model's eager attention; None: eager where the layer passes
    softcapping or sinks, else sdpa) with every argument the layer passed.  With no mask: an explicit
    block-diagonal mask for packed sequences; a bottom-right causal one (with the window) where the
    fallback's own masking would differ (HF's sdpa aligns a shorter query top-left, reads past a static
    buffer's valid keys and knows no window; eager attention applies none).  A 2-D padding mask becomes
    the dense one HF's mask function would have built."""
    if path is None:
        path = EAGER if _eager_needed(kwargs) else SDPA
    _warn_once(path, reason)
    count_eager(hf_stats, "fallback")
    q_len, kv_len = query.shape[2], key.shape[2]
    window = kwargs.get(WINDOW)
    if attention_mask is None:
        if any(kwargs.get(k) is not None for k in ("cu_seq_lens_q", "cu_seq_lens_k")):
            attention_mask = _packed_mask(kwargs, q_len, kv_len, is_causal, query.device, window)
        elif is_causal and (kv_len > q_len or (path == EAGER and q_len > 1) or (window is not None and kv_len > window)):
            attention_mask = _causal_mask(kwargs, key, query.shape[0], q_len, kv_len, window)
    elif _padding_mask(attention_mask, query.shape[0], q_len):
        attention_mask, key, value = _fit_padding(attention_mask, key, value)
        attention_mask = _padding_dense(attention_mask, q_len, is_causal, window)
    if path == SDPA:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    fn = _eager_function(module)
    if attention_mask is not None and attention_mask.dtype == torch.bool:  # eager adds the mask to the scores
        attention_mask = torch.where(attention_mask, 0.0, torch.finfo(query.dtype).min).to(query.dtype)
    return fn(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


# ---------------------------------------------------------------------------------------- attention
def _variant(kwargs, heads_q: int, device):
    """``(softcap, sink, reason)``: the softcap as the kernels' float (0.0: off), the sinks as a (Hq,)
    float32 tensor on ``device`` (or None), and a fallback reason when they are not numbers the
    kernels take."""
    softcap = kwargs.get("softcap")
    if softcap is None:
        softcap = 0.0
    elif isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) or not 0 <= softcap < math.inf:
        return 0.0, None, R_SOFTCAP
    else:
        softcap = float(softcap)
    sink, ok = _sink(kwargs, heads_q, device)
    return (softcap, sink, None) if ok else (softcap, None, R_SINKS)


def _sink(kwargs, heads_q: int, device):
    """``(sink, ok)``: the first of ``s_aux`` / ``sinks`` that is not None, as a (Hq,) float32 tensor on
    ``device`` (None without one); ``ok`` False when it is not one logit per query head."""
    sink = kwargs.get("s_aux")
    if sink is None:
        sink = kwargs.get("sinks")
    if sink is None:
        return None, True
    if not isinstance(sink, torch.Tensor) or sink.dim() != 1 or sink.shape[0] != heads_q:
        return None, False
    return sink.to(device=device, dtype=torch.float32), True


def _deterministic(kwargs) -> bool:
    """The backward's mode for a layer: its ``deterministic`` keyword, else HF's
    ``FLASH_ATTENTION_DETERMINISTIC=1`` or torch's ``use_deterministic_algorithms(True)``."""
    det = kwargs.get("deterministic")
    if det is None:
        return torch.are_deterministic_algorithms_enabled() or os.environ.get("FLASH_ATTENTION_DETERMINISTIC") == "1"
    return bool(det)


def _window_size(window, valid: int) -> tuple:
    """``flash_attn``'s window for HF's ``sliding_window`` W (key j visible to query i when
    i - W < j <= i): ``(W - 1, 0)``, unbounded when no query can see more than W keys."""
    return (window - 1, 0) if window is not None and valid > window else (-1, -1)


def attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs):
    """The ``AttentionInterface`` entry (HF's signature): query (B, Hq, Sq, D), key/value
    (B, Hkv, Sk, D) (a ``StaticCache``'s buffer or the keys a ``DynamicCache`` layer returns), the
    mask from :func:`mask_function` (None, a 2-D padding mask or a dense one).  Returns
    ``(attn_output (B, Sq, Hq, D), weights or None)``; routing in the module doc.  A call with no mask
    whose tensors' metadata and keywords match an earlier call that reached the kernels takes that
    call's decision without repeating its checks (:mod:`.hf_step`: the same decision, fallbacks
    included)."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal)
    compiling = torch.compiler.is_compiling()
    if attention_mask is None and not compiling:
        hit = _step.lookup(query, key, value, dropout, scaling, causal, kwargs)
        if hit is not None:
            sink, ok = _sink(kwargs, hit.heads_q, hit.device) if hit.sinks else (None, True)
            if ok:  # (else the full checks: the sinks' fallback)
                softcap = kwargs.get("softcap")
                return _on_kernels(hit.where, (module, query, key, value, None, dropout, scaling, causal, kwargs),
                                   hit.batch, hit.q_len, key.shape[2], hit.device, kwargs.get(WINDOW),
                                   float(scaling) if scaling is not None else hit.scale,
                                   0.0 if softcap is None else float(softcap), sink, False)
    args = (module, query, key, value, attention_mask, dropout, scaling, causal, kwargs)
    B, q_len, kv_len = query.shape[0], query.shape[2], key.shape[2]
    window = kwargs.get(WINDOW)
    if window is not None and not causal and kv_len > window and (
            attention_mask is None or _padding_mask(attention_mask, B, q_len)):
        raise ValueError(f"cute_kernels attention: a non-causal sliding-window layer (sliding_window={window}) got "
                         f"no dense attention mask for {key.shape[2]} keys; pass one explicitly")
    need = fallback_path(kwargs)
    packed = need == (SDPA, R_PACKED)
    if packed and (attention_mask is not None or B != 1 or _packed_lengths(kwargs) is None):
        return _fallback(*need, *args)  # (what the keywords describe is one batch of packed rows, no mask)
    if need is not None and not packed:
        return _fallback(*need, *args)
    padded = attention_mask is not None
    if padded and not _padding_mask(attention_mask, B, q_len):
        return _fallback(None, R_MASK, *args)
    where, reason = route(query, key, value, None, dropout, False, True, scaling)
    if where == "torch":
        return _fallback(None, reason, *args)
    softcap, sink, reason = _variant(kwargs, query.shape[1], query.device)
    if reason is not None:
        return _fallback(EAGER, reason, *args)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    if packed:
        return _packed_keywords(query, key, value, kwargs, causal, softcap, sink, scale)
    if causal and q_len > kv_len:
        return _fallback(None, R_CAUSAL, *args)
    if padded:
        return _padded(args, softcap, sink, scale, where)
    if not compiling:  # the next calls of this key skip the checks above
        _step.remember(query, key, value, dropout, scaling, causal, kwargs, where,
                       tuple(n for n in kwargs if n not in NO_EFFECT and n not in KERNEL_HONOURS))
    return _on_kernels(where, args, B, q_len, kv_len, key.device, window, scale, softcap, sink, compiling)


def _on_kernels(where, args, B, q_len, kv_len, device, window, scale, softcap, sink, compiling):
    """A call without a mask that the checks sent to ``where``: ``decode_attn`` on the cache in place
    (the valid lengths on the device) or ``flash_attn`` (keys sliced to the valid length read on the
    host when the key tensor is longer than the query; the fallback where the positions do not fit)."""
    module, query, key, value, attention_mask, dropout, scaling, causal, kwargs = args
    q = query.transpose(1, 2)
    if where == "decode_attn" and (window is None or kv_len <= window):  # the cache in place, lengths on the device
        lens = _valid_lengths(kwargs, B, kv_len, device, torch.int32, compiling) if causal else None
        if lens is None:
            if causal:
                _need_lengths(key)
            lens = torch.full((B,), kv_len, dtype=torch.int32, device=device)
        elif window is not None:  # a full sliding buffer holds the last kv_len positions
            lens = lens.clamp(max=kv_len) if compiling else _clamp_lengths(lens, kv_len)
        out = _decode.decode_attn(q, key.transpose(1, 2), value.transpose(1, 2), cache_seqlens=lens, causal=causal,
                                  softmax_scale=scale, softcap=softcap, learnable_sink=sink)
        if not compiling:  # (hf_stats' doc: a traced count would make dynamo guard on it)
            hf_stats["decode_attn"] += 1
        return out, None
    valid = kv_len
    if causal and kv_len > q_len:  # a prefill into a longer cache: slice to the valid keys (host sync)
        lens = _valid_lengths(kwargs, B, kv_len, device, compiling=compiling)
        if lens is None:
            _need_lengths(key)
        else:
            valid = int(lens[0])
            if window is not None:
                valid = min(valid, kv_len)
            if not q_len <= valid <= kv_len:
                return _fallback(None, R_POSITIONS, *args)
        key, value = key.narrow(2, 0, valid), value.narrow(2, 0, valid)
    out = _forward.flash_attn(q, key.transpose(1, 2), value.transpose(1, 2), causal=causal, softmax_scale=scale,
                              deterministic=_deterministic(kwargs),
                              window_size=_window_size(window if causal else None, valid), softcap=softcap,
                              learnable_sink=sink)
    if not compiling:
        hf_stats["flash_attn"] += 1
    return out, None


def _padded(args, softcap, sink, scale, where):
    """A 2-D padding mask: a left-padded decode step reads the cache in place (``decode_attn`` with
    ``cache_leftpad``; not with grad: ``decode_attn`` has no backward); anything else packs the valid
    queries and keys, runs one packed ``flash_attn`` (differentiable) and scatters the output back
    (zeros at padded query rows)."""
    from transformers.utils.import_utils import is_tracing

    module, query, key, value, attention_mask, dropout, scaling, causal, kwargs = args
    B, Hq, q_len, D = query.shape
    if is_tracing(attention_mask) or is_tracing(query):
        return _fallback(None, R_TRACED_PADDING, *args)
    grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    mask, key, value = _fit_padding(attention_mask, key, value)
    window = kwargs.get(WINDOW)
    meta = _unpad_cached(mask, q_len)
    if causal and window is not None and not meta.one_run and mask.shape[1] > window:
        return _fallback(None, R_GAPS, *args)  # HF's window counts the gaps' columns, packing would not
    if where == "decode_attn" and causal and meta.one_run and meta.all_queries and not grad:
        return _left_padded_decode(query, key, value, meta, window, softcap, sink, scale)
    win = _window_size(window if causal else None, meta.max_seqlen_k)
    count_eager(hf_stats, "flash_attn")
    if meta.total_q == 0:
        return query.new_zeros(B, q_len, Hq, D), None
    from ..attention.forward import flash_attn

    q = query.transpose(1, 2)[meta.q_index]
    k, v = key.transpose(1, 2)[meta.k_index], value.transpose(1, 2)[meta.k_index]
    o = flash_attn(q, k, v, cu_seqlens_q=meta.cu_seqlens_q, cu_seqlens_k=meta.cu_seqlens_k,
                   max_seqlen_q=meta.max_seqlen_q, max_seqlen_k=meta.max_seqlen_k, causal=causal,
                   softmax_scale=scale, window_size=win, softcap=softcap, learnable_sink=sink,
                   deterministic=_deterministic(kwargs))
    if meta.all_queries:
        return o.view(B, q_len, Hq, D), None
    out = o.new_zeros(B, q_len, Hq, D)
    out[meta.q_index] = o
    return out, None


def _packed_lengths(kwargs):
    """``(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)`` from HF's packed-sequence keywords
    (``cu_seq_lens_q/k`` tensors, ``max_length_q/k`` ints; a missing k side is the q side's), cu_seqlens
    as int32 on their device (a cast, no sync); None when they are not that (the fallback then applies
    them as a mask)."""
    cu_q, cu_k = _cu_seq_lens(kwargs)
    mq, mk = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    mq = mk if mq is None else mq
    mk = mq if mk is None else mk
    if not (isinstance(cu_q, torch.Tensor) and isinstance(cu_k, torch.Tensor) and cu_q.dim() == cu_k.dim() == 1
            and cu_q.shape == cu_k.shape and cu_q.shape[0] >= 1):
        return None
    if any(isinstance(m, bool) or not isinstance(m, int) or m < 0 for m in (mq, mk)):
        return None
    return cu_q.to(torch.int32), cu_k.to(torch.int32), mq, mk


def _packed_keywords(query, key, value, kwargs, causal, softcap, sink, scale):
    """One batch of packed sequences given by keywords (a padding-free collator's ``cu_seq_lens_q/k``,
    ``max_length_q/k``): one packed ``flash_attn`` call (differentiable), each sequence's causal
    diagonal and window its own."""
    from ..attention.forward import flash_attn

    cu_q, cu_k, mq, mk = _packed_lengths(kwargs)
    window = kwargs.get(WINDOW)
    o = flash_attn(query.transpose(1, 2)[0], key.transpose(1, 2)[0], value.transpose(1, 2)[0], cu_seqlens_q=cu_q,
                   cu_seqlens_k=cu_k, max_seqlen_q=mq, max_seqlen_k=mk, causal=causal, softmax_scale=scale,
                   window_size=_window_size(window if causal else None, mk), softcap=softcap, learnable_sink=sink,
                   deterministic=_deterministic(kwargs))
    count_eager(hf_stats, "flash_attn")
    return o.unsqueeze(0), None


def _left_padded_decode(query, key, value, meta: Unpad, window, softcap, sink, scale):
    """A decode step of a left-padded batch: every query valid and each sequence's keys one run, so the
    run ends at the last column and starts at column ``n - keys``: ``decode_attn`` reads the cache in
    place with ``cache_leftpad`` (positions in cache columns, as HF's window counts them)."""
    from ..attention.decode import decode_attn

    B, n = query.shape[0], key.shape[2]
    keys = meta.cu_seqlens_k[1:] - meta.cu_seqlens_k[:-1]
    lens = torch.full((B,), n, dtype=torch.int32, device=key.device)
    out = decode_attn(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), cache_seqlens=lens,
                      cache_leftpad=(n - keys).to(torch.int32), causal=True, softmax_scale=scale,
                      window_size=(window - 1, 0) if window is not None else (-1, -1), softcap=softcap,
                      learnable_sink=sink)
    count_eager(hf_stats, "decode_attn")
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
