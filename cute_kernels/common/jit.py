"""One place that compiles a kernel for a configuration and caches it in memory and on disk
(``cute.compile`` takes seconds and caches nothing): :func:`get_compiled` loads the object file another
process exported (~1 ms) or compiles and exports it; later calls are a dict hit.

Key = kernel name + configuration (hyperparameters, dtypes, the static shape facts it specializes on)
+ target arch facts; run-time sizes and scalars never enter it.  The file name also hashes the DSL and
TVM-FFI versions and every ``.py`` file of ``cute_kernels/`` and ``layouts/``.  A per-key ``flock``
makes racing processes compile once; files are renamed into place; an in-process lock serializes
compiles (``cute.compile`` is not thread-safe).  Each object file has a ``.sha256`` sidecar written
with it; a file whose checksum does not match (or has none) is recompiled and overwritten, and a cache
directory that cannot be created or written falls back to compiling without the disk cache; each
warns once (:class:`CompileCacheWarning`).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Hashable

from .arch import current_arch, set_dsl_arch_env

set_dsl_arch_env()

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import tvm_ffi  # noqa: E402  (here, not at the first kernel call: loading a cached kernel needs it, ~50 ms)

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
    """The disk cache's directory, created if missing (raises OSError where it cannot be)."""
    p = cache_path()
    p.mkdir(parents=True, exist_ok=True)
    return p


def disk_cache_enabled() -> bool:
    return os.environ.get("CUTE_KERNELS_DISK_CACHE", "1") not in ("0", "false", "off")


def _disk_cache_usable() -> bool:
    """Enabled, and the directory exists (or can be made) and is writable."""
    if not disk_cache_enabled():
        return False
    try:
        return os.access(cache_dir(), os.W_OK)
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """Hash of the DSL/TVM-FFI versions and every source file kernels are built from."""
    h = hashlib.sha256()
    h.update(f"py{sys.version_info[0]}.{sys.version_info[1]}".encode())
    h.update(f"cutlass-dsl={cutlass.__version__};tvm_ffi={tvm_ffi.__version__}".encode())
    for root in _PKG_DIRS:
        for src in sorted(root.rglob("*.py")):
            h.update(src.relative_to(root.parent).as_posix().encode())
            h.update(src.read_bytes())
    return h.hexdigest()[:16]


# What the TVM-FFI entry of every compiled kernel checks of each tensor argument against the fake
# tensors it was compiled with, raising ValueError / TypeError before any launch: rank, dtype (an int
# parameter takes signed or unsigned of its width), device type, one device index for all tensors,
# the assumed data-pointer alignment, static sizes and sizes shared by several tensors (one symbol),
# static strides and stride divisibility -- strides of size-1 dims excepted.  A host fast path keys
# its launchers on the rest (the plan's inputs, strides, anything the kernel assumes but cannot
# check) and counts a launch only once the call returned.


def direct(fn):
    """The cheapest callable equivalent to ``fn``, a function :func:`get_compiled` returned: a kernel
    compiled in this process is a DSL object whose Python ``__call__`` adapts keyword arguments before
    calling the TVM-FFI function underneath; a kernel loaded from the disk cache is that TVM-FFI
    function already.  Host fast paths call the result with every argument positionally (as they
    call a loaded kernel) and keep ``fn`` referenced too (it owns the loaded CUDA library).

    Fast-path keys rely on what that TVM-FFI function checks of its arguments itself, before it
    launches anything (the comment above): a launcher's call it refuses raises, launches nothing,
    and the op then takes its checked path, which names the argument."""
    get = getattr(fn, "__tvm_ffi_object__", None)
    exe = getattr(fn, "execution_args", None)
    if get is None or exe is None or getattr(exe, "has_pointer_address_arg_specs", True):
        return fn
    raw = get()
    return fn if raw is None else raw


def stream_query():
    """``(capturing, current_stream)``: ``capturing()`` is whether torch's current CUDA stream is being
    captured into a graph, ``current_stream(device_index)`` a hashable token of the current stream of
    a device.  Torch's C entry points when it has them (tenths of a microsecond; ``torch.cuda``'s
    Python functions take microseconds), else those functions (a CPU-only build: never called)."""
    import torch

    C = torch._C
    if hasattr(C, "_cuda_isCurrentStreamCapturing") and hasattr(C, "_cuda_getCurrentStream"):
        return C._cuda_isCurrentStreamCapturing, C._cuda_getCurrentStream
    return (torch.cuda.is_current_stream_capturing,
            lambda index: torch.cuda.current_stream(index).cuda_stream)


_capturing, _current_stream = stream_query()


def stream_buffers(cache: dict, device, make: Callable[[], Any]):
    """Buffers that launches on one stream may share (they run in order): ``make()`` once per (device,
    stream), kept in ``cache``; while a CUDA graph is being captured a fresh ``make()`` every call (the
    graph keeps it, so graphs replayed side by side share none).  A non-CUDA device (the CPU tests'
    stub kernels) has no streams: one per device."""
    if device.type != "cuda":
        key = (device, None)
    elif _capturing():
        return make()
    else:
        key = (device, _current_stream(device.index))
    buf = cache.get(key)
    if buf is None:
        buf = cache[key] = make()
    return buf


def size_args(shape) -> tuple:
    """``shape`` as ``torch.empty``'s positional sizes: ``torch.empty(*size_args(s), ...)`` parses a few
    hundred nanoseconds faster than ``torch.empty(s, ...)`` (a tuple, slower still a ``torch.Size``),
    which host fast paths pay on every allocation; ``((),)`` for a 0-d shape."""
    return tuple(int(n) for n in shape) or ((),)


def fresh_or_scratch(empty: Callable, shape, dtype, device) -> Callable[[bool], Any]:
    """``get(fresh)``: ``empty(shape, dtype=dtype, device=device)`` when ``fresh``, else one scratch
    tensor made by the first such call and returned to every later one -- for an output a kernel must
    write but no caller reads (a launcher's LSE when the call did not ask for it): calls on any stream,
    and CUDA graphs, may share it."""
    scratch, size = [], size_args(shape)

    def get(fresh: bool):
        if fresh:
            return empty(*size, dtype=dtype, device=device)
        if not scratch:
            scratch.append(empty(*size, dtype=dtype, device=device))
        return scratch[0]
    return get


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
    fn, args = builder()
    with _compile_lock:
        return cute.compile(fn, *args, options=compile_options(tvm_ffi=tvm_ffi, extra=extra_options))


class _FileLock:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            os.close(self.fd)
            raise
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _load_object(path: Path):
    mod = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
    return getattr(mod, EXPORT_NAME)


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
    if not disk_cache_enabled():
        fn = _memory[key] = _timed_compile(name, config, builder)
        return fn
    digest = hashlib.sha256(repr((key, source_fingerprint())).encode()).hexdigest()[:32]
    try:
        d = cache_dir()
        lock = _FileLock(d / f"{name}-{digest}.lock").__enter__()
    except OSError as e:  # not creatable / not writable: no disk cache for this process's compiles
        _warn_once(("dir", str(cache_path())),
                   f"compile cache directory unusable ({e}); compiling without the disk cache")
        fn = _memory[key] = _timed_compile(name, config, builder)
        return fn
    try:
        fn = _load_or_compile(name, config, builder, key, d / f"{name}-{digest}")
    finally:
        lock.__exit__()
    _memory[key] = fn
    return fn


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load_or_compile(name: str, config: Hashable, builder: Builder, key: tuple, stem: Path):
    """Under the entry's file lock: load ``stem.o`` if its checksum matches ``stem.sha256``, else
    compile and (best effort) write both."""
    obj, sums = Path(f"{stem}.o"), Path(f"{stem}.sha256")
    if obj.exists():
        try:
            ok = sums.exists() and sums.read_text().strip() == _sha256(obj)
        except OSError:
            ok = False
        if not ok:
            _warn_once(("entry", str(obj)), f"cache file {obj} fails its checksum; recompiling it")
        else:
            try:
                fn = _load_object(obj)
                stats["disk_hits"] += 1
                log.debug("loaded %s %s from %s", name, config, obj)
                return fn
            except Exception as e:  # noqa: BLE001 - an unloadable file: rebuild it
                _warn_once(("entry", str(obj)), f"cache file {obj} failed to load ({e}); recompiling it")
    compiled = _timed_compile(name, config, builder)
    tmp, tmp_sums = Path(f"{stem}.tmp{os.getpid()}.o"), Path(f"{stem}.tmp{os.getpid()}.sha256")
    try:
        compiled.export_to_c(str(tmp), function_name=EXPORT_NAME)
        tmp_sums.write_text(_sha256(tmp) + "\n")
        os.replace(tmp, obj)
        os.replace(tmp_sums, sums)
        Path(f"{stem}.txt").write_text(repr(key) + "\n")
    except OSError as e:  # read-only directory, full disk: the compiled function still runs
        _warn_once(("dir", str(obj.parent)), f"cannot write the compile cache in {obj.parent} ({e}); "
                   "compiling without the disk cache")
        for t in (tmp, tmp_sums):
            try:
                t.unlink(missing_ok=True)
            except OSError:
                pass
    return compiled


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


def register_warmup(name: str, fn: Callable[[Any], Any]) -> None:
    _warmers[name] = fn


def warmup(configs) -> int:
    """Precompile ``[(kernel_name, spec), ...]`` (also without a GPU, for the disk cache); returns how
    many were handled.  ``("gemm", dict(m=..., n=..., k=..., dtype=...))`` takes
    :func:`cute_kernels.gemm.warmup_gemm`'s arguments, ``decode_attn`` / ``merge_states`` their configs."""
    n = 0
    for entry in configs:
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
            raise ValueError(f"warmup: each entry must be a (kernel_name, spec) pair, got {entry!r}")
        name, cfg = entry
        if name not in _warmers:
            raise ValueError(f"warmup: unknown kernel {name!r}; known: {sorted(_warmers)}")
        _warmers[name](cfg)
        n += 1
    return n


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
