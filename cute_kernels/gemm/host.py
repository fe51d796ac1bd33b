"""The public entry points of the Hopper GEMM: ``gemm`` (and its ``torch.compile`` custom op),
``explain`` (what a call would run, on any machine) and ``warmup_gemm`` (compile ahead of time).

Hot path (issue 19, host time per call): the call's metadata (:func:`_key`: what the plan reads that
the compiled function's own argument checks leave open) -> a dict lookup of a prepared launcher ->
output allocation and the compiled TVM-FFI function, called with the torch tensors as they are (it
re-views torch's operand order itself; the transposed skinny plan's entry too).  A launcher is made
only after a call with that metadata passed every check and was planned (:func:`.plan.plan`); a hit
the compiled function refuses launches nothing and takes the checked path, which names the argument.
Nothing is keyed on a tensor's identity.  Calls with b's metadata of b's call before (a model's
linears, each with its own weight, alternating) take b's entry (:attr:`.fastpath.LauncherCache.armed`,
found by b's data pointer) on one C++ check of their tensors (its guard, :func:`_arm`) and a few
identity tests, without the key or the requires_grad reads.
Launchers go with the plans they were made from (:func:`.plan.clear_plans`, which the tuner calls).
Modules: :mod:`.validate`, :mod:`.heuristics`, :mod:`.plan`, :mod:`.launch`, :mod:`.tune`, and the
kernels in :mod:`.kernel`, :mod:`.epilogue`, :mod:`.splitk_kernel` and :mod:`.cpasync_kernel`.
"""

from __future__ import annotations

import math
import numbers

import torch

from ..common import jit
from ..common.arch import current_arch
from ..common.fastpath import LauncherCache, metadata_guard
from ..common.overlap import extent, out_guard, same_view
from ..testing import LAUNCHES
from . import launch
from . import plan as _plan_mod
from .plan import make_plan, run
from .autograd import check_differentiable
from .autograd import register as register_autograd
from .tune import tune_gemm
from .validate import canonical_strides, check_operands, check_scalars, fits_layout

_PLAIN_SCALARS = (float, int)  # alpha / beta types that need no check (one type() test each)
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_empty = torch.empty
#: operand types the fast path takes (subclasses such as FakeTensor always take the checked path)
_FAST_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})


def warmup_gemm(m: int, n: int, k: int, *, batch: int | None = None, dtype=torch.bfloat16,
                a_major: str = "row", b_major: str = "row", out_dtype=None, with_c: bool = False) -> None:
    """Compile (or load from disk) exactly what ``gemm`` will run for this problem, without running it;
    also without a GPU, so a build machine can fill ``CUTE_KERNELS_CACHE_DIR`` for a GPU one.  Majors:
    'row' or 'col' of the torch-ordered a (M, K) and b (K, N)."""
    _check_problem("warmup_gemm", m, n, k, batch, a_major, b_major)
    a, b, c = _meta_operands(m, n, k, batch, dtype, a_major, b_major, out_dtype, with_c)
    make_plan(a, b, None, c, 1.0 if with_c else 0.0, out_dtype, allow_cpu=True)


def _meta_operands(m, n, k, batch, dtype, a_major, b_major, out_dtype, with_c):
    """``(a, b, c)`` for planning a problem on the meta device: 16-byte aligned contiguous buffers of
    the given majors ("row" / "col"), c None unless ``with_c``.  Meta tensors have no storage, so a
    (10**6 x 10**6) problem plans without allocating its operands."""

    def operand(rows, cols, major):
        shape = (rows, cols) if batch is None else (batch, rows, cols)
        t = torch.empty(shape, dtype=dtype, device="meta")
        return t if major == "row" else t.mT.contiguous().mT

    a, b = operand(m, k, a_major), operand(k, n, b_major)
    c = torch.empty(*a.shape[:-1], n, dtype=out_dtype or dtype, device="meta") if with_c else None
    return a, b, c


def _check_problem(who, m, n, k, batch, a_major, b_major) -> None:
    """Sizes: ints >= 0 (batch: None for a 2-D problem); majors: 'row' / 'col'."""
    for name, v in (("a_major", a_major), ("b_major", b_major)):
        if v not in ("row", "col"):
            raise ValueError(f"{who}: {name} must be 'row' or 'col', got {v!r}")
    for name, v in (("m", m), ("n", n), ("k", k), ("batch", batch)):
        if v is None and name == "batch":
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{who}: {name} must be an int, got {type(v).__name__} {v!r}")
        if v < 0:
            raise ValueError(f"{who}: {name} must be >= 0, got {v}")


_WARM_KEYS = ("m", "n", "k", "batch", "dtype", "a_major", "b_major", "out_dtype", "with_c")


def _warm(spec):
    """``warmup([("gemm", spec)])``: spec is a dict of :func:`warmup_gemm`'s arguments."""
    if not isinstance(spec, dict):
        raise TypeError(f"warmup: a gemm spec must be a dict of warmup_gemm's arguments, got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(_WARM_KEYS), key=str)
    if unknown:
        raise ValueError(f"warmup: unknown gemm key(s) {unknown}; known: {list(_WARM_KEYS)}")
    missing = [x for x in ("m", "n", "k") if x not in spec]
    if missing:
        raise ValueError(f"warmup: the gemm spec needs {missing}")
    warmup_gemm(**spec)


jit.register_warmup("gemm", _warm)


def explain(m: int, n: int, k: int, *, batch: int | None = None, dtype=torch.bfloat16, a_major: str = "row",
            b_major: str = "row", out_dtype=None, with_c: bool = False) -> list[dict]:
    """What ``gemm`` would run for this problem, on any machine (no GPU, nothing compiled): the real
    planning code (:func:`.plan.make_plan`) on meta tensors under :class:`jit.dry_run`.  One dict per
    kernel: its name, compile configuration and derived facts (tile, cluster, stages, raster as run,
    work units per SM).  Operands are 16-byte aligned contiguous buffers of the given majors ("row" /
    "col"; a leading dimension that breaks TMA's 16-byte rule shows the cp.async path, or the operands
    copied into aligned buffers per call, ``operands`` saying which)."""
    _check_problem("explain", m, n, k, batch, a_major, b_major)
    a, b, c = _meta_operands(m, n, k, batch, dtype, a_major, b_major, out_dtype, with_c)
    with jit.dry_run():
        plan = make_plan(a, b, None, c, 1.0 if with_c else 0.0, out_dtype, allow_cpu=True)
    out = []
    sms = current_arch().sm_count
    for name, cfg in plan.kernels:
        row = {"kernel": name, "config": cfg}
        tiles = cfg.tiles
        tm, tn = tiles.tile_mnk[:2]
        pm, pn = (n, m) if plan.swapped else (m, n)  # the kernel's M and N
        units = math.ceil(pm / tm) * math.ceil(pn / tn) * (batch or 1) * max(1, cfg.splits)
        if plan.swapped:
            row["operands"] = "swapped: out^T = b^T a^T (the problem's M is the kernel's N)"
        staged = [x for x, s in (("a", plan.a_stage), ("b", plan.b_stage)) if s]
        if staged:
            row["operands"] = (f"staged: {' and '.join(staged)} copied per call into 16-byte-aligned buffers "
                               "(TMA cannot describe them in place)")
        row.update(tile_mnk=tiles.tile_mnk, cluster_mn=tiles.cluster_mn, ab_stages=tiles.ab_stages,
                   splits=cfg.splits, work_units=units, units_per_sm=round(units / sms, 2))
        if hasattr(cfg, "raster_swizzle"):
            row.update(raster=(cfg.raster_swizzle, "M" if cfg.raster_along_m else "N"),
                       mainloop=cfg.mainloop, tma_store=cfg.tma_store,
                       epilogue=("deferred (stored under the next tile's mainloop)" if cfg.epi_defer
                                 else "per tile" if cfg.tma_store else "per tile, direct stores"),
                       pdl=cfg.pdl and cfg.mainloop == "tma")
        out.append(row)
    return out


def gemm(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None, out_dtype=None,
         alpha: float = 1.0, beta: float = 0.0, c: torch.Tensor | None = None, tune: bool = False) -> torch.Tensor:
    """``out = alpha * a @ b + beta * c`` on Hopper tensor cores (fp32 accumulation).

    a: (M, K) or (L, M, K); b: (K, N) or (L, K, N); fp16/bf16, each row- or column-major.
    out / out_dtype: fp16, bf16 or fp32 (default: a's dtype); out must not overlap a, b or c (out=c
    exactly is fine), nor its elements each other's (ValueError).  c: same shape as out, any strides.
    Under ``torch.compile`` this goes through the ``cute_kernels::gemm`` custom op.
    ``tune=True`` benchmarks candidate configs for this shape once (results persist on disk and are
    used by later calls, tuned or not); see :mod:`cute_kernels.gemm.tune`.
    Differentiable (:mod:`cute_kernels.gemm.autograd`): with grad enabled and an input that requires
    grad, the call goes through the functional op (``out=`` then raises ValueError).
    """
    ta, tb = type(alpha), type(beta)
    plain = (ta is float or ta is int) and (tb is float or tb is int) and tune is False
    if plain and not _is_compiling() and type(a) in _FAST_TYPES and type(b) in _FAST_TYPES:
        # (is_compiling first: a traced call never reads the armed entries, so never guards on them)
        try:
            pb = b.data_ptr()
        except RuntimeError:  # no storage (a sparse b): the checks say what
            return _checked_run(a, b, out, c, alpha, beta, out_dtype)
        entry = _launchers.armed.get(pb)  # b's launcher entry (_arm): one per weight of a model
        if entry is not None:
            key, hit, guard, rest, grad_off = entry
            if guard is not None and rest == (out is None, c is None, c is out, not beta, type(out_dtype), out_dtype) \
                    and (grad_off is False or not _grad_enabled()):
                # armed: its guard checks what the key holds of a, b, out and c (and more: their types,
                # sizes, devices, dispatch keys, and requires_grad as when armed: none, so grad mode need
                # not be read, or some under grad mode off, ``grad_off``, which is read then), rest the
                # key's other parts; the pointers' 16-byte alignment read here
                if (guard.check(a, b) if out is None else guard.check(a, b, out)) if c is None else (
                        guard.check(a, b, c) if out is None else guard.check(a, b, out) if c is out
                        else guard.check(a, b, out, c)):
                    pa = a.data_ptr()
                    po = 0 if out is None else out.data_ptr()
                    if not (pa | pb | po) & 15:
                        try:
                            return hit(a, b, out, c, alpha, beta, pa, pb, po)
                        except Exception:  # the compiled function refused an argument (nothing ran): the checks name it
                            return _checked_run(a, b, out, c, alpha, beta, out_dtype)
                guard = False  # (failed: the key path below)
        else:
            hit = guard = None
        if not (_grad_enabled() and (a.requires_grad or b.requires_grad
                                     or (c is not None and getattr(c, "requires_grad", False)))):
            # the fast path (module doc): the key as :func:`_key` builds it, the data pointers read once
            # for its alignment and the launcher's overlap guard; anything unusual goes to the checks
            last_hit = hit
            try:
                pa = a.data_ptr()
                po = 0 if out is None else out.data_ptr()
                key = (a.shape, a.stride(), a.dtype, a.get_device(), b.shape, b.stride(), (pa | pb | po) & 15,
                       out_dtype, beta != 0.0, None if out is None else (type(out), out.stride(), out.dtype),
                       None if c is None else (type(c), c.stride(), c.dtype))
                hit = _launchers.get(key)
            except (AttributeError, TypeError, RuntimeError):  # not tensors, an unhashable out_dtype, no
                return _checked_run(a, b, out, c, alpha, beta, out_dtype)  # storage: the checks say what
            if hit is None:
                return _miss(key, a, b, out, c, alpha, beta, out_dtype)
            repeat = hit is last_hit  # b's entry holds this launcher (by identity: keys never share one)
            if not repeat:  # remembered for b, unarmed (_arm)
                _launchers.armed[pb] = (key, hit, None, None, False)
            elif guard is False:  # its guard failed a call its own key takes (inference mode, ...): disarmed
                _launchers.armed[pb] = (key, hit, None, _REARM_AFTER, False)
            elif rest.__class__ is int:  # disarmed: one repeat fewer before arming is tried again
                _launchers.armed[pb] = (key, hit, None, rest - 1 or None, False)
            try:
                res = hit(a, b, out, c, alpha, beta, pa, pb, po)
            except Exception:  # the compiled function refused an argument (nothing ran): the checks name it
                return _checked_run(a, b, out, c, alpha, beta, out_dtype)
            if repeat and rest is None:  # the second call in a row of b with this metadata, launched: arm it
                _arm(key, hit, a, b, out, c, out_dtype, beta, pb)
            return res
    grad = _grad_enabled() and (getattr(a, "requires_grad", False) or getattr(b, "requires_grad", False)
                                or (c is not None and getattr(c, "requires_grad", False)))
    if not grad and plain and not _is_compiling():
        return _run(a, b, out, c, alpha, beta, out_dtype)  # (not tensors: the checks say what)
    if ta not in _PLAIN_SCALARS or tb not in _PLAIN_SCALARS:
        check_scalars(alpha, beta)
    if type(tune) is not bool:  # a string would pass as its truth value
        raise TypeError(f"gemm: tune must be a bool, got {type(tune).__name__} {tune!r}")
    if grad:  # out= first: the tuning below would time a call that then fails
        check_differentiable(out)
    if tune:  # validate before timing any candidate
        check_operands(a, b, out, c, out_dtype)
        if beta != 0.0 and c is None:
            raise ValueError("gemm: beta != 0 needs c")
        tune_gemm(a.detach(), b.detach(), out_dtype=(out.dtype if out is not None else out_dtype))
    if grad:  # through the functional op: its autograd formula (:mod:`.autograd`) runs the backward GEMMs
        return _gemm_op(a, b, c, float(alpha), float(beta), out_dtype)
    if _is_compiling():
        res = torch.ops.cute_kernels.gemm(a, b, c, float(alpha), float(beta), out_dtype)
        if out is not None:
            out.copy_(res)
            return out
        return res
    return _run(a, b, out, c, alpha, beta, out_dtype)


# ---------------------------------------------------------------------------- the fast path
#: call metadata (:func:`_key`) -> launcher (:func:`_prepare`), with an entry per b's data pointer
#: (:func:`_arm`); emptied with the planner's plans
_launchers = LauncherCache()

#: repeats a disarmed entry takes the key path before arming is tried again: a guard that failed a call
#: of its own key (inference mode, a tensor requiring grad) may pass again later, and a weight used with
#: one shape would otherwise never leave that state; a failing guard then costs one check in this many
_REARM_AFTER = 16


def _key(a, b, out, c, beta, out_dtype) -> tuple:
    """What validation and the plan read from a call (of tensors ``a`` and ``b``) that the compiled
    function's own argument checks (:func:`~cute_kernels.common.jit.direct`) leave open: a's and b's
    shapes (the plan's buckets), a's dtype and device (``get_device()``: -1 for every non-CUDA device,
    which never has a launcher), the strides of a, b, out and c (majors; size-1 dims; c's are any),
    the data pointers' 16-byte alignment (TMA or cp.async; c's is never read), out's and c's dtypes
    and types (a fake one never hits), out_dtype and beta != 0.  The compiled function checks b's
    dtype, every device, and out's and c's shapes (sizes shared with a and b) on each call.  Raises
    AttributeError / TypeError for non-tensor out / c."""
    return (a.shape, a.stride(), a.dtype, a.get_device(), b.shape, b.stride(),
            (a.data_ptr() | b.data_ptr() | (0 if out is None else out.data_ptr())) & 15, out_dtype, beta != 0.0,
            None if out is None else (type(out), out.stride(), out.dtype),
            None if c is None else (type(c), c.stride(), c.dtype))


class _PlanCache(dict):
    """The planner's plan cache (:data:`.plan._plans`), whose ``clear`` (:func:`.plan.clear_plans`,
    called by the tuner) also drops every launcher made from its plans."""

    __slots__ = ()

    def clear(self):
        super().clear()
        _launchers.clear()


def _arm(key, hit, a, b, out, c, out_dtype, beta, pb) -> None:
    """Arm b's entry: ``hit``, the launcher of metadata ``key``, has just launched a call (a, b, out, c,
    out_dtype, beta) that had the metadata of b's call before it (``pb``: b's data pointer, the entry's
    hint in ``_launchers.armed``).  The entry then holds its ``guard`` (:func:`.fastpath.metadata_guard`
    of a, b, out and c, made by the first call armed) and ``rest`` (the facts of the call the key holds
    and the guard does not), which :func:`gemm` tests first, before reading any other metadata.  Armed
    by a repeat only, not by every dict hit: a weight used with two shapes in turn (prefill and decode)
    never pays a failing guard, a model's linears, each with its own weight, arm on their second call.
    Left disarmed (``rest`` an int: the repeats before arming is tried again, :data:`_REARM_AFTER`)
    where it has no guard: a misaligned pointer (every call of its key; the guard path takes aligned
    ones only), a tensor passed twice (the check refuses that).  Tensors requiring grad (a weight's
    ``w.t()`` under ``no_grad``: a view of a leaf that requires grad requires grad too) get a guard of
    their own that records it, and the entry's ``grad_off`` makes the guard path read grad mode: with
    grad on, such a call takes the differentiable op, as through the key path.

    A guard holds what the key holds and more (out's and c's sizes and devices, b's dtype, dispatch
    keys), as the call's state made it: a call it fails that has its key (inference mode, another
    tensor type) takes the key path, which disarms it (:func:`gemm`)."""
    g, rest = hit.guard, (out is None, c is None, c is out, not beta, type(out_dtype), out_dtype)
    ts = (a, b) if out is None else (a, b, out)
    if c is not None and c is not out:
        ts += (c,)
    grad_off = any(t.requires_grad for t in ts)  # (the key path ran: so grad mode is off)
    if key[6] or len({id(t) for t in ts}) != len(ts):  # (the key's alignment; a tensor passed twice)
        g = False
    elif grad_off:  # a guard of its own, requires_grad recorded, tested under grad mode off only
        g = metadata_guard(*ts, allow_grad=True) or False
    else:  # the launcher's guard, made once, for calls of the rest it was made with
        if g is None:
            g = hit.guard = metadata_guard(*ts) or False
            hit.rest = rest
        if rest != hit.rest:  # (rest: out=c exactly or not, both with this key)
            g = False
    _launchers.armed[pb] = (key, hit, None, _REARM_AFTER, False) if g is False else (key, hit, g, rest, grad_off)


def _run(a, b, out, c, alpha, beta, out_dtype):
    """``plan.run`` (alpha / beta already checked) through the launcher cache: a miss validates,
    plans (or finds the plan) and runs, then caches a launcher for the call's metadata."""
    try:
        if type(a) not in _FAST_TYPES or type(b) not in _FAST_TYPES:
            raise TypeError
        key = _key(a, b, out, c, beta, out_dtype)
        hit = _launchers.get(key)
    except (AttributeError, TypeError, RuntimeError):  # the checks' own message (an unhashable out_dtype, no storage)
        return _checked_run(a, b, out, c, alpha, beta, out_dtype)
    if hit is not None:
        try:
            return hit(a, b, out, c, alpha, beta)
        except Exception:  # refused (nothing ran): the checks name the argument
            return _checked_run(a, b, out, c, alpha, beta, out_dtype)
    return _miss(key, a, b, out, c, alpha, beta, out_dtype)


def _miss(key, a, b, out, c, alpha, beta, out_dtype):
    """A call whose metadata ``key`` has no launcher yet: validate, plan (or find the plan) and run,
    then cache a launcher for it."""
    res = run(a, b, out, c, alpha, beta, out_dtype)
    _prepare(key, a, b, out, c, beta, out_dtype)
    return res


def _checked_run(a, b, out, c, alpha, beta, out_dtype):
    """``plan.run`` behind the operand checks, no launcher: calls the fast path cannot key (not
    tensors, an unhashable out_dtype) or whose launcher the compiled function refused."""
    _plan_mod.check_operands(a, b, out, c, out_dtype)
    return run(a, b, out, c, alpha, beta, out_dtype)


def _prepare(key, a, b, out, c, beta, out_dtype) -> None:
    """After a call with this metadata passed validation and ran: cache a launcher for it (plans
    with nothing to launch or operands to copy into aligned buffers keep the general path)."""
    if type(_plan_mod._plans) is not _PlanCache:  # (first use, or plan.py rebound its cache)
        _launchers.clear()
        _plan_mod._plans = _PlanCache(_plan_mod._plans)
    p = _plan_mod._plans.get(_plan_mod._signature(a, b, out, c, beta, out_dtype))
    if p is None or p.empty or p.a_stage or p.b_stage:
        return
    fn, ws = p.fn, None
    if isinstance(fn, launch.SwappedLauncher):
        if not fn.torch_order:  # the transposes are host views: the plan's own launcher makes them
            _launchers[key] = _launcher(p, _fixed(p, p.fn, a, b, out), None, a.device, (a, b, out, c))
            return
        fn = fn.fn
    if isinstance(fn, launch.WorkspaceLauncher):
        fn, ws = fn.fn, fn
    _launchers[key] = _launcher(p, _fixed(p, jit.direct(fn), a, b, out), ws, a.device, (a, b, out, c))


def _fixed(p, fn, a, b, out):
    """``fn``, or where the plan takes canonical-stride views of size-1 dims (``p.a_fix`` / ``b_fix`` /
    ``d_fix``: a decode step's M = 1 activations) ``fn`` behind those views -- of the operands whose
    size-1 strides the compiled layout does not take as they are (:func:`.validate.fits_layout`: a
    contiguous (1, K) activation or (1, N) output needs none).  The key holds the operands' shapes and
    strides, so the views' strides are this call's (out allocated by the launcher when None:
    contiguous)."""
    if not (p.a_fix or p.b_fix or p.d_fix):
        return fn
    d = out if out is not None else torch.empty(p.shape, dtype=p.out_dtype, device="meta")
    sa = canonical_strides(a, p.a_fix).stride() if p.a_fix and not fits_layout(a, p.a_fix) else None
    sb = canonical_strides(b, p.b_fix).stride() if p.b_fix and not fits_layout(b, p.b_fix) else None
    sd = canonical_strides(d, p.d_fix).stride() if p.d_fix and not fits_layout(d, p.d_fix) else None
    if sa is None and sb is None and sd is None:
        return fn

    def fixed(a, b, d, c, *rest):
        if sa is not None:
            a = a.as_strided(a.shape, sa)
        if sb is not None:
            b = b.as_strided(b.shape, sb)
        if sd is not None:
            dd = d.as_strided(d.shape, sd)
            d, c = dd, (dd if c is d else c)
        fn(a, b, d, c, *rest)
    return fixed


def _launcher(p, fn, ws, dev, operands):
    """The launcher of one plan, ``launch_(a, b, out, c, alpha, beta, pa=None, pb=None, po=None)``:
    allocate the output (on ``dev``), call ``fn`` (with the workspace of ``ws``, a
    :class:`.launch.WorkspaceLauncher`, when there is one), count once it returned (a call the compiled
    function refuses raises before launching anything).  A given out must not overlap a, b or c (but
    may be c exactly): validation refused it for the call the launcher was made from, and a later call
    with the same metadata (:func:`_key`: shapes and strides, so the byte extents of ``operands``, the
    first call's (a, b, out, c), are the same) is checked against its data pointers before the launch,
    the refused one then taking the checked path that names it.  ``pa``, ``pb``, ``po``: a's, b's and
    out's data pointers when the caller read them already (:func:`gemm`'s fast path, for the key's
    alignment): without c, out's byte range is compared with a's and b's on them, and only a meeting
    one goes to the guard, which names the input."""
    shape, dtype, has_c = jit.size_args(p.shape), p.out_dtype, p.has_c
    a_ext, b_ext, o_ext, c_ext = (0 if t is None else extent(t) for t in operands)
    refuse = out_guard("gemm", "out", o_ext, ("a", "b", "c"), (a_ext, b_ext, c_ext))
    if operands[3] is None:  # no c (the key fixes that): the guard itself, no out=c test around it
        guard, with_c = refuse, False
    else:
        def guard(out, a, b, c):
            if c is not None and same_view(c, out):
                c = None  # out=c: each element read, then written
            refuse(out, a, b, c)
        with_c = True

    def checks(out, a, b, c, pa, pb, po):
        """The overlap guard of a given out: on the pointers given, a test (an empty extent may pass it,
        the guard then skips it) before the guard itself."""
        if pa is None or with_c or (po < pa + a_ext and pa < po + o_ext) or (po < pb + b_ext and pb < po + o_ext):
            guard(out, a, b, c)

    if ws is None:
        def launch_(a, b, out, c, alpha, beta, pa=None, pb=None, po=None):
            if out is None:
                out = _empty(*shape, dtype=dtype, device=dev)
            elif pa is None or with_c or (po < pa + a_ext and pa < po + o_ext) or (po < pb + b_ext and pb < po + o_ext):
                guard(out, a, b, c)  # (the pointer test of checks(), written out: no call)
            fn(a, b, out, c if has_c else out, float(alpha), float(beta))
            LAUNCHES["gemm"] += 1
            return out
    else:
        def launch_(a, b, out, c, alpha, beta, pa=None, pb=None, po=None):
            if out is None:
                out = _empty(*shape, dtype=dtype, device=dev)
            else:
                checks(out, a, b, c, pa, pb, po)
            w, cnt = ws.workspace(dev)
            fn(a, b, out, c if has_c else out, w, cnt, float(alpha), float(beta))
            LAUNCHES["gemm"] += 1
            return out
    launch_.plan = p  # (its launcher holds the compiled object that owns fn's CUDA library)
    launch_.guard = launch_.rest = None  # the metadata guard and rest its entries arm with (_arm makes them)
    return launch_


@torch.library.custom_op("cute_kernels::gemm", mutates_args=())
def _gemm_op(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, alpha: float, beta: float,
             out_dtype: torch.dtype | None) -> torch.Tensor:
    return _run(a, b, None, c, alpha, beta, out_dtype)


register_autograd(_gemm_op)


@_gemm_op.register_fake
def _(a, b, c, alpha, beta, out_dtype):
    # the eager path's checks (shapes, dtypes), so a traced call fails where an eager one would
    check_operands(a, b, None, c, out_dtype, allow_cpu=True)
    if beta != 0.0 and c is None:
        raise ValueError("gemm: beta != 0 needs c")
    return a.new_empty((*a.shape[:-1], b.shape[-1]), dtype=out_dtype or a.dtype)


def _namespace() -> None:
    """``cute_kernels.gemm`` is the function :func:`gemm` (the name hides the subpackage), so the
    subpackage's names are the function's attributes too: ``cute_kernels.gemm.explain(...)``,
    ``cute_kernels.gemm.warmup_gemm``, ``cute_kernels.gemm.plan.config_buckets``,
    ``cute_kernels.gemm.tune``, ... -- every module of the package: the host ones already imported by this
    one, the kernel ones (which import the DSL) at their first attribute read."""
    import importlib
    import sys

    from layouts.lazy import LazyModule

    package = __name__.rpartition(".")[0]
    for name in ("plan", "tune", "tuned", "heuristics", "validate", "launch", "autograd", "config"):
        setattr(gemm, name, importlib.import_module(f"{package}.{name}"))
    for name in ("views", "kernel", "epilogue", "splitk_kernel", "cpasync_kernel", "entries"):  # (the DSL's: at first read)
        setattr(gemm, name, LazyModule(f"{package}.{name}"))
    gemm.host, gemm.explain, gemm.warmup_gemm = sys.modules[__name__], explain, warmup_gemm


_namespace()
