"""The tuner's results on disk: ``<cache dir>/gemm_tuned.json``, one entry per (M, N, K, L, dtypes,
majors, arch).  Read by the planner on every new signature, written by :mod:`.tune`."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from layouts import tiles as T

from ..common import jit
from ..common.arch import current_arch
from .heuristics import make_gemm_tiles

#: split-K modes a tuned entry may name (the planner's kernels; "swap": the transposed skinny plan)
TUNED_SPLITK_MODES = ("cluster", "persistent", "none", "swap")

_table: dict | None = None
_path: Path | None = None  # set by table_at


class TunedChoice(NamedTuple):
    """A tuned entry as the planner uses it: tiles and raster, or (for a split-K shape) a split-K mode."""

    tiles: T.GemmTiles | None
    raster: tuple[int, bool] | None
    splitk_mode: str | None


def table_path() -> Path:
    return _path if _path is not None else jit.cache_dir() / "gemm_tuned.json"


@contextmanager
def table_at(path):
    """Read and write the tuning table at ``path`` inside the block (a scratch or shared table)."""
    global _path, _table
    saved = _path, _table
    _path, _table = Path(path), None
    try:
        yield
    finally:
        _path, _table = saved


def key(m, n, k, l, ab, am, bm, d_name) -> str:
    return f"{m}x{n}x{k}x{l}:{ab}:{am}/{bm}:{d_name}:{current_arch().name}"


def load() -> dict:
    global _table
    if _table is None:
        try:
            _table = json.loads(table_path().read_text())
        except (OSError, ValueError):
            _table = {}
    return _table


def lookup(m, n, k, l, ab, am, bm, d_name) -> TunedChoice | None:
    """The tuned choice for this problem, or None when untuned (or tuned for a variant that no longer
    exists: ping-pong tiles, the fixup / workspace split-K modes)."""
    e = load().get(key(m, n, k, l, ab, am, bm, d_name))
    if e is None:
        return None
    if "splitk" in e:
        return TunedChoice(None, None, e["splitk"]) if e["splitk"] in TUNED_SPLITK_MODES else None
    if e.get("pingpong", False):
        return None
    return TunedChoice(make_gemm_tiles(e["tile_n"], tuple(e["cluster"]), ab, am, bm, d_name, tile_m=e.get("tile_m", 128)),
                       (e["swizzle"], e["along_m"]), None)


def store(entry_key: str, entry: dict, tuned_s: float) -> dict:
    """Persist ``entry`` (+ its tuning time) under ``entry_key``; returns the stored entry."""
    best = dict(entry, tuned_s=round(tuned_s, 1))
    table = load()
    table[entry_key] = best
    tmp = table_path().with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    os.replace(tmp, table_path())
    return best

