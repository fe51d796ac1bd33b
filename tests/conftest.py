import dataclasses
import enum
import fcntl
import hashlib
import os
import pickle
import shutil
import tempfile
import types

import pytest
import torch

# Every test gets its own compile cache directory unless one is given: tests must not depend on
# (or pollute) the user's cache.
os.environ.setdefault("CUTE_KERNELS_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "cute_kernels"))

HAS_CUDA = torch.cuda.is_available()


RUN_SLOW = os.environ.get("CUTE_KERNELS_SLOW_TESTS", "") not in ("", "0")
RUN_MATRIX = RUN_SLOW or os.environ.get("CUTE_KERNELS_MATRIX_TESTS", "") not in ("", "0")

# ---------------------------------------------------------------- the compile matrix: a quick tier
# Compiling one kernel configuration for sm_90a and reading its SASS takes 3-8 s on a 2-core machine,
# and the compile tests' cross-products (dtype x head dim x mask x mode x page size ...) are ~250 of
# them.  Each test below runs the cases named here in every test run: one or two per test, chosen so
# that every kernel family, feature and code path (dense / packed / paged, window, split / direct,
# TMA / cp.async, cluster, split-K kinds, variants) compiles at least once.  Its other cases carry the
# ``matrix`` marker and are skipped, with the reason printed, unless CUTE_KERNELS_MATRIX_TESTS=1 (CI
# sets it: the whole matrix runs there).  Keys: test file name :: test function; values: case ids.
QUICK_COMPILES = {
    "test_forward_compile.py::test_forward_compiles_without_spills": {"bfloat16-128-True", "float16-256-False"},
    "test_forward_compile.py::test_paged_compile_without_spills": {"ps64-varlen-window-128", "ps48-dense-64"},
    "test_backward_compile.py::test_backward_compiles_within_spill_budget": {"bfloat16-128-False", "float16-64-True", "bfloat16-256-True"},
    "test_backward_compile.py::test_gqa_backward_compiles_within_spill_budget": {"128"},
    "test_backward_compile.py::test_window_backward_compiles_within_spill_budget": {"128"},
    "test_backward_compile.py::test_softcap_backward_compiles_without_spills": {"direct-64"},
    "test_backward_compile.py::test_deterministic_backward_compiles_like_the_default": {"gqa-True"},
    "test_backward_compile.py::test_dk_carry_backward_compiles": {"direct-128-causal"},
    "test_backward_compile.py::test_prepost_compile": {"prepass-True-128", "convert-False-128"},
    "test_decode.py::test_compiles_for_sm90a": {"bfloat16-d128-r8-p0-causal-split", "float16-d64-r64-p0-causal-direct"},
    "test_decode.py::test_compiles_tma_path": {"bfloat16-d128-r8-p0-causal-split"},
    "test_merge.py::test_merge_kernel_compiles_for_sm90a": {"float32-bfloat16-128"},
    "test_variants_compile.py::test_forward_variants_compile_without_spills": {"D128-both", "D64-softcap"},
    "test_variants_compile.py::test_forward_variant_modes_compile": {"varlen-window-ps16-D64"},
    "test_variants_compile.py::test_decode_variants_compile_without_spills": {"D128-split-tma-both",
                                                                              "D128-split-paged-sink"},
    "test_gemm.py::test_compiles_for_sm90a": {"k-mn-2-False-True-bfloat16-256-(2, 1)",
                                              "mn-k-3-False-True-bfloat16-128-(1, 1)"},
    "test_gemm.py::test_splitk_cluster_variants_compile": {"128-2-True-True"},
    "test_gemm.py::test_splitk_fixup_compiles": {"128-2-True"},
    "test_gemm.py::test_splitk_persistent_compiles": {"128-2-True-(2, 1)"},
    "test_gemm.py::test_splitk_fixup_a_multicast_compiles": {"64-2-2"},
    "test_gemm.py::test_skinny_swap_compiles": {"16-4-fixup-mn-1"},
    "test_gemm_cpasync.py::test_compiles_for_sm90a": {"mnmn-a16-b4-r2-bfloat16-n128-c-direct"},
    "test_gemm_tiles256.py::test_tiles256_compiles_for_sm90a": {"128-(2, 1)-k-mn-2-False-True-bfloat16-n"},
    "test_gemm_tiles256.py::test_tiles256_epilogue_register_map": {"208-bfloat16-n"},
    "test_gemm_tiles256.py::test_tiles256_c_fragment_ownership": {"128"},
    # not compiles, as slow: the largest raster the bounds allow (66,048 tiles, ~11 s); two of the four
    # fresh-interpreter imports (~5 s each)
    "test_cli.py::test_sizes_at_the_bounds_run": {"argv0", "argv1", "argv2"},
    "test_import.py::test_gemm_stays_the_function": {"import cute_kernels.gemm.plan", "import cute_kernels.integrations.hf"},
}


def beyond_quick_tier(item) -> bool:
    """A case of a test :data:`QUICK_COMPILES` lists that is not in its quick tier."""
    quick = QUICK_COMPILES.get(f"{item.path.name}::{getattr(item, 'originalname', item.name)}")
    return quick is not None and hasattr(item, "callspec") and item.callspec.id not in quick


# ---------------------------------------------------------------- one compile per configuration and run
# A few configurations are compiled and inspected by more than one test (the CLI's compile report lists
# configurations the kernel families' compile tests check as well; two tests of a family may share one).
# ``tools.inspect.inspect_builder`` is wrapped so that a run compiles each of them once: the report is
# kept in a directory made for the run by the controlling pytest process and shared by its xdist
# workers (a file lock per configuration: a second request waits for the first compile, then reads
# it).  The key is the builder itself: its code, the code of the functions it closes over and the
# values it closes over, all of which must be plain (None, bool, int, float, str, tuples, lists, dicts,
# enums, torch dtypes, dataclass instances of such); a builder closing over anything else is compiled
# as before, and so is every call without the SASS (``sass=False``) or without nvdisasm (it raises).
# The key also holds the source fingerprint, arch and compile options of the disk cache's entries.  The
# library's module-level names a builder reads are taken to be the same in every test: a test that
# patched one before inspecting would be served the report compiled without the patch (none does).
_REPORTS_ENV = "CUTE_KERNELS_TEST_REPORTS"


class _NotPlain(Exception):
    pass


def _code_key(code: types.CodeType) -> str:
    consts = [_code_key(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    return repr((code.co_filename, code.co_firstlineno, code.co_qualname, code.co_code.hex(), consts,
                 code.co_names, code.co_freevars))


def _plain(v) -> str:
    """A description of ``v`` that two processes write alike exactly when the values are alike."""
    if v is None or isinstance(v, (bool, int, float, str, bytes, enum.Enum, torch.dtype)):
        return f"{type(v).__qualname__}:{v!r}"
    if isinstance(v, (tuple, list)):
        return f"{type(v).__name__}({', '.join(_plain(x) for x in v)})"
    if isinstance(v, dict):
        return f"dict({', '.join(sorted(f'{_plain(k)}: {_plain(x)}' for k, x in v.items()))})"
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        t = type(v)
        fields = ", ".join(f"{f.name}={_plain(getattr(v, f.name))}" for f in dataclasses.fields(v))
        return f"{t.__module__}.{t.__qualname__}({fields})"
    if isinstance(v, types.FunctionType):
        return _function_key(v)
    raise _NotPlain(type(v).__qualname__)


def _function_key(fn: types.FunctionType) -> str:
    try:
        cells = [_plain(c.cell_contents) for c in fn.__closure__ or ()]
    except ValueError:  # an empty cell
        raise _NotPlain("empty closure cell") from None
    return repr((fn.__module__, _code_key(fn.__code__), _plain(fn.__defaults__), _plain(fn.__kwdefaults__), cells))


def _share_compile_reports():
    from cute_kernels.common import jit
    from cute_kernels.common.arch import current_arch
    from cute_kernels.tools import inspect as ins

    compile_report = ins.inspect_builder

    def inspect_builder(builder, sass: bool = True):
        run_dir = os.environ.get(_REPORTS_ENV)
        if not (sass and run_dir and isinstance(builder, types.FunctionType)) or ins.nvdisasm_path() is None:
            return compile_report(builder, sass)
        try:
            key = _function_key(builder)
        except _NotPlain:
            return compile_report(builder, sass)
        digest = hashlib.sha256(repr((key, jit.source_fingerprint(), current_arch().key(), jit.compile_options()))
                                .encode()).hexdigest()[:32]
        path = os.path.join(run_dir, digest)
        with open(path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(path + ".pkl", "rb") as f:
                    return pickle.load(f)
            except FileNotFoundError:
                pass
            rep = compile_report(builder, sass)
            with open(f"{path}.{os.getpid()}.tmp", "wb") as f:
                pickle.dump(rep, f)
            os.replace(f"{path}.{os.getpid()}.tmp", path + ".pkl")
            return rep

    ins.inspect_builder = inspect_builder


def pytest_configure(config):
    if not hasattr(config, "workerinput") and _REPORTS_ENV not in os.environ:  # the controlling process
        config._cute_kernels_reports = tempfile.mkdtemp(prefix="cute-kernels-test-reports-")
        os.environ[_REPORTS_ENV] = config._cute_kernels_reports  # the xdist workers start after this
    _share_compile_reports()


def pytest_unconfigure(config):
    run_dir = getattr(config, "_cute_kernels_reports", None)
    if run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)
        os.environ.pop(_REPORTS_ENV, None)


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_slow = pytest.mark.skip(reason="slow (exhaustive compile sweep): set CUTE_KERNELS_SLOW_TESTS=1")
    skip_matrix = pytest.mark.skip(reason="beyond the quick tier (the compile matrix: tests/conftest.py QUICK_COMPILES, "
                                          "or slow): set CUTE_KERNELS_MATRIX_TESTS=1")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if beyond_quick_tier(item) or "matrix" in item.keywords:
            item.add_marker(pytest.mark.matrix)
            if not RUN_MATRIX:
                item.add_marker(skip_matrix)
        if "slow" in item.keywords and not RUN_SLOW:
            item.add_marker(skip_slow)




def precompile_for_module_gpu_tests(request, precompile) -> None:
    """For a module-scoped autouse fixture: when CUDA is here and the session collected GPU tests of the
    fixture's module, run ``precompile()`` (compile their configurations up front, in parallel
    processes, into the disk cache) and print its errors."""
    if not HAS_CUDA:
        return
    if not any("gpu" in item.keywords for item in request.session.items if item.module is request.module):
        return
    for e in precompile():
        print("precompile:", e)


def make_c(kind: str, m: int, n: int) -> torch.Tensor:
    """A fresh random (m, n) C operand: 'row' bf16, 'transposed' bf16 (column-major view), 'fp32'."""
    if kind == "row":
        return torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    if kind == "transposed":
        return torch.randn(n, m, device="cuda", dtype=torch.bfloat16).t()
    return torch.randn(m, n, device="cuda", dtype=torch.float32)


def gemm_operand(shape, major, dtype, batch=None):
    """A (rows, cols) GEMM operand stored row- or column-major, fresh random values."""
    rows, cols = shape
    full = (batch, rows, cols) if batch else (rows, cols)
    if major == "row":
        return torch.randn(full, device="cuda", dtype=dtype)
    t = torch.randn((*full[:-2], cols, rows), device="cuda", dtype=dtype)
    return t.transpose(-1, -2)


def gemm_ref(a, b, alpha=1.0, beta=0.0, c=None):
    """alpha * a @ b + beta * c in float64."""
    r = alpha * (a.double() @ b.double())
    if c is not None:
        r = r + beta * c.double()
    return r




def planned_configs(a, b, out=None, c=None, beta=0.0, out_dtype=None, choice=None) -> list:
    """The kernel configs the GEMM plan for these operands runs (planned on any device, nothing
    compiled: ``jit.dry_run``)."""
    from cute_kernels.common import jit
    from cute_kernels.gemm.plan import DEFAULT_CHOICE, make_plan

    with jit.dry_run():
        p = make_plan(a, b, out, c, beta, out_dtype, choice or DEFAULT_CHOICE, allow_cpu=True)
    return [cfg for _, cfg in p.kernels]


def capture_graph(fn):
    """Warm ``fn`` up on a side stream and capture one call of it in a CUDA graph (returned)."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    return g


# ---------------------------------------------------------------- GEMM tile-variant GPU checks
# The 256-row tile tests run the same checks through the real host path with forced
# tiles; the bodies live here once, each test file keeps its own parametrization.
VARIANT_SHAPES = [(1, 8, 8), (7, 8, 16), (127, 256, 64), (1000, 3000, 520), (4097, 136, 264), (131, 64, 8),
                  (2, 4096, 4096), (997, 1013, 136), (4099, 1024, 1000)]


def forced_tiles_gemm(tiles_kw: dict, expect):
    """``run(a, b, *, out, c, alpha, beta, out_dtype, tile_n, cluster)``: gemm through the planner with
    ``make_gemm_tiles(tile_n, cluster, ..., **tiles_kw)`` forced, split-K off; ``expect(cfg, tile_n)``
    checks the config that ran (TMA mainloop always)."""
    from cute_kernels.common.dtypes import TORCH_TO_NAME
    from cute_kernels.gemm import plan as P
    from cute_kernels.gemm.heuristics import make_gemm_tiles
    from cute_kernels.gemm.validate import major_of

    def run(a, b, *, out=None, c=None, alpha=1.0, beta=0.0, out_dtype=None, tile_n=128, cluster=(1, 1)):
        am = "k" if major_of(a, "a", "M", "K") == "row" else "mn"
        bm = "mn" if major_of(b, "b", "K", "N") == "row" else "k"
        d_dtype = out.dtype if out is not None else (out_dtype or a.dtype)
        t = make_gemm_tiles(tile_n, cluster, TORCH_TO_NAME[a.dtype], am, bm, TORCH_TO_NAME[d_dtype], **tiles_kw)
        choice = P.PlanChoice(tiles=t, splits=1)
        res = P.run(a, b, out, c, alpha, beta, out_dtype, choice=choice)
        torch.cuda.synchronize()
        cfg = P.plan(a, b, out, c, beta, out_dtype, choice).kernels[-1][1]
        assert cfg.mainloop == "tma", cfg
        expect(cfg, tile_n)
        return res

    return run


def tma_able(*ts) -> bool:
    from cute_kernels.gemm.validate import major_of, tma_ok

    return all(tma_ok(t, major_of(t, "x", "r", "c")) for t in ts)


def nan_out(*shape, dtype=torch.bfloat16):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)














def check_gemm_compile(case, **tiles_kw):
    """Compile one persistent-GEMM config for sm_90a (no GPU) and check what every config must have:
    HGMMA + TMA loads (+ TMA stores when ``tma_store``), no local memory, and the setmaxnreg split the
    kernel asks for.  ``case`` = (tile_n, cluster, a_major, b_major, rank, has_c, tma_store, d dtype,
    c_major); ``tiles_kw`` go to ``make_gemm_tiles``.  Returns (kernel resources, GemmSm90, SASS)."""
    from cute_kernels.gemm.heuristics import make_gemm_tiles
    from cute_kernels.gemm.kernel import GemmConfig, GemmSm90
    from cute_kernels.gemm.launch import fake_args
    from cute_kernels.tools import inspect as ins

    tile_n, cluster, am, bm, rank, has_c, tma, cd, cmaj = case
    ab = "float16" if cd == "float16" else "bfloat16"
    tiles = make_gemm_tiles(tile_n, cluster, ab, am, bm, cd, cmaj, **tiles_kw)
    cfg = GemmConfig(tiles=tiles, a_rank=rank, has_c=has_c, tma_store=tma)
    rep = ins.inspect_builder(lambda: fake_args(cfg, ab, cd, "bfloat16"))
    (k,) = rep.kernels
    assert k.instructions["HGMMA"] > 0 and k.instructions["UTMALDG"] > 0, rep.summary()
    assert k.spills == 0 and k.stack_frame == 0, rep.summary()
    if tma:
        assert k.instructions["UTMASTG"] > 0, rep.summary()
    kern = GemmSm90(cfg)
    assert f"USETMAXREG.DEALLOC.CTAPOOL {hex(kern.PRODUCER_REGS)}" in rep.sass
    assert f"USETMAXREG.TRY_ALLOC.CTAPOOL UP0, {hex(kern.CONSUMER_REGS)}" in rep.sass
    return k, kern, rep.sass


@pytest.fixture
def fake_gpu(monkeypatch):
    """A bench run's orchestration on the CPU: CUDA calls stubbed, fixed roofs, and a timer that runs the
    call and returns a fixed time per implementation name (``fn.name``; set them in the returned dict,
    10 us by default).  Kept here, not in a ``tests/tools/conftest.py``: a second module named
    ``conftest`` would replace this one in ``sys.modules`` and break ``from conftest import ...``."""
    from cute_kernels.tools.bench import ceiling, timing

    monkeypatch.setenv("CK_COMMIT", "test123")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(ceiling, "measure_roofs", lambda bench, quick=False: {"read_TBps": 4.0, "matmul_TFLOPs": 700.0})
    speeds = {}

    def bench(fn):
        fn()
        return speeds.get(getattr(fn, "name", None), 10.0)

    monkeypatch.setattr(timing, "make_bench", lambda quick: (bench, "stand-in timer"))
    return speeds


# ---------------------------------------------------------------- stubbed kernels (host-path tests)
class Stub:
    """A compiled kernel stand-in: records its arguments.  :meth:`fetch` is the stubbed compile-cache
    getter: one Stub per key (as the memory cache), ``Stub.made`` counts the fetches.

    Like the compiled function's TVM-FFI entry (``jit.direct``), it refuses a call whose tensors
    differ from its first call's in dtype, device or rank, or whose 16-byte-aligned data pointers
    are not any more, with a ValueError before recording anything: the fast paths leave those checks
    to it.  (Shared sizes are the real entry's too; tests/attention/test_host_path_gpu.py covers them.)"""

    made = 0
    cache: dict = {}

    def __init__(self, *key):
        self.key, self.calls, self.spec = key, [], None

    @staticmethod
    def _facts(args):
        return [(t.dtype, t.device, t.dim(), t.data_ptr() % 16 == 0) if isinstance(t, torch.Tensor) else None
                for t in args]

    def __call__(self, *args):
        facts = self._facts(args)
        if self.spec is None:
            self.spec = facts
        for i, (want, got) in enumerate(zip(self.spec, facts)):
            if want is not None and (got is None or got[:3] != want[:3] or (want[3] and not got[3])):
                raise ValueError(f"Mismatched argument #{i}: {got}, expected {want}")
        self.calls.append(args)

    @classmethod
    def fetch(cls, *key):
        cls.made += 1
        if key not in cls.cache:
            cls.cache[key] = cls(*key)
        return cls.cache[key]


@pytest.fixture
def stubbed(monkeypatch):
    """CPU tensors take the kernel paths of every op, kernels are :class:`Stub` s, caches start empty."""
    from cute_kernels.attention import decode as DE
    from cute_kernels.attention import forward as FW
    from cute_kernels.attention import forward_validate as FV
    from cute_kernels.attention import merge as ME
    from cute_kernels.attention import decode_plan as DP
    from cute_kernels.common.fastpath import BoundedCache, LauncherCache
    from cute_kernels.gemm import host as GH
    from cute_kernels.gemm import launch as GL
    from cute_kernels.gemm import plan as GP

    Stub.made, Stub.cache = 0, {}
    check = GP.check_operands
    monkeypatch.setattr(GP, "check_operands", lambda a, b, out, c, od, allow_cpu=False: check(a, b, out, c, od, True))
    monkeypatch.setattr(GL, "compiled", lambda *key, **kw: Stub.fetch("gemm", *key, kw.get("swapped", False)))
    monkeypatch.setattr(GP, "_plans", BoundedCache())
    monkeypatch.setattr(DP, "_PLANS", BoundedCache())
    monkeypatch.setattr(GH, "_launchers", LauncherCache())
    monkeypatch.setattr(DE, "_KERNEL_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(DE, "get_decode_kernel", lambda cfg: Stub.fetch("decode", cfg))
    monkeypatch.setattr(DE, "_launchers", LauncherCache())
    monkeypatch.setattr(DE, "_GROWN", BoundedCache(limit=64))
    monkeypatch.setattr(FV, "_check_devices", lambda named: None)
    monkeypatch.setattr(FW, "get_forward_kernel", lambda cfg: Stub.fetch("flash", cfg))
    monkeypatch.setattr(FW, "_launchers", LauncherCache())
    monkeypatch.setattr(ME, "_KERNEL_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(ME, "get_merge_kernel", lambda cfg: Stub.fetch("merge", cfg))
    monkeypatch.setattr(ME, "_launchers", BoundedCache())
    monkeypatch.delenv("CUTE_KERNELS_CHECKED", raising=False)
    yield
