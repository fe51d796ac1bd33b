"""Ping-pong vs cooperative GEMM consumers vs cuBLAS (torch.matmul) on the four large shapes.

Timing: ``triton.testing.do_bench`` median (cold L2, as profiles/bench_gemm.py), interleaved rounds
(each implementation timed once per shape per round), ratio = cuBLAS time / ours in the same round,
median over rounds.  Our kernels are called through a plan built once (``_make_plan``) with a
preallocated output, so host work per call is one TVM-FFI call.  Every output is checked against
torch.matmul (fp32 accumulate) before timing.  Writes pingpong.md + pingpong.json to --out.

    python3 profiles/bench_pingpong.py [--out DIR] [--repeats 3] [--shapes 4096x4096x4096,...] [--tiles256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

LARGE = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096), (4096, 14336, 4096)]


def variants_256(m, n, k):
    """--tiles256: the cooperative default vs quack's 256 x {128..208} cooperative tiles (2x1 / 1x2
    clusters where the tile counts allow) and 192-wide ping-pong."""
    from cute_kernels.gemm import host as G

    out = {"coop": G.default_tiles(m, n, k, 1, "bfloat16", "k", "mn", "bfloat16", "n", pingpong=False)}
    for tn in (128, 160, 192, 208):
        for cl in ((2, 1), (1, 2)):
            if (cl[0] == 2 and (-(-m // 256)) % 2) or (cl[1] == 2 and (-(-n // tn)) % 2):
                continue
            out[f"t256x{tn}-c{cl[0]}{cl[1]}"] = G.make_gemm_tiles(tn, cl, "bfloat16", "k", "mn", "bfloat16", tile_m=256)
    if (-(-m // 128)) % 2 == 0:
        out["pp192-c21"] = G.make_gemm_tiles(192, (2, 1), "bfloat16", "k", "mn", "bfloat16", pingpong=True)
    return out


def variants(m, n, k):
    """name -> GemmTiles (None: the cooperative default heuristic of cute_kernels.gemm)."""
    from cute_kernels.gemm import host as G

    mk = lambda tn, cl: G.make_gemm_tiles(tn, cl, "bfloat16", "k", "mn", "bfloat16", pingpong=True)  # noqa: E731
    even_m = (-(-m // 128)) % 2 == 0
    out = {
        "coop": G.default_tiles(m, n, k, 1, "bfloat16", "k", "mn", "bfloat16", "n", pingpong=False),
        "pp-auto": G.default_tiles(m, n, k, 1, "bfloat16", "k", "mn", "bfloat16", "n", pingpong=True),
        "pp128-c21": mk(128, (2, 1)) if even_m else None,
        "pp192-c21": mk(192, (2, 1)) if even_m else None,
        "pp128-c12": mk(128, (1, 2)) if (-(-n // 128)) % 2 == 0 else None,
    }
    return {k_: v for k_, v in out.items() if v is not None}


def describe(t):
    return f"{t.tile_mnk[0]}x{t.tile_mnk[1]} c{t.cluster_mn[0]}x{t.cluster_mn[1]} st{t.ab_stages}" + (
        " pp" if t.pingpong else "")


def main():
    from triton.testing import do_bench

    from cute_kernels.gemm import host as G

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shapes", default=None, help="e.g. 4096x4096x4096,8192x8192x8192")
    ap.add_argument("--tiles256", action="store_true",
                    help="variants: cooperative 256 x {128..208} tiles vs the default (writes tiles256.md/json)")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")] if args.shapes else LARGE
    os.makedirs(args.out, exist_ok=True)
    G.FORCE_SPLITS = 1  # large shapes never split; keep the plans honest anyway

    dev = torch.device("cuda")
    cases = {}
    for shape in shapes:
        m, n, k = shape
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        ref = torch.matmul(a, b).float()
        fns = {"cuBLAS": (lambda a=a, b=b: torch.matmul(a, b)), }
        desc = {"cuBLAS": "torch.matmul"}
        for name, tiles in (variants_256 if args.tiles256 else variants)(m, n, k).items():
            t0 = time.time()
            try:
                p = G._make_plan(a, b, None, None, 0.0, None, tiles=tiles)
                out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
                fn = (lambda p=p, a=a, b=b, out=out: p.fn(a, b, out, out, 1.0, 0.0))
                out.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                err = ((out.float() - ref).norm() / ref.norm()).item()
            except Exception as e:  # noqa: BLE001 - report and go on with the other variants
                print(f"{shape} {name}: FAILED {type(e).__name__}: {e}", flush=True)
                continue
            print(f"{shape} {name} [{describe(tiles)}]: first call {time.time() - t0:.1f} s, rel err {err:.2e}",
                  flush=True)
            if not err < 2e-2:
                print(f"{shape} {name}: WRONG RESULT, not timed", flush=True)
                continue
            fns[name], desc[name] = fn, describe(tiles)
        cases[shape] = (fns, desc)

    times = {s: {name: [] for name in cases[s][0]} for s in shapes}
    for r in range(args.repeats):
        for shape in shapes:
            for name, fn in cases[shape][0].items():
                times[shape][name].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
        print(f"round {r + 1} done", flush=True)

    flops = lambda s: 2 * s[0] * s[1] * s[2]  # noqa: E731
    rows, js = [], []
    names = sorted({nm for s in shapes for nm in cases[s][0]}, key=lambda x: (x != "cuBLAS", x))
    head = "| M x N x K | " + " | ".join(names) + " | best vs cuBLAS |"
    rows += [head, "|" + "---|" * (len(names) + 2)]
    for shape in shapes:
        t = times[shape]
        base = t["cuBLAS"]
        cells, best = [], (None, 0.0)
        for nm in names:
            if nm not in t:
                cells.append("-")
                continue
            ms = statistics.median(t[nm])
            ratio = statistics.median(b_ / o for b_, o in zip(base, t[nm]))
            tfl = flops(shape) / ms / 1e9
            cells.append(f"{ms * 1e3:.1f} us {tfl:.0f} TF" + ("" if nm == "cuBLAS" else f" **{ratio:.3f}x**"))
            if nm != "cuBLAS" and ratio > best[1]:
                best = (nm, ratio)
            js.append(dict(shape=shape, impl=nm, config=cases[shape][1][nm], ms=t[nm], median_ms=ms,
                           ratio_vs_cublas=ratio))
        rows.append(f"| {'x'.join(map(str, shape))} | " + " | ".join(cells) + f" | {best[0]} {best[1]:.3f}x |")
    rows.append("")
    rows.append("configs: " + "; ".join(f"{'x'.join(map(str, s))}: " + ", ".join(
        f"{nm}={d}" for nm, d in cases[s][1].items()) for s in shapes))
    table = "\n".join(rows)
    print(table)
    stem = "tiles256" if args.tiles256 else "pingpong"
    with open(os.path.join(args.out, f"{stem}.md"), "w") as f:
        f.write(f"{torch.cuda.get_device_name()}, do_bench median (cold L2), {args.repeats} interleaved rounds\n\n")
        f.write(table + "\n")
    with open(os.path.join(args.out, f"{stem}.json"), "w") as f:
        json.dump(js, f, indent=1)


if __name__ == "__main__":
    main()
