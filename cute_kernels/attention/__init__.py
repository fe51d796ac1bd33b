"""Attention kernels: split-KV decode (:mod:`.decode`), the FlashAttention forward (:mod:`.forward`)
and the exact merge of attention states (:mod:`.merge`)."""

from .decode import DecodeConfig, decode_attn, decode_attn_reference, decode_attn_workspace, explain
from .forward import flash_attn
from .merge import MergeConfig, merge_state, merge_states

__all__ = ["flash_attn", "decode_attn", "decode_attn_workspace", "decode_attn_reference", "explain", "DecodeConfig",
           "merge_states", "merge_state", "MergeConfig"]
