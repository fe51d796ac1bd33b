"""What the attention calls of one Transformers forward step share (:mod:`.hf` describes the routing):
the valid key lengths (:func:`_valid_lengths`: computed once per step, from the step's
``cache_position`` / ``position_ids``; :func:`_clamp_lengths`: once more per step for the sliding
layers) and the decision each call site reaches (:func:`lookup`), reused while the next calls pass
tensors of the same metadata and the same keywords.

An eager decode step calls the attention function once per layer, and the layers of one step (one
kind of layer: full or sliding) pass query / key / value tensors of the same shapes, strides, dtypes and
device, the same keyword names and the same scaling, window and softcap.  The checks that decide
between the kernels and a fallback (:func:`~.sdpa.route`, the keywords' fallbacks, the softcap, the
causal and window tests) read only that, so a call whose key matches a call that reached the kernels
reaches them too: :func:`lookup` answers it with the :class:`Decision` that call stored, and
:mod:`.hf` runs the kernel path (everything per call that depends on values: the valid lengths, the
sinks, the scale) without the checks.

The key, and why it is all those checks read (calls with an attention mask, under tracing, or with
inputs that require grad never use the cache):

- the Python arguments: ``causal`` (after the module default), ``dropout`` and ``scaling``, the
  keyword names in order, the ``sliding_window`` and ``softcap`` values; each value with its type, and
  only plain ones (None, bool, int, float: equal values of one type take the same branches);
- the tensors: :func:`~..common.fastpath.metadata_guard` of query, key and value (exact tensor types,
  so no fake tensors; dtypes, device types and indices, sizes, strides, none requiring grad, so the
  route's grad test is False; dispatch keys, so an inference-mode call keys apart);
- the route's environment: the device types it takes, its Hopper test and that test's cache of
  devices (tests and profiles replace them), compared by identity;
- per call, not keyed: the 16-byte alignment of the three data pointers (where the route checks them:
  not on meta tensors), and that every keyword whose value the fallbacks read is still None or False.
  A call that fails one of these runs the full checks, which give its fallback and its reason.

Only decisions that reach the kernels are stored, so every fallback, its reason and its warning, and
every error, come from the full checks as before.  At most :data:`KEEP` keys are kept (the oldest
dropped first): one per kind of layer and step shape in practice.

A growing cache (a DynamicCache: each step's keys a new tensor one position longer) changes the key and
value lengths and the strides that follow from them every step.  A causal decision for ``decode_attn``
also keeps a guard that leaves those open (:attr:`Decision.grow`); a call it passes is re-checked for
what the route reads of them (strides in 16-byte units, more keys than queries) and takes the decision,
with its own length, instead of running the full checks once per step; the exact guard then moves to
its metadata, which the step's other layers share, so they pass that one check.
"""

from __future__ import annotations

import torch

from ..common.fastpath import BoundedCache, metadata_guard, stream_query
from . import sdpa as _sdpa
from .hf_masks import _is_static_buffer

__all__ = ["Decision", "lookup", "remember", "clear", "KEEP"]

#: keys kept (a model has a few kinds of layers; a new step shape replaces its kind's entry)
KEEP = 64
_SCALARS = frozenset({type(None), bool, int, float})
_DECISIONS = BoundedCache(limit=KEEP)


class Decision:
    """What a call that reached the kernels decided, for the calls of the same key: the route's
    kernel, the keywords that must stay None / False, whether data pointers are checked, and the
    query's shape and device (the guard holds them equal; the keys' length is each call's own)."""

    __slots__ = ("guard", "grow", "devices", "hopper", "hoppers", "where", "others", "sinks", "pointer", "batch", "heads_q",
                 "q_len", "device", "scale")

    def __init__(self, guard, where, others, names, query, grow=None):
        self.guard, self.where, self.others, self.grow = guard, where, others, grow
        self.sinks = "s_aux" in names or "sinks" in names  # (else no call of the key passes sinks)
        self.devices, self.hopper, self.hoppers = _sdpa._KERNEL_DEVICES, _sdpa._is_hopper, _sdpa._HOPPER
        self.device = query.device
        self.pointer = self.device.type != "meta"  # (the route checks no pointer of a meta tensor)
        self.batch, self.heads_q, self.q_len, head_dim = query.shape
        self.scale = head_dim ** -0.5


def call_key(causal: bool, dropout, scaling, kwargs) -> tuple:
    """The Python part of a call's key: each value after its type (a key compares its values only
    where the types are equal: a stored key holds plain scalars, so a lookup's tensor or other odd value
    is never compared with one)."""
    window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap")
    return (tuple(kwargs), causal, type(dropout), dropout, type(scaling), scaling, type(window), window,
            type(softcap), softcap)


def lookup(query, key, value, dropout, scaling, causal: bool, kwargs) -> Decision | None:
    """The stored decision for this call (eager, no attention mask), or None: no entry, other tensor
    metadata or route environment, a keyword now set, a misaligned data pointer."""
    window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap")  # (call_key, written out)
    try:
        hit = _DECISIONS.get((tuple(kwargs), causal, type(dropout), dropout, type(scaling), scaling, type(window),
                              window, type(softcap), softcap))
    except Exception:  # noqa: BLE001  (an unhashable value: never stored)
        return None
    if (hit is None or hit.devices is not _sdpa._KERNEL_DEVICES or hit.hopper is not _sdpa._is_hopper
            or hit.hoppers is not _sdpa._HOPPER):
        return None
    if not hit.guard.check(query, key, value):
        if not (hit.grow is not None and hit.grow.check(query, key, value) and key.shape[2] > hit.q_len
                and _sdpa._strides_ok(key, False) and _sdpa._strides_ok(value, False)):
            return None
        # a growing cache's next step (the module doc): the step's other layers pass the same metadata,
        # so the exact guard follows it and they pass that
        hit.guard = metadata_guard(query, key, value) or hit.guard
    for name in hit.others:
        val = kwargs[name]
        if not (val is None or val is False):
            return None
    if hit.pointer and (query.data_ptr() | key.data_ptr() | value.data_ptr()) & 15:
        return None
    return hit


def remember(query, key, value, dropout, scaling, causal: bool, kwargs, where: str, others: tuple) -> None:
    """Store a call's decision to reach ``where`` (the full checks passed, eager, no attention mask):
    nothing where the key or the guard cannot describe it (a non-plain value, tensors requiring grad,
    fake tensors, one tensor passed twice)."""
    ck = call_key(causal, dropout, scaling, kwargs)
    if any(type(x) not in _SCALARS for x in ck[3::2]) or query is key or key is value or query is value:
        return
    guard = metadata_guard(query, key, value)
    if guard is None:
        return
    grow = None
    if where == "decode_attn" and causal:  # the keys' length and the strides above it left open
        grow = metadata_guard(query, key, value, free=((1, (2,), (0, 1)), (2, (2,), (0, 1))))
    _DECISIONS.pop(ck, None)  # (re-inserted last: the oldest key goes first)
    _DECISIONS[ck] = Decision(guard, where, others, ck[0], query, grow)


def clear() -> None:
    """Forget every decision (and the step's lengths)."""
    _DECISIONS.clear()
    _LENGTHS[0] = _CLAMPED[0] = None


# ------------------------------------------------------------------------------------ valid lengths
#: the last :func:`_valid_lengths` result: (its source tensor, the source's version, batch, dtype,
#: device, the lengths); the layers of one step pass the same source, so each step computes it once
_LENGTHS: list = [None]


_stream_capturing = stream_query()[0]  # torch's C entry point: a tenth of torch.cuda's Python function


def _valid_lengths(kwargs, batch: int, kv_len: int, device, dtype=torch.int64, compiling=None) -> torch.Tensor | None:
    """(batch,) contiguous device tensor of ``dtype`` (read-only: it may be shared): keys valid per
    sequence after this step (last position + 1), from ``cache_position`` (1-D) or ``position_ids``
    ((1 or B, Sq)); None when neither is given.  One small kernel (add with a casting ``out=``), once
    per step: the next layers of the step, given the same unchanged source tensor, get the same result
    (not while a CUDA graph is captured or torch.compile traces: there every layer computes its own).
    "Unchanged" is torch's version counter: a source object reused across steps must change through
    torch ops (Transformers makes a new ``cache_position`` per step), not through ``.data`` or DLPack.
    ``compiling``: ``torch.compiler.is_compiling()`` where the caller has it."""
    cp = kwargs.get("cache_position")
    src = cp if isinstance(cp, torch.Tensor) and cp.dim() == 1 and cp.numel() else None
    if src is None:
        src = kwargs.get("position_ids")
        if not (isinstance(src, torch.Tensor) and src.dim() == 2 and src.shape[0] in (1, batch) and src.numel()):
            return None
    if compiling is None:
        compiling = torch.compiler.is_compiling()
    shared = not (compiling or (device.type == "cuda" and _stream_capturing()))
    if shared:  # (read only then: a traced read of it would make compiled callers depend on eager calls)
        hit = _LENGTHS[0]
        if (hit is not None and hit[0] is src and hit[1] == src._version and hit[2] == batch and hit[3] == dtype
                and hit[4] == device):
            return hit[5]
    last = src[-1:] if src is cp else src[:, -1]
    if last.device != device:
        last = last.to(device)
    lens = torch.add(last.expand(batch), 1, out=torch.empty(batch, dtype=dtype, device=device))
    if shared:  # (a captured or traced result must not outlive its graph)
        _LENGTHS[0] = (src, src._version, batch, dtype, device, lens)
    return lens


#: the last :func:`_clamp_lengths` result: (the shared lengths, the bound, the clamped lengths)
_CLAMPED: list = [None]


def _clamp_lengths(lens: torch.Tensor, kv_len: int) -> torch.Tensor:
    """``lens.clamp(max=kv_len)`` (a sliding layer's buffer holds at most ``kv_len`` keys), computed once
    per step: lengths :func:`_valid_lengths` shares (the step's, not a traced or captured call's) with
    the same bound give the same result object to every sliding layer of the step (read-only)."""
    hit, shared = _CLAMPED[0], _LENGTHS[0]
    if hit is not None and hit[0] is lens and hit[1] == kv_len:
        return hit[2]
    out = lens.clamp(max=kv_len)
    if shared is not None and shared[5] is lens:
        _CLAMPED[0] = (lens, kv_len, out)
    return out


def _need_lengths(key) -> None:
    if _is_static_buffer(key):
        raise ValueError("cute_kernels attention: the key tensor is a static cache buffer but the model passes "
                         "neither cache_position nor position_ids to its attention function, so the valid length "
                         "is unknown; use attn_implementation='sdpa' or a DynamicCache with this model")
