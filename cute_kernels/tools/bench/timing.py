"""Timers shared by every benchmark; the main figure is ``triton.testing.do_bench``'s, except in
``bench gaps``, which judges its rows with the paired timer below.

Every implementation of a shape -- ours, the peers and the ceiling -- is timed by the same timer in
the same process, in interleaved rounds (:func:`time_rounds`): round r runs them in an order rotated
by r, so none always runs first or right after the same competitor.

Why a second timer: ``do_bench`` flushes L2 by *writing* 256 MB (``zero_``) before each call, so the
timed call starts with ~50 MB of dirty L2 lines that HBM must absorb while the kernel reads.  For a
kernel that moves tens of MB (decode at batch 1, a 128-row GEMM reading a 32 MB B) that write-back is
a large part of the measured time and caps every implementation alike.  :func:`bench_clean` times the
same call after a *read-only* 256 MB pass instead: L2 is just as cold but holds only clean lines.

The paired timer (:func:`paired_times`, :func:`paired_ratio`) judges one implementation against
another call by call: each repetition calls every implementation once, in an order rotated by the
repetition, each call after its own L2 flush (``zero_`` of a 256 MiB buffer, as ``do_bench`` flushes)
and timed alone by CUDA events; a ratio is the median of the per-repetition ratios, so a slow moment
of the device (clocks, a neighbour) weighs on both sides of the ratios it falls in.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

_BUF: dict = {}
_ZERO: dict = {}


#: GPU cycles spun between the flush and the start event (~200 us at 1.98 GHz), so that the host has
#: enqueued the timed call before the GPU reaches the start event.  Without it a call whose host work
#: outlasts the flush (decode: argument checks + two launches) is timed with its host time included
#: (the decode "clean" figures once came out 40-80% above do_bench's for the PDL variants).
LEAD_CYCLES = 400_000


def bench_events(fn, flush, n: int = 30) -> float:
    """Median microseconds of one call of ``fn`` timed by CUDA events, ``flush()`` before each call
    (3 untimed warm-up calls first); the GPU spins ``LEAD_CYCLES`` after the flush so that only device
    time is measured."""
    for _ in range(3):
        fn()
    return statistics.median(event_us(fn, flush) for _ in range(n))


def event_us(fn, flush=None, lead: bool = True) -> float:
    """Microseconds of one call of ``fn`` timed by CUDA events: ``flush()`` (when given), then (``lead``)
    a spin of ``LEAD_CYCLES`` on the GPU (the host enqueues the call meanwhile), then the call between
    two events."""
    if flush is not None:
        flush()
    if lead:
        torch.cuda._sleep(LEAD_CYCLES)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3


def read_only_flush():
    """A callable that reads a 256 MB buffer (cached per device): cold L2 holding clean lines only."""
    dev = torch.cuda.current_device()
    if dev not in _BUF:
        _BUF[dev] = (torch.ones(256 * 1024 * 1024 // 4, 1, dtype=torch.float32, device="cuda"),
                     torch.empty(1, dtype=torch.float32, device="cuda"))
    buf, sink = _BUF[dev]
    return lambda: torch.sum(buf, dim=0, out=sink)


def bench_clean(fn, n: int = 30) -> float:
    """Median microseconds of one call (CUDA events) after a read-only 256 MB pass over a buffer."""
    return bench_events(fn, read_only_flush(), n)


def bench_graph(fn, calls: int = 20, n: int = 10) -> float:
    """Median per-call microseconds of ``calls`` back-to-back calls captured in one CUDA graph (no
    flush, launch gaps hidden): the steady state the other timers' overheads are measured against."""
    fn()
    torch.cuda.synchronize()
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        fn()
    torch.cuda.current_stream().wait_stream(st)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / calls)
    del g
    return statistics.median(ts)


def rotated(items, r: int) -> list:
    """``items`` rotated left by ``r``: round r of an interleaved benchmark times the implementations
    in this order, so none always runs first (coolest, right after another shape) or right after the
    same competitor (whose heat it inherits)."""
    items = list(items)
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def make_bench(quick: bool):
    """(bench(fn) -> median microseconds, the timer's description): ``triton.testing.do_bench`` (cold L2),
    or CUDA events after a 512 MB write where triton is missing."""
    try:
        import triton.testing as tt

        def bench(fn):
            return tt.do_bench(fn, warmup=10 if quick else 25, rep=40 if quick else 120, return_mode="median") * 1e3

        return bench, "triton.testing.do_bench (median, L2 flushed per call)"
    except ImportError:  # pragma: no cover - depends on the GPU machine
        flush = torch.empty(512 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")

        def bench(fn):
            return bench_events(fn, flush.zero_, 10 if quick else 40)

        return bench, "CUDA events (median, 512 MB write before each call)"


def time_rounds(impls: dict[str, Callable[[], object]], bench: Callable[[Callable], float], repeats: int,
                tick: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """{name: [microseconds per round]}: every implementation once per round, the order rotated per
    round (:func:`rotated`); ``tick(name)`` after each timing (progress)."""
    times: dict[str, list[float]] = {n: [] for n in impls}
    for r in range(repeats):
        for name, fn in rotated(impls.items(), r):
            times[name].append(bench(fn))
            if tick is not None:
                tick(name)
    return times


def precompile_and_report(precompile, cfgs) -> None:
    """``precompile(cfgs)`` (a kernel family's parallel compile into the disk cache) before timing,
    with its duration and errors printed (configs counted once each, by repr: a warmup spec may be a
    dict)."""
    t0 = time.time()
    errs = precompile(cfgs)
    print(f"precompiled {len({repr(c) for c in cfgs})} configs in {time.time() - t0:.1f} s", flush=True)
    for e in errs:
        print("  precompile error:", e[:300], flush=True)


def zero_flush() -> Callable[[], object]:
    """A callable that zeroes a 256 MiB buffer (cached per device): cold L2, flushed by writes."""
    dev = torch.cuda.current_device()
    if dev not in _ZERO:
        _ZERO[dev] = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    return _ZERO[dev].zero_


def paired_times(impls: dict[str, Callable[[], object]], reps: int, time_one: Callable[[Callable], float] | None = None,
                 warmup: int = 3, tick: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """{name: [microseconds per repetition]}: the paired timer.  ``warmup`` untimed calls of each
    implementation, then ``reps`` repetitions of :func:`time_rounds`, each calling every implementation
    once in an order rotated by the repetition, each call timed alone by ``time_one(fn)`` -- by default
    :func:`event_us` after its own :func:`zero_flush`."""
    if time_one is None:
        flush = zero_flush()

        def time_one(fn):
            return event_us(fn, flush)

    for fn in impls.values():
        for _ in range(warmup):
            fn()
    return time_rounds(impls, time_one, reps, tick)


def paired_ratio(times: dict[str, list[float]], num, den) -> float:
    """The median over the repetitions of num's time / den's time in :func:`paired_times`' ``times``.
    ``num`` and ``den`` are a name or a sequence of names, whose times are summed per repetition (a
    ceiling made of two kernels timed alone, e.g. a bare read and a merge).  ``paired_ratio(t, "ref",
    "ours")`` above 1: ours is faster."""
    def per_rep(names):
        names = (names,) if isinstance(names, str) else tuple(names)
        runs = [times[n] for n in names]
        if not runs or not runs[0] or any(len(r) != len(runs[0]) for r in runs):
            raise ValueError(f"paired_ratio: {names} need the same number of repetitions (> 0)")
        return [sum(ts) for ts in zip(*runs)]

    a, b = per_rep(num), per_rep(den)
    if len(a) != len(b):
        raise ValueError(f"paired_ratio: {num!r} and {den!r} have {len(a)} and {len(b)} repetitions")
    return statistics.median(x / y for x, y in zip(a, b))


def warm_one(entry) -> str:
    """Compile one ``cute_kernels.warmup`` entry ``(kernel name, spec)`` into the disk cache: a job of
    :func:`cute_kernels.common.jit.precompile_in_processes` (spawned process); "" or the error."""
    import cute_kernels

    try:
        cute_kernels.warmup([entry])
        return ""
    except Exception as e:  # noqa: BLE001 - reported; the first call compiles it again
        return f"{entry}: {type(e).__name__}: {e}"


def profiled_kernels(fn, steps: int) -> list[tuple[str, float]]:
    """``(name, microseconds)`` of every CUDA kernel ``steps`` calls of ``fn`` ran, under ``torch.profiler``
    (synchronized before and after), by :func:`device_kernel_times`."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    return device_kernel_times(prof)


def device_kernel_times(prof) -> list[tuple[str, float]]:
    """``(name, microseconds)`` of each device event of a finished ``torch.profiler`` profile that is work
    (kernels, memcpy, memset), without the GPU user annotations (``record_function`` ranges mirrored on
    the device, e.g. the optimizer's step: each spans kernels that are already listed)."""
    cuda = torch.autograd.DeviceType.CUDA
    kernels = [(e.name, e.time_range.elapsed_us()) for e in prof.events()
               if e.device_type == cuda and not getattr(e, "is_user_annotation", False)]
    if not kernels:  # a profiler build that lists kernels only in its averages
        kernels = [(k.key, k.self_device_time_total) for k in prof.key_averages()
                   if k.device_type == cuda and not getattr(k, "is_user_annotation", False)]
    return kernels
