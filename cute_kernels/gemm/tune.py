"""GEMM autotuning: time candidate configs for one problem, keep the fastest, persist it on disk.

Why: the shape heuristic in :func:`cute_kernels.gemm_host.default_tiles` is a guess; the best CTA
tile, cluster shape and raster order depend on the shape.  Two rounds: every (tile, cluster) of
:func:`candidates` (cooperative 128x{256, 192} and 256x{128, 192}, ping-pong 128x{128, 192}, clusters
2x1 / 1x2, compiled in parallel processes first) with the shape's default raster, then the other
rasters on the fastest: at most 15 timings per shape.  A shape the heuristic splits along K instead
times the split-K kernels (cluster, fixup, persistent) and the unsplit one (4 timings); a problem
with M <= 64 also times the transposed plan (:func:`gemm_host.skinny_swap_choice`, entry "swap").
Results live in ``<cache dir>/gemm_tuned.json`` keyed by (M, N, K, L, dtypes, majors) and are picked up by every later
call in any process.  ``cute-kernels tune gemm M N K`` runs it from the shell.
"""

from __future__ import annotations

import json
import os
import time

from layouts import tiles as T

from ..common import jit
from ..common.arch import current_arch

_table: dict | None = None


def _path():
    return jit.cache_dir() / "gemm_tuned.json"


def _key(m, n, k, l, ab, am, bm, d_name) -> str:
    return f"{m}x{n}x{k}x{l}:{ab}:{am}/{bm}:{d_name}:{current_arch().name}"


def _load() -> dict:
    global _table
    if _table is None:
        try:
            _table = json.loads(_path().read_text())
        except (OSError, ValueError):
            _table = {}
    return _table


def lookup(m, n, k, l, ab, am, bm, d_name):
    """(GemmTiles, (raster_swizzle, raster_along_m), None) tuned for this problem; for a split-K
    shape (None, None, split-K mode); or None when untuned."""
    e = _load().get(_key(m, n, k, l, ab, am, bm, d_name))
    if e is None:
        return None
    if "splitk" in e:
        return None, None, e["splitk"]
    return (_tiles(e["tile_n"], tuple(e["cluster"]), ab, am, bm, d_name, e.get("tile_m", 128), e.get("pingpong", False)),
            (e["swizzle"], e["along_m"]), None)


def _tiles(tile_n, cluster, ab, am, bm, d_name, tile_m=128, pingpong=False) -> T.GemmTiles:
    from .host import make_gemm_tiles

    return make_gemm_tiles(tile_n, cluster, ab, am, bm, d_name, pingpong=pingpong, tile_m=tile_m)


#: Tile families the tuner times, as (tile_m, tile_n, pingpong): the cooperative 128 x {256, 192} of
#: the heuristic, quack's cooperative 256 x {128, 192} (two 64-row M-blocks per warpgroup) and ping-pong
#: 128 x {128, 192}; each with clusters 2x1 and 1x2 where the tile counts allow (1x1 when neither
#: does; 128 x 256 only 2x1 then 1x2).  The heuristic's own choice is always a candidate.  256 x 160
#: and 256 x 208 were dropped: on all six shapes of session 3 run 5 they were 4-35% behind the best.
TILE_FAMILIES = ((128, 256, False), (128, 192, False), (256, 128, False), (256, 192, False),
                 (128, 128, True), (128, 192, True))
#: Rasters tried, in a second round, on the fastest (tile, cluster) of the first (which uses (1, M)).
RASTERS = ((1, True), (4, True), (8, False))


def _clusters(m, n, tile_m, tile_n, both=True):
    """Clusters whose CTA pairs tile the grid: 2x1 needs an even count of M tiles, 1x2 of N tiles."""
    out = []
    if -(-m // tile_m) % 2 == 0:
        out.append((2, 1))
    if -(-n // tile_n) % 2 == 0 and (both or not out):
        out.append((1, 2))
    return out or [(1, 1)]


def candidates(m, n, ab, am, bm, d_name, k=4096, l=1):
    """First-round candidates ``(tile_m, tile_n, pingpong, cluster, swizzle, along_m)``: at most 12
    (the families x clusters + the heuristic's choice, first), all with the shape's own raster
    (:func:`gemm_host.default_raster`): with A larger than L2 a swizzle-1 raster costs every tile
    family ~10-15% (session 3 run 5), which would rank them on the raster instead of the tile."""
    from .host import default_raster, default_tiles

    d = default_tiles(m, n, k, l, ab, am, bm, d_name, "n", pingpong=False)
    raster = default_raster(m, n, k, ab, l, d)
    out = [(d.tile_mnk[0], d.tile_mnk[1], d.pingpong, d.cluster_mn, *raster)]
    for tile_m, tile_n, pp in TILE_FAMILIES:
        for cluster in _clusters(m, n, tile_m, tile_n, both=(tile_m, tile_n) != (128, 256)):
            c = (tile_m, tile_n, pp, cluster, *raster)
            if c not in out:
                out.append(c)
    return out


def _describe(c):
    tile_m, tile_n, pp, cluster, swizzle, along_m = c
    return (f"{'pp ' if pp else ''}{tile_m}x{tile_n} cluster {cluster[0]}x{cluster[1]} swizzle {swizzle}"
            f"{'m' if along_m else 'n'}")


def _precompile(job):
    """Worker (spawned process): compile one candidate's kernel into the disk cache, no GPU needed."""
    import torch

    from .host import _make_plan

    (a_shape, a_stride), (b_shape, b_stride), dtype, out_dtype, (ab, am, bm, d_name), c = job
    a = torch.empty_strided(a_shape, a_stride, dtype=dtype)  # CPU, never touched: only the layout counts
    b = torch.empty_strided(b_shape, b_stride, dtype=dtype)
    tile_m, tile_n, pp, cluster, swizzle, along_m = c
    try:
        tiles = _tiles(tile_n, cluster, ab, am, bm, d_name, tile_m, pp)
        _make_plan(a, b, None, None, 0.0, out_dtype, tiles, (swizzle, along_m), allow_cpu=True)
        return None
    except Exception as e:  # reported; the timing loop compiles (and skips) it again
        return f"{type(e).__name__}: {e}"


def _precompile_all(a, b, out_dtype, names, cands):
    """Compile the candidates in parallel processes (``cute.compile`` is not thread-safe; quack uses a
    process pool too) so the timing loop only loads them from the disk cache.  Jobs: env
    CUTE_KERNELS_TUNE_JOBS (default min(8, cores - 1)); 0 or 1, or no disk cache: compile in the loop."""
    import concurrent.futures as cf
    import multiprocessing as mp

    jobs = int(os.environ.get("CUTE_KERNELS_TUNE_JOBS", min(8, (os.cpu_count() or 1) - 1)))
    if jobs <= 1 or len(cands) < 2 or not jit.disk_cache_enabled():
        return
    spec = ((tuple(a.shape), tuple(a.stride())), (tuple(b.shape), tuple(b.stride())), a.dtype, out_dtype, names)
    t0 = time.time()
    try:
        with cf.ProcessPoolExecutor(max_workers=min(jobs, len(cands)), mp_context=mp.get_context("spawn")) as ex:
            for c, err in zip(cands, ex.map(_precompile, [(*spec, c) for c in cands])):
                if err:
                    jit.log.warning("tune: precompile of %s failed: %s", _describe(c), err)
    except Exception as e:  # noqa: BLE001 - the timing loop compiles serially instead
        jit.log.warning("tune: parallel precompile failed (%s); compiling serially", e)
        return
    jit.log.info("tune: precompiled %d candidates in %.1f s with %d processes", len(cands), time.time() - t0, jobs)


def _bench(fn, reps=20):
    """Median ms: triton's do_bench (cold L2) when available, else back-to-back launches timed by events."""
    import torch

    try:
        from triton.testing import do_bench

        return do_bench(fn, warmup=10, rep=40, return_mode="median")
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

    from .host import _TORCH_TO_NAME, _gemm_impl, _major

    m, k = a.shape[-2:]
    n = b.shape[-1]
    l = a.shape[0] if a.dim() == 3 else 1
    ab = _TORCH_TO_NAME[a.dtype]
    d_name = _TORCH_TO_NAME[out_dtype or a.dtype]
    am = "k" if _major(a, "a", "M", "K") == "row" else "mn"
    bm = "mn" if _major(b, "b", "K", "N") == "row" else "k"
    key = _key(m, n, k, l, ab, am, bm, d_name)
    if key in _load():
        return _load()[key]
    t0 = time.time()
    results = []
    out = torch.empty((*a.shape[:-1], n), dtype=out_dtype or a.dtype, device=a.device)
    from .host import SPLITK_MODES, default_tiles, skinny_swap_choice, split_k_factor

    def run_mode(mode):
        """A split-K mode of :func:`gemm_host._make_plan` (or "swap", the transposed skinny plan) as a
        candidate, stored as ``{"splitk": mode}``; one that does not build or run is skipped."""
        try:
            _gemm_impl(a, b, out, None, 1.0, 0.0, None, splitk_mode=mode)
            ms = _bench(lambda: _gemm_impl(a, b, out, None, 1.0, 0.0, None, splitk_mode=mode))
        except Exception as e:  # noqa: BLE001
            jit.log.warning("tune: split-K %s failed: %s", mode, e)
            return
        results.append((ms, dict(splitk=mode)))
        if verbose:
            jit.log.info("tune %s: split-K %s: %.3f ms %.0f TFLOP/s", key, mode, ms, 2 * m * n * k * l / ms / 1e9)

    if l == 1 and skinny_swap_choice(m, n, k) is not None:
        # M <= 64: the transposed plan (the default for such shapes) is a candidate too, so tuning
        # never trades it for the slower untransposed kernels
        run_mode("swap")

    if split_k_factor(m, n, k, l, default_tiles(m, n, k, l, ab, am, bm, d_name, "n", pingpong=False)) > 1:
        # a split-K shape: every tile candidate would run the same split kernel; time the split-K
        # kernels (each with its own tiles) and the unsplit persistent kernel instead
        for mode in SPLITK_MODES:
            run_mode(mode)
        return _store(key, results, t0)

    def run(c):
        tile_m, tile_n, pp, cluster, swizzle, along_m = c
        try:
            tiles = _tiles(tile_n, cluster, ab, am, bm, d_name, tile_m, pp)
            # plan built by the first call and cached; a preallocated out: only the launch is timed
            # (host work per call would otherwise exceed the GPU time of small problems)
            _gemm_impl(a, b, out, None, 1.0, 0.0, None, tiles, (swizzle, along_m))
            ms = _bench(lambda: _gemm_impl(a, b, out, None, 1.0, 0.0, None, tiles, (swizzle, along_m)))
        except Exception as e:  # a candidate that does not build or run is skipped, not fatal
            jit.log.warning("tune: %s failed: %s", _describe(c), e)
            return
        results.append((ms, dict(tile_m=tile_m, tile_n=tile_n, pingpong=pp, cluster=list(cluster),
                                 swizzle=swizzle, along_m=along_m)))
        if verbose:
            tf = 2 * m * n * k * l / ms / 1e9
            jit.log.info("tune %s: %s: %.3f ms %.0f TFLOP/s", key, _describe(c), ms, tf)

    first = candidates(m, n, ab, am, bm, d_name, k, l)
    _precompile_all(a, b, out_dtype, (ab, am, bm, d_name), first)
    for c in first:
        run(c)
    tiled = [r for r in results if "tile_n" in r[1]]
    if tiled:  # second round: the other rasters on the fastest tile/cluster
        e = min(tiled, key=lambda r: r[0])[1]
        for swizzle, along_m in RASTERS:
            if (swizzle, along_m) != (e["swizzle"], e["along_m"]):
                run((e["tile_m"], e["tile_n"], e["pingpong"], tuple(e["cluster"]), swizzle, along_m))
    return _store(key, results, t0)


def _store(key, results, t0):
    """Persist the fastest of ``results`` ((ms, entry) pairs) under ``key``; drop stale plans."""
    if not results:
        raise RuntimeError(f"tune: no candidate ran for {key}")
    results.sort(key=lambda r: r[0])
    best = dict(results[0][1], ms=results[0][0], tuned_s=round(time.time() - t0, 1))
    table = _load()
    table[key] = best
    tmp = _path().with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    os.replace(tmp, _path())
    from .host import _plans

    _plans.clear()  # plans made before tuning used the heuristic
    return best
