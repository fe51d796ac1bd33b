"""Autograd of ``gemm``: ``out = alpha * a @ b + beta * c`` has the gradients

    da = alpha * dout @ b^T,    db = alpha * a^T @ dout,    dc = beta * dout,

two more GEMMs on the same kernels (the transposes are column-major views, no copy), registered as the
formula of the functional op ``cute_kernels::gemm`` (:mod:`.host` routes calls that need gradients
through it).  An fp32 output's gradient is rounded to the operands' dtype for the two GEMMs (the
kernels take 16-bit operands; the accumulation stays fp32).  Each gradient comes out in its input's
layout: a column-major operand's (a linear layer's ``weight.t()``) is computed transposed, ``db^T = dout^T
a``, so autograd hands it to the weight without copying it into the weight's layout.
"""

from __future__ import annotations

__all__ = ["register", "check_differentiable"]


def check_differentiable(out) -> None:
    """``ValueError`` for what a call that needs gradients cannot take."""
    if out is not None:
        raise ValueError("gemm: out= cannot be used when an input requires grad (autograd needs the output it "
                         "allocates); call it under torch.no_grad() or drop out=")


def _setup_context(ctx, inputs, output) -> None:
    a, b, c, alpha, beta, out_dtype = inputs
    ctx.save_for_backward(a, b)
    ctx.alpha, ctx.beta = alpha, beta
    ctx.c_dtype = None if c is None else c.dtype


def _in_layout_of(like, op, x, y, alpha):
    """``alpha * x @ y`` in ``like``'s layout: row-major as the kernel writes it, or, for a column-major
    ``like`` (unit stride along rows), ``(alpha * y^T @ x^T)^T`` (the same values, the transposed GEMM)."""
    if like.dim() >= 2 and like.stride(-1) != 1 and like.stride(-2) == 1:
        return op(y.transpose(-1, -2), x.transpose(-1, -2), None, alpha, 0.0, None).transpose(-1, -2)
    return op(x, y, None, alpha, 0.0, None)


def register(op) -> None:
    """Register the formula on the functional op ``op`` (``cute_kernels::gemm``)."""

    def backward(ctx, dout):
        a, b = ctx.saved_tensors
        g = dout.to(a.dtype).contiguous()  # (a broadcast gradient, e.g. of .sum(), has zero strides)
        need_a, need_b, need_c = ctx.needs_input_grad[:3]
        da = _in_layout_of(a, op, g, b.transpose(-1, -2), ctx.alpha) if need_a else None
        db = _in_layout_of(b, op, a.transpose(-1, -2), g, ctx.alpha) if need_b else None
        dc = (dout * ctx.beta).to(ctx.c_dtype) if need_c else None
        return da, db, dc, None, None, None

    op.register_autograd(backward, setup_context=_setup_context)
