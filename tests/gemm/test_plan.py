"""The planners on the CPU: ``cute_kernels.gemm.explain`` / ``decode_attn.explain`` run the real planning code on
meta tensors (nothing compiled), so random problems exercise every heuristic, split-K choice and raster
fit without a GPU."""

import pytest


def test_explain_gemm_matches_the_plan():
    """explain() runs the real planning code without compiling: the configuration it reports is the
    one the heuristics choose (stream tiles + fitted swizzle, band raster, K = 4100 staged or cp.async,
    cluster split-K for the skinny shape), and nothing is compiled."""
    import torch

    from cute_kernels.common import jit
    from cute_kernels.gemm import explain

    before = dict(jit.stats)
    (r,) = explain(16384, 4400, 4096)
    assert r["kernel"] == "gemm_sm90" and (r["tile_mnk"][:2], r["cluster_mn"], r["raster"]) == ((256, 128), (1, 2), (6, "M"))
    (r,) = explain(4096, 4096, 4096)
    assert (r["tile_mnk"][:2], r["cluster_mn"], r["raster"], r["work_units"]) == ((128, 256), (2, 1), (8, "N"), 512)
    (r,) = explain(4096, 4096, 4100)  # A staged into an aligned copy (the copy is cheap beside the GEMM)
    assert r["mainloop"] == "tma" and r["operands"].startswith("staged: a copied")
    (r,) = explain(128, 4096, 4100)  # the copy would cost more than it saves: cp.async in place
    assert r["mainloop"] == "cpasync" and r["cluster_mn"] == (1, 1) and "operands" not in r
    (r,) = explain(128, 4096, 4096)
    assert r["kernel"] == "gemm_sm90_splitk_cluster" and r["splits"] > 1
    rows = explain(8192, 1000, 520, batch=2, a_major="col", b_major="col", out_dtype=torch.float32, with_c=True)
    assert rows[0]["config"].tiles.mma.a_major == "mn" and rows[0]["config"].has_c
    assert dict(jit.stats) == before
    with pytest.raises(ValueError, match="a_major"):
        explain(64, 64, 64, a_major="k")
    with pytest.raises(ValueError, match="n must be >= 0"):
        explain(64, -1, 64)
    assert explain(0, 64, 64) == []  # empty problem: nothing launches


def test_explain_decode():
    import importlib

    DA = importlib.import_module("cute_kernels.attention.decode")  # the package exports the function by that name

    r = DA.explain(8, 32, 8, 8192)
    assert r["kv_bytes"] == 2 * 8 * 8192 * 8 * 128 * 2 and r["num_splits"] >= 1
    r = DA.explain(64, 32, 8, 2048, page_size=16)
    assert r["config"].paged and r["load"] == "cpasync" and r["config"].page_size == 16
    assert DA.explain(1, 32, 8, 32768, num_splits=1)["num_splits"] == 1


KNOWN_GEMM_KERNELS = {"gemm_sm90", "gemm_sm90_splitk_cluster", "gemm_sm90_splitk_fixup"}


def test_explain_gemm_any_shape():
    """The planning code (heuristics, split-K choice, raster fit) takes any problem without an error:
    random sizes from 1 to 20000 (primes and tile edges included), batch, operand majors, output
    dtype and C.  Every plan names known kernels, a persistent raster fits its grid without wasting
    more than half a strip, and clusters are pairs or single CTAs."""
    import random

    import torch

    from cute_kernels.gemm import explain

    rng = random.Random(6)
    sizes = [1, 7, 64, 127, 128, 129, 255, 256, 520, 1000, 4096, 4097, 4100, 8191, 16384]
    for _ in range(300):
        m, n, k = (rng.choice(sizes) if rng.random() < 0.5 else rng.randint(1, 20000) for _ in range(3))
        batch = rng.choice([None, None, 1, 3])
        kw = dict(batch=batch, a_major=rng.choice(["row", "col"]), b_major=rng.choice(["row", "col"]),
                  dtype=rng.choice([torch.bfloat16, torch.float16]),
                  out_dtype=rng.choice([None, torch.float32, torch.float16]), with_c=rng.random() < 0.3)
        rows = explain(m, n, k, **kw)
        assert rows and {r["kernel"] for r in rows} <= KNOWN_GEMM_KERNELS, (m, n, k, kw)
        for r in rows:
            if "raster" not in r:
                continue
            assert r["cluster_mn"] in ((1, 1), (2, 1), (1, 2)), (m, n, k, kw, r)
            sw, d = r["raster"]
            tm, tn = r["tile_mnk"][:2]
            cm, cn = r["cluster_mn"]
            across = -(-(-(-n // tn)) // cn) if d == "M" else -(-(-(-m // tm)) // cm)
            assert sw >= 1 and (-(-across // sw) * sw - across) * 2 <= max(sw, 1), (m, n, k, kw, r)


def test_explain_decode_any_shape():
    """The decode planner takes any valid problem: random batch, GQA ratio, capacity (1..256K),
    head dim, Sq and page size.  Splits are >= 1 and never more than the cache has KV tiles; paged
    caches gather with cp.async; TMA + evict-first only for contiguous caches within the size bound."""
    import importlib
    import random

    DA = importlib.import_module("cute_kernels.attention.decode")
    rng = random.Random(6)
    for _ in range(200):
        hkv = rng.choice([1, 2, 8, 32])
        hq = hkv * rng.choice([1, 4, 8])
        cap = rng.choice([1, 7, 64, 1000, 65537, 131072, 262144]) if rng.random() < 0.5 else rng.randint(1, 200000)
        page = rng.choice([None, None, 16, 64, 256])
        b = rng.choice([1, 2, 8, 64])
        r = DA.explain(b, hq, hkv, cap, head_dim=rng.choice([64, 128, 256]), sq=rng.randint(1, 16), page_size=page)
        cfg = r["config"]
        cap_rounded = -(-cap // page) * page if page else cap
        assert 1 <= r["num_splits"] <= max(1, -(-cap_rounded // cfg.n_tile)), (b, hq, hkv, cap, page, r)
        if page:
            assert cfg.paged and r["load"] == "cpasync"
        elif r["load"] == "tma+evict_first":
            assert r["kv_bytes"] <= DA.TMA_EF_MAX_KV_BYTES or DA.LOAD_CHOICE != "auto"


def test_tuner_candidates_any_shape():
    """The autotuner's first-round candidates for random problems: at most 9, no duplicates, the
    heuristic's pick first, every cluster tiles its grid, and every candidate's tiles build."""
    import random

    from cute_kernels.gemm import tune

    rng = random.Random(6)
    for _ in range(100):
        m, n, k = rng.randint(1, 20000), rng.randint(1, 20000), rng.randint(1, 20000)
        cands = tune.candidates(m, n, "bfloat16", "k", "mn", "bfloat16", k, 1)
        assert 1 <= len(cands) <= 9 and len(set(cands)) == len(cands), (m, n, k)
        for i, c in enumerate(cands):
            tile_m, tile_n, cluster, swizzle, along_m = c
            # (the heuristic's own pick, first, may pad an odd N-tile count: heuristics.takes_stream_tiles)
            assert i == 0 or cluster == (1, 1) or (cluster[0] == 2 and -(-m // tile_m) % 2 == 0) or \
                (cluster[1] == 2 and -(-n // tile_n) % 2 == 0), (m, n, k, cluster)
            tune.candidate_choice(c, "bfloat16", "k", "mn", "bfloat16")


def test_dry_run_is_per_thread():
    """A plan explained on one thread does not turn another thread's compiles into no-ops."""
    import threading

    from cute_kernels.common import jit

    seen_other = []
    with jit.dry_run() as dry:
        t = threading.Thread(target=lambda: seen_other.append(getattr(jit._dry, "seen", None)))
        t.start()
        t.join()
        assert jit.get_compiled("x", ("cfg",), lambda: None) is None
    assert seen_other == [None] and dry.seen == [("x", ("cfg",))]
    assert getattr(jit._dry, "seen", None) is None


def test_explain_decode_rejects_bad_sizes():
    import importlib

    DA = importlib.import_module("cute_kernels.attention.decode")
    with pytest.raises(ValueError, match="heads_kv must be >= 1"):
        DA.explain(1, 32, 0, 1024)
    with pytest.raises(ValueError, match="multiple"):
        DA.explain(1, 30, 8, 1024)
