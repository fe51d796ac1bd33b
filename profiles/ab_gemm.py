"""Paired A/B timing of GEMM kernel variants: call-by-call interleaving under do_bench's own flush.

Why: ``bench_gemm.py`` runs each implementation in its own ``do_bench`` window (~100 ms), one after the
other.  On this power-capped H200 the SM clock drifts between such windows, and same-round ratios of
one run scattered by +-5% (session 7 run 1: our 4096^3 read 0.91x cuBLAS by the median round ratio
and 0.97x by the median TFLOP/s) -- too coarse for 1-2% kernel changes.  Here every variant is called
once per iteration, in rotated order, each call after the same 256 MB ``zero_`` flush do_bench uses
and timed by CUDA events, so neighbouring calls see the same clock and L2 state.  Reported: each
variant's median microseconds, and the median over iterations of the paired ratio to the first
variant in ``--variants``, with its interquartile range.

    python3 profiles/ab_gemm.py --shapes 4096x4096x4096,3x1000x1000x1000,... \
        --variants cuBLAS,default,default:nodefer [--iters 200] [--out DIR]

A shape ``LxMxNxK`` is L batched products (3-D operands).

``--burst N``: each timed sample is N back-to-back calls of the variant after one flush (us per call
reported), as layers follow each other in a model; the launch gap between kernels is then part of the
figure, which is where programmatic dependent launch can show.

Variants: ``cuBLAS`` (torch.matmul), ``quack`` (autotuned), ``default`` (cute_kernels.gemm), or any
``bench_gemm.explicit_config`` spec (``default:defer``, ``default:nodefer``, ``256x128:1x2:8m``, ...).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))


def make_fn(name):
    import cute_kernels

    if name == "cuBLAS":
        return lambda a, b: torch.matmul(a, b)
    if name == "default":
        return lambda a, b: cute_kernels.gemm(a, b)
    if name == "quack":
        from quack.gemm_interface import gemm as quack_gemm

        return lambda a, b: quack_gemm(a, b, tuned=True)
    from bench_gemm import explicit_config

    return explicit_config(name)


def paired_times(fns: dict, a, b, iters: int, burst: int = 1) -> dict:
    """{name: [us per call]}: every variant once per iteration (rotated order), each call after a
    256 MB ``zero_`` (do_bench's flush) and timed by its own pair of CUDA events."""
    cache = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda")
    names = list(fns)
    ev = {k: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
          for k in names}
    for k in names:  # warm-up (compiles, autotunes)
        for _ in range(3):
            fns[k](a, b)
    torch.cuda.synchronize()
    from timing import rotated

    for i in range(iters):
        for k in rotated(names, i):
            cache.zero_()
            s, e = ev[k][i]
            s.record()
            for _ in range(burst):
                fns[k](a, b)
            e.record()
        if i % 50 == 49:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return {k: [s.elapsed_time(e) * 1e3 / burst for s, e in ev[k]] for k in names}


def quartiles(xs):
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--variants", required=True, help="comma list; the first is the base of the ratios")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--burst", type=int, default=1, help="back-to-back calls per timed sample")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--tag", default="", help="file-name tag, so several calls in one run keep their files")
    args = ap.parse_args()
    # MxNxK, or LxMxNxK: L batched products (3-D operands)
    shapes = [(None, *d) if len(d) == 3 else d for d in
              (tuple(int(x) for x in s.split("x")) for s in args.shapes.split(","))]
    names = args.variants.split(",")
    fns = {k: make_fn(k) for k in names}
    commit = os.environ.get("CK_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=os.path.dirname(__file__)).stdout.strip()
    rows = []
    for l, m, n, k in shapes:
        batch = () if l is None else (l,)
        a = torch.randn(*batch, m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(*batch, k, n, device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ b.float()
        ok = {}
        for name in names:  # every variant must be right before it is timed
            try:
                err = ((fns[name](a, b).float() - ref).norm() / ref.norm()).item()
                ok[name] = err < 2e-2 or f"wrong result: rel err {err:.3g}"
            except Exception as e:  # noqa: BLE001 (recorded, not fatal)
                ok[name] = f"{type(e).__name__}: {str(e)[:160]}"
        del ref
        live = {k_: fns[k_] for k_ in names if ok[k_] is True}
        times = paired_times(live, a, b, args.iters, args.burst)
        base = names[0]
        row = {"shape": [m, n, k] if l is None else [l, m, n, k], "errors": {k_: v for k_, v in ok.items() if v is not True}, "variants": {}}
        for name, ts in times.items():
            lo, med, hi = quartiles(ts)
            entry = {"us_median": med, "us_q1": lo, "us_q3": hi, "tflops": 2 * (l or 1) * m * n * k / med / 1e6}
            if base in times and name != base:
                rs = [tb / t for tb, t in zip(times[base], ts)]  # > 1: faster than the base
                entry["speedup_vs_base"] = quartiles(rs)
            row["variants"][name] = entry
        rows.append(row)
        print("x".join(map(str, row["shape"])) + ": " + "  ".join(
            f"{k_} {v['us_median']:.1f}us" + (" x{:.3f} [{:.3f},{:.3f}]".format(v['speedup_vs_base'][1],
                                                                                v['speedup_vs_base'][0],
                                                                                v['speedup_vs_base'][2])
                                               if 'speedup_vs_base' in v else "")
            for k_, v in row["variants"].items()), flush=True)
        for k_, v in row["errors"].items():
            print(f"  {k_}: {v}", flush=True)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": commit,
           "date": datetime.date.today().isoformat(), "iters": args.iters, "burst": args.burst,
           "base": names[0]}
    os.makedirs(args.out, exist_ok=True)
    tag = (f"-{args.tag}" if args.tag else "") + (f"-burst{args.burst}" if args.burst > 1 else "")
    stem = os.path.join(args.out, f"gemm-ab{tag}-{env['date']}-{commit}")
    with open(stem + ".json", "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    lines = [f"# GEMM paired A/B, {env['gpu']}, {env['date']}, commit {commit}", "",
             f"Each variant called {'once' if args.burst == 1 else f'{args.burst} times back to back'} per "
             f"iteration ({args.iters} iterations, rotated order), after the same "
             "256 MB zero_ flush as do_bench, CUDA events (us per call).  Speedup = median over iterations of "
             f"t({names[0]}) / t(variant), [quartiles]; > 1 is faster than {names[0]}.", "",
             "| M x N x K | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for row in rows:
        cells = []
        for name in names:
            v = row["variants"].get(name)
            if v is None:
                cells.append(row["errors"].get(name, "-")[:40])
                continue
            s = f"{v['us_median']:.1f} us, {v['tflops']:.0f} TF"
            if "speedup_vs_base" in v:
                q1, med, q3 = v["speedup_vs_base"]
                s += f", **{med:.3f}x** [{q1:.3f}, {q3:.3f}]"
            cells.append(s)
        lines.append("| {} | {} |".format("x".join(map(str, row["shape"])), " | ".join(cells)))
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
