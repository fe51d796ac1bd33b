"""Helpers of the host fast paths (a launcher per call metadata, :mod:`.jit`'s compiled functions):
the cheapest callable of a compiled kernel, buffers shared by the launches of one stream, and
allocation sizes in ``torch.empty``'s fastest form.  Pure torch: no DSL import."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

__all__ = ["direct", "stream_query", "stream_buffers", "pooled_views", "size_args", "fresh_or_scratch", "LauncherCache"]


# What the TVM-FFI entry of every compiled kernel checks of each tensor argument against the fake
# tensors it was compiled with, raising ValueError / TypeError before any launch: rank, dtype (an int
# parameter takes signed or unsigned of its width), device type, one device index for all tensors,
# the assumed data-pointer alignment, static sizes and sizes shared by several tensors (one symbol),
# static strides and stride divisibility -- strides of size-1 dims excepted.  A host fast path keys
# its launchers on the rest (the plan's inputs, strides, anything the kernel assumes but cannot
# check) and counts a launch only once the call returned.


def direct(fn):
    """The cheapest callable equivalent to ``fn``, a function :func:`get_compiled` returned: a kernel
    compiled in this process is a DSL object whose Python ``__call__`` adapts keyword arguments before
    calling the TVM-FFI function underneath; a kernel loaded from the disk cache is that TVM-FFI
    function already.  Host fast paths call the result with every argument positionally (as they
    call a loaded kernel) and keep ``fn`` referenced too (it owns the loaded CUDA library).

    Fast-path keys rely on what that TVM-FFI function checks of its arguments itself, before it
    launches anything (the comment above): a launcher's call it refuses raises, launches nothing,
    and the op then takes its checked path, which names the argument."""
    get = getattr(fn, "__tvm_ffi_object__", None)
    exe = getattr(fn, "execution_args", None)
    if get is None or exe is None or getattr(exe, "has_pointer_address_arg_specs", True):
        return fn
    raw = get()
    return fn if raw is None else raw


def stream_query():
    """``(capturing, current_stream)``: ``capturing()`` is whether torch's current CUDA stream is being
    captured into a graph, ``current_stream(device_index)`` a hashable token of the current stream of
    a device.  Torch's C entry points when it has them (tenths of a microsecond; ``torch.cuda``'s
    Python functions take microseconds), else those functions (a CPU-only build: never called)."""
    C = torch._C
    if hasattr(C, "_cuda_isCurrentStreamCapturing") and hasattr(C, "_cuda_getCurrentStream"):
        return C._cuda_isCurrentStreamCapturing, C._cuda_getCurrentStream
    return (torch.cuda.is_current_stream_capturing,
            lambda index: torch.cuda.current_stream(index).cuda_stream)


_capturing, _current_stream = stream_query()


def stream_buffers(cache: dict, device, make: Callable[[], Any]):
    """Buffers that launches on one stream may share (they run in order): ``make()`` once per (device,
    stream), kept in ``cache``; while a CUDA graph is being captured a fresh ``make()`` every call (the
    graph keeps it, so graphs replayed side by side share none).  A non-CUDA device (the CPU tests'
    stub kernels) has no streams: one per device."""
    if device.type != "cuda":
        key = (device, None)
    elif _capturing():
        return make()
    else:
        key = (device, _current_stream(device.index))
    buf = cache.get(key)
    if buf is None:
        buf = cache[key] = make()
    return buf


_POOL_GRAIN = 1 << 16  # pool buffers grow in whole multiples of this many elements
_pool_generation = 0  # counts pool buffers made: views carved before the last one may be of an old buffer


def pooled_views(cache: dict, device, shapes: tuple, dtype=torch.float32) -> tuple:
    """Float32 scratch tensors of ``shapes``, consecutive views of one grow-only buffer per (device,
    stream) that every caller shares: for state a launch writes and reads within its own stream work
    (the split decode's partial states), so launches of every shape on one stream, ordered, take turns
    in the same memory and a server whose batch changes every step holds one buffer the size of its
    largest launch, not one per shape.  ``cache`` (the caller's, per shape) keeps the carved views per
    (device, stream) with the pool generation they were carved in: a call is one dict read and an int
    comparison while no pool has grown since.  A pool that must grow is replaced by a larger buffer;
    the old one lives on only while views of it are cached (each shape re-carves at its next call).
    While a CUDA graph is being captured: fresh tensors every call, which the graph keeps (graphs
    replayed side by side share none).  A non-CUDA device (the CPU tests' stub kernels) has no
    streams: one pool per device."""
    global _pool_generation
    if device.type != "cuda":
        key = (device, None)
    elif _capturing():
        return tuple(torch.empty(s, dtype=dtype, device=device) for s in shapes)
    else:
        key = (device, _current_stream(device.index))
    got = cache.get(key)
    if got is not None and got[0] == _pool_generation:
        return got[1]
    sizes = [math.prod(s) for s in shapes]
    need = sum(sizes)
    buf = _POOLS.get(key)
    if buf is None or buf.numel() < need or buf.dtype != dtype:
        buf = _POOLS[key] = torch.empty(-(-need // _POOL_GRAIN) * _POOL_GRAIN, dtype=dtype, device=device)
        _pool_generation += 1
    views, off = [], 0
    for s, n in zip(shapes, sizes):
        views.append(buf[off:off + n].view(s))
        off += n
    cache[key] = (_pool_generation, tuple(views))
    return cache[key][1]


def size_args(shape) -> tuple:
    """``shape`` as ``torch.empty``'s positional sizes: ``torch.empty(*size_args(s), ...)`` parses a few
    hundred nanoseconds faster than ``torch.empty(s, ...)`` (a tuple, slower still a ``torch.Size``),
    which host fast paths pay on every allocation; ``((),)`` for a 0-d shape."""
    return tuple(int(n) for n in shape) or ((),)


#: (device, dtype) -> the write-only scratch pool's buffers, newest last (:func:`fresh_or_scratch`)
_SCRATCH: dict = {}


def _scratch_view(shape, dtype, device):
    """A view of ``shape`` at the start of the newest scratch buffer of (device, dtype), which grows
    (doubling) when too small.  Superseded buffers are kept: a CUDA graph captured with a view of one
    writes into it on every replay, so it must never be freed and reused."""
    numel = math.prod(shape)
    pool = _SCRATCH.setdefault((device, dtype), [])
    if not pool or pool[-1].numel() < numel:
        pool.append(torch.empty(max(numel, 2 * pool[-1].numel() if pool else 0, 1024), dtype=dtype, device=device))
    return pool[-1][:numel].view(shape)


def fresh_or_scratch(empty: Callable, shape, dtype, device) -> Callable[[bool], Any]:
    """``get(fresh)``: ``empty(shape, dtype=dtype, device=device)`` when ``fresh``, else a scratch tensor
    made by the first such call and returned to every later one -- for an output a kernel must write
    but no caller reads (a launcher's LSE when the call did not ask for it): calls on any stream, and
    CUDA graphs, may share it, and so may every launcher: it is a view of one pool per device and dtype
    (:func:`_scratch_view`), so launchers made per shape (a growing cache's decode steps, prompts of
    every length) do not each hold their own.  ``get.scratch``: the list that holds it once made (empty
    before), for a launcher that takes it without a call."""
    scratch, size = [], size_args(shape)

    def get(fresh: bool):
        if fresh:
            return empty(*size, dtype=dtype, device=device)
        if not scratch:
            scratch.append(_scratch_view(tuple(int(n) for n in shape), dtype, device))
        return scratch[0]
    get.scratch = scratch
    return get


#: :attr:`LauncherCache.last` with no hit to remember (no key equals None)
NO_LAST = (None, None, None, None)

#: entries a cache keyed by call metadata keeps (launchers, plans): a decode step over a growing cache
#: (Transformers' DynamicCache) or a prompt of a new length adds one, so an unbounded cache would grow
#: for as long as a model generates
MAX_ENTRIES = 512

#: armed entries a :class:`LauncherCache` keeps (one per weight of a model): more than any model's linears
#: (Llama-3-70B has 560), since a cache smaller than a step's weights would drop each entry before its
#: next use and never arm one; an entry is a small tuple
MAX_ARMED = 1 << 14


class BoundedCache(dict):
    """A dict that keeps at most ``limit`` entries: inserting a new key into a full one first drops the
    oldest insertion (a key in steady use is made again after ``limit`` newer ones: a miss, never a
    wrong hit).  Reads are plain dict reads."""

    __slots__ = ("limit",)

    def __init__(self, *args, limit: int = MAX_ENTRIES, **kw):
        super().__init__(*args, **kw)
        self.limit = limit

    def __setitem__(self, key, value):
        if len(self) >= self.limit and key not in self:
            super().__delitem__(next(iter(self)))
        super().__setitem__(key, value)

    # (dict's own setdefault and update would insert past the bound)
    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args, **kw):
        for key, value in dict(*args, **kw).items():
            self[key] = value


#: (device, stream) -> the newest pool buffer of :func:`pooled_views`: at most 64 (a server that makes a
#: stream per request would otherwise keep one per stream it ever used; a dropped one is made again)
_POOLS = BoundedCache(limit=64)


class LauncherCache(BoundedCache):
    """A host fast path's launchers by call metadata (key -> launcher) that remembers its last hit:
    ``last`` is ``(key, launcher, guard, rest)``, so a call with the metadata of the call before it
    finds its launcher with one tuple comparison, without hashing the key (a dict lookup hashes it and
    then compares it too: ~0.15 us on a decode key), or, once armed, with its ``guard``
    (:func:`metadata_guard` of the tensors its key describes) checked and ``rest`` (the key's other
    parts) compared, without reading the tensors' metadata in Python at all.  The fast path writes the
    tests out::

        key, launch, guard, rest = cache.last
        hit = launch if guard and rest == call_rest and guard.check(*tensors) else None
        hit = hit or (launch if key == call_key else cache.hit(call_key))

    A dict hit is remembered unarmed (guard and rest None): calls alternating between keys (a model's
    sliding-window and full layers, out= and allocating calls) never run a guard that fails.  A repeat
    through the key (the launcher is the last hit's) arms it, ``(key, launcher, launcher.guard,
    launcher.rest)``, or stores ``rest`` False where it has no guard, so the next calls of the run take
    the guard; a guard that failed a call whose key is the last one (another dispatch state than the one
    it was made in, say inference mode) is disarmed, ``(key, launcher, None, False)``, until another
    launcher is hit (:meth:`repeat`).

    ``armed``: entries of the same kind by a hint the fast path reads cheaply (gemm: b's data pointer,
    one per weight of a model; its entries carry a fifth field, see :func:`~cute_kernels.gemm.host._arm`),
    for calls that alternate between launchers (a model's linears): each finds its own entry, armed by
    its own repeat.  A hint only says which entry to try: the guard and ``rest`` decide, so a stale hint
    (a pointer reused by another tensor) at worst fails its guard.  At most :data:`MAX_ARMED` entries.

    Every change to the dict forgets the last hit and the armed entries (a launcher replaced or removed
    under its key is never returned again).  At most ``limit`` launchers (:class:`BoundedCache`)."""

    __slots__ = ("last", "armed")

    def __init__(self, *args, limit: int = MAX_ENTRIES, **kw):
        super().__init__(*args, limit=limit, **kw)
        self.last = NO_LAST
        self.armed = BoundedCache(limit=MAX_ARMED)

    def _forget(self) -> None:
        self.last = NO_LAST
        if self.armed:
            self.armed.clear()

    def repeat(self, key, launch, guard_failed: bool) -> None:
        """The last hit, ``launch`` under ``key``, taken again through its key: armed (its guard and rest,
        or rest False where it has no guard), or disarmed for the run where its guard failed this call.
        The fast paths call it on those transitions only, after testing ``guard is False or rest is None``
        on ``last`` themselves (a steady run of repeats pays no call)."""
        self.last = (key, launch, None, False) if guard_failed else (key, launch, launch.guard, launch.rest or False)

    def hit(self, key):
        """``get(key)``, remembered as the last hit, unarmed, when there is one."""
        launch = self.get(key)
        if launch is not None:
            self.last = (key, launch, None, None)
        return launch

    def __setitem__(self, key, value):
        self._forget()
        super().__setitem__(key, value)

    def __delitem__(self, key):
        self._forget()
        super().__delitem__(key)

    def clear(self):
        self._forget()
        super().clear()

    def pop(self, *args):
        self._forget()
        return super().pop(*args)

    def popitem(self):
        self._forget()
        return super().popitem()

    def setdefault(self, key, default=None):
        self._forget()
        return super().setdefault(key, default)

    def update(self, *args, **kw):
        self._forget()
        super().update(*args, **kw)

    def __ior__(self, other):
        self.update(other)
        return self


try:  # torch.compile's tensor guard (C++): one call checks a few tensors' metadata
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # pragma: no cover  (another torch)
    _TensorGuards = None

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def metadata_guard(*tensors, free=(), allow_grad: bool = False):
    """A check, ``guard.check(*like) -> bool``, that ``like`` are tensors of ``tensors``' exact types,
    dtypes, device indices, dispatch keys (device type, inference mode), sizes and strides, none
    requiring grad, and no two the same object: torch.compile's ``TensorGuards``, a C++ loop (~0.6 us
    for four tensors where reading their metadata in Python takes ~1.2).  ``free``: ``(tensor index,
    size dims, stride dims)`` entries whose values it leaves open (a growing cache's length and the
    strides that follow from it).  ``allow_grad``: tensors may require grad, the check then asks the
    same of ``like`` (the caller tests grad mode itself).  None where it cannot stand for a launcher's
    key: another torch without it, a tensor that is not a plain one or requires grad (unless allowed),
    two of them the same object (its check refuses that), any failure building it."""
    if _TensorGuards is None or any(type(t) not in _PLAIN or (t.requires_grad and not allow_grad) for t in tensors):
        return None
    sizes, strides = [list(t.shape) for t in tensors], [list(t.stride()) for t in tensors]
    for i, size_dims, stride_dims in free:
        for d in size_dims:
            sizes[i][d] = None
        for d in stride_dims:
            strides[i][d] = None
    try:
        guard = _TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides)
        return guard if guard.check(*tensors) is True else None
    except Exception:  # noqa: BLE001  (a guard is an optimization: without one, the key path)
        return None
