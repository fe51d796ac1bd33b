"""Memory overlap of the tensors a kernel writes (issue 35): an output whose elements share addresses,
or one that overlaps an input, would race with the kernel's reads or with itself, so ``gemm``,
``flash_attn`` and ``decode_attn`` refuse them, as PyTorch refuses overlapping ``out=`` tensors.

Pure host arithmetic on shapes, strides and data pointers (no device access).  The byte-range test is
conservative: two views that interleave without sharing an element (the columns ``x[:, :4]`` and
``x[:, 4:]``) count as overlapping.  Torch strides are never negative, so a tensor's bytes run from
its data pointer over :func:`extent` bytes."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor


def extent(t: torch.Tensor) -> int:
    """Bytes from ``t``'s data pointer to the end of its last element (0 for an empty tensor)."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def internal_overlap(t: torch.Tensor) -> bool:
    """True when two elements of ``t`` may share an address: its dims of size > 1, by stride, must each
    step past the reach of the smaller ones (a stride of 0 fails; so do interleaved layouts that do
    not overlap, which no kernel here takes: each needs a unit-stride dim and row strides)."""
    if torch.compiler.is_compiling():  # symbolic sizes cannot be sorted: the zero strides only here,
        # the rest when the custom op runs on real tensors (:func:`check_written` there)
        return any(s == 0 and n > 1 for n, s in zip(t.shape, t.stride()))
    if t.numel() == 0:
        return False
    reach = 0
    for s, n in sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1):
        if s <= reach:
            return True
        reach += (n - 1) * s
    return False


def has_addresses(t) -> bool:
    """Whether ``t``'s data pointer means something: not while torch.compile traces, nor for a fake or
    meta tensor (their pointers are 0, and a fake one's ``data_ptr()`` warns).  Traced calls reach
    the launchers through the custom ops with real tensors, where the launchers check."""
    return not (torch.compiler.is_compiling() or isinstance(t, FakeTensor) or t.device.type == "meta")


def _meets(o: int, o_ext: int, p: int, p_ext: int) -> bool:
    """The byte ranges [o, o + o_ext) and [p, p + p_ext) share a byte (both non-empty)."""
    return bool(o_ext and p_ext) and p < o + o_ext and o < p + p_ext


def same_view(t: torch.Tensor, out: torch.Tensor) -> bool:
    """``t`` is exactly the view ``out`` (same data pointer, strides and dtype): an elementwise
    read-then-write, as gemm's ``out=c``, is no overlap."""
    return t.data_ptr() == out.data_ptr() and t.stride() == out.stride() and t.dtype == out.dtype


def check_written(who: str, name: str, out: torch.Tensor, inputs, same_ok=()) -> None:
    """ValueError naming ``name`` when ``out`` has elements sharing an address or overlaps one of
    ``inputs`` ((name, tensor or None) pairs); ``same_ok``: names of inputs that ``out`` may be
    exactly (same data pointer, strides and dtype: an elementwise read-then-write, as gemm's
    ``out=c``).  The pointer test is skipped for fake and meta tensors."""
    if internal_overlap(out):
        raise ValueError(f"{who}: {name} of shape {tuple(out.shape)} has strides {tuple(out.stride())} under which "
                         f"elements share memory (a stride of 0, or rows that overlap): it cannot be written")
    if not has_addresses(out):
        return
    n = extent(out)
    for iname, t in inputs:
        if t is None or not has_addresses(t):
            continue
        if iname in same_ok and same_view(t, out):
            continue
        if _meets(out.data_ptr(), n, t.data_ptr(), extent(t)):
            _refused(who, name, iname)


def _refused(who: str, name: str, hit: str):
    raise ValueError(f"{who}: {name} overlaps {hit} in memory: the kernel would overwrite an input it is still "
                     f"reading; pass a separate {name} buffer")


def out_guard(who: str, name: str, out_extent: int, names: tuple, extents: tuple):
    """A launcher's check, made once per launcher: ``guard(out, *inputs)`` raises a ValueError naming
    ``name`` and the input it meets when ``out``'s ``out_extent`` bytes meet an input's bytes
    (``extents``, in the order of ``names``; None inputs and empty extents are skipped).  The
    launcher's key fixes every extent, so only the data pointers are read per call; three inputs (q,
    k, v; a, b, c), the common case, get a closure with the comparisons written out (no per-call
    iterator)."""
    if not out_extent:
        return lambda out, *ts: None
    if len(names) == 3:
        (n1, n2, n3), (e1, e2, e3) = names, extents

        def guard3(out, t1, t2, t3):
            o = out.data_ptr()
            end = o + out_extent
            if t1 is not None and e1:
                p = t1.data_ptr()
                if p < end and o < p + e1:
                    _refused(who, name, n1)
            if t2 is not None and e2:
                p = t2.data_ptr()
                if p < end and o < p + e2:
                    _refused(who, name, n2)
            if t3 is not None and e3:
                p = t3.data_ptr()
                if p < end and o < p + e3:
                    _refused(who, name, n3)
        return guard3

    live = tuple((i, names[i], e) for i, e in enumerate(extents) if e)

    def guard(out, *ts):
        o = out.data_ptr()
        end = o + out_extent
        for i, n, e in live:
            t = ts[i]
            if t is not None:
                p = t.data_ptr()
                if p < end and o < p + e:
                    _refused(who, name, n)
    return guard
