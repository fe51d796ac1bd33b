"""The CLI and the CPU compile report: every kernel family builds for sm_90a without spills."""

import os
import subprocess
import sys

import pytest

from cute_kernels import report


def test_compile_report_every_kernel():
    rows = report.compile_report(print_fn=lambda *_: None)
    labels = {r["label"] for r in rows}
    assert any(l.startswith("gemm") for l in labels)
    assert any(l.startswith("decode_attn") for l in labels)
    assert any(l.startswith("merge_states") for l in labels)
    for r in rows:
        assert r["spills"] == 0 and r["stack"] == 0, r
        if r["label"].startswith("gemm"):  # tensor cores, fed by TMA or (cp.async mainloop) LDGSTS
            assert r.get("HGMMA", 0) > 0, r
            assert r.get("UTMALDG", 0) > 0 or ("cp.async" in r["label"] and r.get("LDGSTS", 0) > 0), r


def test_cli_layouts_text():
    out = subprocess.run([sys.executable, "-m", "cute_kernels", "layouts", "gemm", "--what", "mma-c"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "thread" in out.stdout.lower() or "t0" in out.stdout.lower()


def test_cli_demo_cpu(tmp_path):
    """The CPU demo compiles everything and writes the layout pictures."""
    out = subprocess.run([sys.executable, "-m", "cute_kernels", "demo", "--cpu", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    files = sorted(os.listdir(tmp_path))
    assert any(f.endswith(".svg") for f in files) and any(f.endswith(".png") for f in files), files


def test_cli_unknown_kernel():
    out = subprocess.run([sys.executable, "-m", "cute_kernels", "layouts", "nope"], capture_output=True, text=True)
    assert out.returncode != 0 and "known" in (out.stderr + out.stdout)


def test_explain_gemm_matches_the_plan():
    """explain() runs the real planning code without compiling: the configuration it reports is the
    one the heuristics choose (stream tiles + fitted swizzle, band raster, cp.async for K = 4100,
    cluster split-K for the skinny shape), and nothing is compiled."""
    import torch

    from cute_kernels import gemm_host as G, jit

    before = dict(jit.stats)
    (r,) = G.explain(16384, 4400, 4096)
    assert r["kernel"] == "gemm_sm90" and (r["tile_mnk"][:2], r["cluster_mn"], r["raster"]) == ((256, 128), (1, 2), (6, "M"))
    (r,) = G.explain(4096, 4096, 4096)
    assert (r["tile_mnk"][:2], r["cluster_mn"], r["raster"], r["work_units"]) == ((128, 256), (2, 1), (8, "N"), 512)
    (r,) = G.explain(4096, 4096, 4100)
    assert r["mainloop"] == "cpasync" and r["cluster_mn"] == (1, 1) and r["raster"] == (1, "M")
    (r,) = G.explain(128, 4096, 4096)
    assert r["kernel"] == "gemm_sm90_splitk_cluster" and r["splits"] > 1
    rows = G.explain(8192, 1000, 520, batch=2, a_major="col", b_major="col", out_dtype=torch.float32, with_c=True)
    assert rows[0]["config"].tiles.mma.a_major == "mn" and rows[0]["config"].has_c
    assert dict(jit.stats) == before
    with pytest.raises(ValueError, match="a_major"):
        G.explain(64, 64, 64, a_major="k")
    with pytest.raises(ValueError, match="n must be >= 0"):
        G.explain(64, -1, 64)
    assert G.explain(0, 64, 64) == []  # empty problem: nothing launches


def test_explain_decode():
    import importlib

    DA = importlib.import_module("cute_kernels.decode_attn")  # the package exports the function by that name

    r = DA.explain(8, 32, 8, 8192)
    assert r["kv_bytes"] == 2 * 8 * 8192 * 8 * 128 * 2 and r["num_splits"] >= 1
    r = DA.explain(64, 32, 8, 2048, page_size=16)
    assert r["config"].paged and r["load"] == "cpasync" and r["config"].page_size == 16
    assert DA.explain(1, 32, 8, 32768, num_splits=1)["num_splits"] == 1


def test_cli_plan():
    out = subprocess.run([sys.executable, "-m", "cute_kernels", "plan", "gemm", "4096", "4096", "4096"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tile_mnk       (128, 256, 64)" in out.stdout and "raster         (8, 'N')" in out.stdout
    out = subprocess.run([sys.executable, "-m", "cute_kernels", "plan", "decode", "1", "32", "8", "32768"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "num_splits" in out.stdout and "kv_bytes       134217728" in out.stdout


KNOWN_GEMM_KERNELS = {"gemm_sm90", "gemm_sm90_splitk_cluster", "gemm_sm90_splitk_fixup", "splitk_reduce"}


def test_explain_gemm_any_shape():
    """The planning code (heuristics, split-K choice, raster fit) takes any problem without an error:
    random sizes from 1 to 20000 (primes and tile edges included), batch, operand majors, output
    dtype and C.  Every plan names known kernels, a persistent raster fits its grid without wasting
    more than half a strip, and clusters are pairs or single CTAs."""
    import random

    import torch

    from cute_kernels import gemm_host as G

    rng = random.Random(6)
    sizes = [1, 7, 64, 127, 128, 129, 255, 256, 520, 1000, 4096, 4097, 4100, 8191, 16384]
    for _ in range(300):
        m, n, k = (rng.choice(sizes) if rng.random() < 0.5 else rng.randint(1, 20000) for _ in range(3))
        batch = rng.choice([None, None, 1, 3])
        kw = dict(batch=batch, a_major=rng.choice(["row", "col"]), b_major=rng.choice(["row", "col"]),
                  dtype=rng.choice([torch.bfloat16, torch.float16]),
                  out_dtype=rng.choice([None, torch.float32, torch.float16]), with_c=rng.random() < 0.3)
        rows = G.explain(m, n, k, **kw)
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

    DA = importlib.import_module("cute_kernels.decode_attn")
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
