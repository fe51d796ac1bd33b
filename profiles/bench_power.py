"""Sustained-load GEMM comparison: throughput, SM clock and board power per implementation.

Why: on the long, power-bound shapes (8192^3) our kernel reads 0.89-0.94x cuBLAS under do_bench in
three runs, while the tuner's short timing of the same config read 795 TFLOP/s (1.00x+).  Hypothesis:
under sustained load the board hits its power cap and the clock drops more for us (more energy per
FLOP: shared-memory or L2 traffic), rather than the kernel issuing worse at equal clock.  This script
tells the two apart: each implementation runs back to back for ``--seconds`` (no flush, like a
training step) while ``nvidia-smi`` samples SM clock, power and temperature every 50 ms.

    python3 profiles/bench_power.py [--seconds 3] [--shapes 8192x8192x8192,4096x4096x4096] [--out DIR]
        [--configs 128x256:1x1:4m,128x256:2x1:4m]   # + our kernel at explicit tile:cluster:raster

``--configs`` adds our kernel at explicit configs (``[pp]TMxTN:CMxCN:<swizzle><m|n>[:swap]``), e.g. to see
whether a 2x1 multicast cluster (half the B traffic from L2) costs less power than the default 1x1
on 8192^3 (the session-1 tuner's short timing preferred 1x1; sustained load was never compared).

Per (shape, implementation): TFLOP/s over the window, median SM clock (MHz), mean power (W),
TFLOP/s per kW, and TFLOP/s per GHz (issue efficiency at equal clock).  Implementations run in
rotating order with a 2 s idle gap, so heat from one does not all land on the next.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def sampler(path):
    """Background nvidia-smi: lines 'timestamp, clock MHz, power W, temp C' every 50 ms, into a file.

    Not a pipe: nobody reads it until the end, and once its 64 KB buffer filled (~1 minute of lines)
    nvidia-smi blocked, so every window after the first minute had no samples (session 5 run 1)."""
    cmd = ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
           "--format=csv,noheader,nounits", "-lms", "50"]
    return subprocess.Popen(cmd, stdout=open(path, "w"), stderr=subprocess.DEVNULL, text=True)


def parse(lines):
    import datetime

    out = []
    for ln in lines:
        parts = [p.strip() for p in ln.split(",")]
        if len(parts) != 4:
            continue
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((t, float(parts[1]), float(parts[2]), float(parts[3])))
        except ValueError:
            continue
    return out


#: ``explicit_config`` flags that switch a kernel option off (``GemmConfig`` field, value)
OPTION_FLAGS = {"nopdl": ("pdl", False), "fat": ("lean_tile", False), "defer": ("epi_defer", True),
                "nodefer": ("epi_defer", False), "streamk": ("stream_k", True)}


def explicit_config(spec):
    """``[pp]TMxTN:CMxCN:<swizzle><m|n>[:swap][:nopdl][:fat]`` -> gemm(a, b) at that tile, cluster and
    raster.  ``default`` instead of the first three fields keeps the planner's tiles and raster (only
    the flags change): ``default:nopdl`` is the default plan without programmatic dependent launch,
    ``default:fat`` without the lean per-tile work (acc.fill(0) and an unconditional alpha multiply),
    ``default:defer`` / ``default:nodefer`` with / without the deferred epilogue, ``default:noswap``
    without the transposed plan of skinny (M <= 64) problems, ``default:streamk`` the persistent
    split-K as stream-K (shapes whose plan is the persistent split-K only).

    ``splitk:TN:S:C`` is the cluster split-K kernel at tile width TN, S K slices and A multicast to C
    CTAs along N (L2 evict-first B, vector stores; row-major A, B and out); ``fixup:TN:S:C`` the same
    for the fixup split-K kernel (slices meet in an L2 workspace, the cluster is only along N);
    ``swap:TN:S[:C]`` the transposed skinny plan (gemm_host.skinny_swap_choice) at tile width TN, S slices
    and the weight tile multicast to C CTAs along the problem's M (its N tiles when TN < M);
    ``psplit:TMxTN:CMxCN:S`` the persistent split-K (split-K inside the persistent schedule) at those
    tiles, cluster and S slices (cuBLAS's 1024x1024x32768 kernel: 256x128 tiles, 1x2 clusters, S=4
    plus a separate reduce, ncu session 9 run 9);
    ``swapfix:TN:S[:C]`` the same through the fixup kernel at any S (cuBLAS's M = 64 kernel, session 9:
    64-row weight tiles x 32-wide M halves in 1 x 2 clusters sharing the weight by multicast, no split).

    ``:swap`` computes the transposed problem, out^T = b^T a^T, as quack's ``swap_ab`` does (its
    autotuned 8192^3 winner, session 4 run 5): the kernel's M is then the problem's N, A is MN-major,
    B is K-major and the output is written column-major (a transposed view of the row-major result).
    """
    import torch

    from cute_kernels.gemm import host as G
    from cute_kernels.gemm import tune
    from cute_kernels.gemm.host import _gemm_impl

    fields = spec.split(":")
    if fields[0] in ("swap", "swapfix"):  # the transposed skinny plan at (tile width, K slices), row-major a, b
        tn, s = int(fields[1]), int(fields[2])
        c = int(fields[3]) if len(fields) > 3 else 1
        fns = {}

        def run_swap(a, b):
            m, n = a.shape[0], b.shape[1]
            if (m, n) not in fns:
                fns[(m, n)] = G._skinny_swapped_fn((tn, s, c), m, n, "bfloat16", "mn", "k", "bfloat16", "bfloat16",
                                                   False, fixup=True if fields[0] == "swapfix" else None)
            out = torch.empty(m, n, device=a.device, dtype=a.dtype)
            fns[(m, n)](a, b, out, out, 1.0, 0.0)
            return out

        return run_swap
    if fields[0] == "psplit":  # the persistent split-K (GemmConfig.splits) at explicit tiles, cluster, slices
        from cute_kernels.gemm.kernel import GemmConfig

        tm, tn = (int(x) for x in fields[1].split("x"))
        cl = tuple(int(x) for x in fields[2].split("x"))
        s = int(fields[3])
        cfg = GemmConfig(tiles=tune._tiles(tn, cl, "bfloat16", "k", "mn", "bfloat16", tm), a_rank=2,
                         max_active_clusters=132 // (cl[0] * cl[1]), splits=s)
        raw, launchers = G.compiled_gemm(cfg, "bfloat16", "bfloat16", "bfloat16"), {}

        def run_psplit(a, b):
            m, n = a.shape[0], b.shape[1]
            if (m, n) not in launchers:
                n_tiles = -(-m // tm) * -(-n // tn)
                launchers[(m, n)] = G.SplitKFixupLauncher(raw, n_tiles * s * tm * tn, n_tiles)
            out = torch.empty(m, n, device=a.device, dtype=a.dtype)
            launchers[(m, n)](a, b, out, out, 1.0, 0.0)
            return out

        return run_psplit
    if fields[0] in ("splitk", "fixup"):
        from cute_kernels.gemm.splitk_kernel import SplitKClusterConfig, SplitKFixupConfig, fixup_workspace_numel

        tn, s, c = (int(x) for x in fields[1:4])
        tiles = G.splitk_tiles(tn, "bfloat16", "k", "mn", "bfloat16", c)
        if fields[0] == "splitk":
            cfg = SplitKClusterConfig(tiles=tiles, splits=s, vec_store=True, b_evict_first=True)
            fn = G.compiled_splitk_cluster(cfg, "bfloat16", "bfloat16", "bfloat16")
        else:
            cfg = SplitKFixupConfig(tiles=tiles, splits=s, b_evict_first=True)
            raw, launchers = G.compiled_splitk_fixup(cfg, "bfloat16", "bfloat16", "bfloat16"), {}

            def fn(a, b, out, c_, alpha, beta):
                key = (a.shape[0], b.shape[1])
                if key not in launchers:
                    launchers[key] = G.SplitKFixupLauncher(raw, *fixup_workspace_numel(*key, tn, s))
                launchers[key](a, b, out, c_, alpha, beta)

        def run_splitk(a, b):
            out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
            fn(a, b, out, out, 1.0, 0.0)
            return out

        return run_splitk
    flags = [f for f in fields if f in OPTION_FLAGS or f == "swap"]
    options = tuple(OPTION_FLAGS[f] for f in flags if f in OPTION_FLAGS)
    if fields[0] == "default":
        if "swap" in flags:
            raise ValueError("default:swap is not a config: give the tiles")
        if "noswap" in fields:  # the plan without the skinny-M swap (an explicit split-K mode skips it)
            return lambda a, b: _gemm_impl(a, b, None, None, 1.0, 0.0, None, splitk_mode=G.SPLITK_MODE)
        return lambda a, b: _gemm_impl(a, b, None, None, 1.0, 0.0, None, options=options)
    tile, cluster, raster = fields[:3]
    swap = "swap" in flags
    pp = tile.startswith("pp")
    tile_m, tile_n = (int(x) for x in tile.removeprefix("pp").split("x"))
    cl = tuple(int(x) for x in cluster.split("x"))
    sw, along_m = int(raster[:-1]), raster[-1] == "m"
    if not swap:
        tiles = tune._tiles(tile_n, cl, "bfloat16", "k", "mn", "bfloat16", tile_m, pp)  # row-major A and B
        return lambda a, b: _gemm_impl(a, b, None, None, 1.0, 0.0, None, tiles, (sw, along_m), options=options)
    tiles = tune._tiles(tile_n, cl, "bfloat16", "mn", "k", "bfloat16", tile_m, pp)  # b^T: M-major, a^T: K-major

    def run(a, b):
        out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
        _gemm_impl(b.mT, a.mT, out.mT, None, 1.0, 0.0, None, tiles, (sw, along_m), options=options)
        return out

    return run


def check(fn, name):
    """Every implementation must be right before it is timed (fresh random data, fp32 reference)."""
    a = torch.randn(1000, 520, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(520, 1536, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    err = ((fn(a, b).float() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        raise RuntimeError(f"{name}: wrong result (relative error {err:.3g})")


def gemm_impls(configs: str) -> dict:
    """cuBLAS, our default, quack autotuned (when importable) and our kernel at each explicit config
    (comma-separated :func:`explicit_config` specs), each checked for a right result."""
    import cute_kernels

    impls = {"cuBLAS": torch.matmul, "cute-kernels": cute_kernels.gemm}
    try:
        from quack.gemm_interface import gemm as quack_gemm

        impls["quack"] = lambda a, b: quack_gemm(a, b, tuned=True)
    except Exception as e:  # noqa: BLE001
        print("quack unavailable:", e)
    for spec in filter(None, configs.split(",")):
        impls[f"ck {spec}"] = explicit_config(spec)
    for name, fn in impls.items():
        check(fn, name)
    return impls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--shapes", default="8192x8192x8192,4096x4096x4096,16384x4096x4096")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--configs", default="128x256:2x1:4m,128x256:2x1:1m")
    args = ap.parse_args()

    impls = gemm_impls(args.configs)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    import tempfile

    samples_path = os.path.join(tempfile.mkdtemp(), "smi.csv")
    proc = sampler(samples_path)
    windows = []  # (shape, impl, t0, t1, calls)
    names = list(impls)
    for si, (m, n, k) in enumerate(shapes):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        for name in names:
            impls[name](a, b)  # compile / tune outside the window
        torch.cuda.synchronize()
        order = names[si % len(names):] + names[:si % len(names)]
        for name in order:
            fn = impls[name]
            out = fn(a, b)
            torch.cuda.synchronize()
            t_end = time.time() + args.seconds
            calls = 0
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            t0 = time.time()
            start.record()
            while time.time() < t_end:
                for _ in range(10):
                    out = fn(a, b)
                calls += 10
                if calls % 100 == 0:
                    torch.cuda.synchronize()  # keep the host close to the GPU: windows line up
            stop.record()
            stop.synchronize()
            t1 = time.time()
            gpu_s = start.elapsed_time(stop) / 1e3
            windows.append(dict(shape=[m, n, k], impl=name, t0=t0, t1=t1, calls=calls,
                                tflops=2 * m * n * k * calls / gpu_s / 1e12))
            del out
            time.sleep(2.0)
    proc.terminate()
    proc.wait()
    with open(samples_path) as f:
        samples = parse(f.read().splitlines())

    rows = []
    for w in windows:
        # skip the first 20% of each window: the clock settles after the ramp
        lo = w["t0"] + 0.2 * (w["t1"] - w["t0"])
        s = [x for x in samples if lo <= x[0] <= w["t1"]]
        clk = statistics.median([x[1] for x in s]) if s else float("nan")
        pw = statistics.mean([x[2] for x in s]) if s else float("nan")
        temp = max([x[3] for x in s]) if s else float("nan")
        rows.append(dict(w, clock_mhz=clk, power_w=pw, temp_max_c=temp, n_samples=len(s),
                         tflops_per_kw=w["tflops"] / pw * 1e3 if s else None,
                         tflops_per_ghz=w["tflops"] / clk * 1e3 if s else None))
    lines = [f"# Sustained GEMM (bf16), {torch.cuda.get_device_name(0)}, {time.strftime('%Y-%m-%d')}, "
             f"commit {os.environ.get('CK_COMMIT', '?')}, {args.seconds:.1f} s per window", "",
             "| M x N x K | impl | TFLOP/s | SM MHz (median) | W (mean) | TFLOP/s per kW | TFLOP/s per GHz | max C |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {'x'.join(map(str, r['shape']))} | {r['impl']} | {r['tflops']:.0f} | {r['clock_mhz']:.0f} | "
                     f"{r['power_w']:.0f} | {r['tflops_per_kw'] or float('nan'):.0f} | "
                     f"{r['tflops_per_ghz'] or float('nan'):.0f} | {r['temp_max_c']:.0f} |")
    md = "\n".join(lines)
    print(md)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"gemm-power-{time.strftime('%Y-%m-%d')}-{os.environ.get('CK_COMMIT', 'local')}")
    with open(stem + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(md + "\n")


if __name__ == "__main__":
    main()
