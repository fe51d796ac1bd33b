"""The tuner's results on disk: ``<cache dir>/gemm_tuned.json``, one entry per (M, N, K, L, dtypes,
majors, arch).  Read by the planner on every new signature, written by :mod:`.tune`.

Never fatal: a table that cannot be read or parsed, or an entry that does not describe a plan, means
"untuned" (the planner's heuristics); a directory that cannot be created or written keeps a new
result in this process only.  Each of these warns once (:class:`~cute_kernels.common.jit.CompileCacheWarning`)."""

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
    """The table's file (its directory is not created here)."""
    return _path if _path is not None else jit.cache_path() / "gemm_tuned.json"


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
        _table = _read(table_path())
    return _table


def _read(path: Path) -> dict:
    """The table at ``path``; {} (untuned) when there is none or it is unusable (one warning)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:  # a directory in its place, no permission, ...
        jit._warn_once(("tuned", str(path)), f"cannot read the tuning table {path} ({e}); using the planner's defaults")
        return {}
    try:
        table = json.loads(text)
    except ValueError as e:
        table = e
    if not isinstance(table, dict):
        jit._warn_once(("tuned", str(path)), f"the tuning table {path} is not a JSON object ({table}); "
                       "using the planner's defaults")
        return {}
    return table


def lookup(m, n, k, l, ab, am, bm, d_name) -> TunedChoice | None:
    """The tuned choice for this problem, or None when untuned (or tuned for a variant that no longer
    exists: ping-pong tiles, the fixup / workspace split-K modes)."""
    k_ = key(m, n, k, l, ab, am, bm, d_name)
    e = load().get(k_)
    if e is None:
        return None
    try:
        if "splitk" in e:
            return TunedChoice(None, None, e["splitk"]) if e["splitk"] in TUNED_SPLITK_MODES else None
        if e.get("pingpong", False):
            return None
        tiles = make_gemm_tiles(e["tile_n"], tuple(e["cluster"]), ab, am, bm, d_name, tile_m=e.get("tile_m", 128))
        return TunedChoice(tiles, (int(e["swizzle"]), bool(e["along_m"])), None)
    except (KeyError, TypeError, ValueError, AssertionError, AttributeError) as err:  # a hand-edited entry
        jit._warn_once(("tuned", str(table_path()), k_), f"tuning table entry {k_} is unusable "
                       f"({type(err).__name__}: {err}); using the planner's defaults for it")
        return None


def store(entry_key: str, entry: dict, tuned_s: float) -> dict:
    """Persist ``entry`` (+ its tuning time) under ``entry_key``; returns the stored entry."""
    best = dict(entry, tuned_s=round(tuned_s, 1))
    table = load()
    table[entry_key] = best  # used by this process whatever happens on disk
    path = table_path()
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as e:
        jit._warn_once(("tuned-write", str(path)), f"cannot write the tuning table {path} ({e}); "
                       "the result is kept for this process only")
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
    return best

