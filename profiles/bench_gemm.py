"""GEMM benchmark: cute-kernels vs cuBLAS (torch.matmul) vs quack, one process, one harness.

Timing: ``triton.testing.do_bench`` median (it flushes L2 between runs: cold L2).  Each figure is the
median over ``--repeats`` interleaved rounds (every implementation timed once per shape per round),
and each ratio is a same-round ratio to cuBLAS.  Writes JSON + a markdown table.

    python3 profiles/bench_gemm.py [--quick] [--quack-untuned] [--tune] [--out DIR] [--shapes MxNxK,...]
        [--splitk-variants] [--configs 256x128:1x2:8m,...]

quack runs with its autotuner on (its default, as its users run it): its first call per shape tunes
~40 configs, so that call is slow; the time is recorded as ``first_call_s``.  Besides the ratio to
cuBLAS, each cute-kernels figure has a ratio to the best peer of its round (min of cuBLAS and quack).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

SHAPES = [  # (M, N, K): A (M, K) row-major, B (K, N) row-major, as torch.matmul users hold them
    (4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096), (4096, 14336, 4096),
    (128, 4096, 4096), (1024, 1024, 32768), (4097, 4096, 4096), (1000, 3000, 520), (4096, 4096, 4100),
]
LARGE = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096), (4096, 14336, 4096)]
#: ``--preset llm``: linear layers of Llama-style models at 8192 tokens (M) and an LM head at decode-
#: batch size, where the shape heuristics meet sizes that are not the issue's: Llama-2-7B QKV
#: (12288), gate+up (22016) and down (K = 11008), Llama-2-13B hidden 5120, a 70B down projection
#: (K = 28672), a 32000-entry LM head at 256 tokens, and the odd-N stream shape of session 6.
LLM = [(8192, 12288, 4096), (8192, 22016, 4096), (8192, 4096, 11008), (8192, 11008, 4096),
       (8192, 5120, 5120), (8192, 8192, 28672), (256, 32000, 4096), (16384, 4400, 4096)]
#: ``--preset decode``: decode-time linear layers (M = batch of new tokens, 1..64) of Llama-style models,
#: where cuBLAS runs GEMV-like kernels and ours the transposed skinny plan (session 8).
DECODE = [(1, 4096, 4096), (16, 4096, 4096), (32, 4096, 4096), (64, 4096, 4096), (16, 14336, 4096),
          (16, 4096, 14336), (8, 11008, 4096), (64, 4096, 11008), (32, 8192, 8192)]


def explicit_config(spec: str):
    """``fn(a, b)`` running our GEMM at an explicit config: ``TMxTN:CMxCN[:SW(m|n)][:swap]`` (tile,
    cluster, raster swizzle and direction, and ``swap``: out^T = b^T a^T on those tiles), or
    ``default:defer`` / ``default:nodefer`` (the planner's choice with the deferred epilogue forced)."""
    from cute_kernels.gemm import plan as gemm_plan
    from cute_kernels.gemm.heuristics import make_gemm_tiles

    parts = spec.split(":")
    if parts[0] == "default":
        choice = gemm_plan.PlanChoice(epi_defer={"defer": True, "nodefer": False}[parts[1]])
        return lambda a, b: gemm_plan.run(a, b, choice=choice)
    tm, tn = map(int, parts[0].split("x"))
    cm, cn = map(int, parts[1].split("x"))
    raster = next(((int(p[:-1]), p[-1] == "m") for p in parts[2:] if p[-1] in "mn" and p[:-1].isdigit()), None)
    swap = "swap" in parts[2:]

    def run(a, b):
        if swap:
            a, b = b.mT, a.mT
        am = "k" if a.stride(-1) == 1 else "mn"
        bm = "mn" if b.stride(-1) == 1 else "k"
        tiles = make_gemm_tiles(tn, (cm, cn), "bfloat16", am, bm, "bfloat16", tile_m=tm)
        out = torch.empty(a.shape[-2], b.shape[-1], device=a.device, dtype=a.dtype)
        if swap:  # the output transposed back as a view: D is written M-major
            out = torch.empty(b.shape[-1], a.shape[-2], device=a.device, dtype=a.dtype).mT
        gemm_plan.run(a, b, out, choice=gemm_plan.PlanChoice(tiles=tiles, raster=raster, splits=1))
        return out.mT if swap else out

    return run


def main():
    from triton.testing import do_bench

    import cute_kernels

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="first three shapes, one round")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quack-untuned", dest="quack_tuned", action="store_false",
                    help="quack without its autotuner (its default heuristic config)")
    ap.add_argument("--tune", action="store_true", help="autotune cute-kernels per shape first (persisted)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--shapes", default="", help="comma-separated MxNxK subset, e.g. 8192x8192x8192,1000x3000x520")
    ap.add_argument("--preset", choices=["issue", "llm", "decode"], default="issue",
                    help="shape set: the nine issue shapes (default), LLM layer shapes (LLM above) or "
                         "decode-time ones with M <= 64 (DECODE above)")
    ap.add_argument("--splitk-variants", action="store_true",
                    help="also time every split-K mode (cute_kernels.gemm.plan.SPLITK_MODES) as 'ck:<mode>' columns")
    ap.add_argument("--configs", default="",
                    help="also time our kernel at explicit configs (TMxTN:CMxCN[:SW(m|n)][:swap], e.g. 256x128:1x2:8m,"
                         "256x208:1x2:8m:swap) as 'ck <spec>' columns in the same rounds")
    args = ap.parse_args()
    preset = {"llm": LLM, "decode": DECODE}.get(args.preset, SHAPES)
    shapes = preset[:3] if args.quick else preset
    if args.shapes:
        shapes = [tuple(int(x) for x in s_.split("x")) for s_ in args.shapes.split(",")]
    repeats = 1 if args.quick else args.repeats

    try:
        from quack.gemm_interface import gemm as quack_gemm
    except Exception as e:  # not installed here
        print("quack unavailable:", e)
        quack_gemm = None

    dev = torch.device("cuda")
    impls = {"cuBLAS": lambda a, b: torch.matmul(a, b), "cute-kernels": lambda a, b: cute_kernels.gemm(a, b)}
    if quack_gemm is not None:
        impls["quack"] = lambda a, b: quack_gemm(a, b, tuned=args.quack_tuned)
    if args.splitk_variants:  # same process, same rounds: the split-K modes side by side
        from cute_kernels.gemm import plan as gemm_plan

        for mode in gemm_plan.SPLITK_MODES:
            impls[f"ck:{mode}"] = (lambda c: lambda a, b: gemm_plan.run(a, b, choice=c))(
                gemm_plan.PlanChoice(splitk_mode=mode))

    if args.configs:
        for spec in filter(None, args.configs.split(",")):
            impls[f"ck {spec}"] = explicit_config(spec)

    data, errors, first_call = {}, {}, {}
    for shape in shapes:
        m, n, k = shape
        print(f"shape {shape} {time.strftime('%T')}", flush=True)
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        ref = torch.matmul(a.float(), b.float())
        data[shape] = (a, b)
        if args.tune:
            try:
                t0 = time.time()
                cute_kernels.gemm(a, b, tune=True)
                print(f"tuned {shape} in {time.time() - t0:.1f} s", flush=True)
            except Exception as e:
                print(f"tune {shape} failed: {e}", flush=True)
        for name, fn in impls.items():
            try:
                t0 = time.time()
                out = fn(a, b)
                torch.cuda.synchronize()
                first_call[(shape, name)] = time.time() - t0
                err = ((out.float() - ref).norm() / ref.norm()).item()
                if not err < 2e-2:
                    raise RuntimeError(f"wrong result: rel err {err:.3g}")
            except Exception as e:
                errors[(shape, name)] = f"{type(e).__name__}: {str(e)[:200]}"
                print(f"{shape} {name}: {errors[(shape, name)]}", flush=True)
        del ref

    from timing import rotated

    times = {}  # (shape, impl) -> [ms per round]
    for r in range(repeats):
        for shape in shapes:
            a, b = data[shape]
            for name, fn in rotated(impls.items(), r):
                if (shape, name) in errors:
                    continue
                ms = do_bench(lambda: fn(a, b), warmup=25, rep=100, return_mode="median")
                times.setdefault((shape, name), []).append(ms)

    # second timer, once per shape: after a read-only L2 flush (see profiles/timing.py for why)
    from timing import bench_clean

    clean = {}
    for shape in shapes:
        a, b = data[shape]
        for name, fn in impls.items():
            if (shape, name) not in errors:
                clean[(shape, name)] = bench_clean(lambda: fn(a, b))

    rows = []
    for shape in shapes:
        m, n, k = shape
        flops = 2 * m * n * k
        row = {"shape": shape}
        for name in impls:
            ts = times.get((shape, name))
            if ts:
                row[name] = {"ms": statistics.median(ts), "tflops": flops / statistics.median(ts) / 1e9,
                             "first_call_s": first_call.get((shape, name)),
                             "clean_flush_us": clean.get((shape, name))}
            else:
                row[name] = {"error": errors.get((shape, name), "not run")}
        base = times.get((shape, "cuBLAS"))
        for name in impls:
            ts = times.get((shape, name))
            if ts and base:
                row[name]["ratio_vs_cublas"] = statistics.median([b_ / t for b_, t in zip(base, ts)])
        peers = [times[(shape, p)] for p in impls if p in ("cuBLAS", "quack") and (shape, p) in times]
        ours = times.get((shape, "cute-kernels"))
        if ours and peers:  # per round: best peer's time / ours
            row["cute-kernels"]["ratio_vs_best_peer"] = statistics.median(
                [min(p[i] for p in peers) / t for i, t in enumerate(ours)])
        rows.append(row)

    def geo(name, subset=None):
        rs = [r[name].get("ratio_vs_cublas") for r in rows if subset is None or r["shape"] in subset]
        rs = [x for x in rs if x]
        return math.exp(sum(map(math.log, rs)) / len(rs)) if rs else None

    commit = os.environ.get("CK_COMMIT")  # the device copy's .git may be stale: the caller names it
    try:
        commit = commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(__file__)).stdout.strip()
    except Exception:
        commit = "?"
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": datetime.date.today().isoformat(),
           "commit": commit, "repeats": repeats, "quack_tuned": args.quack_tuned,
           "cute_kernels_tuned": args.tune}
    summary = {name: {"geomean_vs_cublas": geo(name), "geomean_large": geo(name, LARGE)} for name in impls}
    best = [r["cute-kernels"].get("ratio_vs_best_peer") for r in rows]
    best = [x for x in best if x]
    if best:
        summary["cute-kernels"]["geomean_vs_best_peer"] = math.exp(sum(map(math.log, best)) / len(best))
    lines = [f"# GEMM bf16, {env['gpu']}, {env['date']}, commit {commit}", "",
             "| M x N x K | " + " | ".join(f"{n} TFLOP/s (x cuBLAS)" for n in impls) + " |"
             + " cute-kernels x best peer |", "|---|" + "---|" * (len(impls) + 1)]
    for r in rows:
        cells = []
        for name in impls:
            x = r[name]
            cells.append(f"{x['tflops']:.0f} ({x.get('ratio_vs_cublas', 0):.2f}x)" if "tflops" in x else x["error"][:40])
        rb = r["cute-kernels"].get("ratio_vs_best_peer")
        cells.append(f"{rb:.2f}x" if rb else "-")
        lines.append(f"| {'x'.join(map(str, r['shape']))} | " + " | ".join(cells) + " |")
    lines.append("")
    for name, s in summary.items():
        if s["geomean_vs_cublas"]:
            large = f", large shapes {s['geomean_large']:.3f}x" if s["geomean_large"] else ""  # none in the M <= 64 preset
            lines.append(f"- {name}: geomean {s['geomean_vs_cublas']:.3f}x cuBLAS{large}"
                         + (f"; vs best peer {s['geomean_vs_best_peer']:.3f}x" if "geomean_vs_best_peer" in s else ""))
    lines += ["", "Second timer (one round, CUDA events after a read-only 256 MB L2 flush instead of do_bench's "
              "zero_, which leaves ~50 MB of dirty L2 to write back during the call), microseconds:", "",
              "| M x N x K | " + " | ".join(impls) + " | cute-kernels x cuBLAS |", "|---|" + "---|" * (len(impls) + 1)]
    for shape in shapes:
        cs = [clean.get((shape, n_)) for n_ in impls]
        cb, ck = clean.get((shape, "cuBLAS")), clean.get((shape, "cute-kernels"))
        lines.append(f"| {'x'.join(map(str, shape))} | " + " | ".join(f"{c:.1f}" if c else "-" for c in cs)
                     + (f" | {cb / ck:.2f}x |" if cb and ck else " | - |"))
    text = "\n".join(lines)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    tag = "" if args.preset == "issue" and not args.shapes else f"-{args.preset if not args.shapes else 'shapes'}"
    stem = os.path.join(args.out, f"gemm{tag}-{env['date']}-{commit}")
    with open(stem + ".json", "w") as f:
        json.dump({"env": env, "rows": [{**r, "shape": list(r["shape"])} for r in rows], "summary": summary}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
