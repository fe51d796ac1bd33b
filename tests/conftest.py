import os

import pytest
import torch

# Every test gets its own compile cache directory unless one is given: tests must not depend on
# (or pollute) the user's cache.
os.environ.setdefault("CUTE_KERNELS_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "cute_kernels"))

HAS_CUDA = torch.cuda.is_available()


RUN_SLOW = os.environ.get("CUTE_KERNELS_SLOW_TESTS", "") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_slow = pytest.mark.skip(reason="slow (exhaustive compile sweep): set CUTE_KERNELS_SLOW_TESTS=1")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not RUN_SLOW:
            item.add_marker(skip_slow)




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
