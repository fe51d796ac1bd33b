"""The model families of ``cute-kernels bench model`` (``--family``): their configs and what their
caches need beyond :func:`.bench_model.make_cache`'s random fill (issue 34).

- ``llama``: ``LlamaConfig`` of :data:`LLAMA3_8B`'s shapes; every layer full attention.
- ``mistral``: ``MistralConfig`` of the same shapes with ``sliding_window`` :data:`MISTRAL_WINDOW`
  (every layer a sliding one): at context 32k the window bounds attention; at 4k = W the step's
  token sees positions 1..4096 (one key fewer than a full layer).

A ``StaticCache`` built from a config with ``sliding_window`` gives its sliding layers
(``StaticSlidingWindowLayer``) a buffer of min(W, max_cache_len) slots.  After a prefill of ctx
tokens HF's ``update`` (transformers 5.17 and 5.24 alike) leaves it as:

- ctx >= buffer length S ("full"): slots 0..S-1 hold positions ctx-S..ctx-1 in order (the fast
  prefill path copies the last S keys; a prefill of exactly S writes slots 0..S-1), the Python
  ``cumulative_length_int`` = ctx; a one-token step rolls the buffer left and writes the new key in
  slot S-1 (the tensor ``cumulative_length`` is not read);
- ctx < S: slots 0..ctx-1 hold positions 0..ctx-1, both lengths = ctx; a step writes slot ctx.

``make_cache``'s random fill of slots [:ctx] (the whole buffer when full) with the tensor length a
view of its ``lengths`` buffer is that state once ``cumulative_length_int`` is set to ctx
(:func:`sliding_layers`, reset every step by ``DecodeStep``: a step adds 1 to it, which would flip a
buffer that is not yet full to full after S - ctx steps).  A full buffer's contents move every step
(the roll): :func:`snapshot` restores them before each side's first steps, so the sides' logits are
compared on the same keys.  HF's update of a full buffer cannot be captured in a CUDA graph: the
sliding layers get :func:`capturable_update`, the same work, on every side.
"""

from __future__ import annotations

#: Llama-3-8B's shapes (only the layer count differs)
LLAMA3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
             "head_dim": 128, "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
             "max_position_embeddings": 131072, "tie_word_embeddings": False}
#: the mistral family's sliding window (Mistral-7B-v0.1's)
MISTRAL_WINDOW = 4096
FAMILIES = ("llama", "mistral")
TITLES = {"llama": "Llama-3-8B shapes",
          "mistral": f"Mistral (Llama-3-8B shapes, sliding window {MISTRAL_WINDOW})"}


def llama_config(layers: int, **over):
    from transformers import LlamaConfig

    return LlamaConfig(**{**LLAMA3_8B, "num_hidden_layers": layers, **over})


def mistral_config(layers: int, **over):
    """``MistralConfig`` of :data:`LLAMA3_8B`'s shapes, ``sliding_window`` :data:`MISTRAL_WINDOW`
    (``over`` may change either)."""
    from transformers import MistralConfig

    return MistralConfig(**{**LLAMA3_8B, "sliding_window": MISTRAL_WINDOW, "num_hidden_layers": layers, **over})


def family_config(family: str, layers: int, **over):
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r} (expected one of {', '.join(FAMILIES)})")
    return (llama_config if family == "llama" else mistral_config)(layers, **over)


def model_meta(family: str, layers: int) -> dict:
    """The record's ``meta["model"]``: the family's shapes."""
    out = {**LLAMA3_8B, "num_hidden_layers": layers, "dtype": "bfloat16"}
    return {**out, "sliding_window": MISTRAL_WINDOW} if family == "mistral" else out


def record_prefix(family: str) -> str:
    """The record's file-name prefix: ``model-decode`` (llama, as before) or ``model-decode-FAMILY``."""
    return "model-decode" if family == "llama" else f"model-decode-{family}"


def _window(config) -> int | None:
    return getattr(config, "sliding_window", None)


def cache_len(config, capacity: int) -> int:
    """Slots of a layer of a ``StaticCache`` of ``capacity``: min(W, capacity) on a sliding layer."""
    w = _window(config)
    return capacity if w is None else min(w, capacity)


def kv_positions(config, ctx: int) -> int:
    """K/V positions a step at position ctx must read over every layer: ctx + 1, at most W on a sliding
    layer (HF's window: key j visible to query i when i - W < j <= i)."""
    w, n = _window(config), config.num_hidden_layers
    types = getattr(config, "layer_types", None) or (["sliding_attention" if w is not None else "full_attention"] * n)
    return sum(min(ctx + 1, w) if t == "sliding_attention" and w is not None else ctx + 1 for t in types)


def sliding_layers(cache, ctx: int) -> list:
    """The cache's ``StaticSlidingWindowLayer``s, each with ``cumulative_length_int`` set to ctx (a
    prefill of ctx tokens) and its update made capturable (:func:`capturable_update`)."""
    out = [layer for layer in cache.layers if hasattr(layer, "cumulative_length_int")]
    for layer in out:
        layer.cumulative_length_int = ctx
        if "update" not in vars(layer):
            layer.update = capturable_update(layer)
    return out


def capturable_update(layer):
    """``layer.update`` with HF's full-buffer one-token branch done on an index tensor built here, once.

    HF's branch (transformers 5.17 / 5.24) builds ``torch.tensor([-1], device=...)`` on every call: a
    host-to-device copy from pageable memory, which CUDA-graph capture refuses, so no side's step could
    be captured.  The replacement does the same work (roll the buffer left by one, write the new key and
    value in the last slot, copy back in place, advance ``cumulative_length_int``); every other case goes
    to the class's own update.  Every side of the benchmark gets it."""
    import torch

    index = torch.tensor([-1], dtype=torch.long, device=layer.keys.device)
    own = type(layer).update

    def update(key_states, value_states, *args, **kwargs):
        if layer.cumulative_length_int < layer.max_cache_len or key_states.shape[-2] != 1:
            return own(layer, key_states, value_states, *args, **kwargs)
        layer.cumulative_length_int += 1
        new_keys, new_values = layer.keys.roll(-1, dims=-2), layer.values.roll(-1, dims=-2)
        new_keys[:, :, index] = key_states
        new_values[:, :, index] = value_states
        layer.keys.copy_(new_keys)
        layer.values.copy_(new_values)
        return layer.keys, layer.values

    return update


def snapshot(cache):
    """A function that puts the sliding layers' buffers back as they are now (a no-op without any)."""
    saved = [(layer, layer.keys.clone(), layer.values.clone()) for layer in cache.layers
             if hasattr(layer, "cumulative_length_int")]

    def restore() -> None:
        for layer, k, v in saved:
            layer.keys.copy_(k)
            layer.values.copy_(v)

    return restore
