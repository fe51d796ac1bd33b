"""What a new size costs in compiles (CPU, sm_90a; no GPU).

Kernels compile once per configuration, and sizes are run-time values of the compiled kernel, but the
planners map sizes to configurations (shape buckets: tile width, cluster, split-K, the transposed skinny
plan, ...), so a new size compiles when it lands in a configuration not compiled yet.  Checked here:

* GEMM: every configuration the planner picks over a wide sweep of sizes (planned on meta tensors, nothing
  compiled) lies in :func:`cute_kernels.gemm.plan.config_buckets` for those operand facts, a bounded set;
* decode_attn: the configurations over a sweep of batch / heads / lengths lie in the buckets of its
  key (dtype, head dim, rows-per-KV-head tile 16 / 32 / 64, page size, causal, split, load path);
* a sweep actually compiled into a fresh, empty cache compiles each distinct configuration exactly once,
  re-planning the same sweep compiles nothing (memory cache), and a process that starts over (memory
  cache dropped) loads every kernel from the disk cache, compiling nothing.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import cute_kernels  # noqa: F401  (sets the arch before cutlass is imported)
from cute_kernels.attention import decode_plan as DP
from cute_kernels.common import jit
from cute_kernels.gemm import plan as P
from cute_kernels.gemm import tuned
from cute_kernels.gemm.validate import major_of, tma_ok

SWEEP_M = (1, 5, 16, 17, 31, 33, 48, 64, 65, 100, 127, 128, 129, 255, 256, 300, 512, 640, 1000, 1024, 2048, 2049,
           4097, 8192, 16384)
SWEEP_N = (8, 136, 384, 1000, 2088, 4096, 14336)
SWEEP_K = (8, 256, 520, 4096, 32768)


def _mat(rows, cols, major, dtype=torch.bfloat16, batch=None):
    lead = (batch,) if batch else ()
    if major == "row":
        return torch.empty((*lead, rows, cols), dtype=dtype, device="meta")
    return torch.empty((*lead, cols, rows), dtype=dtype, device="meta").transpose(-1, -2)


def _planned(a, b, out=None, c=None, beta=0.0, out_dtype=None, choice=P.DEFAULT_CHOICE) -> list[tuple]:
    """The (family, compile key) of every kernel the plan for these operands runs (nothing compiled)."""
    with jit.dry_run() as dry:
        P.make_plan(a, b, out, c, beta, out_dtype, choice, allow_cpu=True)
    return dry.seen


@pytest.fixture
def untuned(tmp_path):
    """The planner's heuristics only: an empty tuning table."""
    with tuned.table_at(tmp_path / "gemm_tuned.json"):
        yield


# (name, operands(m, n, k) -> (a, b, out, c, beta, out_dtype) or None to skip the size, config_buckets kwargs)
def _plain(dtype, am, bm):
    return lambda m, n, k: (_mat(m, k, am, dtype), _mat(k, n, bm, dtype), None, None, 0.0, None)


def _c_fp32(m, n, k):
    return (_mat(m, k, "row"), _mat(k, n, "row"), None, torch.empty(m, n, device="meta"), 0.5, torch.float32)


def _col_out(m, n, k):
    return _mat(m, k, "row"), _mat(k, n, "col"), _mat(m, n, "col"), None, 0.0, None


def _batched(m, n, k):
    L = 1 if m % 2 else 3
    return _mat(m, k, "row", batch=L), _mat(k, n, "row", batch=L), None, None, 0.0, None


GEMM_FACTS = [
    ("bf16 row/row", _plain(torch.bfloat16, "row", "row"), [dict()]),
    ("bf16 row/col", _plain(torch.bfloat16, "row", "col"), [dict(b_major="col")]),
    ("fp16 col/row", _plain(torch.float16, "col", "row"), [dict(ab="float16", a_major="col")]),
    ("bf16 + fp32 C into fp32", _c_fp32, [dict(d_name="float32", c_name="float32")]),
    # a column-major D: its TMA store needs M % 8 == 0 (an alignment fact that follows M here)
    ("bf16 column-major out", _col_out, [dict(b_major="col", out_major="col", tma_store=t) for t in (True, False)]),
    ("bf16 batched (L = 1 or 3)", _batched, [dict(batched=True)]),
]


@pytest.mark.parametrize("name,operands,facts", GEMM_FACTS, ids=[f[0] for f in GEMM_FACTS])
def test_gemm_configs_stay_in_buckets(name, operands, facts, untuned):
    """Over 25 x 7 x 5 sizes the planner picks configurations from config_buckets only: a bounded set,
    so a sweep of sizes compiles at most that many kernels (and each at most once)."""
    buckets = {cfg for kw in facts for cfg in P.config_buckets(**kw)}
    seen, sizes = set(), 0
    for m, n, k in itertools.product(SWEEP_M, SWEEP_N, SWEEP_K):
        a, b, out, c, beta, out_dtype = operands(m, n, k)
        am, bm = major_of(a, "a", "M", "K"), major_of(b, "b", "K", "N")
        if (am, bm) != (facts[0].get("a_major", "row"), facts[0].get("b_major", "row")):
            continue  # a size-1 dim fits either major; the planner takes the other one (another group)
        if not (tma_ok(a, am) and tma_ok(b, bm)):
            continue  # the cp.async plan: test_gemm_cpasync_configs_stay_in_buckets
        sizes += 1
        for family, key in _planned(a, b, out, c, beta, out_dtype):
            cfg = key[0]
            assert cfg in buckets, f"{name} {m}x{n}x{k}: {family} {cfg} is not in config_buckets({facts})"
            seen.add((family, key))
    assert sizes > 300
    assert 1 < len(seen) <= len(buckets)
    assert len(buckets) < 200  # the bound itself stays small


def test_gemm_cpasync_configs_stay_in_buckets(untuned):
    """Row-major A with K % 8 == 4 (8-byte vectors), row-major B (16-byte): the cp.async persistent kernel,
    at most 12 configurations over the sweep."""
    buckets = set(P.config_buckets(cpasync_vecs=(8, 16)))
    assert len(buckets) <= 12
    seen = set()
    for m, n, k in itertools.product(SWEEP_M, SWEEP_N, (12, 260, 4100)):
        a, b = _mat(m, k, "row"), _mat(k, n, "row")
        if m == 1:  # a single row has no row stride: TMA describes it
            assert tma_ok(a, "row")
            continue
        for family, key in _planned(a, b, choice=P.PlanChoice(stage=False)):  # (staged: the TMA buckets)
            assert key[0] in buckets, (m, n, k, key[0])
            seen.add(key)
    assert 1 < len(seen) <= len(buckets)


def test_decode_configs_stay_in_buckets():
    """decode_attn's configuration is (dtype, head dim, rows-per-KV-head tile 16 / 32 / 64, page size,
    causal, split or not, load path): over batch / query length / heads / capacities at most 3 x 2 x 2
    configurations for a contiguous cache and 3 x 2 for a paged one (whose load is always cp.async)."""
    for paged, causal in itertools.product((False, True), (True, False)):
        ps = 16 if paged else 0
        buckets = {DP.make_config(torch.bfloat16, 128, rows, paged, ps, causal, split, kv_bytes=kv)
                   for rows in (16, 32, 64) for split in (False, True) for kv in (0, 1 << 20)}
        assert len(buckets) == (6 if paged else 12)
        seen = set()
        for B, Sq, (Hq, Hkv), L in itertools.product((1, 4, 64), (1, 2, 4, 16), ((8, 8), (32, 8), (64, 8), (32, 1)),
                                                     (1, 1000, 4096, 131072)):
            q = torch.empty(B, Sq, Hq, 128, dtype=torch.bfloat16, device="meta")
            if paged:
                k = torch.empty(B * -(-L // ps), ps, Hkv, 128, dtype=torch.bfloat16, device="meta")
                bt = torch.empty(B, -(-L // ps), dtype=torch.int32, device="meta")
            else:
                k, bt = torch.empty(B, L, Hkv, 128, dtype=torch.bfloat16, device="meta"), None
            cfg, _ = DP.plan_uncached(q, k, bt, None, causal)
            assert cfg in buckets, (paged, causal, B, Sq, Hq, Hkv, L, cfg)
            seen.add(cfg)
        assert 1 < len(seen) <= len(buckets)


#: (M, N, K) of the compiled sweep: 11 sizes in 3 configurations (M's 128-row tile count even: 2x1
#: cluster; odd: 1x1; M <= 16 at N = K = 4096: the transposed plan, 16-wide tiles, 4 K slices)
COMPILE_SWEEP = [(m, 384, 256) for m in (512, 640, 768, 896, 1000, 1024, 1100, 2000)] + \
                [(m, 4096, 4096) for m in (1, 5, 16)]


def test_sweep_compiles_each_configuration_once(tmp_path, monkeypatch, untuned):
    """A fresh, empty compile cache (directory and memory): planning the sweep compiles exactly its
    distinct configurations (<= the bucket count), planning it again compiles nothing, and after the
    memory cache is dropped (a new process) every kernel loads from the disk cache."""
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CUTE_KERNELS_DISK_CACHE", "1")
    monkeypatch.setattr(jit, "_memory", {})
    buckets = set(P.config_buckets())

    def operands(m, n, k):
        return _mat(m, k, "row"), _mat(k, n, "row")

    keys = [key for shape in COMPILE_SWEEP for key in _planned(*operands(*shape))]
    distinct = set(keys)
    assert len(distinct) == 3 and all(key[0] in buckets for _, key in distinct)

    def plan_sweep():
        before = dict(jit.stats)
        for shape in COMPILE_SWEEP:
            P.make_plan(*operands(*shape), allow_cpu=True)
        return {x: jit.stats[x] - before[x] for x in ("compiles", "disk_hits", "memory_hits")}

    assert plan_sweep() == dict(compiles=len(distinct), disk_hits=0, memory_hits=len(keys) - len(distinct))
    assert len(list((tmp_path / "cache").glob("*.o"))) == len(distinct)
    assert plan_sweep() == dict(compiles=0, disk_hits=0, memory_hits=len(keys))
    jit._memory.clear()  # a new process: the disk cache only
    assert plan_sweep() == dict(compiles=0, disk_hits=len(distinct), memory_hits=len(keys) - len(distinct))
