"""``patch_linear`` / ``unpatch_linear`` of the Transformers integration (:mod:`.hf`): a model's bias-free
16-bit ``nn.Linear`` layers run on ``cute_kernels.gemm`` (differentiable: training runs its backward
GEMMs too), ``F.linear`` for inputs the GEMM does not take."""

from __future__ import annotations

import types

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..gemm import gemm
from . import sdpa as _sdpa
from .sdpa import _is_hopper

__all__ = ["patch_linear", "unpatch_linear"]

_HALF = (torch.float16, torch.bfloat16)
_ORIG = "_cute_kernels_orig_forward"


def _gemm_linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` on ``cute_kernels.gemm`` (the weight read as a column-major B, no copy) for
    16-bit CUDA inputs of the weight's dtype on Hopper, with grad too (gemm is differentiable: the
    backward's two GEMMs run on it); ``F.linear`` otherwise.  Every step of a decode loop runs this
    once per linear: the tests are the cheap ones (device indices, not ``torch.device`` objects; the
    Hopper check's cache read by index first; the weight from the parameter dict, not the module's
    ``__getattr__``), and a 2-D input and its result are taken as they are.  B is a fresh ``w.t()``
    every call: a transpose kept on the module would keep the weight's memory alive after the weight
    is replaced or moved (``weight.data = ...``, Accelerate's offloading), and gemm's guard takes the
    fresh view as it took the last one (under no_grad too, where a view of a weight requiring grad
    requires grad itself)."""
    w = self._parameters["weight"]
    dev = x.get_device()  # -1: CPU, meta
    xs, ws = x.shape, w.shape
    if (dev < 0 or dev != w.get_device() or x.dtype != w.dtype or not xs or xs[-1] != ws[1] or 0 in xs
            or not (_sdpa._HOPPER.get(dev) or _is_hopper(x.device))):
        return F.linear(x, w, self.bias)
    if len(xs) == 2:
        return gemm(x, w.t())
    out = gemm(x.reshape(-1, ws[1]), w.t())
    return out.view(xs[0], xs[1], ws[0]) if len(xs) == 3 else out.view(*xs[:-1], ws[0])


def _check_model(who: str, model) -> None:
    """TypeError naming ``model`` unless it is an ``nn.Module`` (``model.modules()`` would raise
    AttributeError)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"{who}: model must be a torch.nn.Module, got {type(model).__name__}")


def patch_linear(model: nn.Module, *, require_cuda: bool = True) -> int:
    """Route every bias-free ``nn.Linear`` with a 2-D float16/bfloat16 weight (on CUDA, unless
    ``require_cuda=False``) through ``cute_kernels.gemm``; returns how many were patched (already
    patched ones are not counted again).  The patched forward runs ``F.linear`` for inputs the GEMM
    does not take (CPU, other dtypes).  :func:`unpatch_linear` restores them."""
    _check_model("patch_linear", model)
    if type(require_cuda) is not bool:  # a string would pass as its truth value
        raise TypeError(f"patch_linear: require_cuda must be a bool, got {type(require_cuda).__name__} {require_cuda!r}")
    n = 0
    for mod in model.modules():
        w = getattr(mod, "weight", None)
        if (not isinstance(mod, nn.Linear) or mod.bias is not None or not isinstance(w, torch.Tensor)
                or w.dim() != 2 or w.dtype not in _HALF or (require_cuda and w.device.type != "cuda")
                or hasattr(mod, _ORIG)):
            continue
        setattr(mod, _ORIG, mod.__dict__.get("forward"))  # an instance-level forward, if any
        mod.forward = types.MethodType(_gemm_linear_forward, mod)
        n += 1
    return n


def unpatch_linear(model: nn.Module) -> int:
    """Undo :func:`patch_linear`; returns how many layers were restored."""
    _check_model("unpatch_linear", model)
    n = 0
    for mod in model.modules():
        if not hasattr(mod, _ORIG):
            continue
        orig = mod.__dict__.pop(_ORIG)
        if orig is None:
            del mod.forward
        else:
            mod.forward = orig
        n += 1
    return n
