"""Exact merging of partial attention states (split-KV attention).

The *attention state* of one query row over a key subset ``S`` is ``o = sum_j exp(s_j - lse) v_j``
(normalized within ``S``) and ``lse = log sum_j exp(s_j)`` (**natural log**, scaled scores).  States
over disjoint subsets merge exactly into the state over their union::

    m   = max_i lse_i
    w_i = exp(lse_i - m)
    o   = sum_i w_i * o_i / sum_i w_i
    lse = m + log(sum_i w_i)

An empty subset has ``lse = -inf``; its ``o`` is ignored (treated as 0 even if it holds NaN), and
if every part is empty the result is ``o = 0, lse = -inf``.  A part with ``lse = +inf`` dominates, as
in ``torch.logsumexp``: when ``m = +inf`` the weights are ``w_i = 1`` for the parts with
``lse_i = +inf`` and 0 for the others, so ``o`` is the mean of the infinite parts' outputs and
``lse = +inf`` (``exp(lse_i - m)`` would be ``exp(nan)`` for them).  The kernel's merge step
(:meth:`~.merge_kernel.MergeStatesKernel.merge_row`, :func:`~.merge_kernel._part_weight`) and the torch math
(:func:`merge_states_torch`) implement this one definition.  The LSE base is *e* (as in
FlashAttention), not 2 (FlashInfer): convert base-2 LSEs with ``lse_e = lse_2 * ln(2)``.

CUDA tensors run a CuTe kernel (:class:`~.merge_kernel.MergeStatesKernel`, also the split decode's combine step),
CPU tensors torch ops with the same math, both in part order (deterministic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..common.args import tensor_fault
from ..common import jit
from ..common.dtypes import TORCH_TO_NAME, name_of
from ..common.fastpath import BoundedCache
from ..testing import LAUNCHES

__all__ = ["merge_states", "merge_state", "MergeConfig", "launch_merge"]


def __getattr__(name: str):
    """The kernel side (``MergeStatesKernel``, ``merge_builder``), from :mod:`.merge_kernel` (the DSL)."""
    if name in ("MergeStatesKernel", "merge_builder"):
        from . import merge_kernel

        return getattr(merge_kernel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class MergeConfig:
    dtype_in: str  # "float32" | "float16" | "bfloat16"
    dtype_out: str
    head_dim: int
    num_warps: int = 4


def get_merge_kernel(cfg: MergeConfig):
    return jit.get_compiled("merge_states", cfg, jit.lazy_builder(f"{__package__}.merge_kernel", "merge_builder", cfg))


def _warm(cfg):
    """``warmup([("merge_states", MergeConfig(...))])``: dtype names and a head dim whose rows are whole
    16-byte vectors (other head dims run in torch)."""
    if not isinstance(cfg, MergeConfig):
        raise TypeError(f"warmup: a merge_states spec must be a MergeConfig, got {type(cfg).__name__}")
    for name in ("dtype_in", "dtype_out"):
        if getattr(cfg, name) not in TORCH_TO_NAME.values():
            raise ValueError(f"warmup: MergeConfig.{name} must be one of {sorted(TORCH_TO_NAME.values())}, "
                             f"got {getattr(cfg, name)!r}")
    for name in ("head_dim", "num_warps"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"warmup: MergeConfig.{name} must be an int >= 1, got {v!r}")
    get_merge_kernel(cfg)


jit.register_warmup("merge_states", _warm)


def _row_aligned(t: torch.Tensor) -> bool:
    """16-byte aligned base and row strides (what the kernel's vector loads assume)."""
    es = t.element_size()
    return t.data_ptr() % 16 == 0 and all((st * es) % 16 == 0 for st in t.stride()[:-1])


def launch_merge(o_parts5: torch.Tensor, lse_parts4: torch.Tensor, out4: torch.Tensor, lse_out3: torch.Tensor):
    """Run the CuTe merge on 5-d/4-d views: (P,B,S,H,D), (P,B,S,H) -> (B,S,H,D), (B,S,H)."""
    cfg = MergeConfig(name_of(o_parts5.dtype), name_of(out4.dtype), int(o_parts5.shape[-1]))
    LAUNCHES["merge_states"] += 1
    get_merge_kernel(cfg)(o_parts5, lse_parts4, out4, lse_out3)


# ------------------------------------------------------------------------------------------------
# torch math (CPU tensors, and the reference for tests)
# ------------------------------------------------------------------------------------------------
def merge_states_torch(o_parts: torch.Tensor, lse_parts: torch.Tensor):
    """Reference merge in float32 torch ops; same math and part order as the kernel."""
    o32 = o_parts.float()
    lse = lse_parts.float()
    m = lse.amax(dim=0)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w = torch.exp(lse - m_safe.unsqueeze(0))  # exp(-inf) = 0 for empty parts
    # a max of +inf: the parts at +inf weigh 1, the others 0 (the kernel's _part_weight)
    w = torch.where(torch.isposinf(m_safe).unsqueeze(0), torch.isposinf(lse).float(), w)
    w_sum = w.sum(dim=0)
    contrib = torch.where((w > 0).unsqueeze(-1), w.unsqueeze(-1) * o32, torch.zeros_like(o32))
    acc = contrib.sum(dim=0)
    inv = torch.where(w_sum > 0, 1.0 / w_sum, torch.zeros_like(w_sum))
    o = acc * inv.unsqueeze(-1)
    lse_out = m_safe + torch.log(w_sum)
    # NaN LSEs propagate (max would hide them)
    nan_rows = torch.isnan(lse).any(dim=0)
    if nan_rows.any():
        lse_out = torch.where(nan_rows, torch.full_like(lse_out, float("nan")), lse_out)
        o = torch.where(nan_rows.unsqueeze(-1), torch.full_like(o, float("nan")), o)
    return o, lse_out


def _check_states(o_parts: torch.Tensor, lse_parts: torch.Tensor):
    """Types, shapes, dtypes, then devices (last); every message starts with the argument."""
    for name, t in (("o_parts", o_parts), ("lse_parts", lse_parts)):
        if fault := tensor_fault(t):
            raise TypeError(f"merge_states: {name} {fault}")
    if o_parts.dim() < 2:
        raise ValueError(f"merge_states: o_parts must be (P, ..., D), got shape {tuple(o_parts.shape)}")
    if tuple(lse_parts.shape) != tuple(o_parts.shape[:-1]):
        raise ValueError(
            f"merge_states: lse_parts shape {tuple(lse_parts.shape)} must equal o_parts.shape[:-1] "
            f"= {tuple(o_parts.shape[:-1])}"
        )
    if o_parts.shape[0] < 1:
        raise ValueError("merge_states: o_parts needs at least one part (P >= 1)")
    if lse_parts.dtype != torch.float32:
        raise TypeError(f"merge_states: lse_parts must be float32, got {lse_parts.dtype}")
    if o_parts.dtype not in TORCH_TO_NAME:
        raise TypeError(f"merge_states: o_parts must be float32/float16/bfloat16, got {o_parts.dtype}")
    _check_devices("merge_states", (("o_parts", o_parts), ("lse_parts", lse_parts)))


def _check_devices(who: str, named) -> None:
    """One device for all (CUDA: the kernel; CPU: torch ops; meta: the fake implementation's shapes);
    the message names the first tensor that differs."""
    dev = named[0][1].device
    for name, t in named[1:]:
        if t.device != dev:
            raise ValueError(f"{who}: {name} is on {t.device}, {named[0][0]} on {dev}: all must be on one device")


def _check_pair(o_a, lse_a, o_b, lse_b) -> None:
    """merge_state's own checks, so each message names merge_state's arguments."""
    named = (("o_a", o_a), ("lse_a", lse_a), ("o_b", o_b), ("lse_b", lse_b))
    for name, t in named:
        if fault := tensor_fault(t):
            raise TypeError(f"merge_state: {name} {fault}")
    if o_a.dim() < 1:
        raise ValueError(f"merge_state: o_a must be (..., D), got shape {tuple(o_a.shape)}")
    if o_b.shape != o_a.shape:
        raise ValueError(f"merge_state: shapes differ: o_b shape {tuple(o_b.shape)} must equal o_a shape "
                         f"{tuple(o_a.shape)}")
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        if t.shape != o_a.shape[:-1]:
            raise ValueError(f"merge_state: shapes differ: {name} shape {tuple(t.shape)} must equal o_a.shape[:-1] = "
                             f"{tuple(o_a.shape[:-1])}")
    if o_a.dtype not in TORCH_TO_NAME:
        raise TypeError(f"merge_state: o_a must be float32/float16/bfloat16, got {o_a.dtype}")
    if o_b.dtype != o_a.dtype:
        raise TypeError(f"merge_state: o_b dtype {o_b.dtype} must equal o_a dtype {o_a.dtype}")
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        if t.dtype != torch.float32:
            raise TypeError(f"merge_state: {name} must be float32, got {t.dtype}")
    _check_devices("merge_state", named)


def _merge_states_impl(o_parts: torch.Tensor, lse_parts: torch.Tensor):
    P, D = o_parts.shape[0], o_parts.shape[-1]
    rest = tuple(o_parts.shape[1:-1])
    n = math.prod(rest)
    if o_parts.device.type in _KERNEL_DEVICES:
        op = o_parts.reshape(P, 1, 1, n, D)
        if op.stride(-1) != 1 or not _row_aligned(op):
            op = op.contiguous()
        out = torch.empty((1, 1, n, D), dtype=o_parts.dtype, device=o_parts.device)
        lse_out = torch.empty((1, 1, n), dtype=torch.float32, device=o_parts.device)
        # else the torch path: an odd head dim's rows cannot be 16-byte aligned
        if _row_aligned(op) and (n == 0 or _row_aligned(out)):
            if n > 0:
                launch_merge(op, lse_parts.reshape(P, 1, 1, n), out, lse_out)
            return out.reshape(*rest, D), lse_out.reshape(rest)
    LAUNCHES["merge_states:torch"] += 1
    o, lse = merge_states_torch(o_parts, lse_parts)
    return o.to(o_parts.dtype), lse


@torch.library.custom_op("cute_kernels::merge_states", mutates_args=())
def _merge_states_op(o_parts: torch.Tensor, lse_parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _merge_states_impl(o_parts, lse_parts)


@_merge_states_op.register_fake
def _(o_parts, lse_parts):
    return (
        o_parts.new_empty(o_parts.shape[1:]),
        lse_parts.new_empty(lse_parts.shape[1:]),
    )


# ------------------------------------------------------------------------------------------------
# the host fast path: a launcher per call metadata, made after a call with that metadata passed the
# checks and launched the kernel on the tensors as they are (issue 19: host time per call)
# ------------------------------------------------------------------------------------------------
_is_compiling = torch.compiler.is_compiling
_empty = torch.empty
#: tensor types the fast path takes (subclasses such as FakeTensor always take the checked path)
_FAST_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
#: devices the kernel runs on (other tensors: torch ops; tests add "cpu" with a stub kernel)
_KERNEL_DEVICES = ("cuda",)
_launchers = BoundedCache()  # (a key per shape)


def _key(o_parts, lse_parts) -> tuple:
    """What the checks and the launch decision read that the compiled function's own argument checks
    (:func:`~cute_kernels.common.jit.direct`) leave open: o_parts' shape, strides, dtype and device
    (``get_device()``: -1 for every non-CUDA device, which never has a launcher) and lse_parts' shape
    and strides (fewer row dims are viewed before the call, and a view of another shape can succeed).
    The rest -- lse_parts' dtype and device, 16-byte alignment -- the compiled function checks on
    every call."""
    return (o_parts.shape, o_parts.stride(), o_parts.dtype, o_parts.get_device(), lse_parts.shape, lse_parts.stride())


def _prepare(key, o_parts: torch.Tensor, lse_parts: torch.Tensor) -> None:
    """Cache a launcher when the kernel takes the tensors as they are: at most three row dims
    (viewed as the kernel's (B, S, H) with size-1 dims in front, no copy), rows 16-byte aligned in
    o_parts and in the output, at least one row."""
    P, D, rest = o_parts.shape[0], o_parts.shape[-1], tuple(o_parts.shape[1:-1])
    out_aligned = (D * o_parts.element_size()) % 16 == 0
    if (len(rest) > 3 or math.prod(rest) == 0 or o_parts.stride(-1) != 1 or not _row_aligned(o_parts)
            or not out_aligned):
        return
    cfg = MergeConfig(name_of(o_parts.dtype), name_of(o_parts.dtype), int(D))
    fn = get_merge_kernel(cfg)
    _launchers[key] = _launcher(jit.direct(fn), fn, P, rest, D, o_parts.dtype, o_parts.device)


def _launcher(fn, keep, P, rest, D, dtype, dev):
    """``launch(o_parts, lse_parts) -> (o, lse)``: allocate both outputs, launch (5-d o_parts as they
    are, fewer row dims as views with size-1 dims in front), count (a refused call raises uncounted)."""
    f32 = torch.float32
    oshape, lshape = jit.size_args((*rest, D)), jit.size_args(rest)
    if len(rest) == 3:
        def launch(o_parts, lse_parts):
            o, lse = _empty(*oshape, dtype=dtype, device=dev), _empty(*lshape, dtype=f32, device=dev)
            fn(o_parts, lse_parts, o, lse)
            LAUNCHES["merge_states"] += 1
            return o, lse
    else:
        rows = (1,) * (3 - len(rest)) + rest
        op5, lp4, o4, l3 = (P, *rows, D), (P, *rows), (*rows, D), rows

        def launch(o_parts, lse_parts):
            o, lse = _empty(*oshape, dtype=dtype, device=dev), _empty(*lshape, dtype=f32, device=dev)
            fn(o_parts.view(op5), lse_parts.view(lp4), o.view(o4), lse.view(l3))
            LAUNCHES["merge_states"] += 1
            return o, lse
    launch.keep = keep  # the compiled object owns fn's CUDA library
    return launch


def merge_states(o_parts: torch.Tensor, lse_parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge P partial attention states exactly (the math: module doc).

    Args:
        o_parts: (P, ..., D) partial outputs, each normalized within its part (float32, float16 or
            bfloat16).
        lse_parts: (P, ...) float32 **natural-log** LSE of each part (``-inf``: an empty part, ignored).

    Returns ``(o, lse)``: o (..., D) in o_parts' dtype, lse (...) float32; rows where every part is
    empty give ``o = 0, lse = -inf``.
    """
    key = None
    if not _is_compiling():  # the fast path (_key); anything unusual takes the checks below
        try:
            if type(o_parts) in _FAST_TYPES and type(lse_parts) in _FAST_TYPES:
                key = _key(o_parts, lse_parts)
                hit = _launchers.get(key)
            else:
                hit = None
        except (AttributeError, TypeError):
            key = hit = None
        if hit is not None:
            try:
                return hit(o_parts, lse_parts)
            except Exception:  # the compiled function refused an argument: the checks below name it
                pass
    _check_states(o_parts, lse_parts)
    if key is None or o_parts.device.type not in _KERNEL_DEVICES or isinstance(o_parts, FakeTensor):
        return _merge_states_op(o_parts, lse_parts)  # torch.compile, fake / CPU / meta tensors
    res = _merge_states_impl(o_parts, lse_parts)  # eager: no dispatcher
    _prepare(key, o_parts, lse_parts)
    return res


def merge_state(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two attention states (o_a, lse_a) and (o_b, lse_b) over disjoint key sets.

    o: (..., D), lse: (...) float32, **natural-log** LSE; see :func:`merge_states` for the math.
    Returns ``(o, lse)`` with o in o_a's dtype.
    """
    _check_pair(o_a, lse_a, o_b, lse_b)
    return merge_states(torch.stack([o_a, o_b]), torch.stack([lse_a, lse_b]))
