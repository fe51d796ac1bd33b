"""Attention kernels: split-KV decode (:mod:`.decode`), the FlashAttention forward (:mod:`.forward`)
and the exact merge of attention states (:mod:`.merge`)."""

from layouts.lazy import lazy_exports

_EXPORTS = {**dict.fromkeys(["DecodeConfig", "decode_attn", "decode_attn_reference", "decode_attn_workspace",
                             "explain"], ".decode"),
            "flash_attn": ".forward", "flash_attn_backward": ".backward",
            **dict.fromkeys(["MergeConfig", "merge_state", "merge_states"], ".merge")}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)  # (the DSL loads at first use)

__all__ = ["flash_attn", "flash_attn_backward", "decode_attn", "decode_attn_workspace", "decode_attn_reference", "explain", "DecodeConfig",
           "merge_states", "merge_state", "MergeConfig"]
