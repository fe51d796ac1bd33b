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
    launcher's key fixes every extent, so only the data pointers are read per call, each input's
    comparison written out (:func:`_guard_maker`): no per-call loop, star-args tuple or nested call,
    and no pointer read for an input whose extent is empty."""
    if not out_extent:
        return _no_guard
    live = tuple(i for i, e in enumerate(extents) if e)
    make = _guard_makers.get((len(names), live))
    if make is None:
        make = _guard_makers[(len(names), live)] = _guard_maker(len(names), live)
    return make(_refused, who, name, tuple(names), int(out_extent), *(int(extents[i]) for i in live))


def _no_guard(out, *ts) -> None:
    """The guard of an empty out: it meets nothing."""


#: (number of inputs, indices of the non-empty ones) -> :func:`_guard_maker`'s factory
_guard_makers: dict = {}


def _guard_maker(n: int, live: tuple):
    """The factory of :func:`out_guard`'s closures for ``n`` inputs of which those at ``live`` have bytes:
    ``make(refused, who, name, names, out_extent, *live extents) -> guard(out, t0, ..., t{n-1})``, the
    source generated once per pattern (as ``dataclasses`` builds its methods) so that each live
    input's test is written out: its pointer read once, two comparisons against closure constants."""
    ts = ", ".join(f"t{i}" for i in range(n))
    src = [f"def make(refused, who, name, names, out_extent{''.join(f', e{i}' for i in live)}):",
           f"    def guard(out, {ts}):",
           "        o = out.data_ptr()",
           "        end = o + out_extent"]
    for i in live:
        src += [f"        if t{i} is not None:",
                f"            p = t{i}.data_ptr()",
                f"            if p < end and o < p + e{i}:",
                f"                refused(who, name, names[{i}])"]
    src.append("    return guard")
    scope: dict = {}  # (a fixed template: only input counts and indices enter the source)
    exec(compile("\n".join(src), f"<out_guard {n} {live}>", "exec"), scope)
    return scope["make"]
