"""Attention kernels: split-KV decode (:mod:`.decode`) and the exact merge of attention states
(:mod:`.merge`)."""

from .decode import DecodeConfig, decode_attn, decode_attn_reference, decode_attn_workspace, explain
from .merge import MergeConfig, merge_state, merge_states

__all__ = ["decode_attn", "decode_attn_workspace", "decode_attn_reference", "explain", "DecodeConfig",
           "merge_states", "merge_state", "MergeConfig"]
