"""GEMM tests.  CPU: validation errors and sm_90a compiles with resource checks.  GPU: numerics."""

import itertools
import math
import re

import pytest
import torch

from conftest import capture_graph, make_c, planned_configs
from conftest import gemm_operand as _operand
from _check import check_gemm, gemm_reference

import cute_kernels
from cute_kernels.common import jit
from cute_kernels.gemm import heuristics as H
from cute_kernels.gemm import launch, tuned
from cute_kernels.gemm import plan as P
from cute_kernels.gemm.host import explain
from cute_kernels.gemm.kernel import GemmConfig
from cute_kernels.gemm.validate import major_of
from layouts import tiles as T


# ------------------------------------------------------------------------------------------- CPU
def test_cpu_tensors_rejected():
    a = torch.randn(64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        cute_kernels.gemm(a, a)


@pytest.mark.parametrize(
    "a,b,exc,match",
    [
        (torch.randn(8, 8), torch.randn(8, 8), TypeError, "float16 or bfloat16"),
        (torch.randn(8, 8, dtype=torch.half), torch.randn(8, 8, dtype=torch.bfloat16), TypeError, "same dtype"),
        (torch.randn(8, dtype=torch.half), torch.randn(8, 8, dtype=torch.half), ValueError, "2-D"),
    ],
)
def test_bad_inputs(a, b, exc, match):
    with pytest.raises(exc, match=match):
        cute_kernels.gemm(a, b)


def test_tma_store_needs_a_16_byte_row_extent():
    """A TMA store writes up to the next 16-byte boundary of each row: only row extents that are
    16-byte multiples may use it (loads clip per element and keep the stride-only rule)."""
    from cute_kernels.gemm.validate import tma_ok

    big = torch.empty(64, 392, dtype=torch.bfloat16, device="meta")
    assert tma_ok(big[:, :383], "row") and not tma_ok(big[:, :383], "row", store=True)
    assert tma_ok(big[:, :384], "row", store=True)
    col = torch.empty(392, 64, dtype=torch.float32, device="meta").t()[:, :131]  # (64, 131) column-major, M = 64
    assert tma_ok(col, "col", store=True)
    assert not tma_ok(torch.empty(392, 64, dtype=torch.float32, device="meta").t()[:6], "col", store=True)


def test_major_detection():
    x = torch.empty(64, 32)
    assert major_of(x, "a", "M", "K") == "row"
    assert major_of(x.t(), "a", "M", "K") == "col"
    with pytest.raises(ValueError, match="contiguous"):
        major_of(torch.empty(64, 64)[::2, ::2], "a", "M", "K")


def _kernel_like(a, b, alpha=1.0, beta=0.0, c=None, out_dtype=torch.bfloat16):
    """What a correct kernel writes: fp32 accumulation, alpha / beta * C in fp32, one rounding to the
    output dtype (CPU)."""
    acc = alpha * (a.float() @ b.float())
    if c is not None:
        acc = acc + beta * c.float()
    return acc.to(out_dtype)


def test_elementwise_check_catches_what_the_norm_check_missed():
    """The GEMM tests' elementwise check (tests/_check.py) on the issue's example, 4097 x 136 x 264: the
    norm-wise relative error passed a zeroed M-tail row (0.0157 < 2e-2); the elementwise check fails on
    it, on a stale last row, on a zeroed N-tail column, on a lost K term, on one NaN, and passes on what a
    correct kernel writes (bf16, fp16 and fp32 outputs, with and without alpha / beta * C)."""
    from _check import tail_regions

    g = torch.Generator().manual_seed(0)
    m, n, k = 4097, 136, 264
    a = torch.randn(m, k, generator=g).bfloat16()
    b = torch.randn(k, n, generator=g).bfloat16()
    good = _kernel_like(a, b)
    check_gemm(good, a, b)

    zeroed = good.clone()
    zeroed[-1] = 0
    ref = a.double() @ b.double()
    norm_err = ((zeroed.double() - ref).norm() / ref.norm()).item()
    assert norm_err < 2e-2  # what the old check let through (about sqrt(1/4097) = 0.0156)
    with pytest.raises(AssertionError, match=r"tails wrong \(last row"):
        check_gemm(zeroed, a, b)
    stale = good.clone()
    stale[-1] = good[-2]  # a tail row written from the wrong rows
    with pytest.raises(AssertionError, match=r"tails wrong \(last row"):
        check_gemm(stale, a, b)
    col = good.clone()
    col[:, -1] = 0
    with pytest.raises(AssertionError, match=r"tails wrong \(last column"):
        check_gemm(col, a, b)
    inner = good.clone()
    inner[2049] = 0  # a row inside, not a tail: still caught
    with pytest.raises(AssertionError, match=r"136 of .* elements"):
        check_gemm(inner, a, b)
    with pytest.raises(AssertionError):  # the K tail dropped (one k of 264)
        check_gemm(_kernel_like(a[:, :-1], b[:-1]), a, b)
    nan = good.clone()
    nan[1234, 56] = float("nan")
    with pytest.raises(AssertionError, match=r"1 of .*\(1234, 56\)"):
        check_gemm(nan, a, b)
    inf = good.clone()
    inf[0, 0] = float("inf")
    with pytest.raises(AssertionError):
        check_gemm(inf, a, b)
    names = [name for name, _ in tail_regions((m, n))]
    assert names[0].startswith("last row") and names[1].startswith("last column")
    assert any("partial 128-row" in x for x in names) and any("partial 128-column" in x for x in names)

    # correct results of the other epilogues pass
    c = torch.randn(m, n, generator=g)
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        ah, bh = (a, b) if dt != torch.float16 else (a.half(), b.half())
        check_gemm(_kernel_like(ah, bh, out_dtype=dt), ah, bh)
        check_gemm(_kernel_like(ah, bh, 0.75, -1.5, c, out_dtype=dt), ah, bh, 0.75, -1.5, c)
    batched_a = torch.randn(3, 300, 1000, generator=g).bfloat16()
    batched_b = torch.randn(3, 1000, 200, generator=g).bfloat16()
    check_gemm(_kernel_like(batched_a, batched_b, out_dtype=torch.float32), batched_a, batched_b)
    wrong = _kernel_like(batched_a, batched_b, out_dtype=torch.float32)
    wrong[2, -1, 5] += 0.5  # one element of the last batch's tail row, off by ~2% of sqrt(K)
    with pytest.raises(AssertionError, match=r"tails wrong \(last row"):
        check_gemm(wrong, batched_a, batched_b)


COMPILE_CASES = [
    # (a_major, b_major, rank, has_c, tma_store, out dtype, atom_n, cluster)
    ("k", "mn", 2, False, True, "bfloat16", 256, (2, 1)),
    ("k", "k", 3, True, True, "float32", 128, (1, 1)),
    ("mn", "mn", 2, False, True, "float16", 256, (1, 2)),
    ("mn", "k", 3, False, True, "bfloat16", 128, (1, 1)),
]


@pytest.mark.parametrize("case", COMPILE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_compiles_for_sm90a(case):
    """Each variant builds for sm_90a on the CPU: HGMMA + TMA present, no local-memory traffic."""
    from cute_kernels.tools import inspect as ins

    am, bm, rank, has_c, tma, cd, atom_n, cluster = case
    ab = "float16" if cd == "float16" else "bfloat16"
    tiles = T.GemmTiles(tile_mnk=(128, atom_n, 64), cluster_mn=cluster,
                        mma=T.MmaTile(ab_dtype=ab, atom_n=atom_n, a_major=am, b_major=bm),
                        ab_stages=4 if atom_n == 256 else 6, c_dtype=cd)
    cfg = GemmConfig(tiles=tiles, a_rank=rank, has_c=has_c, tma_store=tma)
    rep = ins.inspect_builder(lambda: launch.fake_args(cfg, ab, cd, "bfloat16"))
    (k,) = rep.kernels
    assert k.instructions["HGMMA"] > 0, rep.summary()
    assert k.instructions["UTMALDG"] > 0, rep.summary()
    assert k.spills == 0 and k.stack_frame == 0, rep.summary()


# ------------------------------------------------------------------------------------------- GPU

SHAPES = [(1, 8, 8), (7, 8, 16), (127, 256, 64), (1000, 3000, 520), (4097, 136, 264), (256, 1024, 1000),
          (131, 64, 8), (2, 4096, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("majors", list(itertools.product(["row", "col"], repeat=2)), ids=lambda m: "".join(x[0] for x in m))
def test_gemm_shapes_majors(mnk, majors):
    m, n, k = mnk
    a = _operand((m, k), majors[0], torch.bfloat16)
    b = _operand((k, n), majors[1], torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cute_kernels.gemm(a, b, out=out)
    check_gemm(out, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gemm_dtypes(in_dtype, out_dtype):
    a = torch.randn(509, 384, device="cuda", dtype=in_dtype)
    b = torch.randn(384, 520, device="cuda", dtype=in_dtype)
    out = cute_kernels.gemm(a, b, out_dtype=out_dtype)
    assert out.dtype == out_dtype
    check_gemm(out, a, b)
    poisoned = torch.full((509, 520), float("nan"), device="cuda", dtype=out_dtype)
    cute_kernels.gemm(a, b, out=poisoned)
    check_gemm(poisoned, a, b, what="gemm into a NaN-poisoned out")


@pytest.mark.gpu
@pytest.mark.parametrize("majors", [("row", "row"), ("col", "col")])
def test_gemm_batched(majors):
    L, m, n, k = 3, 296, 264, 200
    a = _operand((m, k), majors[0], torch.bfloat16, batch=L)
    b = _operand((k, n), majors[1], torch.bfloat16, batch=L)
    out = torch.full((L, m, n), float("nan"), device="cuda", dtype=torch.float32)
    cute_kernels.gemm(a, b, out=out)
    check_gemm(out, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("c_kind", ["row", "transposed", "fp32"])
def test_gemm_alpha_beta(c_kind):
    m, n, k = 333, 520, 136
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = make_c(c_kind, m, n)
    out = cute_kernels.gemm(a, b, alpha=0.5, beta=-1.25, c=c, out_dtype=torch.float32)
    check_gemm(out, a, b, 0.5, -1.25, c)
    poisoned = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    cute_kernels.gemm(a, b, alpha=0.5, beta=-1.25, c=c, out=poisoned)
    check_gemm(poisoned, a, b, 0.5, -1.25, c, what="gemm into a NaN-poisoned out")


@pytest.mark.gpu
def test_gemm_unaligned_out_uses_direct_store():
    """An out view whose row stride is not a 16-byte multiple takes the predicated-store epilogue."""
    m, n, k = 100, 250, 64
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()  # K-major: TMA-compatible
    big = torch.full((m, 251), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = big[:, :n]
    cute_kernels.gemm(a, b, out=out)
    check_gemm(out, a, b)
    assert torch.isnan(big[:, n]).all(), "wrote past the view"


@pytest.mark.gpu
@pytest.mark.parametrize("n,ld,out_dtype", [(383, 392, torch.bfloat16), (3, 16, torch.bfloat16), (1027, 1040, torch.bfloat16),
                                            (127, 132, torch.float32), (257, 272, torch.float16)], ids=str)
@pytest.mark.parametrize("m", [1, 319, 1580])
def test_gemm_column_slice_out_untouched_past_n(m, n, ld, out_dtype):
    """out = big[:, :n] with a 16-byte-multiple row stride but N not a 16-byte multiple: Hopper's TMA
    store clips at the next 16-byte boundary of a row, not at N, so these take the direct-store
    epilogue; big[:, n:] must stay NaN (the randomized sweep found zeros there before)."""
    k = 129
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    big = torch.full((m, ld), float("nan"), device="cuda", dtype=out_dtype)
    out = big[:, :n]
    cute_kernels.gemm(a, b, out=out, alpha=0.5)
    check_gemm(out, a, b, 0.5)
    assert torch.isnan(big[:, n:]).all(), f"wrote {int((~torch.isnan(big[:, n:])).sum())} elements past column {n}"


@pytest.mark.gpu
def test_gemm_no_recompile_and_graph_capture():
    """One compile per configuration, not per size: sizes the planner maps to the configuration already
    run (M = 768, 1000 after 512: 2x1 cluster) compile nothing; a size of another bucket (M = 640: an odd
    M-tile count, 1x1 cluster) compiles at most once (not at all on a warm disk cache), and a second size
    of that bucket (M = 896) nothing.  Then a CUDA graph captures a call and replays it on new inputs.
    (The compile counts on the CPU, cold cache, for a sweep: tests/common/test_compile_count.py.)"""
    from cute_kernels.common import jit

    def operand_a(m):
        return torch.randn(m, 256, device="cuda", dtype=torch.bfloat16)

    a = operand_a(512)
    b = torch.randn(256, 384, device="cuda", dtype=torch.bfloat16)
    out = torch.full((512, 384), float("nan"), device="cuda", dtype=torch.bfloat16)
    cute_kernels.gemm(a, b, out=out)
    check_gemm(out, a, b)
    (cfg,) = planned_configs(a, b, out)
    before = jit.stats["compiles"]
    for m in (512, 768, 1000):  # the same configuration: no compile
        am = operand_a(m)
        assert planned_configs(am, b) == [cfg], m
        check_gemm(cute_kernels.gemm(am, b), am, b, what=f"M={m}")
    assert jit.stats["compiles"] == before
    (other,) = planned_configs(operand_a(640), b)
    assert other != cfg and other.tiles.cluster_mn == (1, 1)
    for m in (640, 896, 640):  # another configuration: compiled (or loaded) once
        am = operand_a(m)
        assert planned_configs(am, b) == [other], m
        check_gemm(cute_kernels.gemm(am, b), am, b, what=f"M={m}")
    assert jit.stats["compiles"] <= before + 1
    g = capture_graph(lambda: cute_kernels.gemm(a, b, out=out))
    a.copy_(torch.randn_like(a))
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    check_gemm(out, a, b, what="graph replay")
    assert jit.stats["compiles"] <= before + 1


@pytest.mark.gpu
def test_gemm_torch_compile():
    a = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, 192, device="cuda", dtype=torch.bfloat16)
    f = torch.compile(lambda x, y: cute_kernels.gemm(x, y) * 2, fullgraph=True)
    check_gemm(f(a, b), a, b, alpha=2.0)


@pytest.mark.gpu
def test_gemm_misaligned_pointer():
    """A pointer off 16-byte alignment: the cp.async mainloop."""
    base = torch.randn(64 * 64 + 1, device="cuda", dtype=torch.bfloat16)
    a = base[1:].view(64, 64)
    b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    check_gemm(cute_kernels.gemm(a, b), a, b)
    out = torch.full((64, 64), float("nan"), device="cuda", dtype=torch.bfloat16)
    cute_kernels.gemm(a, b, out=out)
    check_gemm(out, a, b, what="gemm into a NaN-poisoned out")


def test_auto_splitk_mode():
    """The default split-K kernel: persistent for long slices (1024x1024x32768: S=4, 128 k-tiles each),
    the cluster pair for short ones (128x4096x4096: 8 k-tiles), cluster for batched or non-row-major
    outputs (which the persistent kernel does not take), in the plan too."""
    assert H.auto_splitk_mode(1024, 1024, 32768) == "persistent"
    assert H.auto_splitk_mode(128, 4096, 4096) == "cluster"
    assert H.auto_splitk_mode(1024, 1024, 32768, out_row_major=False) == "cluster"
    assert H.auto_splitk_mode(1024, 1024, 32768, l=2) == "cluster"
    a = torch.empty(1024, 32768, dtype=torch.bfloat16)
    b = torch.empty(32768, 1024, dtype=torch.bfloat16)
    with jit.dry_run():
        p = P.make_plan(a, b, allow_cpu=True)
        assert p.kind == "splitk-persistent" and isinstance(p.fn, launch.WorkspaceLauncher)
        col_out = torch.empty(1024, 1024, dtype=torch.bfloat16).t()
        for choice in (P.PlanChoice(), P.PlanChoice(splitk_mode="persistent")):  # column-major out: cluster
            p = P.make_plan(a, b, col_out, choice=choice, allow_cpu=True)
            assert p.kind == "splitk-cluster" and not isinstance(p.fn, launch.WorkspaceLauncher)


def test_split_k_heuristic():
    tiles = H.default_tiles(128, 4096, 4096, 1, "bfloat16", "k", "mn", "bfloat16", "n")
    assert H.split_k_factor(128, 4096, 4096, 1, tiles, "cluster") == 2
    assert H.split_k_factor(128, 4096, 4096, 1, tiles, "none") == 1
    assert H.split_k_factor(1024, 1024, 32768, 1, tiles, "persistent") == 4
    big = H.default_tiles(4096, 4096, 4096, 1, "bfloat16", "k", "mn", "bfloat16", "n")
    assert H.split_k_factor(4096, 4096, 4096, 1, big, "cluster") == 1
    assert H.split_k_factor(128, 4096, 4100, 1, tiles, "cluster") > 1  # TMA zero-fills the K tail
    with pytest.raises(ValueError, match="split-K mode"):
        H.split_k_factor(128, 4096, 4096, 1, tiles, "workspace")


@pytest.mark.matrix  # three majors / C configs (~11 s); the quick tier compiles split-K cluster in the variants test
def test_splitk_cluster_compiles():
    from cute_kernels.tools import inspect as ins
    from cute_kernels.gemm.splitk_kernel import SplitKClusterConfig

    for s, has_c, am, bm in [(2, False, "k", "mn"), (2, True, "mn", "k"), (1, False, "k", "k")]:
        cfg = SplitKClusterConfig(tiles=H.splitk_tiles(128, "bfloat16", am, bm, "bfloat16"), splits=s, has_c=has_c)
        (k,) = ins.inspect_builder(lambda: launch.fake_args(cfg, "bfloat16", "bfloat16", "float32")).kernels
        assert k.instructions["HGMMA"] > 0 and k.spills == 0 and k.stack_frame == 0


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["auto", "cluster", "persistent"])
@pytest.mark.parametrize("mnk", [(128, 4096, 4096), (64, 520, 8192), (1024, 1024, 32768), (200, 136, 8200)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("with_c", [False, True])
def test_gemm_split_k(mnk, with_c, mode):
    m, n, k = mnk
    tiles = H.default_tiles(m, n, k, 1, "bfloat16", "k", "mn", "bfloat16", "n")
    if H.split_k_factor(m, n, k, 1, tiles, H.auto_splitk_mode(m, n, k) if mode == "auto" else mode) == 1:
        pytest.skip(f"{mode} split-K does not apply to {mnk}")
    choice = P.PlanChoice() if mode == "auto" else P.PlanChoice(splitk_mode=mode)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(m, n, device="cuda", dtype=torch.float32) if with_c else None
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    alpha, beta = (0.75, 0.5) if with_c else (1.0, 0.0)
    P.run(a, b, out, c, alpha, beta, choice=choice)
    check_gemm(out, a, b, alpha, beta, c)
    for _ in range(5):
        again = P.run(a, b, None, c, alpha, beta, choice=choice)
        assert torch.equal(out, again), "split-K reduction must be deterministic"


@pytest.mark.gpu
def test_gemm_split_k_cluster_strided_out():
    """The cluster split-K epilogue stores element-wise: a column-major, padded out works."""
    m, n, k = 100, 300, 6000
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    big = torch.full((n, m + 3), float("nan"), device="cuda", dtype=torch.float32)
    out = big[:, :m].t()
    cute_kernels.gemm(a, b, out=out)
    check_gemm(out, a, b)
    assert torch.isnan(big[:, m:]).all()


@pytest.mark.gpu
def test_gemm_empty_dims():
    a = torch.randn(5, 0, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(0, 7, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(cute_kernels.gemm(a, b), torch.zeros(5, 7, device="cuda", dtype=torch.bfloat16))
    c = torch.randn(5, 7, device="cuda", dtype=torch.bfloat16)
    assert torch.allclose(cute_kernels.gemm(a, b, c=c, beta=2.0), 2 * c)
    assert cute_kernels.gemm(torch.randn(0, 8, device="cuda", dtype=torch.bfloat16),
                             torch.randn(8, 8, device="cuda", dtype=torch.bfloat16)).shape == (0, 8)


def test_warmup_compiles_what_gemm_runs():
    """warmup() on the CPU compiles the kernel a later call would use; a second warmup is a cache hit."""
    from cute_kernels.common import jit

    spec = dict(m=300, n=520, k=136, a_major="row", b_major="col", out_dtype=torch.float32)
    before = jit.stats["compiles"] + jit.stats["disk_hits"]
    assert cute_kernels.warmup([("gemm", spec)]) == 1
    assert jit.stats["compiles"] + jit.stats["disk_hits"] == before + 1
    hits = jit.stats["memory_hits"]
    cute_kernels.warmup([("gemm", spec)])
    assert jit.stats["memory_hits"] == hits + 1
    with pytest.raises(ValueError, match="unknown kernel"):
        cute_kernels.warmup([("nope", {})])


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(2176, 2048, 136), (4096, 4096, 4160), (8192, 1024, 200)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gemm_persistent_multi_tile_odd_k(mnk):
    """More output tiles than CTAs and a k-tile count that is not a multiple of 2 x stages: each CTA
    carries the ring's read/release states from one tile to the next (a mainloop that restarted them
    every tile deadlocked or read stale stages exactly here; the first H200 runs never hit this case)."""
    m, n, k = mnk
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    tiles = H.default_tiles(m, n, k, 1, "bfloat16", "k", "mn", "bfloat16", "n")
    n_tiles = -(-m // tiles.tile_mnk[0]) * -(-n // tiles.tile_mnk[1])
    assert n_tiles > 132 and (-(-k // 64)) % (2 * tiles.ab_stages) != 0
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cute_kernels.gemm(a, b, out=out)
    torch.cuda.synchronize()
    check_gemm(out, a, b)


# ---- cluster split-K variants (tile width x split count x store path) -----------------------------
SPLITK_COMPILE_CASES = [(64, 2, True, False), (128, 2, True, True), (256, 2, True, False), (192, 1, False, True),
                        (64, 1, False, False)]


@pytest.mark.matrix  # A multicast compiles in the quick tier through the fixup kind's test
@pytest.mark.parametrize("tn,s,mc", [(32, 1, 2), (64, 1, 2)], ids=lambda v: str(v))
def test_splitk_cluster_a_multicast_compiles(tn, s, mc):
    """A multicast along N (cluster S x c, the skinny plan's pairs): the A loads are multicast TMA, B's
    stay CTA-local, the consumers release stages to remote empty barriers, nothing spills; c = 1 has no
    multicast at all."""
    from cute_kernels.gemm.splitk_kernel import SplitKClusterConfig

    for c in (1, mc):
        cfg = SplitKClusterConfig(tiles=H.splitk_tiles(tn, "bfloat16", "k", "mn", "bfloat16", c), splits=s,
                                  vec_store=True, b_evict_first=True)
        rep, k = _splitk_compile_report(cfg, tn)
        assert k.spills == 0
        if rep.ptx is None:
            pytest.skip("no PTX in the report")
        n_mc = len(re.findall(r"cp\.async\.bulk\.tensor\.\S*multicast::cluster", rep.ptx))
        assert (n_mc > 0) == (c > 1), (c, n_mc)


def _splitk_compile_report(cfg, tn):
    """sm_90a compile of a split-K config: HGMMA 64 x tn x 16 present, no local memory in the mainloop."""
    from cute_kernels.tools import inspect as ins

    rep = ins.inspect_builder(lambda: launch.fake_args(cfg, "bfloat16", "bfloat16", "float32"))
    (k,) = rep.kernels
    assert k.instructions["HGMMA"] > 0 and f"HGMMA.64x{tn}x16" in rep.sass
    lines = rep.sass.splitlines()
    hg = [i for i, ln in enumerate(lines) if "HGMMA" in ln]
    assert not any(("LDL" in ln or "STL" in ln) for ln in lines[hg[0]:hg[-1]])
    return rep, k


@pytest.mark.parametrize("tn,s,vec,has_c", SPLITK_COMPILE_CASES, ids=lambda v: str(v))
def test_splitk_cluster_variants_compile(tn, s, vec, has_c):
    """Every tile width / split count builds for sm_90a: HGMMA of the tile's width, no local memory,
    and 16-byte global stores on the vector-store path."""
    from cute_kernels.gemm.splitk_kernel import SplitKClusterConfig

    cfg = SplitKClusterConfig(tiles=H.splitk_tiles(tn, "bfloat16", "k", "mn", "bfloat16"), splits=s,
                              has_c=has_c, vec_store=vec)
    # a variant may keep one tile index in local memory across the mainloop (the kernel is compiled
    # for 168 registers/thread): allowed, but never inside the mainloop
    rep, k = _splitk_compile_report(cfg, tn)
    assert k.spills <= 6
    assert ("STG.E.128" in rep.sass) == vec


@pytest.mark.matrix  # ~13 s a kind; split-K cluster and fixup compile in the quick tier through other tests
@pytest.mark.parametrize("kind", ["cluster", "fixup"])
def test_splitk_b_evict_first_compiles(kind):
    """The opt-in L2 evict-first hint on split-K's B loads: every B TMA load carries the policy
    (CUTLASS's EVICT_FIRST descriptor), A's loads keep the default, and nothing else changes."""
    import re

    from cute_kernels.common import tma
    from cute_kernels.gemm.splitk_kernel import SplitKClusterConfig, SplitKFixupConfig

    Cfg, tn, s = (SplitKClusterConfig, 64, 2) if kind == "cluster" else (SplitKFixupConfig, 256, 4)
    policies = []
    for hint in (False, True):
        cfg = Cfg(tiles=H.splitk_tiles(tn, "bfloat16", "k", "mn", "bfloat16"), splits=s, b_evict_first=hint)
        rep, k = _splitk_compile_report(cfg, tn)
        if rep.ptx is None:
            pytest.skip("no PTX in the report")
        regs = re.findall(r"cp\.async\.bulk\.tensor\.\S+L2::cache_hint \[[^\]]*\], \[[^\]]*\], \[[^\]]*\], (%rd\d+);",
                          rep.ptx)
        vals = {int(re.findall(r"mov\.[bu]64\s+%s,\s*(\d+);" % re.escape(r), rep.ptx)[0]) for r in regs}
        policies.append(vals)
    assert policies[0] == {0}
    assert policies[1] == {0, tma.L2_EVICT_FIRST}


def test_splitk_tiles_fit():
    from cute_kernels.gemm.splitk_kernel import TILE_NS
    from layouts.tiles import splitk_red_bytes as red_bytes, splitk_stage_bytes as stage_bytes

    for tn in TILE_NS:
        t = H.splitk_tiles(tn, "bfloat16", "k", "mn", "bfloat16")
        assert t.ab_stages >= 4 and t.ab_stages * stage_bytes(tn) >= red_bytes(tn)
        assert 1024 + t.ab_stages * stage_bytes(tn) <= 227 * 1024


SPLITK_GPU_VARIANTS = [(64, 2), (128, 2), (192, 1), (64, 1), (192, 2), (32, 1, 2), (64, 1, 2),
                       (64, 2, 2)]  # (tn, S[, A multicast])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", SPLITK_GPU_VARIANTS, ids=lambda v: f"tn{v[0]}-s{v[1]}" + (f"-mc{v[2]}" if len(v) > 2 else ""))
@pytest.mark.parametrize("mnk", [(1, 256, 4096), (7, 1000, 520), (127, 4096, 4168), (1000, 3000, 520),
                                 (131, 264, 6008), (257, 136, 64)], ids=lambda s: "x".join(map(str, s)))
def test_splitk_cluster_variant_numerics(variant, mnk):
    """Each variant on ragged shapes (M=1, 7, 127, 1000; N and K tails; fewer k-tiles than splits):
    matches a float64 reference, writes every element (NaN-poisoned out), vector and scalar stores
    (a padded out whose rows are not 16-byte aligned), bitwise identical run to run.  With A multicast
    (a third field c) the N = 264 / 136 cases leave padding CTAs in the last cluster."""
    from cute_kernels.gemm.splitk_kernel import SplitKClusterConfig

    tn, s, mc = (*variant, 1)[:3]
    m, n, k = mnk
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    ref = gemm_reference(a, b)
    for vec in (True, False):
        cfg = SplitKClusterConfig(tiles=H.splitk_tiles(tn, "bfloat16", "k", "mn", "bfloat16", mc), splits=s,
                                  vec_store=vec, b_evict_first=mc > 1)
        fn = launch.compiled(cfg, "bfloat16", "bfloat16", "bfloat16")
        big = torch.full((m, n + (0 if vec else 3)), float("nan"), device="cuda", dtype=torch.bfloat16)
        out = big[:, :n]
        fn(a, b, out, out, 1.0, 0.0)
        check_gemm(out, a, b, ref=ref, what=f"split-K cluster vec_store={vec}")
        if not vec:
            assert torch.isnan(big[:, n:]).all()
        for _ in range(2):
            again = torch.full_like(big, float("nan"))
            fn(a, b, again[:, :n], again[:, :n], 1.0, 0.0)
            assert torch.equal(out, again[:, :n]), "split-K reduction must be deterministic"


# ---- last-CTA fixup: the fixup kernel (S CTAs per tile, no cluster: the skinny plan beyond two slices)
# and split-K in the persistent schedule; the last CTA of a tile sums the fp32 partials ---------------
FIXUP_COMPILE_CASES = [(256, 4, False), (128, 2, True), (256, 8, True), (128, 8, False), (256, 3, False),
                       (128, 4, False), (256, 2, True)]


@pytest.mark.parametrize("tn,s,has_c", FIXUP_COMPILE_CASES, ids=lambda v: str(v))
def test_splitk_fixup_compiles(tn, s, has_c):
    """sm_90a build: HGMMA of the tile's width, no local memory at all, 16-byte partial stores/loads,
    the gpu-scope fence + acq_rel atomic of the counter protocol."""
    from cute_kernels.gemm.splitk_kernel import SplitKFixupConfig

    cfg = SplitKFixupConfig(tiles=H.splitk_tiles(tn, "bfloat16", "k", "mn", "bfloat16"), splits=s, has_c=has_c)
    rep, k = _splitk_compile_report(cfg, tn)
    assert k.spills == 0 and k.stack_frame == 0
    assert "STG.E.128" in rep.sass and "LDG.E.128" in rep.sass
    assert "ATOMG.E.ADD" in rep.sass and "MEMBAR.ALL.GPU" in rep.sass
    assert rep.ptx.count("fence.acq_rel.gpu") >= 2 and "atom.global.acq_rel.add" in rep.ptx


@pytest.mark.parametrize("tn,s,has_c,cl", [(256, 4, False, (2, 1)), (256, 8, False, (1, 1)), (128, 2, True, (2, 1)),
                                          (128, 8, True, (1, 1))], ids=str)
def test_splitk_persistent_compiles(tn, s, has_c, cl):
    """Split-K inside the persistent schedule (GemmConfig.splits): sm_90a build with no local memory,
    the counter protocol (gpu-scope fences, acq_rel atomic), 16-byte partial stores/loads, and the
    TMA-store epilogue; the unsplit configs' SASS is unchanged (checked by hand, session 3)."""
    from cute_kernels.tools import inspect as ins
    from cute_kernels.gemm.kernel import GemmConfig

    cfg = GemmConfig(tiles=H.make_gemm_tiles(tn, cl, "bfloat16", "k", "mn", "bfloat16"), has_c=has_c, splits=s,
                     max_active_clusters=132 // cl[0])
    rep = ins.inspect_builder(lambda: launch.fake_args(cfg, "bfloat16", "bfloat16", "bfloat16"))
    (k,) = rep.kernels
    assert k.spills == 0 and k.stack_frame == 0, rep.summary()  # the SASS was read (nvdisasm, else a raise)
    assert f"HGMMA.64x{tn}x16" in rep.sass and "UTMASTG" in rep.sass
    assert "STG.E.128" in rep.sass and "LDG.E.128" in rep.sass and "ATOMG.E.ADD" in rep.sass
    if rep.ptx is not None:
        assert rep.ptx.count("fence.acq_rel.gpu") >= 2 and "atom.global.acq_rel.add" in rep.ptx


@pytest.mark.parametrize("tn,s,has_c,cl", [(256, 4, False, (2, 1)), (256, 3, True, (2, 1)), (128, 8, False, (1, 1))],
                         ids=str)
def test_splitk_persistent_parts_compiles(tn, s, has_c, cl):
    """The shared finish (GemmConfig.fixup_parts): sm_90a build without local memory, the claim protocol
    (acq_rel add, or, compare-and-swap, the reset exchange), 16-byte partial stores / loads; refused
    where it cannot run (no split, D not TMA-stored, more than fixup.MAX_PARTS slices)."""
    from cute_kernels.gemm.kernel import fixup_parts_ok
    from cute_kernels.tools import inspect as ins

    cfg = GemmConfig(tiles=H.make_gemm_tiles(tn, cl, "bfloat16", "k", "mn", "bfloat16"), has_c=has_c, splits=s,
                     max_active_clusters=132 // cl[0], fixup_parts=True)
    rep = ins.inspect_builder(lambda: launch.fake_args(cfg, "bfloat16", "bfloat16", "bfloat16"))
    (k,) = rep.kernels
    assert k.spills == 0 and k.stack_frame == 0, rep.summary()
    for op in ("ATOMG.E.ADD", "ATOMG.E.OR", "ATOMG.E.CAS", "ATOMG.E.EXCH", "STG.E.128", "LDG.E.128", "UTMASTG"):
        assert op in rep.sass, op
    import dataclasses

    for bad in (dict(splits=1), dict(tma_store=False), dict(splits=17)):
        assert not fixup_parts_ok(dataclasses.replace(cfg, **bad)), bad
        with pytest.raises(ValueError, match="fixup_parts"):
            from cute_kernels.gemm.kernel import GemmSm90

            GemmSm90(dataclasses.replace(cfg, **bad))


def test_splitk_persistent_plan_parts():
    """PlanChoice(fixup_parts=True) gives the persistent split-K plan the shared finish; the default
    plan keeps the last-CTA fixup."""
    a = torch.empty(1024, 32768, dtype=torch.bfloat16)
    b = torch.empty(32768, 1024, dtype=torch.bfloat16)
    with jit.dry_run():
        for choice, want in ((P.PlanChoice(splitk_mode="persistent"), False),
                             (P.PlanChoice(splitk_mode="persistent", fixup_parts=True), True)):
            (_, cfg), = P.make_plan(a, b, choice=choice, allow_cpu=True).kernels
            assert cfg.splits == 4 and cfg.fixup_parts is want


def test_splitk_persistent_plan():
    """The persistent split-K plan: 1024x1024x32768 -> 128x256 tiles, 2x1 clusters, S=4 (128 units),
    a workspace of 32 tiles x 4 partials and 32 counters."""
    a = torch.empty(1024, 32768, dtype=torch.bfloat16)
    b = torch.empty(32768, 1024, dtype=torch.bfloat16)
    with jit.dry_run():
        p = P.make_plan(a, b, choice=P.PlanChoice(splitk_mode="persistent"), allow_cpu=True)
    assert isinstance(p.fn, launch.WorkspaceLauncher)
    assert (p.fn.ws_numel, p.fn.n_counters) == (32 * 4 * 128 * 256, 32)
    (_, cfg), = p.kernels
    assert cfg.splits == 4 and cfg.tiles.tile_mnk[:2] == (128, 256) and cfg.tiles.cluster_mn == (2, 1)


def test_persistent_splitk_choice():
    assert H.persistent_splitk_choice(1024, 1024, 32768) == (256, 4)  # 32 tiles x 4 = 128 CTAs
    tn, s = H.persistent_splitk_choice(128, 4096, 4096)
    assert 2 <= s <= 8 and -(-4096 // tn) * s <= 132
    tiles = H.default_tiles(1024, 1024, 32768, 1, "bfloat16", "k", "mn", "bfloat16", "n")
    assert H.split_k_factor(1024, 1024, 32768, 1, tiles, "persistent") == 4


def _fixup_fn(tn, s, has_c=False, c_dtype="bfloat16", d_dtype="bfloat16", kind="fixup", m=1, mc=1):
    """The fixup kernel, or (kind "persistent") the persistent kernel with split-K in its schedule
    (2x1 cluster when M's 128-row tiles pair up, as the host picks); both take (a, b, d, c, ws, cnt,
    alpha, beta)."""
    from cute_kernels.gemm.kernel import GemmConfig
    from cute_kernels.gemm.splitk_kernel import SplitKFixupConfig

    if kind in ("persistent", "parts"):  # parts: the shared finish (GemmConfig.fixup_parts)
        cl = (2, 1) if -(-m // 128) % 2 == 0 else (1, 1)
        cfg = GemmConfig(tiles=H.make_gemm_tiles(tn, cl, "bfloat16", "k", "mn", d_dtype), has_c=has_c,
                         max_active_clusters=132 // cl[0], splits=s, fixup_parts=kind == "parts")
        return launch.compiled(cfg, "bfloat16", d_dtype, c_dtype if has_c else d_dtype)
    cfg = SplitKFixupConfig(tiles=H.splitk_tiles(tn, "bfloat16", "k", "mn", d_dtype, mc), splits=s, has_c=has_c,
                            b_evict_first=mc > 1)
    return launch.compiled(cfg, "bfloat16", d_dtype, c_dtype if has_c else d_dtype)


def _fixup_ws(m, n, tn, s):
    from cute_kernels.gemm.splitk_kernel import fixup_workspace_numel

    numel, n_cnt = fixup_workspace_numel(m, n, tn, s)
    return (torch.full((numel,), float("nan"), device="cuda", dtype=torch.float32),
            torch.zeros(n_cnt, device="cuda", dtype=torch.int32))


FIXUP_GPU_VARIANTS = [(128, 2), (128, 4), (256, 4), (256, 8), (128, 8), (256, 3)]
#: (tn, S, A multicast) of the fixup kernel with clusters along N; N = 264 / 136 / 1000 leave padding CTAs
FIXUP_MC_VARIANTS = [(32, 2, 2), (64, 2, 2), (128, 4, 2), (64, 3, 2), (256, 2, 2)]


@pytest.mark.parametrize("tn,s,mc", [(32, 2, 2), (64, 2, 2), (128, 4, 2)], ids=str)
def test_splitk_fixup_a_multicast_compiles(tn, s, mc):
    """The fixup kernel with A multicast along N: multicast TMA for A only, no local memory, the
    counter protocol intact."""
    from cute_kernels.gemm.splitk_kernel import SplitKFixupConfig

    cfg = SplitKFixupConfig(tiles=H.splitk_tiles(tn, "bfloat16", "k", "mn", "bfloat16", mc), splits=s,
                            b_evict_first=True)
    rep, k = _splitk_compile_report(cfg, tn)
    assert k.spills == 0 and k.stack_frame == 0
    assert "ATOMG.E.ADD" in rep.sass
    if rep.ptx is not None:
        assert re.search(r"cp\.async\.bulk\.tensor\.\S*multicast::cluster", rep.ptx)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", FIXUP_MC_VARIANTS, ids=lambda v: f"tn{v[0]}-s{v[1]}-mc{v[2]}")
@pytest.mark.parametrize("mnk", [(1, 256, 4096), (7, 1000, 520), (128, 4096, 4096), (131, 264, 6008),
                                 (257, 136, 64)], ids=lambda s: "x".join(map(str, s)))
def test_splitk_fixup_a_multicast_numerics(variant, mnk):
    """Fixup split-K with A multicast: float64 reference, NaN-poisoned out, bitwise repeatable, the
    counters back at 0 -- including padding CTAs of a partial last cluster, which must neither count
    nor write."""
    tn, s, mc = variant
    m, n, k = mnk
    fn = _fixup_fn(tn, s, mc=mc)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    ws, cnt = _fixup_ws(m, n, tn, s)
    big = torch.full((m + 1, n + 8), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = big[:m, :n]
    fn(a, b, out, out, ws, cnt, 1.0, 0.0)
    check_gemm(out, a, b)
    assert torch.isnan(big[m:]).all() and torch.isnan(big[:, n:]).all(), "wrote outside the output"
    assert int(cnt.abs().sum()) == 0
    for _ in range(5):
        again = torch.full_like(out, float("nan"))
        fn(a, b, again, again, ws, cnt, 1.0, 0.0)
        assert torch.equal(out, again)


#: (kind, variant) of the split-K numerics: both kernels at every variant, the shared finish at three (even
#: parts, S = 3 over 4 sub-tiles, S = 8 over 2 -- six empty parts)
FIXUP_GPU_KINDS = ([(kind, v) for kind in ("fixup", "persistent") for v in FIXUP_GPU_VARIANTS]
                   + [("parts", v) for v in ((256, 4), (256, 3), (128, 8))])


@pytest.mark.gpu
@pytest.mark.parametrize("kind,variant", FIXUP_GPU_KINDS, ids=lambda v: v if isinstance(v, str) else f"tn{v[0]}-s{v[1]}")
@pytest.mark.parametrize("mnk", [(1, 256, 4096), (7, 1000, 520), (127, 4096, 4168), (1000, 3000, 520),
                                 (131, 264, 6008), (257, 136, 64), (1024, 1024, 8192)],
                         ids=lambda s: "x".join(map(str, s)))
def test_splitk_fixup_numerics(variant, mnk, kind):
    """Ragged M (1, 7, 127, 1000), N and K tails, more slices than k-tiles (K=64, 520): float64
    reference, every element written (NaN-poisoned out), bitwise identical over 10 repeats (whoever
    is last), the counters back at 0 after every call (the workspace is reused as is).  The fixup
    kernel, split-K in the persistent kernel's schedule (several waves at 1024^2 x S=8), and the
    latter with the shared finish (``parts``: every contributor stores a part; with several waves its
    polls run out and the last unit stores the rest)."""
    tn, s = variant
    m, n, k = mnk
    fn = _fixup_fn(tn, s, kind=kind, m=m)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    ws, cnt = _fixup_ws(m, n, tn, s)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    fn(a, b, out, out, ws, cnt, 1.0, 0.0)
    check_gemm(out, a, b)
    assert int(cnt.abs().sum()) == 0, "the last CTA must reset its tile's counter"
    for _ in range(10):
        again = torch.full_like(out, float("nan"))
        fn(a, b, again, again, ws, cnt, 1.0, 0.0)
        assert torch.equal(out, again), "fixup split-K must be bitwise deterministic"
    assert int(cnt.abs().sum()) == 0


def _check_alpha_beta_c(m, n, k, c_kind):
    """gemm(a, b, alpha=0.75, beta=0.5, c) into NaN-poisoned bf16 and fp32 outputs, each against the
    float64 reference, on fresh bf16 operands; returns (a, b, c, outputs) for the caller's plan checks."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = make_c(c_kind, m, n)
    outs = []
    for out_dtype in (torch.bfloat16, torch.float32):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
        cute_kernels.gemm(a, b, out=out, alpha=0.75, beta=0.5, c=c)
        check_gemm(out, a, b, 0.75, 0.5, c, what=f"gemm C {c_kind}")
        outs.append(out)
    return a, b, c, outs


@pytest.mark.gpu
@pytest.mark.parametrize("c_kind", ["row", "transposed", "fp32"])
def test_splitk_persistent_alpha_beta_c(c_kind):
    """gemm() on a shape the persistent split-K takes by default: alpha / beta * C (any C strides),
    fp32 and bf16 out."""
    m, n, k = 256, 512, 32768
    assert H.auto_splitk_mode(m, n, k) == "persistent"
    a, b, c, outs = _check_alpha_beta_c(m, n, k, c_kind)
    for out in outs:
        assert P.plan(a, b, out, c, 0.5).kind == "splitk-persistent"


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(5, 4096, 4096), (40, 1000, 2056)], ids=str)
def test_gemm_skinny_swapped_fp16(mnk):
    """fp16 operands and output through the transposed plan (the tests above are bf16)."""
    m, n, k = mnk
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    cute_kernels.gemm(a, b, out=out)
    p = P.plan(a, b, out)
    assert p.swapped and isinstance(p.fn, launch.SwappedLauncher)
    # K slices meet in an L2 workspace (fixup kernel) beyond two, in a cluster's shared memory up to two
    assert isinstance(p.fn.fn, launch.WorkspaceLauncher) == H.skinny_swap_choice(m, n, k).fixup
    check_gemm(out, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(1024, 1024, 32768), (1, 4096, 4096)], ids=["persistent", "skinny-fixup"])
def test_splitk_fixup_back_to_back_and_graph(mnk):
    """The plans with a last-CTA fixup (persistent split-K, the skinny fixup): two calls back to back
    (no sync) reuse one cached workspace; a CUDA graph replays correctly; the counters stay at 0; the
    results repeat bitwise."""
    m, n, k = mnk
    a1, a2 = (torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    b1, b2 = (torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o1 = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    o2 = torch.full_like(o1, float("nan"))
    cute_kernels.gemm(a1, b1, out=o1)
    cute_kernels.gemm(a2, b2, out=o2)
    torch.cuda.synchronize()
    check_gemm(o1, a1, b1, what="first call")
    check_gemm(o2, a2, b2, what="second call")
    launcher = P.plan(a1, b1, o1).fn
    launcher = launcher.fn if isinstance(launcher, launch.SwappedLauncher) else launcher
    assert isinstance(launcher, launch.WorkspaceLauncher) and len(launcher.cache) == 1
    (ws, cnt), = launcher.cache.values()
    assert int(cnt.abs().sum()) == 0
    for _ in range(3):
        assert torch.equal(cute_kernels.gemm(a1, b1), o1)
    # CUDA graph: captured on a side stream (fresh workspace), replayed twice with new inputs
    g = capture_graph(lambda: cute_kernels.gemm(a1, b1, out=o1))
    a1_orig = a1.clone()
    for src in (a2, a1_orig):
        a1.copy_(src)
        o1.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check_gemm(o1, a1, b1, what="graph replay")


@pytest.mark.gpu
def test_gemm_large_a_swizzled_raster():
    """A >= 64 MB takes the (1, 1) cluster + raster swizzle 4 (default_raster): many tiles per CTA,
    ragged N, against a float64 reference with a NaN-poisoned output."""
    m, n, k = 8192, 1000, 4104
    assert H.default_raster(m, n, k, "bfloat16") == (4, True)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cute_kernels.gemm(a, b, out=out)
    torch.cuda.synchronize()
    check_gemm(out, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["plain", "c_fp32", "col_out", "swizzle6", "odd_n"])
def test_gemm_stream_tiles(variant):
    """The A-streaming default (256 x 128 tiles, 1x2 cluster, swizzle 8: takes_stream_tiles) on a ragged
    shape (M, N, K not multiples of the tile), NaN-poisoned outputs, float64 reference; with
    alpha/beta/C into an fp32 output, and into a column-major output.  ``swizzle6``: N = 3000 gives
    12 cluster columns, run with strips of 6 (fit_swizzle) instead of padding to 16.  ``odd_n``:
    N = 4400 gives 35 N tiles, so the last 1x2 cluster's second CTA has only out-of-bounds tiles."""
    m, n, k = 8200, {"swizzle6": 3000, "odd_n": 4400}.get(variant, 2000), 4104
    if variant == "swizzle6":
        assert H.fit_swizzle(*H.default_raster(m, n, k, "bfloat16"), m, n, (256, 128), (1, 2)) == 6
    t = H.default_tiles(m, n, k, 1, "bfloat16", "k", "mn", "bfloat16", "n")
    assert (t.tile_mnk[:2], t.cluster_mn) == ((256, 128), (1, 2))
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.full((n, m), float("nan"), device="cuda", dtype=torch.bfloat16).mT if variant == "col_out" else None
    _check_poisoned_gemm(a, b, c_fp32=variant == "c_fp32", out=out)


def _check_poisoned_gemm(a, b, *, c_fp32=False, out=None):
    """gemm into a NaN-poisoned output (``out``, which the caller poisoned, else a fresh row-major bf16
    one; ``c_fp32``: alpha 0.5, beta -1.5 and a random C into an fp32 output) against the float64
    reference, elementwise (:func:`check_gemm`)."""
    shape = (*a.shape[:-1], b.shape[-1])
    if c_fp32:
        c = torch.randn(shape, device="cuda", dtype=torch.float32)
        out = torch.full(shape, float("nan"), device="cuda", dtype=torch.float32)
        cute_kernels.gemm(a, b, out=out, alpha=0.5, beta=-1.5, c=c)
        torch.cuda.synchronize()
        check_gemm(out, a, b, 0.5, -1.5, c)
        return
    if out is None:
        out = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    else:
        assert out.isnan().all(), "the caller's out must be NaN-poisoned"
    cute_kernels.gemm(a, b, out=out)
    torch.cuda.synchronize()
    check_gemm(out, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["plain", "batched_c_fp32", "b_kmajor"])
def test_gemm_band_raster(variant):
    """A fitting in L2, 2x1 cluster, several waves: swizzle 8 along N (default_raster), fitted to 6
    for 12 cluster rows; ragged N and K, NaN-poisoned outputs, float64 reference; batched with
    alpha/beta/C into fp32, and with a K-major B."""
    m, n, k = 3000, 8200, 520
    l = 2 if variant == "batched_c_fp32" else 1
    t = H.default_tiles(m, n, k, l, "bfloat16", "k", "mn", "bfloat16", "n")
    assert t.cluster_mn == (2, 1) and H.default_raster(m, n, k, "bfloat16", l, t) == (8, False)
    assert H.fit_swizzle(8, False, m, n, t.tile_mnk[:2], t.cluster_mn) == 6
    a = torch.randn(l, m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(l, k, n, device="cuda", dtype=torch.bfloat16)
    if variant == "b_kmajor":
        b = torch.randn(l, n, k, device="cuda", dtype=torch.bfloat16).mT
    if variant == "batched_c_fp32":
        _check_poisoned_gemm(a, b, c_fp32=True)
    else:
        _check_poisoned_gemm(a[0], b[0])


TILE224_CASES = {  # variant: (batch, m, n, k), A / B / out majors, C: alpha 0.5, beta -1.5, fp32 out
    "batched": ((3, 1000, 1000, 1000), "row", "row", "row", False),
    "kmajor_b": ((None, 1000, 997, 520), "row", "col", "row", False),
    "col_out": ((None, 517, 1000, 264), "row", "row", "col", False),
    "col_a_c_fp32": ((2, 300, 450, 136), "col", "row", "row", True),
}


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(TILE224_CASES))
def test_gemm_tile_224(variant):
    """128 x 224 tiles forced through ``PlanChoice`` (issue 36's candidate for 3 x 1000^3: 120 tiles in
    one wave of 132 SMs, where 128 x 256 leaves 36 idle): an N-major B in 64-byte swizzle atoms, seven
    32-column epilogue sub-tiles.  Ragged shapes, every major, batched, alpha/beta/C into fp32;
    NaN-poisoned outputs against the float64 reference, tails elementwise."""
    (l, m, n, k), am, bm, om, with_c = TILE224_CASES[variant]
    batch = () if l is None else (l,)
    a = _operand((m, k), am, torch.bfloat16, batch=l)
    b = _operand((k, n), bm, torch.bfloat16, batch=l)
    od = torch.float32 if with_c else torch.bfloat16
    out = torch.full((*batch, m, n), float("nan"), device="cuda", dtype=od)
    if om == "col":
        out = torch.full((*batch, n, m), float("nan"), device="cuda", dtype=od).mT
    c = torch.randn(out.shape, device="cuda", dtype=torch.float32) if with_c else None
    cluster = (2, 1) if math.ceil(m / 128) % 2 == 0 else (1, 1)
    tiles = H.make_gemm_tiles(224, cluster, "bfloat16", {"row": "k", "col": "mn"}[am], {"row": "mn", "col": "k"}[bm],
                              "float32" if with_c else "bfloat16", {"row": "n", "col": "m"}[om])
    choice = P.PlanChoice(tiles=tiles, splits=1)
    alpha, beta = (0.5, -1.5) if with_c else (1.0, 0.0)
    (_, ran), = P.plan(a, b, out, c, beta, None, choice).kernels
    assert ran.tiles.tile_mnk[:2] == (128, 224) and ran.tiles.cluster_mn == cluster
    P.run(a, b, out, c, alpha, beta, choice=choice)
    torch.cuda.synchronize()
    check_gemm(out, a, b, alpha, beta, c)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["cluster", "persistent", "swap"])
@pytest.mark.parametrize("mnk", [(128, 4096, 4096), (1024, 1024, 32768), (16, 1000, 2056)], ids=str)
def test_splitk_b_evict_first_bitwise(mode, mnk):
    """The L2 hint changes no arithmetic: the same bits as without it (NaN-poisoned outputs), and
    both match the float64 reference."""
    m, n, k = mnk
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    outs = []
    for hint in (False, True):
        choice = P.PlanChoice(splitk_mode=mode, b_evict_first=hint)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        P.run(a, b, out, choice=choice)
        torch.cuda.synchronize()
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    check_gemm(outs[1], a, b)


def test_default_raster_rule():
    # A >= 64 MB, N tiles pairing up: 256 x 128 tiles, 1x2 cluster, swizzle 8 (takes_stream_tiles)
    assert H.default_raster(8192, 8192, 8192, "bfloat16") == (8, True)
    for mnk in ((8192, 8192, 8192), (16384, 4096, 4096), (8200, 2000, 4104)):
        t = H.default_tiles(*mnk[:3], 1, "bfloat16", "k", "mn", "bfloat16", "n")
        assert (t.tile_mnk[:2], t.cluster_mn) == ((256, 128), (1, 2)), mnk
        assert H.default_raster(*mnk, "bfloat16", 1, t) == (8, True)
    # odd N-tile counts from 15 up: the last cluster column pads one out-of-bounds CTA
    for mnk in ((8192, 8064, 8192), (16384, 4400, 4096)):
        t = H.default_tiles(*mnk, 1, "bfloat16", "k", "mn", "bfloat16", "n")
        assert (t.tile_mnk[:2], t.cluster_mn) == ((256, 128), (1, 2)), mnk
    # ... not when batched, narrow (N < 1024), with an odd N-tile count under 15 (N = 1600: 13), or on
    # the cp.async path
    # (2048x1024x16384: 64 such tiles would leave half the SMs idle; the width heuristic's 128 tiles stay)
    for mnk, l in (((8192, 8192, 8192), 2), ((8192, 1000, 4104), 1), ((8192, 1600, 8192), 1), ((2048, 1024, 16384), 1)):
        t = H.default_tiles(*mnk, l, "bfloat16", "k", "mn", "bfloat16", "n")
        assert t.tile_mnk[0] == 128 and t.cluster_mn == (1, 1), (mnk, l)
        assert H.default_raster(*mnk, "bfloat16", l, t) == (4, True)
        assert H.default_raster(*mnk, "bfloat16", l) == (4, True)
    # the swizzle actually run pads the fewest scheduler units (padding units run full mainloops)
    assert H.fit_swizzle(8, True, 8192, 8192, (256, 128), (1, 2)) == 8  # 32 cluster columns
    assert H.fit_swizzle(8, True, 8192, 3000, (256, 128), (1, 2)) == 6  # 12 columns: 8 would pad 4
    assert H.fit_swizzle(4, True, 16384, 4400, (128, 256), (1, 1)) == 3  # 18 columns: 4 would pad 2
    assert H.fit_swizzle(8, False, 3000, 8192, (128, 256), (2, 1)) == 6  # along N: 12 cluster rows
    assert H.fit_swizzle(1, True, 8192, 3000, (256, 128), (1, 2)) == 1
    # never wider than the grid: 1 cluster row (LM-head-like 256 x 32000), 1 N tile (65536 x 128)
    assert H.fit_swizzle(8, False, 256, 32000, (128, 256), (2, 1)) == 1
    assert H.fit_swizzle(4, True, 65536, 128, (128, 128), (1, 1)) == 1
    assert H.fit_swizzle(8, False, 384, 32000, (128, 256), (2, 1)) == 2  # 3 M tiles -> 2 cluster rows
    t = H.default_tiles(8192, 8192, 8192, 1, "bfloat16", "k", "mn", "bfloat16", "n", stream_tiles=False)
    assert t.tile_mnk[0] == 128 and H.default_raster(8192, 8192, 8192, "bfloat16", 1, t) == (4, True)
    # A in L2, 2x1 cluster, more than one wave: swizzle 8 along N; one wave or a 1x1 cluster: swizzle 1
    assert H.default_raster(4096, 14336, 4096, "bfloat16") == (8, False)
    assert H.default_raster(4096, 4096, 4096, "bfloat16") == (8, False)
    assert H.default_raster(4097, 4096, 4096, "bfloat16") == (1, True)  # 33 M tiles: 1x1 cluster
    assert H.default_raster(1000, 3000, 520, "bfloat16") == (1, True)  # 96 tiles: one wave
    t = H.default_tiles(4096, 4096, 4096, 1, "bfloat16", "k", "mn", "bfloat16", "n")
    assert t.cluster_mn == (2, 1)
    # 2x1 whenever the M tiles pair up, small problems included
    assert H.default_tiles(1000, 3000, 520, 1, "bfloat16", "k", "mn", "bfloat16", "n").cluster_mn == (2, 1)
    assert H.default_tiles(4097, 4096, 4096, 1, "bfloat16", "k", "mn", "bfloat16", "n").cluster_mn == (1, 1)
    assert H.default_tiles(200, 136, 72, 1, "bfloat16", "k", "mn", "bfloat16", "n").cluster_mn == (2, 1)


@pytest.mark.gpu
def test_tune_gemm_persists_and_is_used(monkeypatch, tmp_path):
    """gemm(tune=True) times the candidates once, writes the winner to the tuning table, and later
    plain calls run that winner and compute correctly."""
    monkeypatch.setenv("CUTE_KERNELS_TUNE_JOBS", "0")  # compile in the loop: no worker processes in tests
    m, n, k = 1024, 1536, 520
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    with tuned.table_at(tmp_path / "gemm_tuned.json"):
        P.clear_plans()
        out = cute_kernels.gemm(a, b, tune=True)
        check_gemm(out, a, b, what="gemm(tune=True)")
        (entry,) = tuned.load().values()
        assert (tmp_path / "gemm_tuned.json").exists() and entry["ms"] > 0
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        cute_kernels.gemm(a, b, out=out)
        (_, ran), = P.plan(a, b, out).kernels
        assert ran.tiles.tile_mnk[:2] == (entry.get("tile_m", 128), entry["tile_n"])
        # the stored raster, with the strip width fitted to the grid (fit_swizzle)
        sw = H.fit_swizzle(entry["swizzle"], entry["along_m"], m, n, ran.tiles.tile_mnk[:2], ran.tiles.cluster_mn)
        assert (ran.raster_swizzle, ran.raster_along_m) == (sw, entry["along_m"])
        check_gemm(out, a, b, what="tuned gemm")
    P.clear_plans()


def _tuned_table(path, entries: dict):
    import json

    path.write_text(json.dumps(entries))
    return tuned.table_at(path)


def test_tuned_splitk_mode_is_used(tmp_path):
    """A tuned split-K entry ({"splitk": mode}) selects that kernel for the shape (CPU plan): persistent
    -> GemmConfig.splits, none -> no split, cluster -> the DSMEM kernel; an entry of a removed variant
    (the fixup / workspace modes, ping-pong tiles) falls back to the heuristic."""
    key = tuned.key(1024, 1024, 32768, 1, "bfloat16", "k", "mn", "bfloat16")
    a = torch.empty(1024, 32768, dtype=torch.bfloat16)
    b = torch.empty(32768, 1024, dtype=torch.bfloat16)
    kinds = {"persistent": "splitk-persistent", "none": "persistent", "cluster": "splitk-cluster",
             "fixup": "splitk-persistent", "workspace": "splitk-persistent"}
    for mode, kind in kinds.items():
        with _tuned_table(tmp_path / "t.json", {key: dict(splitk=mode, ms=0.1)}), jit.dry_run():
            p = P.make_plan(a, b, allow_cpu=True)
        assert p.kind == kind, mode
        (_, cfg), = p.kernels
        assert cfg.splits == {"persistent": 4, "none": 1, "cluster": 2}.get(mode, 4), mode
    entry = dict(tile_m=128, tile_n=192, pingpong=True, cluster=[2, 1], swizzle=1, along_m=True, ms=0.1)
    key = tuned.key(4096, 4096, 4096, 1, "bfloat16", "k", "mn", "bfloat16")
    with _tuned_table(tmp_path / "t.json", {key: entry}):
        assert explain(4096, 4096, 4096)[0]["tile_mnk"] == (128, 256, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("m,modes", [(128, ("cluster", "persistent", "none")),
                                     (16, ("cluster", "persistent", "none", "swap"))], ids=["splitk", "skinny"])
def test_tune_gemm_splitk_shape(m, modes, monkeypatch, tmp_path):
    """gemm(tune=True) on a split-K shape times the split-K kernels and the unsplit one (with M <= 64
    also the transposed plan, entry "swap"), stores the winning mode, and later calls use it and
    compute correctly."""
    monkeypatch.setenv("CUTE_KERNELS_TUNE_JOBS", "0")
    n, k = 4096, 4096
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    with tuned.table_at(tmp_path / "gemm_tuned.json"):
        P.clear_plans()
        out = cute_kernels.gemm(a, b, tune=True)
        check_gemm(out, a, b, what="gemm(tune=True)")
        (entry,) = tuned.load().values()
        assert entry["splitk"] in modes and entry["ms"] > 0
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        cute_kernels.gemm(a, b, out=out)
        check_gemm(out, a, b, what="tuned gemm")
        assert P.plan(a, b, out).swapped == (entry["splitk"] == "swap")
    P.clear_plans()


# ---------------------------------------------------------------- PDL, lean tiles, deferred epilogue


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(4096, 4096, 256), (2000, 2000, 104), (777, 1000, 1), (1000, 3000, 520),
                                 (8200, 2000, 4104), (4096, 4096, 4096), (1030, 2056, 264)], ids=str)
@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_gemm_epi_defer(mnk, alpha):
    """The deferred epilogue (a tile's sub-tiles stored during the next tile's first k-tiles) gives
    the same bits as the default epilogue and matches the float64 reference, NaN-poisoned outputs.
    K = 256: as many k-tiles as sub-tiles (4); K = 104 and K = 1: fewer, so sub-tiles are stored
    after the mainloop; several tiles per CTA (4096 x 4096: 512 tiles; the small shapes on 2 clusters
    through ``max_active_clusters``); 8200 x 2000 x 4104: the 256 x 128 stream tiles; alpha != 1
    (scaled in registers before the conversion).  (K must keep A's and B's rows 16-byte multiples:
    otherwise the plan takes the cp.async mainloop, which has no deferred epilogue.)"""
    m, n, k = mnk
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    few = 2 if m * n < 4096 * 4096 else None  # several tiles per CTA
    outs = []
    for defer in (False, True):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        P.run(a, b, out, None, alpha, choice=P.PlanChoice(epi_defer=defer, max_active_clusters=few))
        outs.append(out)
    torch.cuda.synchronize()
    ref = gemm_reference(a, b, alpha)
    for defer, out in zip((False, True), outs):
        check_gemm(out, a, b, alpha, ref=ref, what=f"epi_defer={defer}")
    assert torch.equal(outs[0], outs[1])


def test_epi_defer_default_rule():
    """CPU: the planner turns the deferred epilogue on for eligible plans with more tiles than SMs
    (a next mainloop to hide the stores under) and nowhere else."""
    def cfg_of(m, n, k, **kw):
        return explain(m, n, k, **kw)[0]["config"]

    assert cfg_of(4096, 4096, 4096).epi_defer  # 512 tiles of 128 x 256
    assert explain(4096, 4096, 4096)[0]["epilogue"].startswith("deferred")
    assert explain(1000, 3000, 520)[0]["epilogue"] == "per tile"
    assert cfg_of(8192, 8192, 8192).epi_defer  # 256 x 128 stream tiles
    assert not cfg_of(1000, 3000, 520).epi_defer  # 128 tiles: one wave
    assert not cfg_of(4096, 4096, 4096, out_dtype=torch.float32).epi_defer  # fp32 D
    assert not cfg_of(4096, 4096, 4096, with_c=True).epi_defer  # beta * C


def test_plan_choice_overrides_defaults():
    """CPU: a PlanChoice replaces the planner's own choice of the same field and reaches the config."""
    a = torch.empty(4096, 4096, dtype=torch.bfloat16)
    seen = []
    for choice in (P.PlanChoice(), P.PlanChoice(epi_defer=False), P.PlanChoice(max_active_clusters=1),
                   P.PlanChoice(raster=(1, True))):
        (cfg,) = planned_configs(a, a, choice=choice)
        seen.append((cfg.epi_defer, cfg.max_active_clusters, cfg.raster_swizzle))
    assert seen == [(True, 66, 8), (False, 66, 8), (True, 1, 8), (True, 66, 1)]
    with pytest.raises(ValueError, match="splitk_mode"):
        P.PlanChoice(splitk_mode="fixup")


def test_epi_defer_eligibility():
    """CPU: the deferred epilogue is refused (clear ValueError) where its converted copy of a tile
    cannot exist: fp32 D, beta * C, split-K, > 128 accumulators per thread."""
    from cute_kernels.gemm.kernel import GemmSm90, epi_defer_ok

    base = GemmConfig(tiles=H.make_gemm_tiles(256, (2, 1), "bfloat16", "k", "mn", "bfloat16"), epi_defer=True)
    assert epi_defer_ok(base)
    GemmSm90(base)
    bad = [
        GemmConfig(tiles=H.make_gemm_tiles(256, (2, 1), "bfloat16", "k", "mn", "float32"), epi_defer=True),
        GemmConfig(tiles=base.tiles, has_c=True, epi_defer=True),
        GemmConfig(tiles=base.tiles, splits=2, epi_defer=True),
        GemmConfig(tiles=H.make_gemm_tiles(192, (1, 2), "bfloat16", "k", "mn", "bfloat16", tile_m=256), epi_defer=True),
    ]
    for cfg in bad:
        assert not epi_defer_ok(cfg)
        with pytest.raises(ValueError, match="epi_defer"):
            GemmSm90(cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("defer", [None, True, False], ids=["default", "defer", "nodefer"])
def test_gemm_pdl_chain(defer):
    """Programmatic dependent launch, enqueued back to back with no host sync: a chain of GEMMs each
    reading the previous one's NaN-poisoned-then-written output (read after write), then a GEMM
    overwriting the input the GEMM before it reads (write after read).  A kernel that touched
    global memory before its predecessor finished would read NaN / stale data or clobber an input."""
    m = n = k = 2048
    choice = P.PlanChoice(epi_defer=defer)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) / 8
    ws = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / 45 for _ in range(4)]
    outs, h = [], x
    for w in ws:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        P.run(h, w, out, choice=choice)
        outs.append(out)
        h = out
    last = outs[-1].clone()
    r = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    P.run(outs[-1], ws[2], r, choice=choice)  # reads outs[-1] ...
    P.run(x, ws[1], outs[-1], choice=choice)  # ... which this overwrites
    torch.cuda.synchronize()
    checks = [(x, ws[0], outs[0])] + [(outs[i - 1], ws[i], outs[i]) for i in range(1, 3)]
    checks += [(outs[2], ws[3], last), (last, ws[2], r), (x, ws[1], outs[-1])]
    for i, (lhs, w, out) in enumerate(checks):
        check_gemm(out, lhs, w, what=f"PDL chain step {i}")


# ---- skinny problems (M <= 64) run transposed: out^T = b^T a^T ------------------------------------
def test_skinny_swap_plan():
    """The planner swaps unbatched M <= 64 problems (narrowest 16 / 32 / 64 N tile holding M, K split to
    fill the SMs), not M = 65 or batched ones; explain says so."""
    assert H.skinny_swap_choice(1, 4096, 4096) == (16, 4, 1)
    assert H.skinny_swap_choice(17, 4096, 4096) == (32, 4, 1)
    assert H.skinny_swap_choice(16, 4096, 520) == (16, 1, 1)  # 9 k-tiles: no split
    # 32 < M <= 64: two 32-wide CTAs share each weight tile (1 x 2 cluster, multicast) where the pairs
    # fit in one wave, with slices of >= 64 k-tiles through the workspace
    assert H.skinny_swap_choice(64, 4096, 4096) == (32, 1, 2)
    assert H.skinny_swap_choice(33, 4096, 4096) == (32, 1, 2)
    assert H.skinny_swap_choice(64, 4096, 11008) == (32, 2, 2) and H.skinny_swap_choice(64, 4096, 11008).fixup
    assert H.skinny_swap_choice(64, 14336, 4096) == (64, 1, 1)  # 224 CTAs in pairs: one 64-wide CTA per tile
    assert not H.skinny_swap_choice(64, 4096, 4096).fixup and H.skinny_swap_choice(1, 4096, 4096).fixup
    # the pairs only where they were GPU-tested: no C, 16-bit out (the planner's mcast=False otherwise)
    assert H.skinny_swap_choice(64, 4096, 4096, mcast=False) == (64, 2, 1)
    assert explain(64, 4096, 4096)[0]["cluster_mn"] == (1, 2)
    assert explain(64, 4096, 4096, with_c=True)[0]["cluster_mn"] == (1, 1)
    assert explain(64, 4096, 4096, out_dtype=torch.float32)[0]["cluster_mn"] == (1, 1)
    assert H.skinny_swap_choice(65, 4096, 4096) is None
    rows = explain(16, 4096, 4096)
    assert rows[0]["operands"].startswith("swapped") and rows[0]["tile_mnk"] == (128, 16, 64)
    assert "operands" not in explain(16, 4096, 4096, batch=2)[0]
    assert "operands" not in explain(65, 4096, 4096)[0]


def test_skinny_swap_without_pairs():
    """Without the multicast pairs (C or an fp32 output) 32 < M <= 64 takes the 64-wide tile."""
    assert H.skinny_swap_choice(64, 4096, 4096, mcast=False) == (64, 2, 1)  # 64-wide, short slices: DSMEM pairs
    assert H.skinny_swap_choice(64, 4096, 11008, mcast=False) == (64, 4, 1)  # long slices: the fixup pays off
    assert explain(64, 4096, 4096, with_c=True)[0]["cluster_mn"] == (1, 1)
    assert explain(64, 4096, 4096)[0]["cluster_mn"] == (1, 2)


@pytest.mark.parametrize("tn,s,kind,am,mc", [(16, 4, "fixup", "mn", 1), (16, 1, "cluster", "mn", 1),
                                             (32, 2, "cluster", "k", 1), (32, 4, "fixup", "k", 1),
                                             (32, 1, "cluster", "mn", 2), (32, 2, "fixup", "mn", 2)], ids=str)
def test_skinny_swap_compiles(tn, s, kind, am, mc):
    """The swapped kernels' narrow tiles (wgmma 64 x 16 / 32) with the weight as an MN- or K-major A
    and its L2 evict-first hint, also on a multicast load (``mc``: CTAs along N sharing the weight
    tile): sm_90a builds without local memory."""
    from cute_kernels.gemm.splitk_kernel import SplitKClusterConfig, SplitKFixupConfig

    tiles = H.splitk_tiles(tn, "bfloat16", am, "k" if am == "mn" else "mn", "bfloat16", mc)
    Cfg = SplitKFixupConfig if kind == "fixup" else SplitKClusterConfig
    rep, k = _splitk_compile_report(Cfg(tiles=tiles, splits=s, a_evict_first=True), tn)
    assert k.spills == 0


SKINNY_SHAPES = [(1, 4096, 4096), (7, 1000, 520), (16, 14336, 4096), (31, 4104, 4168), (33, 8192, 1032),
                 (64, 4096, 4096), (2, 136, 64), (57, 2000, 8200), (64, 14336, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("majors", ["rr", "cr", "rc"])
@pytest.mark.parametrize("mnk", SKINNY_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_skinny_swapped(mnk, majors):
    """gemm() on skinny problems (the swapped plan): float64 reference, NaN-poisoned out, ragged N / K,
    K slices met in shared memory (S <= 2) or an L2 workspace (S > 2), bitwise repeatable.  A
    column-major A whose M is not a multiple of 8 breaks TMA's 16-byte rule: the default plan copies it
    into an aligned buffer and runs swapped when ``heuristics.stage_misaligned`` says the copy pays,
    else takes the cp.async plan (not swapped); both are checked the same way."""
    m, n, k = mnk
    a = _operand((m, k), "row" if majors[0] == "r" else "col", torch.bfloat16)
    b = _operand((k, n), "row" if majors[1] == "r" else "col", torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cute_kernels.gemm(a, b, out=out)
    tma_ok = majors[0] == "r" or m % 8 == 0 or m == 1
    p = P.plan(a, b, out)
    staged = p.a_stage is not None
    assert not (tma_ok and staged) and p.b_stage is None
    assert p.swapped == (tma_ok or staged)
    if not tma_ok and m % 2:
        assert staged  # an odd M leaves the cp.async mainloop element-wide vectors: always staged
    check_gemm(out, a, b)
    for _ in range(3):
        again = torch.full_like(out, float("nan"))
        cute_kernels.gemm(a, b, out=again)
        assert torch.equal(out, again)


@pytest.mark.gpu
@pytest.mark.parametrize("c_kind", ["row", "transposed", "fp32"])
def test_gemm_skinny_swapped_alpha_beta(c_kind):
    """alpha / beta * C through the transposed views, bf16 and fp32 out."""
    _check_alpha_beta_c(12, 3000, 4096, c_kind)


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(48, 3000, 4096), (64, 4096, 11008)], ids=str)
@pytest.mark.parametrize("c_kind", ["row", "transposed", "fp32"])
def test_gemm_skinny_pairs_alpha_beta(c_kind, mnk):
    """alpha / beta * C and an fp32 output through the multicast pairs (32 < M <= 64; one slice in
    the DSMEM kernel, two through the fixup workspace).  The planner routes these to the pairs only
    with ``PlanChoice(skinny_pairs_any_epilogue=True)`` until this test has passed on the GPU (then
    drop the guard)."""
    m, n, k = mnk
    choice = P.PlanChoice(skinny_pairs_any_epilogue=True)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = make_c(c_kind, m, n)
    for out_dtype in (torch.bfloat16, torch.float32):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
        P.run(a, b, out, c, 0.75, 0.5, choice=choice)
        check_gemm(out, a, b, 0.75, 0.5, c, what=f"gemm C {c_kind}")
        p = P.plan(a, b, out, c, 0.5, choice=choice)
        assert p.swapped and p.kernels[-1][1].tiles.cluster_mn == (1, 2)


def test_skinny_swap_tuned_entry(tmp_path):
    """A tuned entry "swap" keeps the transposed plan; a tuned split-K mode replaces it (the tuner
    times the transposed plan as a candidate, so it only loses when something else was faster); a
    "swap" entry for a shape the transposed plan does not take runs the cluster split-K."""
    key = tuned.key(16, 4096, 4096, 1, "bfloat16", "k", "mn", "bfloat16")
    with _tuned_table(tmp_path / "t.json", {key: {"splitk": "swap", "ms": 0.017}}):
        assert explain(16, 4096, 4096)[0]["operands"].startswith("swapped")
    with _tuned_table(tmp_path / "t.json", {key: {"splitk": "cluster", "ms": 0.025}}):
        assert "operands" not in explain(16, 4096, 4096)[0]
    key = tuned.key(65, 4096, 4096, 1, "bfloat16", "k", "mn", "bfloat16")
    with _tuned_table(tmp_path / "t.json", {key: {"splitk": "swap", "ms": 0.017}}):
        rows = explain(65, 4096, 4096)
    assert "operands" not in rows[0] and rows[0]["kernel"] == "gemm_sm90_splitk_cluster"


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(16, 4096, 4096), (64, 14336, 4096)], ids=str)
def test_gemm_skinny_swapped_graph_and_compile(mnk):
    """The transposed plan under CUDA-graph capture (its fixup workspace and counters are made for the
    capture) with new inputs at replay, and under torch.compile."""
    m, n, k = mnk
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    g = capture_graph(lambda: cute_kernels.gemm(a, b, out=out))
    assert P.plan(a, b, out).swapped
    for _ in range(2):
        a.copy_(torch.randn_like(a))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check_gemm(out, a, b, what="graph replay")
    f = torch.compile(lambda x, y: cute_kernels.gemm(x, y) + 1, fullgraph=True)
    check_gemm(f(a, b), a, b, beta=1.0, c=torch.ones(m, n, device="cuda"), what="torch.compile gemm + 1")
