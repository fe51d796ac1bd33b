"""GEMM autotuning: time candidate configs for one problem, keep the fastest, persist it on disk.

Why: the shape heuristic in :func:`cute_kernels.gemm_host.default_tiles` is a guess; the best CTA
tile, cluster shape and raster order depend on the shape.  Results live in
``<cache dir>/gemm_tuned.json`` keyed by (M, N, K, L, dtypes, majors) and are picked up by every later
call in any process.  ``cute-kernels tune gemm M N K`` runs it from the shell.
"""

from __future__ import annotations

import json
import os
import time

from layouts import tiles as T

from . import jit
from .arch import current_arch

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
    """(GemmTiles, (raster_swizzle, raster_along_m)) tuned for this problem, or None."""
    e = _load().get(_key(m, n, k, l, ab, am, bm, d_name))
    if e is None:
        return None
    return _tiles(e["tile_n"], tuple(e["cluster"]), ab, am, bm, d_name), (e["swizzle"], e["along_m"])


def _tiles(tile_n, cluster, ab, am, bm, d_name) -> T.GemmTiles:
    from .gemm_host import make_gemm_tiles

    return make_gemm_tiles(tile_n, cluster, ab, am, bm, d_name)


def candidates(m, n, ab, am, bm, d_name):
    out = []
    for tile_n in (256, 192, 128):
        for cluster in ((1, 1), (2, 1), (1, 2)):
            if cluster[0] == 2 and -(-m // 128) % 2 or cluster[1] == 2 and -(-n // tile_n) % 2:
                continue
            for swizzle, along_m in ((1, True), (4, True), (8, False)):
                out.append((tile_n, cluster, swizzle, along_m))
    return out


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
    from .gemm_host import _TORCH_TO_NAME, _gemm_impl, _major

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
    results = []
    t0 = time.time()
    for tile_n, cluster, swizzle, along_m in candidates(m, n, ab, am, bm, d_name):
        tiles = _tiles(tile_n, cluster, ab, am, bm, d_name)
        try:
            ms = _bench(lambda: _gemm_impl(a, b, None, None, 1.0, 0.0, out_dtype, tiles, (swizzle, along_m)))
        except Exception as e:  # a candidate that does not build or run is skipped, not fatal
            jit.log.warning("tune: %s %s swizzle %s failed: %s", tile_n, cluster, swizzle, e)
            continue
        results.append((ms, dict(tile_n=tile_n, cluster=list(cluster), swizzle=swizzle, along_m=along_m)))
        if verbose:
            tf = 2 * m * n * k * l / ms / 1e9
            jit.log.info("tune %s: tile 128x%d cluster %s swizzle %d%s: %.3f ms %.0f TFLOP/s", key, tile_n,
                         cluster, swizzle, "m" if along_m else "n", ms, tf)
    if not results:
        raise RuntimeError(f"tune: no candidate ran for {key}")
    results.sort(key=lambda r: r[0])
    best = dict(results[0][1], ms=results[0][0], tuned_s=round(time.time() - t0, 1))
    table = _load()
    table[key] = best
    tmp = _path().with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    os.replace(tmp, _path())
    from .gemm_host import _plans

    _plans.clear()  # plans made before tuning used the heuristic
    return best
