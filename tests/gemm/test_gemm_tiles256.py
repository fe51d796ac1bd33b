"""Cooperative 256 x N GEMM tiles (quack's sm90 space: 256 x {128, 160, 192, 208}): two consumer
warpgroups, each computing two 64-row wgmma M-blocks (rows 64w.. and 128+64w..) of every tile.

CPU: tile descriptions (stages, epilogue sub-tile, accumulator registers, register split), sm_90a
compiles with resource checks, the C-fragment ownership of the 256-row tile and the epilogue's
register -> tile map, the tuner's candidate list.  GPU: numerics against a float64 reference,
elementwise with the tails named (``_check.check_gemm``), NaN-poisoned outputs, ragged shapes,
multi-tile persistent CTAs with odd k-tile counts, alpha/beta/C, dtypes, batched, column-major /
unaligned D.  The GPU tests pin the kernel: explicit 256-row tiles, split-K off, and a check that the
compiled config really has 256-row tiles.
"""

import itertools
import json
import re

import pytest
import torch

from conftest import VARIANT_SHAPES, check_gemm_compile, forced_tiles_gemm
from _check import (check_alpha_beta, check_batched, check_dtypes, check_gemm, check_random, check_shapes_majors,
                    check_unaligned_out)

import cute_kernels  # noqa: F401  (sets the arch before cutlass is imported)
from cute_kernels.common.arch import current_arch
from cute_kernels.gemm import heuristics as H
from cute_kernels.gemm import launch, tune, tuned
from cute_kernels.gemm import plan as P
from cute_kernels.gemm.kernel import GemmConfig, GemmSm90
from layouts import tiles as T
from layouts.explore import epilogue_register_map

WIDTHS = (128, 160, 192, 208)


def tiles256(tile_n, cluster=(1, 1), a_major="k", b_major="mn", d="bfloat16", c_major="n", ab="bfloat16"):
    return H.make_gemm_tiles(tile_n, cluster, ab, a_major, b_major, d, c_major, tile_m=256)


# ------------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("tile_n", WIDTHS)
def test_tiles256_description(tile_n):
    t = tiles256(tile_n, (2, 1))
    assert t.tile_mnk == (256, tile_n, 64) and not t.pingpong
    assert t.mma.warpgroups_mn == (2, 1) and t.mma.tile_mn == (128, tile_n)
    assert t.m_blocks_per_warpgroup == 2 and t.acc_regs_per_thread == tile_n
    assert t.epi_tile_mn[0] == 128 and tile_n % t.epi_tile_mn[1] == 0
    assert t.epi_tile_mn[1] == (64 if tile_n == 128 else 16 if tile_n == 208 else 32)
    assert t.ab_stages == (4 if tile_n <= 160 else 3)
    assert t.smem_bytes() + 1024 <= 227 * 1024
    k = GemmSm90(GemmConfig(tiles=t))
    assert k.threads == 384 and k.num_mma_threads == 256
    assert (k.PRODUCER_REGS, k.CONSUMER_REGS) == ((24, 240) if tile_n >= 208 else (40, 232))
    assert 128 * k.PRODUCER_REGS + 256 * k.CONSUMER_REGS <= 168 * 384  # what the launch allocates
    # fp32 D: the epilogue buffers are twice as large, still >= 3 stages
    assert tiles256(tile_n, d="float32").ab_stages >= 3


def test_tiles256_rejects():
    with pytest.raises(ValueError, match="tile_m"):
        H.make_gemm_tiles(128, (1, 1), "bfloat16", "k", "k", "bfloat16", tile_m=192)
    with pytest.raises(ValueError, match="accumulator registers"):  # 256 regs of accumulators per thread
        T.GemmTiles(tile_mnk=(256, 256, 64), mma=T.MmaTile(atom_n=256), ab_stages=2)
    # the existing tiles keep their register split
    assert GemmSm90(GemmConfig(tiles=H.make_gemm_tiles(256, (2, 1), "bfloat16", "k", "mn", "bfloat16"))).CONSUMER_REGS == 232


COMPILE_CASES = [
    # (tile_n, cluster, a_major, b_major, rank, has_c, tma_store, d dtype, c_major)
    (128, (2, 1), "k", "mn", 2, False, True, "bfloat16", "n"),
    (160, (2, 1), "k", "mn", 2, False, True, "bfloat16", "n"),
    (192, (2, 1), "k", "mn", 2, False, True, "bfloat16", "n"),
    (208, (2, 1), "k", "mn", 2, False, True, "bfloat16", "n"),
    (128, (1, 2), "mn", "mn", 2, False, True, "float16", "m"),
    (208, (1, 2), "k", "mn", 2, False, True, "float16", "m"),
    (128, (1, 1), "k", "k", 3, True, True, "float32", "n"),
    (160, (1, 1), "k", "k", 3, True, True, "float32", "n"),
    (192, (1, 1), "k", "k", 3, True, True, "float32", "n"),
    (208, (1, 1), "k", "k", 3, True, True, "float32", "n"),
    (160, (1, 1), "k", "k", 2, True, True, "bfloat16", "n"),
    (208, (1, 1), "k", "mn", 2, True, True, "bfloat16", "n"),
    (208, (1, 1), "mn", "k", 2, False, False, "bfloat16", "n"),
    # not here: 192 + C + bf16 D (rank 2) spills 24 B at 232 registers (ptxas; 240 spills more elsewhere)
]


@pytest.mark.parametrize("case", COMPILE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_tiles256_compiles_for_sm90a(case):
    """HGMMA 64xNx16 + TMA present, no local memory, the register split the kernel asks for, and the
    highest register used within it."""
    _, kern, sass = check_gemm_compile(case, tile_m=256)
    assert re.search(rf"HGMMA\.64x{case[0]}x16\.F32", sass), "wgmma 64 x N x 16 missing"
    assert max(int(r) for r in re.findall(r"\bR(\d+)\b", sass)) < kern.CONSUMER_REGS


#: the threads the ownership probe walks: every lane of warp 0, and lanes 0 / 5 / 31 of the other seven
#: warps (the fragment is affine in lane % 4, lane // 4, warp and warpgroup, so these pin it down; all
#: 256 threads cost ~10x the compile time for no further coverage)
PROBED_THREADS = tuple(range(32)) + tuple(32 * w + lane for w in range(1, 8) for lane in (0, 5, 31))


@pytest.mark.filterwarnings("ignore:This static loop has")  # a host-side walk over the probed threads, unrolled
@pytest.mark.parametrize("tile_n", [128, 208])
def test_tiles256_c_fragment_ownership(tile_n):
    """partition_C of the 256 x N tile, element by element for :data:`PROBED_THREADS`: thread t
    (warpgroup wg, warp w within it, lane l) holds N accumulators, M-block-major (register i < N/2:
    the first M-block), and register i of M-block blk is the wgmma fragment's element: row
    128 blk + 64 wg + 16 w + l // 4 + 8 ((i // 2) % 2), column 8 (i // 4) + 2 (l % 4) + i % 2 (i within the
    block).  That map is one-to-one over the 256 threads onto the 256 x N tile, so every element is
    owned exactly once."""
    import cutlass
    import cutlass.cute as cute

    t = tiles256(tile_n)
    found = {}

    @cute.jit
    def probe():
        tiled_mma = T.make_tiled_mma(t.mma)
        ident = cute.make_identity_tensor((256, tile_n))
        bad = []
        for thr in cutlass.range_constexpr(len(PROBED_THREADS)):
            thr = PROBED_THREADS[thr]
            tCcD = tiled_mma.get_slice(thr).partition_C(ident)
            n = cute.size(tCcD)
            wg, w, lane = thr // 128, (thr % 128) // 32, thr % 32
            if cutlass.const_expr(n != tile_n):
                bad.append(("count", thr, n))
            for i in cutlass.range_constexpr(n):
                blk, ib = i // (tile_n // 2), i % (tile_n // 2)
                want = (128 * blk + 64 * wg + 16 * w + lane // 4 + 8 * ((ib // 2) % 2), 8 * (ib // 4) + 2 * (lane % 4) + ib % 2)
                r, c = tCcD[i]
                if cutlass.const_expr((r, c) != want):
                    bad.append((thr, i, (r, c), want))
        found["bad"] = bad

    cute.compile(probe)
    assert not found["bad"], found["bad"][:10]
    # the expected map is a bijection: distinct (thread, register) pairs give distinct elements
    owned = {(128 * (i // (tile_n // 2)) + 64 * (t // 128) + 16 * (t % 128 // 32) + t % 32 // 4 + 8 * (i % (tile_n // 2) // 2 % 2),
              8 * (i % (tile_n // 2) // 4) + 2 * (t % 4) + i % 2) for t in range(256) for i in range(tile_n)}
    assert len(owned) == 256 * tile_n and all(0 <= r < 256 and 0 <= c < tile_n for r, c in owned)


EPI_MAP_CASES = [(128, "bfloat16", "n"), (160, "bfloat16", "n"), (192, "bfloat16", "n"), (208, "bfloat16", "n"),
                 (208, "float32", "n"), (128, "float16", "m"), (192, "float32", "m")]


@pytest.mark.parametrize("case", EPI_MAP_CASES, ids=lambda c: "-".join(map(str, c)))
def test_tiles256_epilogue_register_map(case):
    """The epilogue copies accumulator register ``e * n_rD + v`` into sub-tile e's register v, sub-tiles
    enumerated M-block-major (``epi_order``): both views must name the same element of the 256-row tile."""
    tile_n, cd, cmaj = case
    t = tiles256(tile_n, d=cd, c_major=cmaj)
    found = epilogue_register_map(t, thread_step=7)
    assert found["checked"] > 0 and found["bad"] == 0, found


def test_tuner_candidates():
    """<= 9 first-round candidates (+ 2 rasters) per shape, all with the shape's default raster; the
    256-row and 2x1/1x2 tiles are among them for the large shapes, every cluster tiles its grid, and
    the heuristic's pick is first."""
    for m, n in ((4096, 4096), (8192, 8192), (16384, 4096), (4096, 14336), (128, 4096), (1000, 3000), (4097, 4096)):
        cands = tune.candidates(m, n, "bfloat16", "k", "mn", "bfloat16", 4096, 1)
        assert 1 <= len(cands) <= 9 and len(set(cands)) == len(cands)
        d = H.default_tiles(m, n, 4096, 1, "bfloat16", "k", "mn", "bfloat16", "n")
        assert cands[0][:3] == (*d.tile_mnk[:2], d.cluster_mn)
        for c in cands[1:]:
            tile_m, tile_n, cluster, swizzle, along_m = c
            assert (swizzle, along_m) == H.default_raster(m, n, 4096, "bfloat16")
            assert cluster == (1, 1) or (cluster[0] == 2 and -(-m // tile_m) % 2 == 0) or \
                (cluster[1] == 2 and -(-n // tile_n) % 2 == 0)
            tune.candidate_choice(c, "bfloat16", "k", "mn", "bfloat16")  # builds the tiles
    cands = tune.candidates(8192, 8192, "bfloat16", "k", "mn", "bfloat16", 8192, 1)
    have = {(c[0], c[1], c[2]) for c in cands}
    for tn in (128, 192):
        assert (256, tn, (2, 1)) in have
    assert (256, 128, (1, 2)) in have and (128, 192, (2, 1)) in have


def test_tuned_entry_roundtrip(tmp_path):
    """A tuned 256-row entry comes back as those tiles; old entries (no tile_m) as 128-row tiles."""
    key = tuned.key(8192, 8192, 8192, 1, "bfloat16", "k", "mn", "bfloat16")
    key_old = tuned.key(4096, 4096, 4096, 1, "bfloat16", "k", "mn", "bfloat16")
    path = tmp_path / "gemm_tuned.json"
    path.write_text(json.dumps({
        key: dict(tile_m=256, tile_n=208, pingpong=False, cluster=[1, 2], swizzle=4, along_m=True),
        key_old: dict(tile_n=192, cluster=[2, 1], swizzle=1, along_m=True)}))
    with tuned.table_at(path):
        t, raster, mode = tuned.lookup(8192, 8192, 8192, 1, "bfloat16", "k", "mn", "bfloat16")
        assert mode is None
        assert t.tile_mnk == (256, 208, 64) and t.cluster_mn == (1, 2) and raster == (4, True)
        t, _, _ = tuned.lookup(4096, 4096, 4096, 1, "bfloat16", "k", "mn", "bfloat16")
        assert t.tile_mnk == (128, 192, 64)


# ------------------------------------------------------------------------------------------- GPU
def _cluster_ok(m, n, tile_n, cluster):
    return (cluster[0] == 1 or -(-m // 256) % 2 == 0) and (cluster[1] == 1 or -(-n // tile_n) % 2 == 0)


@pytest.fixture
def gemm256():
    """gemm through the real host path with explicit 256-row tiles, split-K off, and a check that the
    compiled config has them (TMA mainloop)."""
    def expect(cfg, tile_n):
        want = 160 if tile_n == 192 and cfg.has_c else tile_n  # the host narrows 256x192 with C (spill)
        assert cfg.tiles.tile_mnk[:2] == (256, want), cfg

    return forced_tiles_gemm(dict(tile_m=256), expect)


@pytest.mark.gpu
@pytest.mark.parametrize("tile_n", WIDTHS)
def test_tiles256_smoke(gemm256, tile_n):
    """First GPU contact: 1-2 tiles per CTA, 3 k-tiles per tile (not a multiple of the stage count),
    cluster 2x1 multicast."""
    check_random(gemm256, (2560, 2080, 136), tile_n=tile_n, cluster=(2, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", VARIANT_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("majors,tile_n", [(mj, 128) for mj in itertools.product(["row", "col"], repeat=2)]
                         + [(mj, 208) for mj in itertools.product(["row", "col"], repeat=2)]
                         + [(("row", "row"), 160), (("col", "row"), 192)], ids=lambda x: str(x))
def test_tiles256_shapes_majors(gemm256, mnk, majors, tile_n):
    check_shapes_majors(gemm256, mnk, majors, tile_n)


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(2560, 2048, 136), (4096, 4096, 4160), (8192, 1024, 200), (4096, 2048, 64),
                                 (2048, 3328, 384), (3840, 2304, 840), (512, 17472, 72)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("tile_n,cluster", [(128, (2, 1)), (128, (1, 2)), (160, (2, 1)), (192, (1, 1)),
                                            (192, (2, 1)), (208, (1, 1)), (208, (2, 1)), (208, (1, 2))],
                         ids=lambda x: str(x))
def test_tiles256_persistent_multi_tile(gemm256, mnk, tile_n, cluster):
    """Many tiles per CTA, k-tile counts 1, 3, 4, 6, 14, 65 (stages: 4 for N <= 160, 3 above), so the
    ring's phase carries across tiles at every offset; clusters only where they tile the grid."""
    if not _cluster_ok(mnk[0], mnk[1], tile_n, cluster):
        pytest.skip("cluster does not tile this grid")
    check_random(gemm256, mnk, tile_n=tile_n, cluster=cluster)


@pytest.mark.gpu
@pytest.mark.parametrize("tile_n", [128, 192, 208])
@pytest.mark.parametrize("c_kind", ["row", "transposed", "fp32"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_tiles256_alpha_beta(gemm256, c_kind, out_dtype, tile_n):
    check_alpha_beta(gemm256, c_kind, out_dtype, tile_n)


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_tiles256_dtypes(gemm256, in_dtype, out_dtype):
    check_dtypes(gemm256, in_dtype, out_dtype, tile_n=208)


@pytest.mark.gpu
@pytest.mark.parametrize("majors", [("row", "row"), ("col", "col")])
@pytest.mark.parametrize("tile_n", [128, 208])
def test_tiles256_batched(gemm256, majors, tile_n):
    check_batched(gemm256, majors, tile_n)


@pytest.mark.gpu
@pytest.mark.parametrize("tile_n", [128, 208])
def test_tiles256_unaligned_out(gemm256, tile_n):
    check_unaligned_out(gemm256, tile_n=tile_n)


@pytest.mark.gpu
@pytest.mark.parametrize("tile_n,cluster", [(128, (1, 2)), (208, (2, 1))])
def test_tiles256_column_major_out_kernel(tile_n, cluster):
    """Column-major D through the kernel itself (the host plan rebuilds column-major tiles 128 rows
    high, so this compiles the 256-row config directly): TMA store of M-major sub-tiles."""
    m, n, k = 2048, 2048, 520
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    out = torch.full((n, m), float("nan"), device="cuda", dtype=torch.float16).t()
    t = tiles256(tile_n, cluster, "k", "mn", "float16", "m", "float16")
    cfg = GemmConfig(tiles=t, a_rank=2, has_c=False, tma_store=True,
                     max_active_clusters=current_arch().sm_count // (cluster[0] * cluster[1]))
    fn = launch.compiled(cfg, "float16", "float16", "float16")
    fn(a, b, out, out, 1.0, 0.0)
    torch.cuda.synchronize()
    check_gemm(out, a, b)


@pytest.mark.gpu
def test_tuned_256_entry_is_used(tmp_path):
    """A tuned 256-row entry on disk is what a plain gemm() call compiles and runs."""
    m, n, k = 4096, 4096, 1024
    path = tmp_path / "gemm_tuned.json"
    path.write_text(json.dumps({tuned.key(m, n, k, 1, "bfloat16", "k", "mn", "bfloat16"):
                                dict(tile_m=256, tile_n=160, cluster=[2, 1], swizzle=1, along_m=True)}))
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    with tuned.table_at(path):
        P.clear_plans()
        cute_kernels.gemm(a, b, out=out)
        assert P.plan(a, b, out).kernels[-1][1].tiles.tile_mnk == (256, 160, 64)
    P.clear_plans()
    check_gemm(out, a, b)


def test_swapped_operands_plan_256x128():
    """quack's 8192^3 winner computes out^T = b^T a^T (swap_ab) on 256x128 tiles in 1x2 clusters;
    forced through the planner: b^T is M-major A, a^T K-major B, and out^T a column-major D.  The plan
    keeps the 256-row tile and cluster, writes D M-major, and the kernel compiles for sm_90a without
    local memory."""
    from conftest import planned_configs

    from cute_kernels.tools import inspect as ins

    a = torch.empty(8192, 8192, dtype=torch.bfloat16)
    b = torch.empty(8192, 8192, dtype=torch.bfloat16)
    out = torch.empty(8192, 8192, dtype=torch.bfloat16)
    tiles = H.make_gemm_tiles(128, (1, 2), "bfloat16", "mn", "k", "bfloat16", tile_m=256)
    (cfg,) = planned_configs(b.mT, a.mT, out.mT, choice=P.PlanChoice(tiles=tiles, raster=(8, True)))
    assert cfg.tiles.tile_mnk[:2] == (256, 128) and cfg.tiles.cluster_mn == (1, 2)
    assert cfg.tiles.c_major == "m" and (cfg.raster_swizzle, cfg.raster_along_m) == (8, True)
    (k,) = ins.inspect_builder(lambda: launch.fake_args(cfg, "bfloat16", "bfloat16", "bfloat16")).kernels
    assert k.spills == 0 and k.instructions["HGMMA"] > 0
