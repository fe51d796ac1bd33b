"""Ping-pong GEMM consumers (GemmTiles.pingpong).  CPU: tile validation, plan selection, sm_90a compiles
with resource checks, the epilogue's register -> tile map.  GPU: numerics against a float64 reference
with NaN-poisoned outputs, ragged shapes, multi-tile persistent CTAs with odd k-tile counts, alpha/beta/C,
batched, every output path (TMA store, column-major D, predicated direct stores).

The GPU tests pin the kernel: explicit ping-pong tiles, split-K off (``FORCE_SPLITS = 1``), and a check
that the config that was compiled really is a ping-pong one.
"""

import itertools
import re

import pytest
import torch

from conftest import (VARIANT_SHAPES, check_alpha_beta, check_gemm_compile, check_batched, check_dtypes, check_random,
                      check_shapes_majors, check_unaligned_out, forced_tiles_gemm, rel_err)
from conftest import gemm_ref as _ref

import cute_kernels  # noqa: F401  (sets the arch before cutlass is imported)
from cute_kernels.gemm import host as G
from cute_kernels.gemm.kernel import GemmConfig, GemmSm90
from layouts import tiles as T
from layouts.explore import epilogue_register_map


# ------------------------------------------------------------------------------------------- CPU
def test_pingpong_tiles():
    t = G.make_gemm_tiles(128, (2, 1), "bfloat16", "k", "mn", "bfloat16", pingpong=True)
    assert t.pingpong and t.mma.warpgroups_mn == (1, 1) and t.mma.tile_mn == (64, 128)
    assert t.epi_tile_mn[0] == 64 and t.num_consumer_warpgroups == 2 and t.epi_buffers == 2 * t.epi_stages
    assert t.ab_stages >= 4 and t.smem_bytes() + 1024 <= 227 * 1024
    t192 = G.make_gemm_tiles(192, (2, 1), "bfloat16", "k", "mn", "bfloat16", pingpong=True)
    assert t192.ab_stages >= 4 and t192.smem_bytes() + 1024 <= 227 * 1024
    with pytest.raises(ValueError, match="ping-pong"):  # two-warpgroup MMA cannot ping-pong
        T.GemmTiles(tile_mnk=(128, 128, 64), mma=T.MmaTile(atom_n=128), pingpong=True)
    with pytest.raises(ValueError, match="ping-pong"):  # the MMA must span the tile's N
        T.GemmTiles(tile_mnk=(128, 256, 64), mma=T.MmaTile(atom_n=128, warpgroups_mn=(1, 2)),
                    epi_tile_mn=(64, 32), pingpong=True)
    coop = G.make_gemm_tiles(256, (2, 1), "bfloat16", "k", "mn", "bfloat16")
    assert not coop.pingpong and coop.epi_buffers == coop.epi_stages and coop.mma.warpgroups_mn == (2, 1)
    k = GemmSm90(GemmConfig(tiles=t))
    assert k.threads == 384 and k.num_mma_threads == 128 and k.CONSUMER_REGS == 232
    k192 = GemmSm90(GemmConfig(tiles=t192))
    assert (k192.PRODUCER_REGS, k192.CONSUMER_REGS) == (24, 240)
    assert 128 * k192.PRODUCER_REGS + 256 * k192.CONSUMER_REGS <= 65536
    # the barrier ids of the two schemes do not collide with each other or with barrier 0
    ids = {GemmSm90.EPI_BARRIER, GemmSm90.PP_EPI_BARRIER, GemmSm90.PP_EPI_BARRIER + 1,
           GemmSm90.PP_MMA_BARRIER, GemmSm90.PP_MMA_BARRIER + 1}
    assert len(ids) == 5 and 0 not in ids and max(ids) < 16


def test_pingpong_heuristic():
    pick = lambda m, n: G.default_tiles(m, n, 4096, 1, "bfloat16", "k", "mn", "bfloat16", "n", pingpong=True)  # noqa: E731
    for m, n in ((4096, 4096), (8192, 8192), (16384, 4096), (4096, 14336), (1000, 3000)):
        t = pick(m, n)
        assert t.pingpong and t.tile_mnk[1] in (128, 192)
    assert not G.default_tiles(4096, 4096, 4096, 1, "bfloat16", "k", "mn", "bfloat16", "n",
                               pingpong=False).pingpong


@pytest.fixture
def record_cfgs(monkeypatch):
    """Record the GemmConfigs the host compiles (without compiling) and forget cached plans."""
    seen = []
    monkeypatch.setattr(G, "compiled_gemm", lambda cfg, *args: seen.append(cfg) or (lambda *a: None))
    monkeypatch.setattr(G, "_plans", {})
    return seen


def test_pingpong_plan_selection(monkeypatch, record_cfgs):
    monkeypatch.setattr(G, "PINGPONG", True)
    monkeypatch.setattr(G, "FORCE_SPLITS", 1)
    a = torch.empty(4096, 4096, dtype=torch.bfloat16)
    b = torch.empty(4096, 4096, dtype=torch.bfloat16)
    G._make_plan(a, b, None, None, 0.0, None, allow_cpu=True)
    assert record_cfgs[-1].tiles.pingpong
    # C forces 128-wide tiles (192 x C spills); a column-major D keeps ping-pong
    G._make_plan(a, torch.empty(4096, 14336, dtype=torch.bfloat16), None,
                 torch.empty(4096, 14336, dtype=torch.float32), 0.5, None, allow_cpu=True)
    cfg = record_cfgs[-1]
    assert cfg.tiles.pingpong and cfg.has_c and cfg.tiles.tile_mnk[1] == 128
    G._make_plan(a, b, torch.empty(4096, 4096, dtype=torch.bfloat16).t(), None, 0.0, None, allow_cpu=True)
    cfg = record_cfgs[-1]
    assert cfg.tiles.pingpong and cfg.tiles.c_major == "m"
    # the cp.async mainloop (operands TMA cannot describe) stays cooperative
    n_before = len(record_cfgs)
    G._make_plan(torch.empty(300, 100, dtype=torch.bfloat16), torch.empty(100, 60, dtype=torch.bfloat16)[:, :50],
                 None, None, 0.0, None, allow_cpu=True)
    assert len(record_cfgs) == n_before + 1 and record_cfgs[-1].mainloop == "cpasync"
    assert not record_cfgs[-1].tiles.pingpong
    # off: cooperative
    monkeypatch.setattr(G, "PINGPONG", False)
    monkeypatch.setattr(G, "_plans", {})
    G._make_plan(a, b, None, None, 0.0, None, allow_cpu=True)
    assert not record_cfgs[-1].tiles.pingpong


COMPILE_CASES = [
    # (tile_n, cluster, a_major, b_major, rank, has_c, tma_store, d dtype, c_major)
    (128, (2, 1), "k", "mn", 2, False, True, "bfloat16", "n"),
    (192, (2, 1), "k", "mn", 2, False, True, "bfloat16", "n"),
    (128, (1, 1), "k", "k", 3, True, True, "float32", "n"),
    (128, (1, 1), "mn", "k", 2, False, False, "bfloat16", "n"),
    (192, (1, 1), "k", "k", 2, True, True, "bfloat16", "n"),
    (128, (1, 2), "mn", "mn", 2, False, True, "float16", "m"),
    (192, (1, 1), "k", "mn", 3, False, True, "float32", "n"),
]


@pytest.mark.parametrize("case", COMPILE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_pingpong_compiles_for_sm90a(case):
    """HGMMA + TMA present, no local memory, the register split the kernel asks for, and the hand-over
    barrier (BAR.ARV / BAR.SYNC over 256 threads) present."""
    _, _, sass = check_gemm_compile(case, pingpong=True)
    assert re.search(r"BAR\.ARV R\d+, 0x100", sass) and re.search(r"BAR\.SYNC\.DEFER_BLOCKING R\d+, 0x100", sass), \
        "hand-over barrier (256 threads, register id) missing"


def _protocol_model(T, K, S, seed, handoff=True):
    """Random-interleaving model of consumer_pingpong's protocol: a TMA producer filling an S-slot
    mbarrier ring in schedule order, consumers 0/1 on alternate tiles of K k-tiles, each skipping the
    other's ring positions, mbarrier waits by phase *parity* (as the hardware does), and the two
    arrive/sync hand-over barriers.  Returns 'ok', 'deadlock' or 'alias' (a parity wait passed on the
    wrong phase: a stale or unfilled stage)."""
    import random

    rng = random.Random(seed)
    full, empty = [0] * S, [0] * S  # completed phases per slot
    bar = {0: [0, 0], 1: [0, 0]}  # hand-over barrier c: [parties arrived, generation]
    errors = []

    def producer():
        for p in range(T * K):
            j, r = p % S, p // S
            while empty[j] % 2 != r % 2:  # producer phase starts at 1
                yield
            errors.extend([p] if empty[j] != r else [])
            full[j] += 1
            yield

    def arrive(b):
        bar[b][0] += 1
        if bar[b][0] == 2:
            bar[b] = [0, bar[b][1] + 1]

    def sync(b):
        g = bar[b][1]
        arrive(b)
        while bar[b][1] == g:
            yield

    def consumer(c):
        for n, t in enumerate(range(c, T, 2)):
            if handoff and n + c > 0:  # every mainloop but consumer 0's first
                yield from sync(c)
            for kt in range(K):
                p = t * K + kt
                j, r = p % S, p // S
                while full[j] % 2 == r % 2:
                    yield
                errors.extend([p] if full[j] != r + 1 else [])
                yield
                if kt > 0:
                    empty[(p - 1) % S] += 1
            if handoff:
                arrive(1 - c)  # after the last wgmma issue, before wait_group(0)
            yield
            empty[(t * K + K - 1) % S] += 1
            for _ in range(rng.randint(0, 3)):  # epilogue
                yield

    agents = [producer(), consumer(0), consumer(1)]
    for _ in range(100000):
        if not agents:
            return "alias" if errors else "ok"
        a = rng.choice(agents)
        try:
            next(a)
        except StopIteration:
            agents.remove(a)
    return "deadlock"


def test_protocol_model():
    for T, K, S in itertools.product([1, 2, 3, 4, 5, 7], [1, 2, 3, 5, 6, 7, 13], [4, 5, 6]):
        for seed in range(4):
            assert _protocol_model(T, K, S, seed) == "ok", (T, K, S, seed)
    # control: without the hand-over the model does catch parity aliasing / out-of-order consumption
    assert any(_protocol_model(T, K, S, seed, handoff=False) != "ok"
               for T in (2, 3, 4) for K in (1, 2, 3) for S in (2, 4) for seed in range(10))


# The epilogue copies accumulator register e * n_rD + v into sub-tile e's register v.  That is right only
# if both views of a thread's registers name the same element of the CTA tile; checked statically here
# for the ping-pong (one warpgroup, 2 x 64 rows) and, as a control, the cooperative tiles.
EPI_MAP_CASES = [(True, 128, "bfloat16", "n"), (True, 192, "bfloat16", "n"), (True, 128, "float32", "n"),
                 (True, 128, "float16", "m"), (True, 192, "float32", "m"), (False, 256, "bfloat16", "n")]


@pytest.mark.parametrize("case", EPI_MAP_CASES, ids=lambda c: "-".join(map(str, c)))
def test_epilogue_register_map(case):
    pp, tile_n, cd, cmaj = case
    t = G.make_gemm_tiles(tile_n, (1, 1), "bfloat16", "k", "k", cd, cmaj, pingpong=pp)
    found = epilogue_register_map(t, thread_step=5)
    assert found["checked"] > 0 and found["bad"] == 0, found


# ------------------------------------------------------------------------------------------- GPU

@pytest.fixture
def pingpong_gemm(monkeypatch):
    """gemm through the real host path with explicit ping-pong tiles, split-K off, and a check that
    the compiled config is a ping-pong one (TMA mainloop)."""
    def expect(cfg, tile_n):
        assert cfg.tiles.pingpong, cfg

    return forced_tiles_gemm(monkeypatch, dict(pingpong=True), expect)


@pytest.mark.gpu
def test_pingpong_smoke(pingpong_gemm):
    """First GPU contact: several tiles per CTA (both consumers busy), 3 k-tiles per tile (not a
    multiple of 2 x stages), cluster 2x1 multicast.  A hang here means the barrier protocol is wrong."""
    check_random(pingpong_gemm, (2304, 2048, 136), cluster=(2, 1))  # 18 x 16 tiles of 128 x 128: 2-3 per CTA


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", VARIANT_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("majors,tile_n", [(mj, 128) for mj in itertools.product(["row", "col"], repeat=2)]
                         + [(("row", "row"), 192), (("col", "col"), 192)], ids=lambda x: str(x))
def test_pingpong_shapes_majors(pingpong_gemm, mnk, majors, tile_n):
    check_shapes_majors(pingpong_gemm, mnk, majors, tile_n)


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(2304, 2048, 136), (4096, 4096, 4160), (8192, 1024, 200), (4096, 2048, 64),
                                 (2048, 3072, 384), (3840, 2304, 840), (256, 17408, 72)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("tile_n,cluster", [(128, (1, 1)), (128, (2, 1)), (192, (2, 1)), (192, (1, 1)), (128, (1, 2))],
                         ids=lambda x: str(x))
def test_pingpong_persistent_multi_tile(pingpong_gemm, mnk, tile_n, cluster):
    """Many tiles per CTA (even and odd counts per CTA, so either consumer may finish last), k-tile
    counts of 1, 2, 3, 4, 6 (= the stage count of 128-wide tiles; 192-wide: 5), 14, 65: each consumer's
    ring states skip the other's positions, so any off-by-one in that bookkeeping hangs or reads stale
    stages.  (Every M and N here has an even 128-tile count, as 2x1 / 1x2 clusters need.)"""
    check_random(pingpong_gemm, mnk, tile_n=tile_n, cluster=cluster)


@pytest.mark.gpu
@pytest.mark.parametrize("c_kind", ["row", "transposed", "fp32"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_pingpong_alpha_beta(pingpong_gemm, c_kind, out_dtype):
    check_alpha_beta(pingpong_gemm, c_kind, out_dtype, tile_n=192)  # the host narrows C tiles to 128


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_pingpong_dtypes(pingpong_gemm, in_dtype, out_dtype):
    check_dtypes(pingpong_gemm, in_dtype, out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("majors", [("row", "row"), ("col", "col")])
@pytest.mark.parametrize("tile_n", [128, 192])
def test_pingpong_batched(pingpong_gemm, majors, tile_n):
    check_batched(pingpong_gemm, majors, tile_n)


@pytest.mark.gpu
def test_pingpong_column_major_and_unaligned_out(pingpong_gemm):
    m, n, k = 1000, 2000, 264
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.full((n, m), float("nan"), device="cuda", dtype=torch.bfloat16).t()  # column-major D
    pingpong_gemm(a, b, out=out)
    assert rel_err(out, _ref(a, b)) < 2e-2
    check_unaligned_out(pingpong_gemm)


@pytest.mark.gpu
def test_pingpong_env_default_path(monkeypatch):
    """CUTE_KERNELS_PINGPONG=1 (the module flag): the plain gemm() call picks ping-pong tiles."""
    seen = []
    orig = G.compiled_gemm
    monkeypatch.setattr(G, "compiled_gemm", lambda cfg, *a: seen.append(cfg) or orig(cfg, *a))
    monkeypatch.setattr(G, "PINGPONG", True)
    monkeypatch.setattr(G, "_plans", {})
    for m, n, k in ((4096, 4096, 4096), (2048, 14336, 1024)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        cute_kernels.gemm(a, b, out=out)
        assert seen and seen[-1].tiles.pingpong
        assert rel_err(out, _ref(a, b)) < 2e-2
