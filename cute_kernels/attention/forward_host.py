"""The host fast path of ``flash_attn`` (issue 19: host time per call).

A launcher per call *metadata*, made after a call with that metadata passed the checks
(:mod:`.forward_validate`) and launched; a later call with the same metadata allocates its outputs and
calls the compiled function, nothing else.  A key holds what validation and the plan read that the
compiled function's own argument checks leave open (:func:`~cute_kernels.common.jit.direct`): q's
shape, dtype and device; k's shape (the GQA ratio, the page size); every stride (those of size-1 dims
and an out's zero strides included); the int tensors' shapes where the kernel does not tie them to q,
and their dtypes (the compiled function takes uint32 for int32); the host scalars (max_seqlen, window,
causal) with their types; the optional tensors' types (a fake one never hits).  Never a device value
(lengths, page ids), never a tensor's identity.  A hit the compiled function refuses raises before it
launches and counts nothing; :func:`~.forward.flash_attn` then takes its checked path, which names the
argument.  ``decode_attn``'s launchers live here too (:func:`decode_launcher`, its keys in
:mod:`.decode`): the same convention and the same per-call overlap guard.
"""

from __future__ import annotations

import math

import torch

from ..common import jit
from ..common.fastpath import BoundedCache, pooled_views
from ..common.overlap import extent, out_guard
from ..common.host import LOG2_E, WINDOW_UNBOUNDED, tile_counter
from ..testing import LAUNCHES
from .decode_plan import checked_env
from .forward_validate import FLOAT32_MAX, MAX_SOFTMAX_SCALE

_empty = torch.empty
#: tensor types the fast path takes (subclasses such as FakeTensor always take the checked path)
FAST_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})


def window_args(window_left: int, window_right: int) -> tuple[int, int]:
    """API window sides (-1: unbounded; other negative sides are FlashAttention-4's, the kernel takes
    them as they are) as the kernel takes them."""
    return (WINDOW_UNBOUNDED if window_left == -1 else window_left), (WINDOW_UNBOUNDED if window_right == -1 else window_right)


def int_sides(window_size) -> bool:
    """``window_size`` is a pair of ints / None: the last-hit test (:class:`~..common.fastpath.LauncherCache`)
    compares keys without hashing them, which the dict does, and a tensor side compares equal to its
    value where the dict, hashing it by identity, finds nothing (the checks then refuse it)."""
    return (window_size.__class__ is tuple and len(window_size) == 2 and window_size[0].__class__ in _SIDES
            and window_size[1].__class__ in _SIDES)


_SIDES = frozenset({int, type(None)})


def variant_key(softcap, learnable_sink) -> tuple:
    """What a call with softcapping or a sink adds to its key: softcap with its type (its value: a
    launcher is made only after the checks passed it, so a NaN or negative one never hits), and the
    sink's type, shape, stride, dtype and device (never its values)."""
    sink = None if learnable_sink is None else (type(learnable_sink), learnable_sink.shape, learnable_sink.stride(),
                                                learnable_sink.dtype, learnable_sink.get_device())
    return ("variant", type(softcap), softcap, sink)


def variant_values(softcap, learnable_sink) -> tuple:
    """The values a launcher of a variant configuration takes after the device tensors, in the order of
    :attr:`~.forward_kernel.FlashFwdConfig.variant_args`: softcap (when not 0), the sink (when given)."""
    return ((softcap,) if softcap else ()) + (() if learnable_sink is None else (learnable_sink,))


# ------------------------------------------------------------------------------------------- keys
def _no_key(causal) -> None:
    """Raise TypeError (no key, the checked path) for a causal that is not a bool: a tensor would key
    a launcher by its identity, one more per call."""
    raise TypeError(f"fast path: causal of type {type(causal).__name__}")


def dense_key(q, k, v, out, causal, window_size) -> tuple:
    """A dense call's metadata (the module doc); an unhashable argument, or a causal that is not a
    bool, raises TypeError."""
    if type(causal) is not bool:
        _no_key(causal)
    # (the parts calls of one model vary in first: a key unlike the last hit's differs early, LauncherCache)
    return (type(window_size), window_size, None if out is None else (type(out), out.stride()), type(causal), causal,
            q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), v.stride())


def packed_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, causal, window_size) -> tuple:
    """A packed call's metadata: :func:`dense_key`'s, cu_seqlens_q's shape (the kernel ties cu_seqlens_k's
    to it), both cu_seqlens dtypes and the max_seqlen values: never the cu_seqlens values."""
    if type(causal) is not bool:
        _no_key(causal)
    return ("packed", q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), v.stride(),
            cu_seqlens_q.shape, cu_seqlens_q.dtype, cu_seqlens_k.dtype,
            type(max_seqlen_q), max_seqlen_q, type(max_seqlen_k), max_seqlen_k,
            None if out is None else (type(out), out.stride()), type(causal), causal, type(window_size), window_size)


def paged_key(q, k, v, block_table, seqused_k, cu_seqlens_q, max_seqlen_q, max_seqlen_k, out, causal,
              window_size) -> tuple:
    """A paged call's metadata: :func:`dense_key`'s (k's shape: pages and page size), the block table's
    shape, stride and dtype (the kernel ties seqused_k's shape to it), seqused_k's dtype, for packed
    queries cu_seqlens_q's type, shape and dtype (which the kernel does not tie to the batch) and
    max_seqlen_q, and the max_seqlen_k hint (checked against the capacity): never the lengths or page ids."""
    if type(causal) is not bool:
        _no_key(causal)
    return ("paged", q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), v.stride(),
            block_table.shape, block_table.stride(), block_table.dtype, seqused_k.dtype,
            None if cu_seqlens_q is None else (type(cu_seqlens_q), cu_seqlens_q.shape, cu_seqlens_q.dtype),
            type(max_seqlen_q), max_seqlen_q, type(max_seqlen_k), max_seqlen_k,
            None if out is None else (type(out), out.stride()), type(causal), causal, type(window_size), window_size)


def fast_scale(hit, softmax_scale):
    """The scale a hit launches with; None when softmax_scale needs the checks (they say what is wrong
    with it, or take a numpy scalar).  The bound is the checks' (:func:`.forward_validate.check_scale`):
    an int past the float range (``10**400 < math.inf`` is True) or a float whose ``scale * log2(e)``
    overflows float32 goes to them."""
    if softmax_scale is None:
        return hit.default_scale
    ts = type(softmax_scale)
    return softmax_scale if (ts is float or ts is int) and 0.0 < softmax_scale <= MAX_SOFTMAX_SCALE else None


def lookup(launchers: dict, make_key, args: tuple, tensors: tuple, variant=None):
    """``(key, launcher or None)`` of a call in ``launchers`` (key -> :func:`make_launcher`'s launcher):
    ``make_key(*args)`` when every one of ``tensors`` is a plain tensor, else ``(None, None)`` (so is a
    non-tensor or an unhashable argument: the checks say what); ``variant``: ``(softcap,
    learnable_sink)`` of a call with either (:func:`variant_key` joins the key)."""
    try:
        for t in tensors:
            if type(t) not in FAST_TYPES:
                return None, None
        key = make_key(*args)
        if variant is not None:
            if variant[1] is not None and type(variant[1]) not in FAST_TYPES:
                return None, None
            key = (key, variant_key(*variant))
        return key, launchers.get(key)
    except (AttributeError, TypeError):
        return None, None


def run_hit(hit, checked, softmax_scale, return_lse, q, k, v, out, *device_tensors):
    """A call's result from its launcher ``hit``, or None when the checked path must run instead: no
    launcher, checked mode (``checked`` None: the environment), a scale or return_lse the checks must
    see, or a call the compiled function refused (it launched nothing)."""
    if hit is None or return_lse.__class__ is not bool or (checked is None and checked_env()):
        return None
    scale = fast_scale(hit, softmax_scale)
    if scale is None:
        return None
    try:
        o, lse = hit(q, k, v, out, return_lse, scale, *device_tensors)
    except Exception:  # the compiled function refused an argument: the checked path names it
        return None
    return (o, lse) if return_lse else o


# ---------------------------------------------------------------------------------------- launchers
def make_launcher(fn, q, lshape, dynamic: bool, mode: str, window=(-1, -1), max_seqlens=(), inputs=(), out=None,
                  variant=()):
    """The launcher of a compiled forward ``fn`` for calls shaped as ``q``: allocates out (unless
    given) and the LSE (``lse``: a tensor, or a bool -- True a fresh (``lshape``) one, False a scratch
    one made by the first such call and never read), launches, counts.  Every launch of the forward
    goes through one (the checked path makes one per call, a fast-path hit reuses it).  ``mode`` and
    the device tensors a launch passes after ``(q, k, v, out, lse, scale)``, in the kernel's order
    (:func:`~.forward_kernel.forward_builder`):

    * ``"dense"``: none (a window other than (-1, -1): the window entry);
    * ``"packed"``: ``cu_seqlens_q, cu_seqlens_k`` (``max_seqlens``: (max_seqlen_q, max_seqlen_k));
    * ``"paged"``: ``block_table, seqused_k``;
    * ``"paged_packed"``: ``cu_seqlens_q, block_table, seqused_k`` (``max_seqlens``: (max_seqlen_q,)).

    A given out must not overlap an input (issue 35): validation refuses it before a launcher is made,
    and each launch with a given out checks its data pointer against the inputs' byte ranges, whose
    sizes (``inputs``: the call's ``(q, k, v, *device tensors)``, and ``out``) are fixed by the metadata
    a launcher is kept under (shapes, strides), so a fast-path hit with an overlapping out raises
    before launching (the checked path then names it).

    ``variant``: the configuration's :attr:`~.forward_kernel.FlashFwdConfig.variant_args`; a launch then
    takes their values after the device tensors (softcap: the float, learnable_sink: the tensor, which
    joins ``inputs`` for the overlap guard) and passes the kernel ``softcap * log2(e)`` as the softmax's
    scale and ``softmax_scale / softcap`` (:func:`variant_launcher`)."""
    if variant:
        return variant_launcher(fn, q, lshape, dynamic, mode, window, max_seqlens, inputs, out, tuple(variant))
    qshape, dtype, dev, run = jit.size_args(q.shape), q.dtype, q.device, jit.direct(fn)
    names = ("q", "k", "v") + {"dense": (), "packed": ("cu_seqlens_q", "cu_seqlens_k"),
                               "paged": ("block_table", "seqused_k"),
                               "paged_packed": ("cu_seqlens_q", "block_table", "seqused_k")}.get(mode, ())
    exts, o_ext = tuple(extent(t) for t in inputs), (0 if out is None else extent(out))
    guard = out_guard("flash_attn", "out", o_ext, names, exts)
    lse_for = jit.fresh_or_scratch(_empty, lshape, torch.float32, dev)
    wl, wr = window_args(*window)

    if mode == "dense" and tuple(window) == (-1, -1):
        scratch, (qe, ke, ve) = lse_for.scratch, exts
        static = None if dynamic else tile_counter(dev, False)  # (a static schedule's: one per device, kept)

        def launch(q, k, v, out, lse, scale):
            if out is None:
                out = _empty(*qshape, dtype=dtype, device=dev)
            else:  # out's byte range against the inputs' on their pointers, written out (one read each, no
                # call); one that meets (or an empty input's, which the guard skips) goes to the guard
                o = out.data_ptr()
                end = o + o_ext
                if ((p := q.data_ptr()) < end and o < p + qe or (p := k.data_ptr()) < end and o < p + ke
                        or (p := v.data_ptr()) < end and o < p + ve):
                    guard(out, q, k, v)
            if lse is False:
                lse = scratch[0] if scratch else lse_for(False)
            elif lse is True:
                lse = lse_for(True)
            run(q, k, v, out, lse, tile_counter(dev, True) if static is None else static, scale * LOG2_E)
            LAUNCHES["flash_attn"] += 1
            return out, lse
    elif mode == "dense":
        qe, ke, ve = exts

        def launch(q, k, v, out, lse, scale):
            if out is None:
                out = _empty(*qshape, dtype=dtype, device=dev)
            else:  # (the pointer test of the launcher above: windowed layers alternate with full ones)
                o = out.data_ptr()
                end = o + o_ext
                if ((p := q.data_ptr()) < end and o < p + qe or (p := k.data_ptr()) < end and o < p + ke
                        or (p := v.data_ptr()) < end and o < p + ve):
                    guard(out, q, k, v)
            if lse.__class__ is bool:
                lse = lse_for(lse)
            run(q, k, v, out, lse, tile_counter(dev, dynamic), scale * LOG2_E, wl, wr)
            LAUNCHES["flash_attn"] += 1
            return out, lse
    elif mode == "packed":
        mq, mk = max_seqlens

        def launch(q, k, v, out, lse, scale, cu_seqlens_q, cu_seqlens_k):
            if out is None:
                out = _empty(*qshape, dtype=dtype, device=dev)
            else:
                guard(out, q, k, v, cu_seqlens_q, cu_seqlens_k)
            if lse.__class__ is bool:
                lse = lse_for(lse)
            run(q, k, v, out, lse, tile_counter(dev, dynamic), cu_seqlens_q, cu_seqlens_k, mq, mk, scale * LOG2_E,
                wl, wr)
            LAUNCHES["flash_attn"] += 1
            return out, lse
    elif mode == "paged":
        def launch(q, k, v, out, lse, scale, block_table, seqused_k):
            if out is None:
                out = _empty(*qshape, dtype=dtype, device=dev)
            else:
                guard(out, q, k, v, block_table, seqused_k)
            if lse.__class__ is bool:
                lse = lse_for(lse)
            run(q, k, v, out, lse, tile_counter(dev, dynamic), block_table, seqused_k, scale * LOG2_E, wl, wr)
            LAUNCHES["flash_attn"] += 1
            return out, lse
    elif mode == "paged_packed":
        (mq,) = max_seqlens

        def launch(q, k, v, out, lse, scale, cu_seqlens_q, block_table, seqused_k):
            if out is None:
                out = _empty(*qshape, dtype=dtype, device=dev)
            else:
                guard(out, q, k, v, cu_seqlens_q, block_table, seqused_k)
            if lse.__class__ is bool:
                lse = lse_for(lse)
            run(q, k, v, out, lse, tile_counter(dev, dynamic), cu_seqlens_q, mq, block_table, seqused_k,
                scale * LOG2_E, wl, wr)
            LAUNCHES["flash_attn"] += 1
            return out, lse
    else:
        raise ValueError(f"make_launcher: unknown mode {mode!r}")
    launch.default_scale, launch.keep = 1.0 / math.sqrt(q.shape[-1]), fn  # (fn owns run's CUDA library)
    launch.guard = launch.rest = None  # (LauncherCache: the op sets them for a plain call's)
    return launch


#: (mode) -> the device tensors and max_seqlens in the kernel's order before scale_log2
_BEFORE_SCALE = {
    "dense": lambda ts, ms: (),
    "packed": lambda ts, ms: (ts[0], ts[1], ms[0], ms[1]),
    "paged": lambda ts, ms: (ts[0], ts[1]),
    "paged_packed": lambda ts, ms: (ts[0], ms[0], ts[1], ts[2]),
}
_DEVICE_NAMES = {"dense": (), "packed": ("cu_seqlens_q", "cu_seqlens_k"), "paged": ("block_table", "seqused_k"),
                 "paged_packed": ("cu_seqlens_q", "block_table", "seqused_k")}


def variant_launcher(fn, q, lshape, dynamic: bool, mode: str, window, max_seqlens, inputs, out, variant: tuple):
    """:func:`make_launcher` of a softcapping and / or sink configuration: ``launch(q, k, v, out, lse,
    scale, *device_tensors, *variant_values)`` (one body for every mode; the plain configurations keep
    the mode-specific ones)."""
    if mode not in _BEFORE_SCALE:
        raise ValueError(f"make_launcher: unknown mode {mode!r}")
    qshape, dtype, dev, run = jit.size_args(q.shape), q.dtype, q.device, jit.direct(fn)
    n_dev = len(_DEVICE_NAMES[mode])
    before, ms = _BEFORE_SCALE[mode], tuple(max_seqlens)
    after = () if mode == "dense" and tuple(window) == (-1, -1) else window_args(*window)
    softcap_on = "softcap_scale" in variant
    names = ("q", "k", "v") + _DEVICE_NAMES[mode] + (("learnable_sink",) if "learnable_sink" in variant else ())
    exts, o_ext = tuple(extent(t) for t in inputs), (0 if out is None else extent(out))
    guard = out_guard("flash_attn", "out", o_ext, names, exts)
    lse_for = jit.fresh_or_scratch(_empty, lshape, torch.float32, dev)

    def launch(q, k, v, out, lse, scale, *rest):
        ts = rest[:n_dev]
        if softcap_on and not scale / rest[n_dev] <= FLOAT32_MAX:  # a hit's new scale: the checks name it
            raise ValueError("flash_attn: softmax_scale / softcap past the float32 range")
        if out is None:
            out = _empty(*qshape, dtype=dtype, device=dev)
        else:
            guard(out, q, k, v, *ts, *(rest[-1:] if names[-1] == "learnable_sink" else ()))
        if lse.__class__ is bool:
            lse = lse_for(lse)
        extra = rest[n_dev:]
        if softcap_on:  # scores tanh(q.k * scale / softcap), softmax scale softcap (module softmax's convention)
            softcap = extra[0]
            run(q, k, v, out, lse, tile_counter(dev, dynamic), *before(ts, ms), softcap * LOG2_E, *after,
                scale / softcap, *extra[1:])
        else:
            run(q, k, v, out, lse, tile_counter(dev, dynamic), *before(ts, ms), scale * LOG2_E, *after, *extra)
        LAUNCHES["flash_attn"] += 1
        return out, lse
    launch.default_scale, launch.keep = 1.0 / math.sqrt(q.shape[-1]), fn
    launch.guard = launch.rest = None
    return launch


# ------------------------------------------------------------------------------- decode_attn's launchers
#: (P, B, Sq, Hq, D), device -> the split decode's partial states per (device, stream) (:func:`decode_parts`);
#: a dropped entry lives on in the launchers that hold it (bounded too)
_DECODE_PARTS = BoundedCache(limit=64)


def decode_parts(pshape, dev) -> dict:
    """The per-stream views of the split decode's partial outputs / LSEs for launches of ``pshape``
    (:func:`.fastpath.pooled_views`' cache): every launcher of that shape shares them, and every shape
    carves them from one pool buffer per stream (a growing cache's decode steps make a launcher per
    length; a continuously batched server a shape per batch size; launches on one stream are ordered,
    so sharing is as safe as reuse)."""
    return _DECODE_PARTS.setdefault((pshape, dev), BoundedCache(limit=16))  # (streams)


def decode_launcher(fn, keep, P, qshape, dtype, dev, operands=(None,) * 6, variant=(), sink=None, leftpad=None, window=None):
    """``launch(q, k, v, out, lse, scale, seqlens, block_table, workspace) -> (out, lse)`` (the
    forward's launcher convention, :func:`run_hit`): allocates out (unless given) and the
    LSE (``lse`` a tensor, or a bool: a fresh one, or False a scratch one), then launches and counts
    (a call the compiled function refuses raises uncounted).  Every launch goes through one.  With
    P > 1 the partial outputs and LSEs are views of the given workspace, else views of the stream's
    pool (:func:`decode_parts`; calls on one stream are ordered, so each reuses them: two allocations
    fewer per call) or, while a CUDA graph is being captured, fresh ones that the graph keeps.
    Without ``want_lse`` the kernel writes the LSE into a scratch buffer (:func:`.fastpath.fresh_or_scratch`):
    nothing ever reads it, so calls (on any stream, in CUDA graphs too) may share it.

    A given out (or, split, workspace) must not overlap an input or each other (issue 35): validation
    refused that for the call the launcher was made from, and each later call with the same metadata
    (:func:`.decode._key`: shapes and strides fix the byte extents of ``operands``, the first call's (q, k, v,
    cache_seqlens, block_table, workspace); out is contiguous) is checked against its data pointers
    before the launch; a refused one takes the checked path, which names it.

    ``variant`` (the config's ``variant_args``; ``sink`` / ``leftpad``: the first call's, for their
    extents; ``window``: the normalized sides): :func:`_decode_variant_launcher`."""
    if variant:
        return _decode_variant_launcher(fn, keep, P, qshape, dtype, dev, operands, variant, sink, leftpad, window)
    B, Sq, Hq, D = qshape
    lshape, osize = (B, Hq, Sq), jit.size_args(qshape)
    lse_for = jit.fresh_or_scratch(_empty, lshape, torch.float32, dev)
    scratch = lse_for.scratch
    qe, ke, ve, se, bte, wse = (0 if t is None else extent(t) for t in operands)
    o_ext = B * Sq * Hq * D * dtype.itemsize

    names = ("q", "k_cache", "v_cache", "cache_seqlens", "block_table")

    # Each launch below tests out's byte range against the inputs' on their pointers, written out (one
    # read each, no call), and only a range that meets one (or an empty input's, which the guard then
    # skips) goes to the guard, which names it.
    if P == 1:  # (one split: the workspace is not used, nor guarded)
        out_g = out_guard("decode_attn", "out", o_ext, names, (qe, ke, ve, se, bte))

        def launch(q, k, v, out, lse, scale, s, bt, ws):
            if out is None:
                out = _empty(*osize, dtype=dtype, device=dev)
            else:
                o = out.data_ptr()
                end = o + o_ext
                if ((p := q.data_ptr()) < end and o < p + qe or (p := k.data_ptr()) < end and o < p + ke
                        or (p := v.data_ptr()) < end and o < p + ve or (p := s.data_ptr()) < end and o < p + se
                        or bt is not None and (p := bt.data_ptr()) < end and o < p + bte):
                    out_g(out, q, k, v, s, bt)
            if lse is False:
                lse = scratch[0] if scratch else lse_for(False)
            elif lse is True:
                lse = lse_for(True)
            fn(q, k, v, s, bt, out, lse, None, None, scale * LOG2_E)
            LAUNCHES["decode_attn"] += 1
            return out, lse
    else:
        pshape, plshape = (P, B, Sq, Hq, D), (P, B, Sq, Hq)
        pstride, plstride = (B * Sq * Hq * D, Sq * Hq * D, Hq * D, D, 1), (B * Sq * Hq, Sq * Hq, Hq, 1)
        lse_off = P * B * Sq * Hq * D  # the partial LSEs follow the partial outputs in a workspace

        parts = decode_parts(pshape, dev)  # (device, stream) -> (o_part, lse_part), of the stream's pool
        part_shapes = (pshape, plshape)

        out_g = out_guard("decode_attn", "out", o_ext, names + ("workspace",), (qe, ke, ve, se, bte, wse))
        ws_g = out_guard("decode_attn", "workspace", wse, names, (qe, ke, ve, se, bte))

        def launch(q, k, v, out, lse, scale, s, bt, ws):
            if out is not None:
                o = out.data_ptr()
                end = o + o_ext
                if ((p := q.data_ptr()) < end and o < p + qe or (p := k.data_ptr()) < end and o < p + ke
                        or (p := v.data_ptr()) < end and o < p + ve or (p := s.data_ptr()) < end and o < p + se
                        or bt is not None and (p := bt.data_ptr()) < end and o < p + bte
                        or ws is not None and (p := ws.data_ptr()) < end and o < p + wse):
                    out_g(out, q, k, v, s, bt, ws)
            if ws is not None:
                ws_g(ws, q, k, v, s, bt)
            if out is None:
                out = _empty(*osize, dtype=dtype, device=dev)
            if lse is False:
                lse = scratch[0] if scratch else lse_for(False)
            elif lse is True:
                lse = lse_for(True)
            if ws is None:
                o_part, lse_part = pooled_views(parts, dev, part_shapes)
            else:
                off = ws.storage_offset()
                o_part, lse_part = ws.as_strided(pshape, pstride, off), ws.as_strided(plshape, plstride, off + lse_off)
            fn(q, k, v, s, bt, out, lse, o_part, lse_part, scale * LOG2_E)
            LAUNCHES["decode_attn"] += 1
            return out, lse
    launch.default_scale = D ** -0.5
    launch.keep = keep  # the compiled object owns fn's CUDA library
    launch.guard = launch.rest = None  # (LauncherCache: decode_attn sets them for a plain call's)
    return launch


def _decode_variant_launcher(fn, keep, P, qshape, dtype, dev, operands, variant, sink, leftpad=None, window=None):
    """:func:`decode_launcher` of a softcapping, sink, window and / or left-padding config: ``launch(q, k, v, out,
    lse, scale, seqlens, block_table, workspace, *values)`` with the values of :func:`.decode._variant_values`
    (softcap: the float, passed as ``softcap * log2(e)`` for the softmax and ``softmax_scale / softcap``;
    learnable_sink, cache_leftpad: the tensors, guarded against overlap with out and the workspace
    too); a window's sides (``window``, normalized; -1: :data:`~.forward_softmax.WINDOW_UNBOUNDED`) are
    fixed by the launcher's key and passed by the launcher; one body for split and unsplit calls."""
    B, Sq, Hq, D = qshape
    lshape, osize = (B, Hq, Sq), jit.size_args(qshape)
    lse_for = jit.fresh_or_scratch(_empty, lshape, torch.float32, dev)
    exts = tuple(0 if t is None else extent(t) for t in (*operands, sink, leftpad))
    o_ext = B * Sq * Hq * D * dtype.itemsize
    names = ("q", "k_cache", "v_cache", "cache_seqlens", "block_table", "learnable_sink", "cache_leftpad")
    in_exts = exts[:5] + exts[6:]
    out_g = out_guard("decode_attn", "out", o_ext, names + ("workspace",), in_exts + exts[5:6])
    ws_g = out_guard("decode_attn", "workspace", exts[5], names, in_exts)
    softcap_on = "softcap_scale" in variant
    n_sink = int("learnable_sink" in variant)
    pad_on = "cache_leftpad" in variant
    win = window_args(*window) if "window_left" in variant else ()
    pshape, plshape = (P, B, Sq, Hq, D), (P, B, Sq, Hq)
    pstride, plstride = (B * Sq * Hq * D, Sq * Hq * D, Hq * D, D, 1), (B * Sq * Hq, Sq * Hq, Hq, 1)
    lse_off = P * B * Sq * Hq * D
    parts, part_shapes = decode_parts(pshape, dev), (pshape, plshape)

    def launch(q, k, v, out, lse, scale, s, bt, ws, *vals):
        if softcap_on and not scale / vals[0] <= FLOAT32_MAX:  # a hit's new scale: the checks name it
            raise ValueError("decode_attn: softmax_scale / softcap past the float32 range")
        ws = ws if P > 1 else None  # (one split: the workspace is not used)
        tens = vals[1:] if softcap_on else vals  # (sink,) (leftpad,)
        if out is not None or ws is not None:
            sk = tens[0] if n_sink else None
            lp = tens[-1] if pad_on else None
            if out is not None:
                out_g(out, q, k, v, s, bt, sk, lp, ws)
            if ws is not None:
                ws_g(ws, q, k, v, s, bt, sk, lp)
        if out is None:
            out = _empty(*osize, dtype=dtype, device=dev)
        if lse.__class__ is bool:
            lse = lse_for(lse)
        if P == 1:
            o_part = lse_part = None
        elif ws is None:
            o_part, lse_part = pooled_views(parts, dev, part_shapes)
        else:
            off = ws.storage_offset()
            o_part, lse_part = ws.as_strided(pshape, pstride, off), ws.as_strided(plshape, plstride, off + lse_off)
        if softcap_on:
            fn(q, k, v, s, bt, out, lse, o_part, lse_part, vals[0] * LOG2_E, scale / vals[0], *tens[:n_sink], *win,
               *tens[n_sink:])
        else:
            fn(q, k, v, s, bt, out, lse, o_part, lse_part, scale * LOG2_E, *tens[:n_sink], *win, *tens[n_sink:])
        LAUNCHES["decode_attn"] += 1
        return out, lse
    launch.default_scale = D ** -0.5
    launch.keep = keep
    launch.guard = launch.rest = None
    return launch
