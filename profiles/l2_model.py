"""HBM reads of a persistent GEMM's tile order through an LRU model of L2 (CPU only, no GPU).

Why: on the power-capped shapes the clock follows energy per FLOP, and HBM traffic is part of it
(session 5: ncu read 1.47-1.52 GB per 8192^3 call for 128x256 / swizzle 4 against 1.23 GB for
256x128 / 1x2 / swizzle 8, and the latter ran ~3% faster at the cap).  Rasters and tiles can be
ranked on the CPU before spending device time: this replays the scheduler's order
(``layouts.raster.scheduler_cluster_order``, read off the DSL's ``PersistentTileSchedulerParams``)
wave by wave, k-tile by k-tile, through an LRU cache of ``--l2-mb``.

It is a model: all CTAs of a wave advance in lockstep, L2 is one LRU pool, multicast loads count
once per cluster.  The pool is 28 MB, not the 50 MB of the spec sheet: the H100/H200 L2 is two
partitions, and data every SM reads lives in both.  Checked against ncu's dram__bytes_read
(``results/gemm-ncu-2026-11-30-s5.md``; model at 28 MB / ncu, GB): 8192^3 128x256 1x1 sw4m
1.460 / 1.47-1.52, 256x128 1x2 sw8m 1.225 / 1.226, 256x128 2x1 sw8m 1.552 / 1.556, 256x192 2x1
sw8m 1.232 / 1.254, 256x208 2x1 sw8m 1.098 / 1.092; 4096^3 128x256 2x1 sw1m 0.174 / 0.174,
128x256 1x2 sw8m 0.171 / 0.171.  With 50 MB the 4096^3 figures fall to the 0.067 compulsory
minimum, which ncu does not see.  It ranks HBM traffic only: session 1 measured 128x256 2x1 sw4m
at 8192^3 11% slower than 1x1 sw4m, with the same modelled traffic (1.49 vs 1.46 GB).

    python3 profiles/l2_model.py [--shapes 8192x8192x8192,...] [--configs default,128x256:1x1:4m,...] [--l2-mb 28]

``default`` is the configuration the library runs for the shape (its real plan, via ``cute_kernels.gemm.explain``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("CUTE_KERNELS_ARCH", "sm_90a")
from layouts.raster import scheduler_cluster_order  # noqa: E402  (the DSL scheduler's own order)

SMS = 132


def grouped_order(mc, nc, swizzle, along_m, serpentine=True):
    """A scheduler order with no padding (the quack library's sm90 scheduler, as read in session 6):
    groups of ``swizzle`` cluster columns (along M; rows when along N), the last group narrower instead
    of padded, each group walked down the raster direction one row of the group at a time, odd groups
    in reverse when ``serpentine``."""
    across, down = (nc, mc) if along_m else (mc, nc)
    out = []
    for g0 in range(0, across, swizzle):
        cols = range(g0, min(g0 + swizzle, across))
        rows = range(down - 1, -1, -1) if serpentine and (g0 // swizzle) % 2 else range(down)
        for r in rows:
            for c in cols:
                out.append((r, c) if along_m else (c, r))
    return tuple(out)


def hbm_reads(m, n, k, tile_m, tile_n, cluster, swizzle, along_m, l2_bytes, el=2, tile_k=64, order=None):
    """Bytes read from HBM for A and B (the output write is not modelled).  ``order``: "grouped" or
    "serpentine" for :func:`grouped_order` instead of the DSL scheduler's (which pads)."""
    cm_, cn_ = cluster
    mt, nt = math.ceil(m / tile_m), math.ceil(n / tile_n)
    if order in ("grouped", "serpentine"):
        order = grouped_order(math.ceil(mt / cm_), math.ceil(nt / cn_), swizzle, along_m, order == "serpentine")
    else:
        order = scheduler_cluster_order((mt, nt), cluster, swizzle, along_m)  # padding units included
    slots = SMS // (cm_ * cn_)
    kt = math.ceil(k / tile_k)
    a_bytes, b_bytes = tile_m * tile_k * el, tile_n * tile_k * el
    cap = l2_bytes
    lru: OrderedDict = OrderedDict()
    used = 0
    miss = 0

    def touch(key, size):
        nonlocal used, miss
        if key in lru:
            lru.move_to_end(key)
            return
        miss += size
        lru[key] = size
        used += size
        while used > cap:
            _, s = lru.popitem(last=False)
            used -= s

    for w0 in range(0, len(order), slots):
        wave = order[w0:w0 + slots]
        tiles = set()
        for cm, cn in wave:
            for i in range(cm_):
                for j in range(cn_):
                    if cm * cm_ + i < mt and cn * cn_ + j < nt:
                        tiles.add((cm * cm_ + i, cn * cn_ + j))
        rows = sorted({t[0] for t in tiles})
        cols = sorted({t[1] for t in tiles})
        for kk in range(kt):
            for r in rows:
                touch(("a", r, kk), a_bytes)
            for c in cols:
                touch(("b", c, kk), b_bytes)
    return miss


def default_config(m, n, k):
    """The (tile_m, tile_n, cluster, swizzle, along_m) the library runs for this bf16 row-major problem
    (``cute_kernels.gemm.explain``: the real plan, nothing compiled); None for the split-K kernels."""
    from cute_kernels.gemm import explain

    r = explain(m, n, k)[0]
    if "raster" not in r or r.get("splits", 1) > 1:
        return None
    return (*r["tile_mnk"][:2], r["cluster_mn"], r["raster"][0], r["raster"][1] == "M")


def parse_config(spec):
    """``TMxTN:CMxCN:<swizzle><m|n>[:grouped|:serpentine]`` -> (tm, tn, cluster, swizzle, along_m)."""
    tile, cluster, raster = spec.split(":")[:3]
    tm, tn = (int(x) for x in tile.removeprefix("pp").split("x"))
    cl = tuple(int(x) for x in cluster.split("x"))
    return tm, tn, cl, int(raster[:-1]), raster[-1] == "m"


def order_of(spec):
    flags = spec.split(":")[3:]
    return next((f for f in flags if f in ("grouped", "serpentine")), None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x8192x8192,4096x4096x4096,16384x4096x4096,4096x14336x4096")
    ap.add_argument("--configs", default="default,128x256:1x1:4m,256x128:1x2:8m,256x128:2x1:8m,256x192:2x1:8m,"
                                         "256x208:2x1:8m,128x256:2x1:1m,128x256:2x1:8m,128x256:1x2:8m")
    ap.add_argument("--l2-mb", type=float, default=28.0)
    args = ap.parse_args()
    l2 = int(args.l2_mb * 2**20)
    print("| M x N x K | " + " | ".join(args.configs.split(",")) + " |")
    print("|---|" + "---|" * len(args.configs.split(",")))
    for s in args.shapes.split(","):
        m, n, k = (int(x) for x in s.split("x"))
        cells = []
        for spec in args.configs.split(","):
            if spec == "default":
                d = default_config(m, n, k)
                if d is None:
                    cells.append("split-K")
                    continue
                tm, tn, cl, sw, am = d
            else:
                tm, tn, cl, sw, am = parse_config(spec)
            cells.append(f"{hbm_reads(m, n, k, tm, tn, cl, sw, am, l2, order=order_of(spec)) / 1e9:.3f}")
        print(f"| {s} | " + " | ".join(cells) + " |  (GB of A+B read from HBM)")


if __name__ == "__main__":
    main()
