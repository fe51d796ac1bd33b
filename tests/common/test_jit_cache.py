"""The compile cache's disk layer on the CPU (compiles for sm_90a, no GPU): a clean entry loads without
compiling; a corrupted object file fails its checksum, is recompiled and overwritten, with one warning;
an unusable cache directory compiles without the disk cache, with one warning; two processes compiling
the same kernel at once compile it once (the per-entry file lock).  The kernel is the cheapest one, the
merge of attention states (~1 s to compile)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from cute_kernels.attention.merge import MergeConfig, merge_builder
from cute_kernels.common import jit

NAME = "merge_states"
CFG = MergeConfig("float32", "bfloat16", 64)


def _get():
    return jit.get_compiled(NAME, CFG, merge_builder(CFG))


def _forget():
    """Drop the entry from the in-process (memory) cache, so the next call goes to the disk."""
    jit._memory.pop(jit.full_key(NAME, CFG), None)


def _get_counting_warnings():
    """(compiled fn, compiles it took, CompileCacheWarnings it raised)."""
    _forget()
    before = jit.stats["compiles"]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fn = _get()
    ours = [x for x in w if issubclass(x.category, jit.CompileCacheWarning)]
    return fn, jit.stats["compiles"] - before, ours


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(d))
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "1")
    yield d
    _forget()


def _entry(d: Path) -> Path:
    (obj,) = d.glob(f"{NAME}-*.o")
    return obj


def _valid(obj: Path) -> bool:
    sums = Path(str(obj)[: -len(".o")] + ".sha256")
    return sums.read_text().strip() == hashlib.sha256(obj.read_bytes()).hexdigest()


def test_clean_entry_loads_without_compiling(cache):
    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 1 and not warned
    assert _valid(_entry(cache))
    hits = jit.stats["disk_hits"]
    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 0 and not warned
    assert jit.stats["disk_hits"] == hits + 1


def test_corrupt_entry_recompiles_and_warns_once(cache):
    _get_counting_warnings()
    obj = _entry(cache)
    good = obj.read_bytes()
    assert len(good) > 12 * 1024
    with open(obj, "r+b") as f:  # 4 KB of random bytes inside the file (same size, same name)
        f.seek(8 * 1024)
        f.write(os.urandom(4096))
    assert not _valid(obj)

    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 1
    assert len(warned) == 1 and "checksum" in str(warned[0].message), [str(x.message) for x in warned]
    assert _valid(obj)  # overwritten with the recompiled object and its checksum

    # the recompiled object is a valid entry: loads from the disk, no compile, no warning
    hits = jit.stats["disk_hits"]
    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 0 and not warned and jit.stats["disk_hits"] == hits + 1
    assert jit._load_object(obj) is not None


def test_missing_checksum_recompiles(cache):
    _get_counting_warnings()
    Path(str(_entry(cache))[: -len(".o")] + ".sha256").unlink()
    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 1 and len(warned) == 1
    assert _valid(_entry(cache))


@pytest.mark.parametrize("where", ["under-a-file", "file", "proc"])
def test_unusable_cache_dir_compiles_without_disk_cache(tmp_path, monkeypatch, where):
    """A path under a file or a file (cannot be created), /proc/self (exists; no file can be created
    there, not even by root): one warning, then compiles without the disk cache."""
    f = tmp_path / "not-a-dir"
    f.write_text("x")
    if where == "proc" and not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", {"under-a-file": str(f / "sub"), "file": str(f),
                                                  "proc": "/proc/self"}[where])
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "1")
    try:
        fn, compiles, warned = _get_counting_warnings()
        assert fn is not None and compiles == 1
        assert len(warned) == 1 and "without the disk cache" in str(warned[0].message)
        fn, compiles, warned = _get_counting_warnings()  # again: compiles, no second warning
        assert fn is not None and compiles == 1 and not warned
        assert f.read_text() == "x"
    finally:
        _forget()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_cache_dir_compiles_without_disk_cache(tmp_path, monkeypatch):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(d))
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "1")
    try:
        fn, compiles, warned = _get_counting_warnings()
        assert fn is not None and compiles == 1 and len(warned) == 1
        fn, compiles, warned = _get_counting_warnings()
        assert fn is not None and compiles == 1 and not warned
        assert list(d.iterdir()) == []
    finally:
        d.chmod(0o755)
        _forget()


_WORKER = """
from cute_kernels.attention.merge import MergeConfig, merge_builder
from cute_kernels.common import jit
cfg = MergeConfig("float32", "bfloat16", 64)
assert jit.get_compiled("merge_states", cfg, merge_builder(cfg)) is not None
print("compiles", jit.stats["compiles"], "disk_hits", jit.stats["disk_hits"])
"""


def test_two_processes_compile_once(cache):
    """Two processes asking for the same kernel at once: the file lock makes one compile and the
    other load its object file."""
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(cache), CUTE_KERNELS_LOG_LEVEL="WARNING")
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    counts = [tuple(int(x) for x in o.split()[1::2]) for o, _ in outs]
    assert sorted(counts) == [(0, 1), (1, 0)], outs
    assert _valid(_entry(cache))
