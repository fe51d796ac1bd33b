"""One place that compiles a kernel for a configuration and caches it in memory and on disk
(``cute.compile`` takes seconds and caches nothing): :func:`get_compiled` loads the kernel another
process exported (~1 ms) or compiles and exports it; later calls are a dict hit.

Key = kernel name + configuration (hyperparameters, dtypes, the static shape facts it specializes on)
+ target arch facts; run-time sizes and scalars never enter it.  The file name also hashes the DSL and
TVM-FFI builds and every ``.py`` file of ``cute_kernels/`` and ``layouts/``.

A disk entry is the exported object file ``.o``, the shared library ``.so`` linked from it when a C
compiler (``cc``) is there, and a ``.sha256`` sidecar holding both checksums.  The ``.so`` loads with
TVM-FFI alone; the ``.o`` needs the DSL's in-process linker, so a process that only loads ``.so``
entries never imports the DSL (issue 31; profiles/NOTES-host.md).

A hit opens the entry read-only and takes no lock, so a read-only, pre-filled cache (built on one
machine, shipped to another) works.  A miss takes a per-entry ``flock`` (racing processes compile
once), looks again, compiles, and renames the files into place; an in-process lock serializes
compiles (``cute.compile`` is not thread-safe).

An entry is host code loaded into the process: whoever can write the cache can run code as this user
(the checksums catch corruption, not tampering).  The directory is created with mode 0700, and a
directory or file is used only if it is owned by this user or root and not writable by group or
others (as ssh and pip require); a file must also be a regular file (opened without following links
or blocking, so a FIFO cannot hang the process).  A directory that fails this, cannot be created or
cannot be written compiles without the disk cache; an entry that fails it or its checksum is
recompiled and overwritten; each warns once (:class:`CompileCacheWarning`).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import importlib.util
import logging
import numbers
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Hashable

import torch

from .arch import current_arch, set_dsl_arch_env

set_dsl_arch_env()

# The DSL (``cutlass``, about a second to import) and ``tvm_ffi`` are imported by the functions that
# compile, export or load a kernel, not here: ``import cute_kernels`` must not import the DSL (issue
# 31), and a process that loads only linked (.so) entries never does.

log = logging.getLogger("cute_kernels")
if not log.handlers:
    _h = logging.StreamHandler(sys.stderr)
    _h.setFormatter(logging.Formatter("[cute-kernels] %(message)s"))
    log.addHandler(_h)
    log.setLevel(os.environ.get("CUTE_KERNELS_LOG_LEVEL", "INFO").upper())
    log.propagate = False

EXPORT_NAME = "cute_kernels_entry"
#: the package and layouts/: every source file a kernel is built from (cute_kernels/common/jit.py -> up two)
_PKG_DIRS = [Path(__file__).resolve().parents[1], Path(__file__).resolve().parents[2] / "layouts"]

#: Builder: returns the ``@cute.jit`` callable and the (fake) arguments to compile it with.
Builder = Callable[[], tuple[Callable[..., Any], tuple]]


def lazy_builder(module: str, factory: str, *args) -> Builder:
    """``module.factory(*args)``'s builder, ``module`` (a kernel module: the DSL) imported when it runs: on a
    compile, never on a memory or disk hit (:func:`get_compiled`), so a warm process never imports the DSL."""
    return lambda: getattr(importlib.import_module(module), factory)(*args)()

_memory: dict[tuple, Any] = {}
_compile_lock = threading.Lock()
stats = {"memory_hits": 0, "disk_hits": 0, "compiles": 0, "compile_seconds": 0.0}


class CompileCacheWarning(UserWarning):
    """The disk cache could not be used as is (a corrupt entry, an unwritable directory)."""


_warned: set = set()


def _warn_once(key: Hashable, msg: str) -> None:
    """One warning per ``key`` (a file or directory) and process."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"cute-kernels: {msg}", CompileCacheWarning, stacklevel=4)


def cache_path() -> Path:
    """The disk cache's directory (not created)."""
    d = os.environ.get("CUTE_KERNELS_CACHE_DIR")
    if d:
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cute_kernels"


def cache_dir() -> Path:
    """The disk cache's directory, created if missing, mode 0700 (raises OSError where it cannot be)."""
    p = cache_path()
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    return p


def disk_cache_enabled() -> bool:
    return os.environ.get("CUTE_KERNELS_DISK_CACHE", "1") not in ("0", "false", "off")


def _trust_problem(st: os.stat_result) -> str | None:
    """Why a cache directory or file must not be used (whoever can write it can run code as this
    user), None if it may: owned by this user or root, not writable by group or others."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"owned by uid {st.st_uid} (neither this user, uid {os.geteuid()}, nor root)"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.filemode(st.st_mode)})"
    return None


def _usable_dir(warn: bool = True) -> Path | None:
    """The cache directory if the disk cache is enabled and the directory exists (or can be made) and
    may be trusted; else None, with one warning (``warn``) saying why."""
    if not disk_cache_enabled():
        return None
    why = None
    try:
        d = cache_dir()
        why = _trust_problem(os.stat(d))
        if why:
            why = (f"compile cache directory {d} is {why}: whoever can write it can run code as this "
                   "user; compiling without the disk cache (chown / chmod go-w it to use it)")
    except OSError as e:
        why = f"compile cache directory unusable ({e}); compiling without the disk cache"
    if why is None:
        return d
    if warn:
        _warn_once(("dir", str(cache_path())), why)
    return None


def _disk_cache_usable() -> bool:
    """Enabled, and the directory exists (or can be made), may be trusted and is writable."""
    d = _usable_dir(warn=False)
    return d is not None and os.access(d, os.W_OK)


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """Hash of the DSL/TVM-FFI builds and every source file kernels are built from."""
    import tvm_ffi

    h = hashlib.sha256()
    h.update(f"py{sys.version_info[0]}.{sys.version_info[1]};tvm_ffi={tvm_ffi.__version__}".encode())
    # the DSL's build without importing it: its __init__.py (it sets __version__)
    spec = importlib.util.find_spec("cutlass")
    h.update(Path(spec.origin).read_bytes() if spec is not None and spec.origin else b"no cutlass")
    for root in _PKG_DIRS:
        for src in sorted(root.rglob("*.py")):
            h.update(src.relative_to(root.parent).as_posix().encode())
            h.update(src.read_bytes())
    return h.hexdigest()[:16]


# The host fast paths' helpers (a launcher's TVM-FFI function, stream-shared buffers, allocation
# sizes) live in :mod:`.fastpath`; they are read as ``jit.direct`` etc. by the ops and benches.
from .fastpath import direct, fresh_or_scratch, size_args, stream_buffers, stream_query  # noqa: E402,F401


def full_key(name: str, config: Hashable) -> tuple:
    """The cache key: kernel, its configuration, and the target's facts."""
    return (name, config, current_arch().key())


def compile_options(*, tvm_ffi: bool = True, extra: str = "") -> str:
    opts = f"--gpu-arch {current_arch().name}"
    if tvm_ffi:
        opts += " --enable-tvm-ffi"
    if os.environ.get("CUTE_KERNELS_LINEINFO"):
        opts += " --generate-line-info"
    return (opts + " " + extra).strip()


def compile_now(builder: Builder, *, tvm_ffi: bool = True, extra_options: str = ""):
    """Compile without any cache (used by the cache itself and by :mod:`cute_kernels.tools.inspect`)."""
    import cutlass.cute as cute

    with _compile_lock, warnings.catch_warnings():
        # The kernels unroll their register loops in Python on purpose (``range_constexpr`` over a
        # fragment, up to a few hundred iterations): the DSL's advice to use a device loop instead
        # does not apply, and it would print once per loop per compile.
        warnings.filterwarnings("ignore", message="This static loop has")
        fn, args = builder()
        return cute.compile(fn, *args, options=compile_options(tvm_ffi=tvm_ffi, extra=extra_options))


class _FileLock:
    """``flock`` of ``path`` (created, mode 0600): needs write access, so only a miss takes it."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        # O_NONBLOCK: a FIFO planted as the lock file cannot block the open
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            os.close(self.fd)
            raise
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


class _Refused(Exception):
    """A cache file that must not be read (not a regular file, or not trusted)."""


def _read_cache_file(path: Path) -> bytes | None:
    """The bytes of a cache file, None if there is none.  Opened read-only, without following a
    symbolic link and without blocking (a FIFO would block the open and every read while this
    process holds the entry's lock); raises :class:`_Refused` unless it is a regular file that may
    be trusted (:func:`_trust_problem`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _Refused(f"cache file {path} is a symbolic link" if e.errno == errno.ELOOP
                       else f"cache file {path} cannot be read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Refused(f"cache file {path} is not a regular file")
        why = _trust_problem(st)
        if why:
            raise _Refused(f"cache file {path} is {why}")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _load_object(path: Path):
    """The kernel in an exported object file, through the DSL's in-process linker (imports the DSL)."""
    import cutlass.cute as cute

    mod = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
    return getattr(mod, EXPORT_NAME)


_RUNTIME_NAME = "libcute_dsl_runtime.so"


@functools.lru_cache(maxsize=1)
def _runtime_libraries() -> tuple[str, ...] | None:
    """The libraries a linked kernel (.so) names as needed (by soname, no path): the DSL's runtime
    and TVM-FFI's, found as the DSL finds them (``CUTE_DSL_LIBS``, else the one toolkit flavor's
    ``nvidia_cutlass_dsl/cu*/lib``) without importing it.  None where that is not exactly one
    library (several flavors: the DSL picks by the driver): load the .o through the DSL."""
    import tvm_ffi

    env = os.environ.get("CUTE_DSL_LIBS")
    if env:
        found = {p for p in env.split(os.pathsep) if os.path.basename(p) == _RUNTIME_NAME}
    else:
        spec = importlib.util.find_spec("nvidia_cutlass_dsl")
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
        found = {str(p) for r in roots for p in (*Path(r).glob(f"cu*/lib/{_RUNTIME_NAME}"),
                                                 *Path(r).glob(f"lib/{_RUNTIME_NAME}"))}
    if len(found) != 1:
        return None
    return (found.pop(), tvm_ffi.libinfo.find_libtvm_ffi())


_loaded_libs: list = []  # the runtime libraries, loaded once by path (a handle per library)


def _load_shared(path: Path):
    """The kernel in a linked shared library, through TVM-FFI alone (no DSL import).  Raises where it
    cannot be loaded here (no single runtime library found, a symbol left unresolved)."""
    import ctypes

    import tvm_ffi

    libs = _runtime_libraries()
    if libs is None:
        raise OSError(f"no single {_RUNTIME_NAME} found (CUTE_DSL_LIBS, nvidia_cutlass_dsl/cu*/lib)")
    if not _loaded_libs:  # loaded by path, they satisfy the .so's needed sonames
        _loaded_libs.extend(ctypes.CDLL(lib) for lib in libs)
    ctypes.CDLL(str(path))  # binds every symbol now (RTLD_NOW): one left unresolved fails here, not in a call
    return tvm_ffi.load_module(str(path))[EXPORT_NAME]


def _link_shared(obj: Path, out: Path) -> bool:
    """Link the exported object into a shared library a later process loads without the DSL
    (:func:`_load_shared`); False (the entry is then the .o alone) without a C compiler or where
    linking fails.  The runtime libraries are named by soname, not path, so the cache can move to
    another machine."""
    cc = shutil.which("cc")
    if cc is None:
        return False
    from cutlass.runtime import find_runtime_libraries

    try:
        r = subprocess.run([cc, "-shared", "-o", str(out), str(obj), *find_runtime_libraries(enable_tvm_ffi=True)],
                           capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        log.debug("linking %s failed: %s", out, e)
        return False
    if r.returncode:
        log.debug("linking %s failed: %s", out, r.stderr.strip())
    return r.returncode == 0


#: Per thread, set by :func:`dry_run`: get_compiled records ``(name, config)`` there and compiles nothing.
_dry = threading.local()


class dry_run:
    """Context manager: every :func:`get_compiled` inside (on this thread) records ``(name, config)`` in
    ``.seen`` and returns None, so ``explain`` can run the real planning code without compiling."""

    def __enter__(self):
        self.prev, self.seen = getattr(_dry, "seen", None), []
        _dry.seen = self.seen
        return self

    def __exit__(self, *exc):
        _dry.seen = self.prev


def get_compiled(name: str, config: Hashable, builder: Builder):
    """The compiled callable for ``(name, config)``: memory, then disk, then a fresh compile."""
    seen = getattr(_dry, "seen", None)
    if seen is not None:
        seen.append((name, config))
        return None
    key = full_key(name, config)
    fn = _memory.get(key)
    if fn is not None:
        stats["memory_hits"] += 1
        return fn
    d = _usable_dir()
    fn = _timed_compile(name, config, builder) if d is None else _from_disk(name, config, builder, key, d)
    _memory[key] = fn
    return fn


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _load_entry(stem: Path) -> tuple[Any, str | None]:
    """Without a lock (a hit needs no write access): ``(kernel, None)`` from a valid entry, ``(None,
    None)`` where there is none, ``(None, why)`` where it must not be used.  The .so first (no DSL
    import); one that does not load here falls back to the .o."""
    obj, so, sums = Path(f"{stem}.o"), Path(f"{stem}.so"), Path(f"{stem}.sha256")
    try:
        obj_bytes = _read_cache_file(obj)
        if obj_bytes is None:
            return None, None
        sums_bytes = _read_cache_file(sums)
        if sums_bytes is None:
            return None, f"cache file {obj} has no checksum file"
        want = {}  # file name -> checksum, from sha256sum-style lines ("<hex>  <name>")
        for line in sums_bytes.decode(errors="replace").splitlines():
            digest, _, fname = line.partition("  ")
            want[fname] = digest
        if want.get(obj.name) != _sha256(obj_bytes):
            return None, f"cache file {obj} fails its checksum"
        if so.name in want:
            so_bytes = _read_cache_file(so)
            if so_bytes is None or want[so.name] != _sha256(so_bytes):
                return None, f"cache file {so} fails its checksum"
            try:
                return _load_shared(so), None
            except Exception as e:  # noqa: BLE001 - not loadable here: the .o below
                log.debug("cannot load %s (%s); loading %s", so, e, obj)
    except _Refused as e:
        return None, str(e)
    try:
        return _load_object(obj), None
    except Exception as e:  # noqa: BLE001 - an unloadable file: rebuild it
        return None, f"cache file {obj} failed to load ({e})"


def _from_disk(name: str, config: Hashable, builder: Builder, key: tuple, d: Path):
    """Load the entry without a lock; else, under its file lock, look again (another process may have
    just written it), compile and write it.  Without the lock (a read-only cache) compile only."""
    digest = hashlib.sha256(repr((key, source_fingerprint())).encode()).hexdigest()[:32]
    stem = d / f"{name}-{digest}"
    fn, why = _load_entry(stem)
    if fn is not None:
        return _disk_hit(fn, name, config, stem)
    try:
        lock = _FileLock(Path(f"{stem}.lock")).__enter__()
    except OSError as e:  # a read-only cache: this process compiles without it
        if why:
            _warn_once(("entry", str(stem)), f"{why}; compiling without the disk cache")
        _warn_once(("dir", str(d)), f"cannot write the compile cache in {d} ({e}); compiling without the disk cache")
        return _timed_compile(name, config, builder)
    try:
        fn, why = _load_entry(stem)
        if fn is not None:
            return _disk_hit(fn, name, config, stem)
        if why:  # seen under the lock, so not a writer's half-renamed entry
            _warn_once(("entry", str(stem)), f"{why}; recompiling it")
        compiled = _timed_compile(name, config, builder)
        _store(compiled, stem, key)
        return compiled
    finally:
        lock.__exit__()


def _disk_hit(fn, name: str, config: Hashable, stem: Path):
    stats["disk_hits"] += 1
    log.debug("loaded %s %s from %s", name, config, stem)
    return fn


def _write_new(path: Path, data: bytes) -> None:
    """Create ``path`` (mode 0644, not through a link) holding ``data``."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _store(compiled, stem: Path, key: tuple) -> None:
    """Under the entry's lock: export ``compiled`` (.o, .so where it links, .sha256, .txt with the
    key) to temporary names, then rename them into place, the checksums last (a reader that sees new
    files with the old checksums takes the lock and looks again).  Best effort: a read-only directory
    or a full disk warns once; the compiled function still runs."""
    tmp = {ext: Path(f"{stem}.tmp{os.getpid()}.{ext}") for ext in ("o", "so", "sha256", "txt")}
    try:
        tmp["o"].unlink(missing_ok=True)
        compiled.export_to_c(str(tmp["o"]), function_name=EXPORT_NAME)
        os.chmod(tmp["o"], 0o644)  # not group-writable whatever the umask: _trust_problem would refuse it
        lines = [f"{_sha256(tmp['o'].read_bytes())}  {stem.name}.o"]
        tmp["so"].unlink(missing_ok=True)
        linked = _link_shared(tmp["o"], tmp["so"])
        if linked:
            os.chmod(tmp["so"], 0o644)
            lines.append(f"{_sha256(tmp['so'].read_bytes())}  {stem.name}.so")
        _write_new(tmp["sha256"], ("\n".join(lines) + "\n").encode())
        _write_new(tmp["txt"], (repr(key) + "\n").encode())
        os.replace(tmp["o"], f"{stem}.o")
        if linked:
            os.replace(tmp["so"], f"{stem}.so")
        else:
            Path(f"{stem}.so").unlink(missing_ok=True)
        os.replace(tmp["txt"], f"{stem}.txt")
        os.replace(tmp["sha256"], f"{stem}.sha256")
    except OSError as e:  # read-only directory, full disk: the compiled function still runs
        _warn_once(("dir", str(stem.parent)), f"cannot write the compile cache in {stem.parent} ({e}); "
                   "compiling without the disk cache")
        for t in tmp.values():
            try:
                t.unlink(missing_ok=True)
            except OSError:
                pass


def _timed_compile(name: str, config: Hashable, builder: Builder):
    t0 = time.perf_counter()
    compiled = compile_now(builder)
    dt = time.perf_counter() - t0
    stats["compiles"] += 1
    stats["compile_seconds"] += dt
    log.info("compiled %s %s for %s in %.2f s", name, _short(config), current_arch().name, dt)
    return compiled


def _short(config: Hashable) -> str:
    s = repr(config)
    return s if len(s) < 160 else s[:157] + "..."


# ---- warm-up registry: kernels register how to compile one of their configs ----------------------
_warmers: dict[str, Callable[[Any], Any]] = {}
#: other names a warmup answers to: the CLI's ``warmup decode``
_WARMUP_ALIASES = {"decode": "decode_attn"}


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


#: What the value of each key of a warmup's dict spec must be, checked at face value before the op's
#: warmup runs: it reads them as a call would (``bool('no')`` is True: the causal kernel; ``int(64.9)``
#: is 64), so a str for a flag or a float for a size would compile some other kernel.  Unknown and
#: missing keys, and the values' ranges, are the op's to check.
_WARMUP_VALUE_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "int": ("an int", _is_int),
    "int|None": ("an int or None", lambda v: v is None or _is_int(v)),
    "bool": ("a bool", lambda v: isinstance(v, bool)),
    "str": ("a str", lambda v: isinstance(v, str)),
    "dtype": ("a torch.dtype", lambda v: isinstance(v, torch.dtype)),
    "dtype|None": ("a torch.dtype or None", lambda v: v is None or isinstance(v, torch.dtype)),
    "dtype|str": ("a torch.dtype or its name", lambda v: isinstance(v, (torch.dtype, str))),
}
_WARMUP_SPEC_KEYS: dict[str, dict[str, str]] = {
    "gemm": dict(m="int", n="int", k="int", batch="int|None", dtype="dtype", a_major="str", b_major="str",
                 out_dtype="dtype|None", with_c="bool"),
    "flash_attn": dict(dtype="dtype|str", head_dim="int", causal="bool", varlen="bool", window="bool",
                       page_size="int"),
    "flash_attn_backward": dict(dtype="dtype|str", head_dim="int", causal="bool", dlse="bool", window="bool",
                                gqa="bool"),
}


def register_warmup(name: str, fn: Callable[[Any], Any]) -> None:
    _warmers[name] = fn


def _check_warmup_spec(name: str, spec) -> None:
    """TypeError naming the key whose value is not of its kind (:data:`_WARMUP_SPEC_KEYS`)."""
    kinds = _WARMUP_SPEC_KEYS.get(name)
    if kinds is None or not isinstance(spec, dict):
        return
    for key, value in spec.items():
        kind = kinds.get(key)
        if kind is None:
            continue
        what, ok = _WARMUP_VALUE_KINDS[kind]
        if not ok(value):
            raise TypeError(f"warmup {name}: {key} must be {what}, got {type(value).__name__} {value!r}")


def warmup(configs) -> int:
    """Precompile ``[(kernel_name, spec), ...]`` (also without a GPU, for the disk cache); returns how
    many were handled.  ``("gemm", dict(m=..., n=..., k=..., dtype=...))`` takes
    :func:`cute_kernels.gemm.warmup_gemm`'s arguments, ``("flash_attn", dict(...))``
    :func:`cute_kernels.attention.forward.warmup_flash_attn`'s, ``decode_attn`` (or ``decode``) /
    ``merge_states`` their configs.  The names and value kinds of all entries are checked before any
    compiles."""
    todo = []
    for entry in configs:
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
            raise ValueError(f"warmup: each entry must be a (kernel_name, spec) pair, got {entry!r}")
        name, cfg = entry
        name = _WARMUP_ALIASES.get(name, name)
        if name not in _warmers:
            raise ValueError(f"warmup: unknown kernel {entry[0]!r}; known: {sorted([*_warmers, *_WARMUP_ALIASES])}")
        _check_warmup_spec(name, cfg)
        todo.append((name, cfg))
    for name, cfg in todo:
        _warmers[name](cfg)
    return len(todo)


def precompile_in_processes(worker: Callable[[Any], str | None], jobs: list, processes: int | None = None) -> list[str]:
    """Run ``worker(job)`` (module-level, compiling through :func:`get_compiled`, returning None / "" or
    an error string) for each job in spawned processes (``cute.compile`` is not thread-safe), so later
    calls load the kernels from the disk cache; returns the error strings.  One process, or no disk
    cache to share (disabled or unwritable): serially, here.  ``processes`` defaults to
    min(jobs, cores - 1, 16)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    if not jobs:
        return []
    n = processes or max(1, min(len(jobs), (os.cpu_count() or 2) - 1, 16))
    if n == 1 or len(jobs) == 1 or not _disk_cache_usable():
        results = list(map(worker, jobs))
    else:
        with cf.ProcessPoolExecutor(n, mp_context=mp.get_context("spawn")) as ex:
            results = list(ex.map(worker, jobs))
    return [r for r in results if r]


def _compile_reporting(get: Callable[[Any], Any], cfg) -> str:
    """``get(cfg)`` (compile or load one config); its exception as a line instead of raised."""
    try:
        get(cfg)
        return ""
    except Exception as e:  # reported, and raised again where the config is used
        return f"{cfg}: {type(e).__name__}: {e}"


def precompile_configs(get: Callable[[Any], Any], configs, processes: int | None = None) -> list[str]:
    """Compile ``configs`` with ``get`` (a module-level getter such as ``get_decode_kernel``) in spawned
    processes, into the disk cache; returns one error line per config that failed."""
    return precompile_in_processes(functools.partial(_compile_reporting, get), list(dict.fromkeys(configs)),
                                   processes)
