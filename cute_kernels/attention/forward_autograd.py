"""Autograd of ``flash_attn``: the backward as a custom op (``cute_kernels::flash_attn_backward``, with a
fake implementation for ``torch.compile``) and its formula registered on the functional forward op
``cute_kernels::flash_attn`` (torch refuses autograd on the mutating ``flash_attn_``).

The forward op saves q, k, v, out and lse (and the sink logits); the backward runs
:func:`.backward.flash_attn_backward` (imported at the first backward: the DSL loads then), the LSE's
gradient entering its Delta, with the forward's window, softcap and packed sequences and, when the
sink needs its gradient, the sink.  Which calls may take this path (dense or packed q and K/V, not
paged; no ``out=``, windows with sides >= -1, head dims the backward has; softcapping and sinks are
fine) is :func:`check_differentiable`'s, called by ``flash_attn`` before the forward launches.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..testing import LAUNCHES

__all__ = ["check_differentiable", "register", "BWD_HEAD_DIMS"]

#: Head dims the backward kernels run (``layouts.attention_backward.BWD_HEAD_DIMS``, read without the DSL).
BWD_HEAD_DIMS = (64, 96, 128, 256)


def check_differentiable(call, q, out) -> None:
    """A ``ValueError`` naming what keeps a call that needs gradients from the backward: ``out=``, a
    paged call, a window side below -1 (FlashAttention-4's windows that end before the diagonal or
    start after it), a head dim the backward lacks.  (Packed sequences, windows with sides >= -1,
    softcapping and sinks have one.)"""
    if out is not None:
        raise ValueError("flash_attn: out= cannot be used when an input requires grad (autograd needs the "
                         "output it allocates); call it under torch.no_grad() or drop out=")
    if call.block_table is not None:
        raise ValueError("flash_attn: block_table (paged K/V) has no backward; inputs that require grad need "
                         "dense or packed q, k, v (or run under torch.no_grad())")
    if min(call.window) < -1:
        raise ValueError(f"flash_attn: window_size {call.window} has a side below -1 (a window that ends before "
                         "the diagonal or starts after it), which has no backward yet; inputs that require "
                         "grad need sides >= -1 (-1 or None: unbounded)")
    if q.shape[-1] not in BWD_HEAD_DIMS:
        raise ValueError(f"flash_attn: the backward runs head dims {BWD_HEAD_DIMS}, got {q.shape[-1]} with an "
                         "input that requires grad")


@torch.library.custom_op("cute_kernels::flash_attn_backward", mutates_args=())
def _flash_attn_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            out: torch.Tensor, lse: torch.Tensor, dlse: Optional[torch.Tensor], causal: bool,
                            softmax_scale: float, softcap: float = 0.0, learnable_sink: Optional[torch.Tensor] = None,
                            window_left: int = -1, window_right: int = -1, deterministic: bool = False,
                            cu_seqlens_q: Optional[torch.Tensor] = None, cu_seqlens_k: Optional[torch.Tensor] = None,
                            max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv, dsink)``: dsink the sink's gradient ((Hq,) fp32) when ``learnable_sink`` is given
    (pass it only when its gradient is wanted: q, k, v's gradients do not read it), else an empty (0,).
    Packed sequences: the forward's cu_seqlens and max_seqlens."""
    from .backward import flash_attn_backward

    LAUNCHES["flash_attn_backward"] += 1
    res = flash_attn_backward(dout, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale, dlse=dlse,
                              softcap=softcap, learnable_sink=learnable_sink, window_size=(window_left, window_right),
                              deterministic=deterministic, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                              max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    if learnable_sink is None:
        return (*res, q.new_empty((0,), dtype=torch.float32))
    return res


@_flash_attn_backward_op.register_fake
def _(dout, q, k, v, out, lse, dlse, causal, softmax_scale, softcap=0.0, learnable_sink=None, window_left=-1,
      window_right=-1, deterministic=False, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
      max_seqlen_k=None):
    n = 0 if learnable_sink is None else learnable_sink.shape[0]
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), q.new_empty((n,), dtype=torch.float32)


#: the functional forward op's inputs (``cute_kernels::flash_attn``, defaults filled): q, k, v, causal,
#: softmax_scale, window_left, window_right, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
#: block_table, seqused_k, softcap, learnable_sink, deterministic
_NUM_INPUTS, _CU_Q, _MAX_Q, _SOFTCAP, _SINK, _DETERMINISTIC = 16, 7, 9, 13, 14, 15


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, causal, softmax_scale = inputs[:5]
    softcap, sink = inputs[_SOFTCAP], inputs[_SINK]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sink, inputs[_CU_Q], inputs[_CU_Q + 1])
    ctx.max_seqlens = inputs[_MAX_Q], inputs[_MAX_Q + 1]
    ctx.causal, ctx.softmax_scale, ctx.softcap = causal, softmax_scale, softcap
    ctx.window = inputs[5], inputs[6]  # window_left, window_right (-1: unbounded)
    ctx.deterministic = inputs[_DETERMINISTIC]
    ctx.set_materialize_grads(False)  # an unused LSE's gradient stays None: no zeros to read, no dLSE config


def _kernel_ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the backward takes it: a gradient autograd hands over may be a broadcast (zero-stride)
    or misaligned view; those become a fresh contiguous copy."""
    ok = t.stride(-1) == 1 and all(s % 8 == 0 and s > 0 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1)
    if ok and not isinstance(t, FakeTensor):
        try:
            ok = t.data_ptr() % 16 == 0
        except RuntimeError:  # traced (AOTAutograd's functional tensors have no data): strides decide
            pass
    return t if ok else t.clone(memory_format=torch.contiguous_format)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, sink, cu_q, cu_k = ctx.saved_tensors
    dout = torch.zeros_like(out) if dout is None else _kernel_ready(dout)  # None: only the LSE was used
    if dlse is not None:
        dlse = dlse.contiguous()
    want_sink = sink is not None and ctx.needs_input_grad[_SINK]
    variant = {}
    if ctx.softcap:
        variant["softcap"] = ctx.softcap
    if want_sink:
        variant["learnable_sink"] = sink
    if ctx.window != (-1, -1):
        variant["window_left"], variant["window_right"] = ctx.window
    if ctx.deterministic:
        variant["deterministic"] = True
    if cu_q is not None:  # packed sequences
        variant.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=ctx.max_seqlens[0],
                       max_seqlen_k=ctx.max_seqlens[1])
    dq, dk, dv, dsink = _flash_attn_backward_op(dout, q, k, v, out, lse, dlse, ctx.causal, ctx.softmax_scale,
                                                **variant)
    grads = [None] * _NUM_INPUTS
    grads[:3] = dq, dk, dv
    if want_sink:
        grads[_SINK] = dsink
    return tuple(grads)


def register(forward_op) -> None:
    """Register the formula on the functional forward op (:mod:`.forward` calls this once it is defined)."""
    forward_op.register_autograd(_backward, setup_context=_setup_context)
