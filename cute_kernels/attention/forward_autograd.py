"""Autograd of ``flash_attn``: the backward as a custom op (``cute_kernels::flash_attn_backward``, with a
fake implementation for ``torch.compile``) and its formula registered on the functional forward op
``cute_kernels::flash_attn`` (torch refuses autograd on the mutating ``flash_attn_``).

The forward op saves q, k, v, out and lse; the backward runs :func:`.backward.flash_attn_backward`
(imported at the first backward: the DSL loads then), the LSE's gradient entering its Delta.  Which
calls may take this path (dense q and K/V, no ``out=``, head dims the backward has) is
:func:`check_differentiable`'s, called by ``flash_attn`` before the forward launches.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..testing import LAUNCHES

__all__ = ["check_differentiable", "register", "BWD_HEAD_DIMS"]

#: Head dims the backward kernels run (``layouts.attention.BWD_HEAD_DIMS``, read without the DSL).
BWD_HEAD_DIMS = (64, 96, 128)


def check_differentiable(call, q, out) -> None:
    """A ``ValueError`` naming what keeps a call that needs gradients from the backward: ``out=``, a
    paged or packed call, a window, softcapping or sinks, a head dim the backward lacks."""
    if out is not None:
        raise ValueError("flash_attn: out= cannot be used when an input requires grad (autograd needs the "
                         "output it allocates); call it under torch.no_grad() or drop out=")
    if call.mode != "dense":
        what = "block_table (paged K/V)" if call.block_table is not None else "cu_seqlens (packed sequences)"
        raise ValueError(f"flash_attn: {what} has no backward yet; inputs that require grad need dense q, k, v "
                         "(or run under torch.no_grad())")
    if call.window != (-1, -1):
        raise ValueError("flash_attn: window_size has no backward yet; inputs that require grad need "
                         "window_size=(-1, -1)")
    if getattr(call, "softcap", 0.0) or getattr(call, "learnable_sink", None) is not None:
        what = "softcap" if getattr(call, "softcap", 0.0) else "learnable_sink"
        raise ValueError(f"flash_attn: {what} has no backward yet; inputs that require grad need softcap=0 and "
                         "learnable_sink=None (or run under torch.no_grad())")
    if q.shape[-1] not in BWD_HEAD_DIMS:
        raise ValueError(f"flash_attn: the backward runs head dims {BWD_HEAD_DIMS}, got {q.shape[-1]} with an "
                         "input that requires grad")


@torch.library.custom_op("cute_kernels::flash_attn_backward", mutates_args=())
def _flash_attn_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            out: torch.Tensor, lse: torch.Tensor, dlse: Optional[torch.Tensor], causal: bool,
                            softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from .backward import flash_attn_backward

    LAUNCHES["flash_attn_backward"] += 1
    return flash_attn_backward(dout, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale, dlse=dlse)


@_flash_attn_backward_op.register_fake
def _(dout, q, k, v, out, lse, dlse, causal, softmax_scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, causal, softmax_scale = inputs[:5]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.softmax_scale = causal, softmax_scale
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
    q, k, v, out, lse = ctx.saved_tensors
    dout = torch.zeros_like(out) if dout is None else _kernel_ready(dout)  # None: only the LSE was used
    if dlse is not None:
        dlse = dlse.contiguous()
    dq, dk, dv = _flash_attn_backward_op(dout, q, k, v, out, lse, dlse, ctx.causal, ctx.softmax_scale)
    return (dq, dk, dv) + (None,) * 10


def register(forward_op) -> None:
    """Register the formula on the functional forward op (:mod:`.forward` calls this once it is defined)."""
    forward_op.register_autograd(_backward, setup_context=_setup_context)
