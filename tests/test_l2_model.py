"""profiles/l2_model.py (CPU): the scheduler order it replays, and its agreement with the ncu figures it
was checked against (session 5, results/gemm-ncu-2026-11-30-s5.md)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "profiles"))
import l2_model as L  # noqa: E402


def test_cluster_order_is_a_permutation():
    for mc, nc, sw, am in [(16, 8, 1, True), (16, 8, 1, False), (16, 9, 4, True), (15, 8, 8, False), (7, 5, 8, True)]:
        order = [c for c in L.cluster_order(mc, nc, sw, am) if c is not None]
        assert sorted(order) == [(i, j) for i in range(mc) for j in range(nc)]
    # swizzle 4 along M: strips of 4 cluster columns, walked row by row down M
    assert L.cluster_order(3, 8, 4, True)[:6] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]
    assert L.cluster_order(3, 2, 1, True)[:4] == [(0, 0), (1, 0), (2, 0), (0, 1)]


@pytest.mark.parametrize("shape,cfg,ncu_gb", [
    ((8192, 8192, 8192), "128x256:1x1:4m", 1.474), ((8192, 8192, 8192), "256x128:1x2:8m", 1.226),
    ((8192, 8192, 8192), "256x128:2x1:8m", 1.556), ((8192, 8192, 8192), "256x208:2x1:8m", 1.092),
    ((4096, 4096, 4096), "128x256:2x1:1m", 0.174), ((4096, 4096, 4096), "128x256:1x2:8m", 0.171),
])
def test_matches_ncu(shape, cfg, ncu_gb):
    tm, tn, cl, sw, am = L.parse_config(cfg)
    got = L.hbm_reads(*shape, tm, tn, cl, sw, am, 28 * 2**20) / 1e9
    assert abs(got - ncu_gb) / ncu_gb < 0.05, (shape, cfg, got)
