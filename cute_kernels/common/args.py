"""Argument checks every op shares (pure torch, no DSL): whether a value is a tensor a kernel can read
as memory -- a dense (strided) ``torch.Tensor``, not a sparse, MKL-DNN or nested one, whose strides
mean nothing to a kernel (a sparse tensor reports strides of 0 and has no data pointer)."""

from __future__ import annotations

import torch


def tensor_fault(t) -> str | None:
    """Why ``t`` is not a dense tensor (the rest of a message naming the argument), or None when it is."""
    if not isinstance(t, torch.Tensor):
        return f"must be a torch.Tensor, got {type(t).__name__}"
    if t.layout is not torch.strided or t.is_nested:
        return f"must be a dense (strided) tensor, got {'a nested tensor' if t.is_nested else t.layout}"
    return None
