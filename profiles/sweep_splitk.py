"""Skinny-GEMM sweep: every cluster split-K variant (tile width x split count x store path), the
workspace split-K, the default ``cute_kernels.gemm`` path and cuBLAS, on the skinny shapes.

    python3 profiles/sweep_splitk.py --out $OUT            # ~2-4 min on an H200
    python3 profiles/sweep_splitk.py --out $OUT --quick    # fewer variants

Each variant is first checked against an fp32 torch reference on the benchmark shape and on a ragged
one (M=127, N=1000, K=4168: partial M/N tiles and a K tail), with a NaN-poisoned output and a
run-to-run bitwise comparison; then timed with triton's do_bench (median, L2 flushed between calls).
cuBLAS (torch.matmul) is timed before and after each shape's variants; ratios use their mean.
Fixup split-K variants (S CTAs per 128 x tile_n tile without a cluster, the last CTA sums the fp32
partials: GemmSm90SplitKFixup) on 1024x1024x32768 and 128x4096x4096, tile_n 128/256 x S 2/4/8, with
5 extra bitwise repeats and a counters-back-at-zero check; ``--fixup-only`` runs just those (plus
cuBLAS and the default gemm() path, for same-run ratios) on those two shapes (~1 min).
Writes splitk-sweep.json and splitk-sweep.txt to --out.
"""
import argparse
import json
import os
import sys
import time
import traceback

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import cute_kernels  # noqa: E402
from cute_kernels.gemm import host as G  # noqa: E402
from cute_kernels.gemm.splitk_kernel import SplitKClusterConfig  # noqa: E402

# (tile_n, splits): CTAs = splits * tiles; cluster size = splits
VARIANTS = {
    (128, 4096, 4096): [(128, 2), (64, 2), (128, 4), (64, 4), (256, 4), (256, 8), (128, 8), (64, 1), (128, 1)],
    (1024, 1024, 32768): [(128, 2), (256, 4), (256, 2), (128, 4), (192, 2)],
    (1000, 3000, 520): [(192, 1), (256, 1), (128, 1), (256, 2), (192, 2)],
}
QUICK = {
    (128, 4096, 4096): [(128, 2), (64, 2), (128, 4), (256, 8)],
    (1024, 1024, 32768): [(128, 2), (256, 4)],
    (1000, 3000, 520): [(192, 1), (256, 1)],
}
FIXUP_VARIANTS = {
    (1024, 1024, 32768): [(256, 4), (256, 2), (256, 8), (128, 2), (128, 4), (128, 8)],
    (128, 4096, 4096): [(256, 8), (256, 4), (256, 2), (128, 4), (128, 2), (128, 8)],
}
VEC_OFF = {(128, 4096, 4096): (64, 2), (1024, 1024, 32768): (128, 2), (1000, 3000, 520): (192, 1)}


def rel(out, ref):
    o = out.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return ((o - ref.double()).norm() / ref.double().norm()).item()


def bench(fn):
    return do_bench(fn, warmup=20, rep=80, return_mode="median") * 1e3  # us


def splitk_fn(tile_n, s, vec=True, has_c=False):
    cfg = SplitKClusterConfig(tiles=G.splitk_tiles(tile_n, "bfloat16", "k", "mn", "bfloat16"), splits=s,
                              has_c=has_c, vec_store=vec)
    return G.compiled_splitk_cluster(cfg, "bfloat16", "bfloat16", "float32" if has_c else "bfloat16")


def fixup_fn(tile_n, s, has_c=False):
    """The fixup kernel wrapped as fn(a, b, d, c, alpha, beta), one cached workspace per output shape."""
    from cute_kernels.gemm.splitk_kernel import SplitKFixupConfig, fixup_workspace_numel

    cfg = SplitKFixupConfig(tiles=G.splitk_tiles(tile_n, "bfloat16", "k", "mn", "bfloat16"), splits=s, has_c=has_c)
    raw = G.compiled_splitk_fixup(cfg, "bfloat16", "bfloat16", "float32" if has_c else "bfloat16")
    launchers = {}

    def fn(a, b, d, c, alpha, beta):
        key = tuple(d.shape)
        if key not in launchers:
            launchers[key] = G.SplitKFixupLauncher(raw, *fixup_workspace_numel(*key, tile_n, s))
        launchers[key](a, b, d, c, alpha, beta)

    fn.launchers = launchers
    return fn


def check_variant(fn, a, b, ref, ragged):
    out = torch.full(ref.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    fn(a, b, out, out, 1.0, 0.0)
    err = rel(out, ref)
    again = torch.full_like(out, float("nan"))
    fn(a, b, again, again, 1.0, 0.0)
    det = torch.equal(out, again)
    ra, rb, rref = ragged
    rout = torch.full(rref.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    fn(ra, rb, rout, rout, 1.0, 0.0)
    return err, det, rel(rout, rref), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--fixup-only", action="store_true", help="only the fixup split-K variants (+ cuBLAS, gemm())")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    lines = []

    def say(s):
        print(s, flush=True)
        lines.append(s)

    say(f"device {torch.cuda.get_device_name()}, sms {torch.cuda.get_device_properties(0).multi_processor_count}")
    try:
        import cutlass.utils

        hw = cutlass.utils.HardwareInfo()
        say("max active clusters by size: " + ", ".join(f"{c}: {hw.get_max_active_clusters(c)}" for c in (1, 2, 4, 8)))
    except Exception as e:  # informative only
        say(f"max active clusters: n/a ({e})")

    torch.manual_seed(0)
    ra = torch.randn(127, 4168, device="cuda", dtype=torch.bfloat16)
    rb = torch.randn(4168, 1000, device="cuda", dtype=torch.bfloat16)
    ragged = (ra, rb, ra.float() @ rb.float())
    rows = []
    variants = QUICK if args.quick else VARIANTS
    if args.fixup_only:
        variants = {shape: [] for shape in FIXUP_VARIANTS}
    for (m, n, k), vlist in variants.items():
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ b.float()
        fl = 2 * m * n * k
        t_cub0 = bench(lambda: torch.matmul(a, b))
        shape_rows = []

        def record(name, t, err, det=None, rerr=None, extra=None):
            r = dict(shape=[m, n, k], variant=name, us=t, tflops=fl / t / 1e6, err=err, deterministic=det,
                     ragged_err=rerr, **(extra or {}))
            shape_rows.append(r)
            print(r, flush=True)

        cases = [(tn, s, True) for tn, s in vlist] + ([] if args.fixup_only else [(*VEC_OFF[(m, n, k)], False)])
        for tn, s, vec in cases:
            name = f"cluster tn={tn} S={s}{'' if vec else ' scalar-store'}"
            try:
                fn = splitk_fn(tn, s, vec)
                err, det, rerr, _ = check_variant(fn, a, b, ref, ragged)
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                t = bench(lambda: fn(a, b, out, out, 1.0, 0.0))
                ctas = s * -(-m // 128) * -(-n // tn)
                record(name, t, err, det, rerr, dict(ctas=ctas))
            except Exception as e:
                traceback.print_exc()
                shape_rows.append(dict(shape=[m, n, k], variant=name, error=str(e)[:300]))
        for tn, s in FIXUP_VARIANTS.get((m, n, k), []):
            name = f"fixup tn={tn} S={s}"
            try:
                fn = fixup_fn(tn, s)
                err, det, rerr, out0 = check_variant(fn, a, b, ref, ragged)
                for _ in range(5):  # whoever is last, the same bits
                    again = torch.full_like(out0, float("nan"))
                    fn(a, b, again, again, 1.0, 0.0)
                    det = det and torch.equal(out0, again)
                cnt_ok = all(int(l.cache[next(iter(l.cache))][1].abs().sum()) == 0 for l in fn.launchers.values())
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                t = bench(lambda: fn(a, b, out, out, 1.0, 0.0))
                ctas = s * -(-m // 128) * -(-n // tn)
                record(name, t, err, det and cnt_ok, rerr, dict(ctas=ctas, counters_zero=cnt_ok))
            except Exception as e:
                traceback.print_exc()
                shape_rows.append(dict(shape=[m, n, k], variant=name, error=str(e)[:300]))
        if FIXUP_VARIANTS.get((m, n, k)):  # the host path: gemm() with CUTE_KERNELS_SPLITK=fixup
            G.SPLITK_MODE = "fixup"
            G._plans.clear()
            try:
                out = cute_kernels.gemm(a, b)
                tn_s = G.splitk_fixup_choice(m, n, k)
                record(f"gemm() fixup tn={tn_s[0]} S={tn_s[1]}", bench(lambda: cute_kernels.gemm(a, b)), rel(out, ref))
            except Exception as e:
                traceback.print_exc()
                shape_rows.append(dict(shape=[m, n, k], variant="gemm() fixup", error=str(e)[:300]))
            finally:
                G.SPLITK_MODE = "cluster"
                G._plans.clear()
        # the library's default path (heuristic) and the workspace split-K
        G._plans.clear()
        try:
            out = cute_kernels.gemm(a, b)
            record("gemm() default", bench(lambda: cute_kernels.gemm(a, b)), rel(out, ref))
        except Exception as e:
            shape_rows.append(dict(shape=[m, n, k], variant="gemm() default", error=str(e)[:300]))
        if not args.quick and not args.fixup_only and k >= 4096:
            for s in (2, 4):
                G.SPLITK_MODE, G.FORCE_SPLITS = "workspace", s
                G._plans.clear()
                try:
                    out = cute_kernels.gemm(a, b)
                    record(f"workspace S={s}", bench(lambda: cute_kernels.gemm(a, b)), rel(out, ref))
                except Exception as e:
                    shape_rows.append(dict(shape=[m, n, k], variant=f"workspace S={s}", error=str(e)[:300]))
                finally:
                    G.SPLITK_MODE, G.FORCE_SPLITS = "cluster", None
                    G._plans.clear()
        t_cub1 = bench(lambda: torch.matmul(a, b))
        t_cub = (t_cub0 + t_cub1) / 2
        say(f"\n{m}x{n}x{k}: cuBLAS {t_cub0:.1f} / {t_cub1:.1f} us ({fl / t_cub / 1e6:.0f} TFLOP/s)")
        say(f"  {'variant':32s} {'us':>7s} {'TFLOP/s':>8s} {'x cuBLAS':>8s} {'CTAs':>5s} {'err':>8s} {'ragged':>8s} det")
        for r in sorted(shape_rows, key=lambda r: r.get("us", 1e9)):
            r["vs_cublas"] = t_cub / r["us"] if "us" in r else None
            r["cublas_us"] = t_cub
            if "us" in r:
                ok = r["err"] < 1e-2 and (r["ragged_err"] is None or r["ragged_err"] < 1e-2) and r["deterministic"] is not False
                rag = "-" if r["ragged_err"] is None else format(r["ragged_err"], ".1e")
                say(f"  {r['variant']:32s} {r['us']:7.1f} {r['tflops']:8.0f} {r['vs_cublas']:8.3f} {str(r.get('ctas', '')):>5} "
                    f"{r['err']:8.1e} {rag:>8} {r['deterministic']}{'' if ok else '  <-- WRONG'}")
            else:
                say(f"  {r['variant']:32s} ERROR {r['error'][:200]}")
        rows += shape_rows
        with open(os.path.join(args.out, "splitk-sweep.json"), "w") as f:  # after every shape: a hang
            json.dump(rows, f, indent=1)  # or timeout later still leaves the finished shapes
        with open(os.path.join(args.out, "splitk-sweep.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    say(f"\nsweep took {time.time() - t_start:.0f} s")
    with open(os.path.join(args.out, "splitk-sweep.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(args.out, "splitk-sweep.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
