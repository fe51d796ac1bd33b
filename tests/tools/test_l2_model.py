"""profiles/l2_model.py (CPU): its agreement with the ncu figures it was checked against (session 5,
results/gemm-ncu-2026-11-30-s5.md).  The tile order it replays is layouts.raster's (tests/layouts/test_layouts.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "profiles"))
import l2_model as L  # noqa: E402


@pytest.mark.parametrize("shape,cfg,ncu_gb", [
    ((8192, 8192, 8192), "128x256:1x1:4m", 1.474), ((8192, 8192, 8192), "256x128:1x2:8m", 1.226),
    ((8192, 8192, 8192), "256x128:2x1:8m", 1.556), ((8192, 8192, 8192), "256x208:2x1:8m", 1.092),
    ((4096, 4096, 4096), "128x256:2x1:1m", 0.174), ((4096, 4096, 4096), "128x256:1x2:8m", 0.171),
])
def test_matches_ncu(shape, cfg, ncu_gb):
    tm, tn, cl, sw, am = L.parse_config(cfg)
    got = L.hbm_reads(*shape, tm, tn, cl, sw, am, 28 * 2**20) / 1e9
    assert abs(got - ncu_gb) / ncu_gb < 0.05, (shape, cfg, got)


def test_default_config_is_the_plan():
    """``--configs default`` models what the library runs (its plan, fitted swizzle included)."""
    assert L.default_config(4096, 4096, 4096) == (128, 256, (2, 1), 8, False)
    assert L.default_config(16384, 4400, 4096) == (256, 128, (1, 2), 6, True)
    assert L.default_config(128, 4096, 4096) is None  # split-K kernel: no persistent raster


def test_grouped_order_is_a_permutation():
    """The unpadded (quack-like) order visits every cluster exactly once; serpentine reverses odd groups."""
    for mc, nc, sw, am in ((5, 7, 3, True), (8, 43, 8, True), (6, 4, 4, False), (1, 1, 8, True)):
        for serp in (False, True):
            o = L.grouped_order(mc, nc, sw, am, serp)
            assert sorted(o) == [(r, c) for r in range(mc) for c in range(nc)]
    o = L.grouped_order(4, 4, 2, True, True)
    assert o[:4] == ((0, 0), (0, 1), (1, 0), (1, 1)) and o[8:10] == ((3, 2), (3, 3))
