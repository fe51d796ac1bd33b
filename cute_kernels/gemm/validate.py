"""Argument checks and layout facts of ``gemm``'s operands (pure Python, no device sync)."""

from __future__ import annotations

import numbers

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..common.args import tensor_fault
from ..common.dtypes import HALF_TORCH, TORCH_TO_NAME
from ..common.overlap import check_written

_OUT_DTYPES = tuple(TORCH_TO_NAME)


def tma_ok(t: torch.Tensor, major: str, store: bool = False) -> bool:
    """TMA needs a 16-byte aligned base and 16-byte multiples for every non-unit stride.  A TMA
    *store* also needs the contiguous extent to be a 16-byte multiple: Hopper's TMA unit clips a
    store at the next 16-byte boundary of each row, not at the extent, so a box ending past N writes
    the elements from N up to that boundary (another tensor's data when ``t`` is a column slice)."""
    es = t.element_size()
    if ptr_bits(t):
        return False
    unit = t.dim() - 1 if major == "row" else t.dim() - 2
    if store and (t.shape[unit] * es) % 16:
        return False
    return all((s * es) % 16 == 0 for i, s in enumerate(t.stride()) if i != unit and t.shape[i] > 1)


def ptr_bits(*ts) -> int:
    """The low 4 bits of the data pointers of ``ts`` (None skipped), OR-ed: 0 when all are 16-byte
    aligned.  A fake tensor counts as aligned: its pointer means nothing, and reading it warns."""
    bits = 0
    for t in ts:
        if t is not None and not isinstance(t, FakeTensor):
            bits |= t.data_ptr()
    return bits & 15


def major_of(t: torch.Tensor, name: str, rows: str, cols: str) -> str:
    """'row' (last dim contiguous) or 'col'; size-1 dims fit either, so prefer the TMA-compatible one."""
    cands = [m for m, d in (("row", -1), ("col", -2)) if t.stride(d) == 1 or t.shape[d] == 1]
    if not cands:
        raise ValueError(
            f"gemm: {name} of shape {tuple(t.shape)} has strides {tuple(t.stride())}; one of its last two "
            f"dimensions ({rows} or {cols}) must be contiguous (row- or column-major)"
        )
    return next((m for m in cands if tma_ok(t, m)), cands[0])


def canonical_strides(t: torch.Tensor, major: str) -> torch.Tensor:
    """Size-1 dims may carry any stride in torch; give them the ones the compiled layout assumes
    (unit stride 1, others 16-byte multiples).  A view, never a copy; only for degenerate shapes."""
    unit = t.dim() - 1 if major == "row" else t.dim() - 2
    want = list(t.stride())
    changed = False
    for i, n in enumerate(t.shape):
        if n == 1:
            w = 1 if i == unit else 0
            changed |= want[i] != w
            want[i] = w
    return t.as_strided(t.shape, want) if changed else t


def fits_layout(t: torch.Tensor, major: str) -> bool:
    """Whether ``t``'s size-1 dims already have strides the compiled layout accepts (the unit dim 1, the
    others multiples of 16 bytes, which every kernel's stride divisibility divides, below 2^40 bytes):
    then the kernel may take ``t`` as it is instead of :func:`canonical_strides`' view -- a size-1
    dim's stride never moves an address (its only index is 0), and a TMA descriptor takes any such
    stride."""
    unit = t.dim() - 1 if major == "row" else t.dim() - 2
    size = t.element_size()
    return all(n != 1 or (s == 1 if i == unit else s * size % 16 == 0 and s * size < _TMA_MAX_STRIDE)
               for i, (n, s) in enumerate(zip(t.shape, t.stride())))


_TMA_MAX_STRIDE = 1 << 40  # bytes: a TMA descriptor's strides stay below this


def check_types(a, b, out=None, c=None) -> None:
    """TypeError naming the first of a, b (and out, c when given) that is not a tensor."""
    for name, t in (("a", a), ("b", b), ("out", out), ("c", c)):
        if (t is not None or name in "ab") and (fault := tensor_fault(t)):
            raise TypeError(f"gemm: {name} {fault}")


def check_scalars(alpha, beta) -> None:
    """alpha and beta: real numbers (int, float, numpy scalars, torch.compile's symbolic ones), not
    bools, strings, complex numbers or tensors (float() of a CUDA tensor would synchronize)."""
    for name, v in (("alpha", alpha), ("beta", beta)):
        if isinstance(v, (torch.SymFloat, torch.SymInt)):
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"gemm: {name} must be a real number (int or float), got {type(v).__name__} {v!r}")


def check_operands(a, b, out, c, out_dtype, allow_cpu=False) -> tuple[int, ...]:
    """Raise TypeError / ValueError for anything ``gemm`` cannot take; returns the output shape.
    Types, dtypes and shapes first, devices last: a CPU or meta operand with a shape fault gets the
    shape's message."""
    check_types(a, b, out, c)
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in HALF_TORCH:
            raise TypeError(f"gemm: {name} must be float16 or bfloat16, got {t.dtype}")
        if t.dim() not in (2, 3):
            raise ValueError(f"gemm: {name} must be 2-D (M, K)/(K, N) or 3-D batched, got {t.dim()}-D")
    if a.dtype != b.dtype:
        raise TypeError(f"gemm: a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.dim() != b.dim():
        raise ValueError(f"gemm: a is {a.dim()}-D but b is {b.dim()}-D; both 2-D or both 3-D")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"gemm: a is (.., M, K={a.shape[-1]}) but b is (.., K={b.shape[-2]}, N)")
    if a.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"gemm: batch sizes differ: a {a.shape[0]}, b {b.shape[0]}")
    if out_dtype is not None and out_dtype not in _OUT_DTYPES:
        raise TypeError(f"gemm: out_dtype must be float16, bfloat16 or float32 (a torch.dtype), got {out_dtype!r}")
    shape = (*a.shape[:-1], b.shape[-1])
    if out is not None:
        if tuple(out.shape) != shape:
            raise ValueError(f"gemm: out has shape {tuple(out.shape)}, expected {shape}")
        if out.dtype not in _OUT_DTYPES:
            raise TypeError(f"gemm: out dtype {out.dtype} must be float16, bfloat16 or float32")
        if out_dtype is not None and out.dtype != out_dtype:
            raise TypeError(f"gemm: out dtype {out.dtype} does not match out_dtype {out_dtype}")
        # elements sharing an address (a stride of 0), or over a / b (c: only exactly, out=c)
        check_written("gemm", "out", out, (("a", a), ("b", b), ("c", c)), same_ok=("c",))
    if c is not None:
        if tuple(c.shape) != shape:
            raise ValueError(f"gemm: c has shape {tuple(c.shape)}, expected {shape}")
        if c.dtype not in _OUT_DTYPES:
            raise TypeError(f"gemm: c must be float16, bfloat16 or float32, got {c.dtype}")
    if a.device != b.device or (a.device.type != "cuda" and not allow_cpu):
        name = "a" if a.device.type != "cuda" and not allow_cpu else "b"
        raise ValueError(f"gemm: {name} is on {(a if name == 'a' else b).device}; a and b must be on the same "
                         f"CUDA device, got {a.device} and {b.device}")
    for name, t in (("out", out), ("c", c)):
        if t is not None and t.device != a.device:
            raise ValueError(f"gemm: {name} is on {t.device}, a on {a.device}")
    return shape
