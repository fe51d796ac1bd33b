"""GEMM autotuning: time candidate configs for one problem, keep the fastest, persist it on disk
(``<cache dir>/gemm_tuned.json``, :mod:`.tuned`, used by every later call in any process).

The heuristic (:func:`.heuristics.default_tiles`) is a guess.  Two rounds: every (tile, cluster) of
:func:`candidates` (compiled in parallel processes first) with the shape's default raster, then the
other rasters on the fastest: at most 13 timings.  A shape the heuristic splits along K times the
split-K kernels and the unsplit one instead; M <= 64 also times the transposed plan ("swap").
"""

from __future__ import annotations

import os
import time

from ..common import jit
from ..common.dtypes import TORCH_TO_NAME
from . import tuned
from .heuristics import auto_splitk_mode, default_raster, default_tiles, make_gemm_tiles, skinny_swap_choice, split_k_factor
from .plan import PlanChoice, clear_plans, make_plan, run
from .validate import major_of

#: Tile families the tuner times, as (tile_m, tile_n), each with clusters 2x1 and 1x2 where the tile
#: counts allow (1x1 when neither does; 128 x 256 only 2x1 then 1x2), plus the heuristic's choice.
TILE_FAMILIES = ((128, 256), (128, 192), (256, 128), (256, 192))
#: Rasters tried, in a second round, on the fastest (tile, cluster) of the first (which uses (1, M)).
RASTERS = ((1, True), (4, True), (8, False))
#: what the tuner times for a shape the heuristic splits ("none": the unsplit persistent kernel)
SPLITK_CANDIDATES = ("cluster", "persistent", "none")


def _clusters(m, n, tile_m, tile_n, both=True):
    """Clusters whose CTA pairs tile the grid: 2x1 needs an even count of M tiles, 1x2 of N tiles."""
    out = []
    if -(-m // tile_m) % 2 == 0:
        out.append((2, 1))
    if -(-n // tile_n) % 2 == 0 and (both or not out):
        out.append((1, 2))
    return out or [(1, 1)]


def candidates(m, n, ab, am, bm, d_name, k=4096, l=1):
    """First-round candidates ``(tile_m, tile_n, cluster, swizzle, along_m)``: the heuristic's choice,
    then the families x clusters, all with the shape's own raster (a swizzle-1 raster with A larger
    than L2 would rank the tiles on the raster instead)."""
    d = default_tiles(m, n, k, l, ab, am, bm, d_name, "n")
    raster = default_raster(m, n, k, ab, l, d)
    out = [(d.tile_mnk[0], d.tile_mnk[1], d.cluster_mn, *raster)]
    for tile_m, tile_n in TILE_FAMILIES:
        for cluster in _clusters(m, n, tile_m, tile_n, both=(tile_m, tile_n) != (128, 256)):
            c = (tile_m, tile_n, cluster, *raster)
            if c not in out:
                out.append(c)
    return out


def candidate_choice(c, ab, am, bm, d_name) -> PlanChoice:
    """The plan choice that runs candidate ``c`` (its tiles and raster)."""
    tile_m, tile_n, cluster, swizzle, along_m = c
    return PlanChoice(tiles=make_gemm_tiles(tile_n, cluster, ab, am, bm, d_name, tile_m=tile_m),
                      raster=(swizzle, along_m))


def _describe(c):
    tile_m, tile_n, cluster, swizzle, along_m = c
    return f"{tile_m}x{tile_n} cluster {cluster[0]}x{cluster[1]} swizzle {swizzle}{'m' if along_m else 'n'}"


def _precompile(job):
    """Worker (spawned process): compile one candidate's kernel into the disk cache, no GPU needed."""
    import torch

    (a_shape, a_stride), (b_shape, b_stride), dtype, out_dtype, names, c = job
    a = torch.empty_strided(a_shape, a_stride, dtype=dtype)  # CPU, never touched: only the layout counts
    b = torch.empty_strided(b_shape, b_stride, dtype=dtype)
    try:
        make_plan(a, b, None, None, 0.0, out_dtype, candidate_choice(c, *names), allow_cpu=True)
        return None
    except Exception as e:  # reported; the timing loop compiles (and skips) it again
        return f"{_describe(c)}: {type(e).__name__}: {e}"


def _precompile_all(a, b, out_dtype, names, cands):
    """Compile the candidates in parallel processes (:func:`jit.precompile_in_processes`) so the timing
    loop only loads them from the disk cache.  Jobs: env CUTE_KERNELS_TUNE_JOBS (default
    min(8, cores - 1)); 0 or 1: nothing here, the timing loop compiles them."""
    jobs = int(os.environ.get("CUTE_KERNELS_TUNE_JOBS", min(8, (os.cpu_count() or 1) - 1)))
    if jobs <= 1 or len(cands) < 2:
        return
    spec = ((tuple(a.shape), tuple(a.stride())), (tuple(b.shape), tuple(b.stride())), a.dtype, out_dtype, names)
    t0 = time.time()
    try:
        errors = jit.precompile_in_processes(_precompile, [(*spec, c) for c in cands], min(jobs, len(cands)))
    except Exception as e:  # noqa: BLE001 - the timing loop compiles serially instead
        jit.log.warning("tune: parallel precompile failed (%s); compiling serially", e)
        return
    for err in errors:
        jit.log.warning("tune: precompile of %s", err)
    jit.log.info("tune: precompiled %d candidates in %.1f s with %d processes", len(cands), time.time() - t0, jobs)


def bench_ms(fn, reps=20, rep_ms=40):
    """Median ms: triton's do_bench (cold L2; ``rep_ms`` of timing) when available, else ``reps``
    back-to-back launches timed by events."""
    import torch

    try:
        from triton.testing import do_bench

        return do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")
    except ImportError:
        pass
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def tune_gemm(a, b, out_dtype=None, verbose=True):
    """Time every candidate on (a, b); store and return the best entry."""
    import torch

    m, k = a.shape[-2:]
    n = b.shape[-1]
    l = a.shape[0] if a.dim() == 3 else 1
    ab = TORCH_TO_NAME[a.dtype]
    d_name = TORCH_TO_NAME[out_dtype or a.dtype]
    am = "k" if major_of(a, "a", "M", "K") == "row" else "mn"
    bm = "mn" if major_of(b, "b", "K", "N") == "row" else "k"
    key = tuned.key(m, n, k, l, ab, am, bm, d_name)
    if key in tuned.load():
        return tuned.load()[key]
    t0 = time.time()
    results = []
    out = torch.empty((*a.shape[:-1], n), dtype=out_dtype or a.dtype, device=a.device)

    def time_choice(choice, entry, what):
        """Time one plan choice (built by the first call and cached; a preallocated out, so only the
        launch is timed); one that does not build or run is skipped, not fatal."""
        try:
            run(a, b, out, choice=choice)
            ms = bench_ms(lambda: run(a, b, out, choice=choice))
        except Exception as e:  # noqa: BLE001
            jit.log.warning("tune: %s failed: %s", what, e)
            return
        results.append((ms, entry))
        if verbose:
            jit.log.info("tune %s: %s: %.3f ms %.0f TFLOP/s", key, what, ms, 2 * m * n * k * l / ms / 1e9)

    if l == 1 and skinny_swap_choice(m, n, k) is not None:
        # M <= 64: the transposed plan (the default for such shapes) is a candidate too, so tuning
        # never trades it for the slower untransposed kernels
        time_choice(PlanChoice(splitk_mode="swap"), dict(splitk="swap"), "split-K swap")

    if split_k_factor(m, n, k, l, default_tiles(m, n, k, l, ab, am, bm, d_name, "n"), auto_splitk_mode(m, n, k, l)) > 1:
        # a split-K shape: every tile candidate would run the same split kernel; time the split-K
        # kernels (each with its own tiles) and the unsplit persistent kernel instead
        for mode in SPLITK_CANDIDATES:
            time_choice(PlanChoice(splitk_mode=mode), dict(splitk=mode), f"split-K {mode}")
        return _store(key, results, t0)

    def run_candidate(c):
        tile_m, tile_n, cluster, swizzle, along_m = c
        time_choice(candidate_choice(c, ab, am, bm, d_name),
                    dict(tile_m=tile_m, tile_n=tile_n, cluster=list(cluster), swizzle=swizzle, along_m=along_m),
                    _describe(c))

    first = candidates(m, n, ab, am, bm, d_name, k, l)
    _precompile_all(a, b, out_dtype, (ab, am, bm, d_name), first)
    for c in first:
        run_candidate(c)
    tiled = [r for r in results if "tile_n" in r[1]]
    if tiled:  # second round: the other rasters on the fastest tile/cluster
        e = min(tiled, key=lambda r: r[0])[1]
        for swizzle, along_m in RASTERS:
            if (swizzle, along_m) != (e["swizzle"], e["along_m"]):
                run_candidate((e["tile_m"], e["tile_n"], tuple(e["cluster"]), swizzle, along_m))
    return _store(key, results, t0)


def _store(key, results, t0):
    """Persist the fastest of ``results`` ((ms, entry) pairs) under ``key``; drop stale plans."""
    if not results:
        raise RuntimeError(f"tune: no candidate ran for {key}")
    results.sort(key=lambda r: r[0])
    best = tuned.store(key, dict(results[0][1], ms=results[0][0]), time.time() - t0)
    clear_plans()  # plans made before tuning used the heuristic
    return best
