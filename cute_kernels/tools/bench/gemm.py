"""GEMM benchmark: cute-kernels vs cuBLAS (torch.matmul) vs quack, one process, one timer.

Timing: ``triton.testing.do_bench`` median (cold L2).  Each figure is the median over ``--repeats``
interleaved rounds (every implementation timed once per shape per round, the order rotated), and each
ratio is taken within the run.  Beside the figures, the same-run ceiling: a bare read of A and B for
shapes below the ridge of the measured roofs (bandwidth-bound: decode-time M <= 64, 128-row
problems); for the compute-bound ones a square cuBLAS matmul of the same FLOPs, its time scaled to
exactly this shape's FLOPs (what the tensor cores give for this much work on a shape cuBLAS likes).  A second timer (CUDA events after a read-only L2 flush,
see :mod:`.timing`) times each implementation once per shape (not with ``--quick``).

quack runs with its autotuner on (as its users run it; off with ``--quack-untuned`` and in
``--quick``): its first call per shape tunes ~40 configs, recorded as ``first_call_s``.  quack
missing: skipped with a note.

    cute-kernels bench gemm [--quick] [--shapes MxNxK,...] [--preset issue|llm|decode] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence

from ..args import OneLineParser, int_in
from . import results

SHAPES = [  # (M, N, K): A (M, K) row-major, B (K, N) row-major, as torch.matmul users hold them
    (4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096), (4096, 14336, 4096),
    (128, 4096, 4096), (1024, 1024, 32768), (4097, 4096, 4096), (1000, 3000, 520), (4096, 4096, 4100),
]
LARGE = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096), (4096, 14336, 4096)]
#: ``--preset llm``: linear layers of Llama-style models at 8192 tokens (M) and an LM head at decode-
#: batch size: Llama-2-7B QKV (12288), gate+up (22016) and down (K = 11008), Llama-2-13B hidden 5120,
#: a 70B down projection (K = 28672), a 32000-entry LM head at 256 tokens, an odd-N stream shape.
LLM = [(8192, 12288, 4096), (8192, 22016, 4096), (8192, 4096, 11008), (8192, 11008, 4096),
       (8192, 5120, 5120), (8192, 8192, 28672), (256, 32000, 4096), (16384, 4400, 4096)]
#: ``--preset decode``: decode-time linear layers (M = batch of new tokens, 1..64) of Llama-style
#: models, where cuBLAS runs GEMV-like kernels and ours the transposed skinny plan.
DECODE = [(1, 4096, 4096), (16, 4096, 4096), (32, 4096, 4096), (64, 4096, 4096), (16, 14336, 4096),
          (16, 4096, 14336), (8, 11008, 4096), (64, 4096, 11008), (32, 8192, 8192)]
#: ``--quick``: one compute-bound and one bandwidth-bound shape (two kernels to compile)
QUICK = [(4096, 4096, 4096), (64, 4096, 4096)]
PRESETS = {"issue": SHAPES, "llm": LLM, "decode": DECODE}
OURS, CUBLAS = "cute-kernels", "cuBLAS"
READ, MATMUL = "read A+B", "cublas_same_flops"  # the ceilings


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"MxNxK,MxNxK"`` -> [(M, N, K), ...]; a bad entry raises ValueError naming --shapes."""
    out = []
    for s in filter(None, (t.strip() for t in text.split(","))):
        parts = s.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--shapes: expected MxNxK with positive integers, got {s!r}")
        out.append(tuple(int(p) for p in parts))
    if not out:
        raise ValueError(f"--shapes: no shape in {text!r}")
    return out


def flops_bytes(m: int, n: int, k: int, batch: int = 1) -> tuple[float, float]:
    """2MNK FLOPs per batch entry; bf16 bytes of A and B read once and the output written once."""
    return 2.0 * batch * m * n * k, 2.0 * batch * (m * k + k * n + m * n)


#: the largest relative (Frobenius) error of a bf16 result against the float32 product that is timed
REL_TOL = 2e-2


def rel_error(out, ref) -> float:
    """``out``'s relative Frobenius error against the float32 ``ref``; RuntimeError above
    :data:`REL_TOL` (a wrong result is not timed)."""
    err = ((out.float() - ref).norm() / ref.norm()).item()
    if not err < REL_TOL:
        raise RuntimeError(f"wrong result: rel err {err:.3g}")
    return err


def explicit_config(spec: str):
    """``fn(a, b)`` running our GEMM (2-D or batched 3-D operands) at an explicit config:
    ``TMxTN:CMxCN[:SW(m|n)][:swap][:sS[:parts]]`` (tile, cluster, raster swizzle and direction, ``swap``:
    out^T = b^T a^T on those tiles, ``sS``: K split S ways (default 1), ``parts``: with split-K's shared
    finish), or
    ``default:defer`` / ``default:nodefer`` (the planner's choice with the deferred epilogue forced),
    ``default:stage`` (operands TMA cannot describe copied into aligned buffers, then the TMA plan), or
    ``default:parts`` (split-K's shared finish, ``PlanChoice.fixup_parts``, where the plan splits K)."""
    import torch

    from ...gemm import plan as gemm_plan
    from ...gemm.heuristics import make_gemm_tiles

    parts = spec.split(":")
    if parts[0] == "default":
        choice = (gemm_plan.PlanChoice(stage=True) if parts[1] == "stage" else
                  gemm_plan.PlanChoice(fixup_parts=True) if parts[1] == "parts" else
                  gemm_plan.PlanChoice(epi_defer={"defer": True, "nodefer": False}[parts[1]]))
        return lambda a, b: gemm_plan.run(a, b, choice=choice)
    tm, tn = map(int, parts[0].split("x"))
    cm, cn = map(int, parts[1].split("x"))
    raster = next(((int(p[:-1]), p[-1] == "m") for p in parts[2:] if p[-1] in "mn" and p[:-1].isdigit()), None)
    swap = "swap" in parts[2:]
    splits = next((int(p[1:]) for p in parts[2:] if p[:1] == "s" and p[1:].isdigit()), 1)
    fixup_parts = "parts" in parts[2:] or None

    def run(a, b):
        if swap:
            a, b = b.mT, a.mT
        am = "k" if a.stride(-1) == 1 else "mn"
        bm = "mn" if b.stride(-1) == 1 else "k"
        tiles = make_gemm_tiles(tn, (cm, cn), "bfloat16", am, bm, "bfloat16", tile_m=tm)
        batch = a.shape[:-2]  # (L,) for a batched (3-D) pair
        out = torch.empty(*batch, a.shape[-2], b.shape[-1], device=a.device, dtype=a.dtype)
        if swap:  # the output transposed back as a view: D is written M-major
            out = torch.empty(*batch, b.shape[-1], a.shape[-2], device=a.device, dtype=a.dtype).mT
        gemm_plan.run(a, b, out, choice=gemm_plan.PlanChoice(tiles=tiles, raster=raster, splits=splits,
                                                             fixup_parts=fixup_parts))
        return out.mT if swap else out

    return run


def precompile(shapes) -> None:
    """Our kernels for ``shapes`` compiled in parallel processes before timing (disk cache)."""
    from ...common import jit
    from .timing import warm_one

    specs = [("gemm", {"m": m, "n": n, "k": k}) for m, n, k in shapes]
    t0 = time.time()
    errs = jit.precompile_in_processes(warm_one, specs)
    print(f"precompiled our kernels for {len(specs)} shapes in {time.time() - t0:.1f} s", flush=True)
    for e in errs:
        print("  precompile error:", e[:300], flush=True)


def peer_impls(quack_tuned: bool, notes: list[str]) -> dict[str, Callable]:
    """{name: fn(a, b)}: cuBLAS and, when importable, quack (a note when it is not)."""
    import torch

    impls = {CUBLAS: lambda a, b: torch.matmul(a, b)}
    try:
        from quack.gemm_interface import gemm as quack_gemm

        impls["quack"] = lambda a, b: quack_gemm(a, b, tuned=quack_tuned)
    except Exception as e:  # noqa: BLE001 - not installed, or broken: either way skipped with a note
        notes.append(f"quack: skipped, not importable ({type(e).__name__}: {str(e)[:100]})")
    return impls


def run(shapes: Sequence[tuple[int, int, int]], repeats: int = 3, quick: bool = False, quack_tuned: bool = True,
        tune: bool = False, variants: dict[str, Callable] | None = None, clean: bool = True,
        preset: str = "issue", device: str = "cuda") -> dict:
    """Benchmark ``shapes``; returns the results document (:mod:`.results`).  ``variants``: more
    ``fn(a, b)`` of ours timed in the same rounds (role "variant").  ``device``: where the operands
    live (the tests run the orchestration on the CPU with stand-in timers)."""
    import torch

    import cute_kernels

    from .ceiling import bare_read, matmul_same_flops, start_run
    from .progress import Progress
    from .timing import bench_clean, rotated

    bench, timer, roofs = start_run("bench gemm", quick)
    notes: list[str] = []
    impls: dict[str, Callable] = {OURS: lambda a, b: cute_kernels.gemm(a, b)}
    impls.update(peer_impls(quack_tuned, notes))
    impls.update(variants or {})
    roles = {n: "ours" if n == OURS else "peer" if n in (CUBLAS, "quack") else "variant" for n in impls}
    precompile(shapes)

    dev = torch.device(device)
    data, errors, first_call, ceil = {}, {}, {}, {}
    for shape in shapes:
        m, n, k = shape
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        ref = torch.matmul(a.float(), b.float())
        data[shape] = (a, b)
        if tune:
            try:
                t0 = time.time()
                cute_kernels.gemm(a, b, tune=True)
                print(f"tuned {shape} in {time.time() - t0:.1f} s", flush=True)
            except Exception as e:  # noqa: BLE001 - reported; the default plan is timed
                notes.append(f"tune {shape} failed: {type(e).__name__}: {str(e)[:160]}")
        for name, fn in impls.items():
            try:
                t0 = time.time()
                out = fn(a, b)
                torch.cuda.synchronize()
                first_call[(shape, name)] = time.time() - t0
                rel_error(out, ref)
            except Exception as e:  # noqa: BLE001 - the row shows the error instead of a time
                errors[(shape, name)] = f"{type(e).__name__}: {str(e)[:200]}"
                print(f"{shape} {name}: {errors[(shape, name)]}", flush=True)
        del ref
        fl, nb = flops_bytes(m, n, k)
        if fl / nb < results.ridge(roofs):  # bandwidth-bound: the ceiling is a bare read of A and B
            fn, what = bare_read(2 * (m * k + k * n), bench, quick)
            ceil[shape] = (READ, fn, f"{what} of A and B", 2.0 * (m * k + k * n), 1.0)
        else:  # compute-bound: a square cuBLAS matmul of the same FLOPs (time scaled to this shape's)
            fn, mm_flops = matmul_same_flops(fl)
            ceil[shape] = (MATMUL, fn, f"cuBLAS bf16 {round((mm_flops / 2) ** (1 / 3))}^3", None, fl / mm_flops)

    times: dict = {}
    n_steps = repeats * len(shapes) * (len(impls) + 1)
    with Progress(n_steps, "bench gemm") as prog:
        for r in range(repeats):
            for shape in shapes:
                a, b = data[shape]
                todo = {n_: (lambda f=f, a=a, b=b: f(a, b)) for n_, f in impls.items() if (shape, n_) not in errors}
                todo[ceil[shape][0]] = ceil[shape][1]
                for name, fn in rotated(todo.items(), r):
                    times.setdefault((shape, name), []).append(bench(fn))
                    prog.step(f"{'x'.join(map(str, shape))} {name}")

    clean_us = {}
    if clean and not quick:  # the second timer, once per shape
        for shape in shapes:
            a, b = data[shape]
            for name, fn in impls.items():
                if (shape, name) not in errors:
                    clean_us[(shape, name)] = bench_clean(lambda fn=fn, a=a, b=b: fn(a, b))

    rows = []
    for shape in shapes:
        m, n, k = shape
        fl, nb = flops_bytes(m, n, k)
        cname, _, cwhat, cbytes, scale = ceil[shape]
        row = {"shape": "x".join(map(str, shape)), "params": {"M": m, "N": n, "K": k}, "flops": fl, "bytes": nb,
               "bound": "memory" if cname == READ else "compute", "impls": {}, "notes": [], "ceiling": cname}
        for name in impls:
            ts = times.get((shape, name))
            if not ts:
                row["impls"][name] = {"role": roles[name], "error": errors.get((shape, name), "not run")}
                continue
            row["impls"][name] = results.impl_entry(
                roles[name], ts, fl, nb, first_call_s=first_call.get((shape, name)),
                clean_flush_us=clean_us.get((shape, name)))
        ts = [t * scale for t in times[(shape, cname)]]  # the matmul's time at this shape's FLOPs
        row["impls"][cname] = results.impl_entry("ceiling", ts, None if cname == READ else fl, cbytes or nb,
                                                 what=cwhat)
        rows.append(row)
    meta = results.run_meta(timer, repeats, preset=preset, quick=quick, quack_tuned=quack_tuned,
                            cute_kernels_tuned=tune)
    doc = results.document("gemm", meta, rows, roofs, notes)
    large = [r for r in doc["rows"] if tuple(r["params"].values()) in LARGE]
    doc["summary"]["geomean_large_vs_cuBLAS"] = results.geomean(r.get("ratio_vs", {}).get(CUBLAS) for r in large)
    return doc


def build_parser(prog: str = "cute-kernels bench gemm") -> argparse.ArgumentParser:
    ap = OneLineParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"two small shapes ({', '.join('x'.join(map(str, s)) for s in QUICK)}), one round, short "
                         "do_bench, quack untuned, no second timer")
    ap.add_argument("--repeats", type=int_in(1), default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--quack-untuned", dest="quack_tuned", action="store_false",
                    help="quack without its autotuner (its default heuristic config)")
    ap.add_argument("--tune", action="store_true", help="autotune cute-kernels per shape first (persisted)")
    ap.add_argument("--out", default=os.path.join("profiles", "results"),
                    help="folder for the JSON and markdown (default profiles/results)")
    ap.add_argument("--tag", default="", help="suffix of the file names after the kind")
    ap.add_argument("--shapes", default="", help="comma-separated MxNxK, e.g. 8192x8192x8192,1000x3000x520")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="issue",
                    help="shape set: the nine issue shapes (default), LLM layer shapes or decode-time ones (M <= 64)")
    ap.add_argument("--splitk-variants", action="store_true",
                    help="also time every split-K mode (cute_kernels.gemm.plan.SPLITK_MODES) as 'ck:<mode>'")
    ap.add_argument("--configs", default="",
                    help="also time our kernel at explicit configs (TMxTN:CMxCN[:SW(m|n)][:swap], e.g. 256x128:1x2:8m) "
                         "as 'ck <spec>' columns in the same rounds")
    return ap


def main(argv: list[str] | None = None, prog: str = "cute-kernels bench gemm") -> int:
    ap = build_parser(prog)
    args = ap.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes) if args.shapes else (QUICK if args.quick else PRESETS[args.preset])
    except ValueError as e:
        ap.error(str(e))
    variants = {}
    if args.splitk_variants:
        from ...gemm import plan as gemm_plan

        for mode in gemm_plan.SPLITK_MODES:
            choice = gemm_plan.PlanChoice(splitk_mode=mode)
            variants[f"ck:{mode}"] = lambda a, b, c=choice: gemm_plan.run(a, b, choice=c)
    for spec in filter(None, args.configs.split(",")):
        variants[f"ck {spec}"] = explicit_config(spec)
    if results.cuda_missing(prog):
        return 2
    doc = run(shapes, 1 if args.quick else args.repeats, args.quick, args.quack_tuned and not args.quick, args.tune,
              variants, preset=args.preset)
    tag = args.tag or ("" if args.preset == "issue" and not args.shapes and not args.quick
                       else "quick" if args.quick else args.preset if not args.shapes else "shapes")
    return results.publish(doc, args.out, tag)
