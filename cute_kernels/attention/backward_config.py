"""The attention backward kernel's compile-time configuration (:class:`FlashBwdConfig`, the compile-cache
key) and its compile entry (:func:`backward_builder`: the fake arguments the DSL traces the kernel of
:mod:`.backward_kernel` with)."""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from layouts import attention as LA

from ..common.dtypes import HALF_NAMES, to_cutlass
from . import forward_seqlen as fsl


@dataclass(frozen=True)
class FlashBwdConfig:
    """Everything the compiled backward specializes on (the compile-cache key).  B, Sq, Sk, Hq, Hkv
    and the strides of q, k, v, dout are run-time values."""

    dtype: str  # "bfloat16" | "float16"
    head_dim: int  # one of layouts.attention.BWD_HEAD_DIMS
    causal: bool
    tile: LA.BwdTile
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
        the packed sequences' bounds, ``softcap_scale`` (a float) with softcapping, then the deterministic
        mode's semaphores."""
        return (("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k") * self.varlen
                + ("softcap_scale",) * self.softcap + ("dq_semaphore",) * self.deterministic
                + ("dkv_semaphore",) * (self.deterministic and not self.direct_kv))


def bwd_config(dtype: str, head_dim: int, causal: bool, window: bool = False, direct_kv: bool = False,
               softcap: bool = False, deterministic: bool = False, varlen: bool = False) -> FlashBwdConfig:
    """The configuration the backward compiles for these facts (tile from :func:`layouts.attention.bwd_tile`)."""
    return FlashBwdConfig(dtype=dtype, head_dim=head_dim, causal=bool(causal),
                          tile=LA.bwd_tile(dtype, head_dim, bool(window), softcap=bool(softcap)), window=bool(window),
                          direct_kv=bool(direct_kv), softcap=bool(softcap), deterministic=bool(deterministic),
                          varlen=bool(varlen))


def backward_builder(cfg: FlashBwdConfig):
    """``() -> (kernel, fake_args)`` for :func:`cute_kernels.common.jit.get_compiled`: symbolic B, Sq,
    Sk, Hq, Hkv, Sq_pad (a multiple of :data:`layouts.attention.BWD_ROW_PAD`) and a fresh symbolic
    stride for every stride of q, k, v, dout (stride(-1) = 1); the fp32 buffers compact.  Arguments:
    ``(q, k, v, dout, lse_log2, delta, dq_accum, dk_accum, dv_accum, scale_log2)`` (``direct_kv``: dk, dv
    in the input dtype, any 16-byte strides, in place of the two accumulators), and a window
    config's ``window_left, window_right`` after them (:meth:`FlashAttnBwdSm90.call_window`), then a softcap
    config's ``softcap_scale`` and a deterministic one's int32 semaphores, compact (B, Hq, Sq_pad / 64)
    and (B, Hkv, KV tiles) (:attr:`FlashBwdConfig.variant_args`); a packed config's cu_seqlens and
    max_seqlens before them (the tensors then hold one batch of packed rows)."""

    def build():
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

        dt = to_cutlass(cfg.dtype)
        D = cfg.head_dim
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        B, Sq, Sk, Hq, Hkv = (cute.sym_int() for _ in range(5))
        Sp = cute.sym_int(divisibility=LA.BWD_ROW_PAD)
        mQ, mK, mV, mdO = (fsl.fake_rows(dt, s) for s in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D),
                                                           (B, Sq, Hq, D)))
        f32 = cutlass.Float32
        mLSE2 = make_fake_compact_tensor(f32, (B, Hq, Sp), stride_order=(2, 1, 0), assumed_align=16)
        mDelta = make_fake_compact_tensor(f32, (B, Hq, Sp), stride_order=(2, 1, 0), assumed_align=16)
        mdQ = make_fake_compact_tensor(f32, (B, Hq, Sp, D), stride_order=(3, 2, 1, 0), assumed_align=16)
        if cfg.direct_kv:  # dk, dv themselves: the input dtype, any 16-byte strides
            mdK, mdV = fsl.fake_rows(dt, (B, Sk, Hkv, D)), fsl.fake_rows(dt, (B, Sk, Hkv, D))
        else:
            mdK = make_fake_compact_tensor(f32, (B, Sk, Hkv, D), stride_order=(3, 2, 1, 0), assumed_align=16)
            mdV = make_fake_compact_tensor(f32, (B, Sk, Hkv, D), stride_order=(3, 2, 1, 0), assumed_align=16)
        from .backward_kernel import FlashAttnBwdSm90

        k = FlashAttnBwdSm90(cfg)
        variant = ()
        if cfg.varlen:  # cu_seqlens_q / _k, max_seqlen_q / _k
            variant += (make_fake_compact_tensor(Int32, (cute.sym_int(),)),
                        make_fake_compact_tensor(Int32, (cute.sym_int(),)), Int32(0), Int32(0))
        variant += (Float32(1.0),) * cfg.softcap  # softcap_scale
        if cfg.deterministic:
            variant += (make_fake_compact_tensor(Int32, (B, Hq, cute.sym_int()), stride_order=(2, 1, 0)),)
            if not cfg.direct_kv:
                variant += (make_fake_compact_tensor(Int32, (B, Hkv, cute.sym_int()), stride_order=(2, 1, 0)),)
        if cfg.window:
            return k.call_window, (mQ, mK, mV, mdO, mLSE2, mDelta, mdQ, mdK, mdV, Float32(1.0), Int32(0), Int32(0),
                                   stream, *variant)
        return k, (mQ, mK, mV, mdO, mLSE2, mDelta, mdQ, mdK, mdV, Float32(1.0), stream, *variant)

    return build
