"""The compile cache's disk layer on the CPU (compiles for sm_90a, no GPU): a clean entry loads without
compiling; a corrupted object file fails its checksum, is recompiled and overwritten, with one warning;
an unusable cache directory compiles without the disk cache, with one warning; two processes compiling
the same kernel at once compile it once (the per-entry file lock).

Issue 35: a FIFO or a symbolic link in an entry's place never blocks nor is read; a hit takes no lock,
so a read-only cache filled by another user (root) is used; a directory or entry owned by another user
or writable by group or others is not loaded (host code: whoever can write it runs code as this
user).  Issue 31: an entry with its linked .so loads in a process that never imports the DSL.

The kernel is the cheapest one, the merge of attention states (~1 s to compile)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
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


@pytest.fixture(scope="session")
def compiled_entry(tmp_path_factory):
    """A directory holding what one compile of the kernel leaves in a fresh cache (its .o, .so, .sha256,
    .txt and .lock), compiled once per test process; the compile itself is checked by
    test_clean_entry_loads_without_compiling."""
    d = tmp_path_factory.mktemp("entry") / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUTE_KERNELS_CACHE_DIR", str(d))
        mp.setenv("CUTE_KERNELS_DISK_CACHE", "1")
        fn, compiles, warned = _get_counting_warnings()
        _forget()
    assert fn is not None and compiles == 1 and not warned
    return d


@pytest.fixture
def entry(cache, compiled_entry):
    """``cache`` as a compile into it leaves it: the directory (mode 0700) and a valid entry, copied
    (same names, modes and bytes) from :func:`compiled_entry` rather than compiled again."""
    cache.mkdir(mode=0o700, parents=True)
    for f in compiled_entry.iterdir():
        shutil.copy2(f, cache / f.name)
    assert _valid(_entry(cache))
    return cache


def _entry(d: Path) -> Path:
    (obj,) = d.glob(f"{NAME}-*.o")
    return obj


def _sums(obj: Path) -> dict:
    """The entry's checksum file: file name -> checksum."""
    lines = Path(str(obj)[: -len(".o")] + ".sha256").read_text().splitlines()
    return {name: digest for digest, name in (line.split("  ") for line in lines)}


def _valid(obj: Path) -> bool:
    """The .o, and the .so where the entry has one, match the checksums."""
    sums = _sums(obj)
    files = [obj] + [obj.with_suffix(".so")] * (obj.with_suffix(".so").name in sums)
    return all(sums.get(f.name) == hashlib.sha256(f.read_bytes()).hexdigest() for f in files)


def test_clean_entry_loads_without_compiling(cache):
    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 1 and not warned
    assert _valid(_entry(cache))
    hits = jit.stats["disk_hits"]
    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 0 and not warned
    assert jit.stats["disk_hits"] == hits + 1


def test_corrupt_entry_recompiles_and_warns_once(entry):
    cache = entry
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


def test_missing_checksum_recompiles(entry):
    cache = entry
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
import sys
from cute_kernels.attention.merge import MergeConfig, merge_builder
from cute_kernels.common import jit
jit.source_fingerprint = lambda: sys.argv[1]  # the test's: the checkout may change meanwhile
cfg = MergeConfig("float32", "bfloat16", 64)
assert jit.get_compiled("merge_states", cfg, merge_builder(cfg)) is not None
print("compiles", jit.stats["compiles"], "disk_hits", jit.stats["disk_hits"])
"""


def test_two_processes_compile_once(cache):
    """Two processes asking for the same kernel at once: the file lock makes one compile and the
    other load its object file."""
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(cache), CUTE_KERNELS_LOG_LEVEL="WARNING")
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, jit.source_fingerprint()], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    counts = [tuple(int(x) for x in o.split()[1::2]) for o, _ in outs]
    assert sorted(counts) == [(0, 1), (1, 0)], outs
    assert _valid(_entry(cache))


def _stem(d: Path) -> Path:
    return Path(str(_entry(d))[: -len(".o")])


def _messages(warned) -> list[str]:
    return [str(x.message) for x in warned]


@pytest.mark.parametrize("ext", ["o", "sha256"])
def test_fifo_in_an_entry_does_not_block(entry, ext):
    """A FIFO in place of the object or checksum file: not opened for a blocking read (the old cache
    blocked there forever, holding the entry's lock); one warning, recompiled, replaced by a file."""
    cache = entry
    path = Path(f"{_stem(cache)}.{ext}")
    path.unlink()
    os.mkfifo(path)
    done, blocked = threading.Event(), []

    def release():  # a reader still blocked after 60 s is the bug: give it EOF, so the test fails, not hangs
        if done.wait(60):
            return
        blocked.append(path)
        while not done.is_set():
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                time.sleep(0.1)

    threading.Thread(target=release, daemon=True).start()
    try:
        fn, compiles, warned = _get_counting_warnings()
    finally:
        done.set()
    assert not blocked, "a FIFO in the cache blocked the process"
    assert fn is not None and compiles == 1
    assert len(warned) == 1 and "not a regular file" in _messages(warned)[0], _messages(warned)
    assert stat.S_ISREG(os.lstat(path).st_mode) and _valid(_entry(cache))


def test_symlink_in_an_entry_is_not_followed(entry, tmp_path):
    """A link in place of the object file (even to a valid copy) is not read: recompiled, replaced."""
    cache = entry
    obj = _entry(cache)
    copy = tmp_path / "elsewhere.o"
    copy.write_bytes(obj.read_bytes())
    obj.unlink()
    obj.symlink_to(copy)
    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 1
    assert len(warned) == 1 and "symbolic link" in _messages(warned)[0], _messages(warned)
    assert not obj.is_symlink() and _valid(obj)


def test_hit_takes_no_lock(entry, monkeypatch):
    """A hit needs no write access: with the entry's lock impossible to take (a read-only cache), a
    valid entry still loads, without a compile or a warning."""

    def no_lock(self):
        raise PermissionError(errno.EACCES, "Permission denied", str(self.path))

    monkeypatch.setattr(jit._FileLock, "__enter__", no_lock)
    hits = jit.stats["disk_hits"]
    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 0 and not warned and jit.stats["disk_hits"] == hits + 1


_READER = """
import json, os, sys, warnings
if sys.argv[1] == "as-another-user":  # root's cache read by uid 12345 (the files stay root's)
    os.geteuid = lambda: 12345
from cute_kernels.attention.merge import MergeConfig, merge_builder
from cute_kernels.common import jit
jit.source_fingerprint = lambda: sys.argv[2]  # the test's: the checkout may change meanwhile
get = lambda cfg: jit.get_compiled("merge_states", cfg, merge_builder(cfg))
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    assert get(MergeConfig("float32", "bfloat16", 64)) is not None  # in the shipped cache
    hit = dict(jit.stats)
    assert get(MergeConfig("float32", "float16", 64)) is not None  # not in it
print(json.dumps(dict(hit=hit, end=jit.stats, warned=[str(x.message) for x in w
                                                    if issubclass(x.category, jit.CompileCacheWarning)])))
"""


def test_read_only_cache_of_another_user_is_used(entry, tmp_path):
    """A cache filled on one machine and shipped read-only.  As root: root's files, read by a process
    that cannot write them (CAP_DAC_OVERRIDE dropped) and checks them as uid 12345 would; otherwise
    this user's own files made read-only.  A hit loads without compiling or warning; a miss compiles
    with one warning and writes nothing."""
    root = os.geteuid() == 0
    setpriv = shutil.which("setpriv")
    if root and setpriv is None:
        pytest.skip("root writes into read-only directories, and setpriv (to drop that) is missing")
    cache = entry
    ro = tmp_path / "shipped"
    shutil.copytree(cache, ro)
    names = sorted(p.name for p in ro.iterdir())
    for p in [*ro.iterdir(), ro]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(ro), CUTE_KERNELS_LOG_LEVEL="WARNING")
    cmd = [sys.executable, "-c", _READER, "as-another-user" if root else "as-self", jit.source_fingerprint()]
    if root:
        cmd = [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", *cmd]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    finally:
        ro.chmod(0o755)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.splitlines()[-1])
    assert (r["hit"]["compiles"], r["hit"]["disk_hits"]) == (0, 1), r
    assert (r["end"]["compiles"], r["end"]["disk_hits"]) == (1, 1), r
    assert len(r["warned"]) == 1 and "cannot write the compile cache" in r["warned"][0], r
    assert sorted(p.name for p in ro.iterdir()) == names


def _owned_by_someone_else(path: Path, monkeypatch) -> None:
    """Make ``path`` another user's: as root, chown it to uid 12345; otherwise this process pretends to
    run as another uid (so every file it owns looks foreign)."""
    if os.geteuid() == 0:
        os.chown(path, 12345, -1)
    else:
        uid = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: uid + 1)


@pytest.mark.parametrize("how", ["other-owner", "group-writable", "other-writable"])
def test_untrusted_cache_dir_is_not_used(entry, monkeypatch, how):
    """A directory another user owns or group / others may write: its (valid) entry is not loaded, one
    warning, compiled without the disk cache, nothing written."""
    cache = entry
    names = sorted(p.name for p in cache.iterdir())
    if how == "other-owner":
        _owned_by_someone_else(cache, monkeypatch)
    else:
        cache.chmod(0o770 if how == "group-writable" else 0o707)
    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 1
    why = "owned by uid" if how == "other-owner" else "writable by group or others"
    assert len(warned) == 1 and why in _messages(warned)[0], _messages(warned)
    assert "without the disk cache" in _messages(warned)[0]
    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 1 and not warned
    assert sorted(p.name for p in cache.iterdir()) == names


@pytest.mark.parametrize("ext", ["o", "sha256", "so"])
@pytest.mark.parametrize("how", ["other-owner", "group-writable", "other-writable"])
def test_untrusted_entry_is_recompiled(entry, how, ext):
    """An entry file another user owns or group / others may write: not loaded, one warning, recompiled
    and replaced by this user's files (the directory is trusted: this user may replace them)."""
    cache = entry
    path = Path(f"{_stem(cache)}.{ext}")
    if not path.exists():
        pytest.skip("no .so in the entry: no C compiler (cc) to link one")
    if how == "other-owner":
        if os.geteuid() != 0:
            pytest.skip("making one file another user's needs root (chown)")
        os.chown(path, 12345, -1)
    else:
        path.chmod(0o664 if how == "group-writable" else 0o646)
    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 1
    why = "owned by uid 12345" if how == "other-owner" else "writable by group or others"
    assert len(warned) == 1 and why in _messages(warned)[0] and "recompiling" in _messages(warned)[0], _messages(warned)
    st = path.stat()
    assert st.st_uid == os.geteuid() and not st.st_mode & 0o022 and _valid(_entry(cache))
    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 0 and not warned


def test_new_cache_is_private_whatever_the_umask(tmp_path, monkeypatch):
    """A new cache directory is mode 0700 and its files are not group-writable, also under umask 002
    (else this user's own entries would be refused as untrusted)."""
    d = tmp_path / "new" / "cache"
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(d))
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "1")
    old = os.umask(0o002)
    try:
        fn, compiles, warned = _get_counting_warnings()
    finally:
        os.umask(old)
    try:
        assert fn is not None and compiles == 1 and not warned
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        assert [f.name for f in d.iterdir() if f.stat().st_mode & 0o022] == []
        fn, compiles, warned = _get_counting_warnings()
        assert fn is not None and compiles == 0 and not warned
    finally:
        _forget()


_NO_DSL = """
import sys, types
# the package without its __init__ (which imports every op, and with them the DSL)
pkg = types.ModuleType("cute_kernels")
pkg.__path__ = ["cute_kernels"]
sys.modules["cute_kernels"] = pkg
from cute_kernels.common import jit

jit.source_fingerprint = lambda: sys.argv[1]  # the test's: the checkout may change meanwhile


def refuse():
    raise AssertionError("a disk hit compiled")

fn = jit.get_compiled("probe", ("merge", 64), refuse)
print("cutlass" in sys.modules, type(fn).__module__, jit.stats["disk_hits"], jit.stats["compiles"])
from cute_kernels.attention.merge import MergeConfig, merge_builder  # the DSL after a .so load: compiles
cfg = MergeConfig("float32", "float16", 64)
assert jit.get_compiled("merge_states", cfg, merge_builder(cfg)) is not None
print("cutlass" in sys.modules, jit.stats["compiles"])
"""


def test_linked_entry_loads_without_the_dsl(cache):
    """An entry with its linked .so loads in a process that has not imported the DSL, through TVM-FFI
    alone, and leaves it unimported; the DSL imported afterwards still compiles."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc): entries are .o files only, loaded through the DSL")
    key = jit.full_key("probe", ("merge", 64))
    try:
        assert jit.get_compiled("probe", ("merge", 64), merge_builder(CFG)) is not None
    finally:
        jit._memory.pop(key, None)
    assert len(list(cache.glob("probe-*.so"))) == 1
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(cache), CUTE_KERNELS_LOG_LEVEL="WARNING")
    out = subprocess.run([sys.executable, "-c", _NO_DSL, jit.source_fingerprint()], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["False", "tvm_ffi.core", "1", "0", "True", "1"], out.stdout


def test_unloadable_linked_entry_falls_back_to_the_object_file(entry, monkeypatch):
    """A .so that cannot be loaded here (no single DSL runtime library found) is not an error: the .o
    loads through the DSL, no compile, no warning."""
    monkeypatch.setattr(jit, "_runtime_libraries", lambda: None)
    hits = jit.stats["disk_hits"]
    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 0 and not warned and jit.stats["disk_hits"] == hits + 1


def test_corrupt_linked_entry_recompiles(entry):
    cache = entry
    so = _stem(cache).with_suffix(".so")
    if not so.exists():
        pytest.skip("no .so in the entry: no C compiler (cc) to link one")
    with open(so, "r+b") as f:
        f.seek(4096)
        f.write(os.urandom(1024))
    fn, compiles, warned = _get_counting_warnings()
    assert fn is not None and compiles == 1
    assert len(warned) == 1 and f"{so} fails its checksum" in _messages(warned)[0], _messages(warned)
    assert _valid(_entry(cache))
