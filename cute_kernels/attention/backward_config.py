"""The attention backward kernel's compile-time configuration (:class:`FlashBwdConfig`, the compile-cache
key of :mod:`.backward_kernel`) and how a call's facts choose it (:func:`bwd_config`)."""

from __future__ import annotations

from dataclasses import dataclass


from layouts import attention_backward as LB

from ..common.dtypes import HALF_NAMES


@dataclass(frozen=True)
class FlashBwdConfig:
    """Everything the compiled backward specializes on (the compile-cache key).  B, Sq, Sk, Hq, Hkv
    and the strides of q, k, v, dout are run-time values."""

    dtype: str  # "bfloat16" | "float16"
    head_dim: int  # one of layouts.attention_backward.BWD_HEAD_DIMS
    causal: bool
    tile: LB.BwdTile
    #: a sliding window, its two sides run-time values (causal is folded into it: ``causal`` is False)
    window: bool = False
    #: the MMA bound of the benchmark (``cute-kernels bench attention --backward``): the mask, the
    #: exponentials and dS compiled out (P = S, dS = dP in 16 bits); loads, the five GEMMs and the
    #: dQ / dK / dV reductions as in the real kernel.  Wrong gradients: never planned for a call.
    mma_only: bool = False
    #: dK and dV stored by the kernel, scaled and in the input dtype (Hq == Hkv: no other CTA adds into
    #: a KV head's rows), instead of added into fp32 accumulators that a post-pass converts
    direct_kv: bool = False
    #: score softcapping (the forward's ``softcap * tanh(s * softmax_scale / softcap)``): the entries take
    #: a trailing run-time ``softcap_scale = softmax_scale / softcap`` and ``scale_log2 = softcap *
    #: log2(e)``; P from the capped scores and dS times ``1 - tanh^2`` (:meth:`FlashAttnBwdSm90.probs`)
    softcap: bool = False
    #: deterministic adds (see the module doc): the entries take a trailing int32 ``dq_semaphore`` (B,
    #: Hq, Sq_pad / 64) and, without ``direct_kv``, ``dkv_semaphore`` (B, Hkv, KV tiles), both zeroed
    deterministic: bool = False
    #: packed sequences (:mod:`.backward` doc): the entries take ``cu_seqlens_q``, ``cu_seqlens_k`` (B + 1,)
    #: int32 and ``max_seqlen_q``, ``max_seqlen_k`` first among the trailing arguments; the tensors hold one
    #: batch (the packed rows), the grid's z is the sequence
    varlen: bool = False

    def __post_init__(self):
        if self.dtype not in HALF_NAMES:
            raise ValueError(f"FlashBwdConfig: dtype {self.dtype!r} must be one of {HALF_NAMES}")
        if self.tile.dtype != self.dtype or self.tile.head_dim != self.head_dim:
            raise ValueError(f"FlashBwdConfig: tile {self.tile} does not match dtype {self.dtype} / D {self.head_dim}")
        if self.window and self.causal:
            raise ValueError("FlashBwdConfig: a window config folds causal into its right side (causal=False)")
        if self.mma_only and self.softcap:
            raise ValueError("FlashBwdConfig: the MMA bound (mma_only) has no softmax to softcap")

    @property
    def variant_args(self) -> tuple:
        """The entries' trailing run-time arguments after the stream (:meth:`FlashAttnBwdSm90.__call__`):
        the packed sequences' bounds and the grid's numbering (``gapped``: 1 for
        :func:`.forward_seqlen.gapped_tile_coords`, 0 for a max_seqlen_k-sized row of CTAs per sequence;
        :func:`.forward_seqlen.gapped_pays`), ``softcap_scale`` (a float) with softcapping, then the
        deterministic mode's semaphores."""
        return (("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "gapped") * self.varlen
                + ("softcap_scale",) * self.softcap + ("dq_semaphore",) * self.deterministic
                + ("dkv_semaphore",) * (self.deterministic and not self.direct_kv))


def bwd_config(dtype: str, head_dim: int, causal: bool, window: bool = False, direct_kv: bool = False,
               softcap: bool = False, deterministic: bool = False, varlen: bool = False) -> FlashBwdConfig:
    """The configuration the backward compiles for these facts (tile from :func:`layouts.attention_backward.bwd_tile`)."""
    return FlashBwdConfig(dtype=dtype, head_dim=head_dim, causal=bool(causal),
                          tile=LB.bwd_tile(dtype, head_dim, bool(window), softcap=bool(softcap)), window=bool(window),
                          direct_kv=bool(direct_kv), softcap=bool(softcap), deterministic=bool(deterministic),
                          varlen=bool(varlen))
