"""Decode-attention benchmark: this project (contiguous and paged) vs cuDNN SDPA, FlashAttention-2 SDPA
and FlashAttention-4 (flash_attn.cute), one process, one harness.

Timing: ``triton.testing.do_bench`` median with its L2 flush before every call (cold L2); without
triton, CUDA events around each call after writing a 512 MB buffer.  Each shape runs ``--repeats``
interleaved rounds (every implementation once per round); the reported time is the median over the
rounds and ratios are taken within this run.  Bandwidth = KV bytes read / time with
KV bytes = 2 * B * L * Hkv * D * 2 (bf16 K and V, each byte once).

    python profiles/bench_decode.py                  # the six issue shapes -> profiles/results/
    python profiles/bench_decode.py --quick          # 1 round, short do_bench
    python profiles/bench_decode.py --size-sweep     # b1 hq32 hkv8 at growing L (34-537 MB of KV)

The kernel measured is ``decode_attn`` as a user calls it (its default plan); the variants that once
had switches are listed with their figures in NOTES-decode.md ("Removed variants").

Writes profiles/results/bench_decode.json and .md (``--tag`` appends a suffix).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "profiles"))

from timing import make_bench, precompile_and_report, rotated  # noqa: E402

from cute_kernels.attention import decode as DA  # noqa: E402
from cute_kernels.attention.decode import decode_attn  # noqa: E402
from cute_kernels.attention.decode_plan import plan  # noqa: E402

SHAPES = [
    # name, B, Hq, Hkv, L, page size of our paged run
    ("b1_hq32_hkv8_L32768", 1, 32, 8, 32768, 16),
    ("b1_hq32_hkv32_L131072", 1, 32, 32, 131072, 16),
    ("b8_hq32_hkv8_L8192", 8, 32, 8, 8192, 16),
    ("b32_hq32_hkv8_L4096", 32, 32, 8, 4096, 16),
    ("b4_hq64_hkv8_L65536", 4, 64, 8, 65536, 16),
    ("b64_hq32_hkv8_L2048_paged16", 64, 32, 8, 2048, 16),
]
BIG_BYTES = 256 * 1024 * 1024  # "big shapes": at least 256 MiB of KV
D = 128
DTYPE = torch.bfloat16


# ---------------------------------------------------------------------------------------- inputs
def to_paged(k, v, page_size, seed=0):
    B, L, H, Dd = k.shape
    pps = -(-L // page_size)
    n_pages = B * pps
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n_pages, generator=g).to(k.device)
    kp = torch.empty(n_pages, page_size, H, Dd, dtype=k.dtype, device=k.device)
    vp = torch.empty_like(kp)
    pad = pps * page_size - L
    kk = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).reshape(n_pages, page_size, H, Dd)
    vv = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).reshape(n_pages, page_size, H, Dd)
    kp[perm] = kk
    vp[perm] = vv
    return kp, vp, perm.view(B, pps).to(torch.int32).contiguous()


def build_impls(B, Hq, Hkv, L, page, notes):
    """Returns {name: (callable, output getter)} with inputs allocated once."""
    torch.manual_seed(0)
    q = torch.randn(B, 1, Hq, D, device="cuda", dtype=DTYPE)
    k = torch.randn(B, L, Hkv, D, device="cuda", dtype=DTYPE)
    v = torch.randn(B, L, Hkv, D, device="cuda", dtype=DTYPE)
    seqlens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    impls = {}

    out_c = torch.empty_like(q)
    impls["cute"] = (lambda: decode_attn(q, k, v, cache_seqlens=seqlens, out=out_c), lambda: out_c)
    kp, vp, bt = to_paged(k, v, page)
    out_p = torch.empty_like(q)
    impls[f"cute_paged{page}"] = (
        lambda: decode_attn(q, kp, vp, cache_seqlens=seqlens, block_table=bt, out=out_p),
        lambda: out_p,
    )

    # torch SDPA baselines want (B, H, L, D); give them contiguous copies (not timed)
    qt = q.transpose(1, 2).contiguous()
    kt = k.transpose(1, 2).contiguous()
    vt = v.transpose(1, 2).contiguous()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional.scaled_dot_product_attention

    def sdpa_impl(backend, name):
        def run_gqa():
            with sdpa_kernel(backend):
                return F(qt, kt, vt, enable_gqa=True)

        try:
            run_gqa()
            torch.cuda.synchronize()
            impls[name] = (run_gqa, lambda: run_gqa().transpose(1, 2))
        except Exception as e:  # expanded heads as a fallback (reads Hq/Hkv x more bytes)
            notes.append(f"{name}: enable_gqa failed ({type(e).__name__}: {str(e)[:120]}); expanded K/V heads")
            ke = kt.repeat_interleave(Hq // Hkv, 1)
            ve = vt.repeat_interleave(Hq // Hkv, 1)

            def run_exp():
                with sdpa_kernel(backend):
                    return F(qt, ke, ve)

            try:
                run_exp()
                torch.cuda.synchronize()
                impls[name] = (run_exp, lambda: run_exp().transpose(1, 2))
            except Exception as e2:
                notes.append(f"{name}: unavailable ({type(e2).__name__}: {str(e2)[:120]})")

    sdpa_impl(SDPBackend.CUDNN_ATTENTION, "cudnn_sdpa")
    sdpa_impl(SDPBackend.FLASH_ATTENTION, "fa2_sdpa")

    try:
        from flash_attn.cute import flash_attn_func

        def fa4(ns):
            def run():
                r = flash_attn_func(q, k, v, causal=False, num_splits=ns)
                return r[0] if isinstance(r, tuple) else r

            return run

        for ns in (0, 1):
            try:
                fa4(ns)()
                torch.cuda.synchronize()
                impls["fa4"] = (fa4(ns), fa4(ns))
                if ns == 1:
                    notes.append("fa4: num_splits=0 (auto) failed, using 1")
                break
            except Exception as e:
                notes.append(f"fa4 num_splits={ns}: {type(e).__name__}: {str(e)[:160]}")
    except Exception as e:
        notes.append(f"fa4: flash_attn.cute not importable ({type(e).__name__}: {str(e)[:100]})")
    return impls


# ---------------------------------------------------------------------------------------- main
def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def precompile_all(args):
    """Compile every config this run needs in parallel processes (disk cache), before timing."""
    cfgs = []
    for name, B, Hq, Hkv, L, page in SHAPES:
        if args.only and args.only not in name:
            continue
        q = torch.empty(B, 1, Hq, D, dtype=DTYPE, device="meta")
        for paged in (False, True):
            k = torch.empty(B if not paged else 1, L if not paged else page, Hkv, D, dtype=DTYPE, device="meta")
            bt = torch.empty(B, -(-L // page), dtype=torch.int32, device="meta") if paged else None
            cfgs.append(plan(q, k, bt, None, True)[0])
    precompile_and_report(DA.precompile, cfgs)


def run_shapes(args, bench):
    results, notes_all = [], {}
    for name, B, Hq, Hkv, L, page in SHAPES:
        if args.only and args.only not in name:
            continue
        notes = []
        impls = build_impls(B, Hq, Hkv, L, page, notes)
        kv_bytes = 2 * B * L * Hkv * D * 2
        # correctness sanity against the first available SDPA output
        ref = None
        for rn in ("fa2_sdpa", "cudnn_sdpa"):
            if rn in impls:
                ref = impls[rn][1]().float()
                break
        errs = {}
        for n, (fn, get) in impls.items():
            fn()
        torch.cuda.synchronize()
        if ref is not None:
            for n, (fn, get) in impls.items():
                errs[n] = (get().float() - ref).abs().max().item()
        times = {n: [] for n in impls}
        for r in range(args.repeats):
            for n, (fn, _) in rotated(impls.items(), r):
                times[n].append(bench(fn))
        row = {"shape": name, "B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "D": D, "kv_bytes": kv_bytes, "impls": {}}
        for n, ts in times.items():
            med = statistics.median(ts)
            row["impls"][n] = {
                "times_us": ts,
                "median_us": med,
                "TBps": kv_bytes / (med * 1e-6) / 1e12,
                "max_abs_err_vs_sdpa": errs.get(n),
            }
        cud = row["impls"].get("cudnn_sdpa", {}).get("median_us")
        row["speedup_vs_cudnn"] = {
            n: (cud / v["median_us"]) if cud else None for n, v in row["impls"].items()
        }
        row["num_splits"] = plan(
            torch.empty(B, 1, Hq, D, dtype=DTYPE, device="cuda"),
            torch.empty(B, L, Hkv, D, dtype=DTYPE, device="meta"),
            None, None, True,
        )[1]
        results.append(row)
        notes_all[name] = notes
        line = "  ".join(f"{n}={v['median_us']:.1f}us/{v['TBps']:.2f}TB/s" for n, v in row["impls"].items())
        print(f"{name:32s} splits={row['num_splits']:3d}  {line}", flush=True)
        for nt in notes:
            print(f"    note: {nt}", flush=True)
        del impls
        torch.cuda.empty_cache()
    return results, notes_all


#: ``--size-sweep``: one sequence at growing length (KV bytes 34, 67, 134, 268, 537 MB)
SIZE_SWEEP_SHAPES = [(f"b1_hq32_hkv8_L{L}", 1, 32, 8, L, 16) for L in (8192, 16384, 32768, 65536, 131072)]


def sdpa_cudnn(q, k, v):
    """cuDNN SDPA on (B, Sq, H, D) decode inputs (GQA through enable_gqa); the transposed copies are
    made here, untimed.  Raises if cuDNN cannot run the shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    cudnn()
    return cudnn


def write_md(path, meta, results, notes):
    lines = [f"# Decode attention benchmark ({meta['device']})", ""]
    lines.append(f"{meta['timer']}; {meta['repeats']} interleaved rounds, median; bf16, D=128, q_len=1.")
    lines.append("KV bytes = 2·B·L·Hkv·D·2; TB/s = KV bytes / time.  Speedup = cuDNN time / time (same run).")
    lines.append("")
    names = []
    for r in results:
        for n in r["impls"]:
            if n not in names:
                names.append(n)
    lines.append("| shape | splits | " + " | ".join(f"{n} µs (TB/s)" for n in names) + " | cute / cuDNN | cute paged / cuDNN |")
    lines.append("|---|---|" + "---|" * len(names) + "---|---|")
    for r in results:
        cells = []
        for n in names:
            v = r["impls"].get(n)
            cells.append(f"{v['median_us']:.1f} ({v['TBps']:.2f})" if v else "—")
        sp = r["speedup_vs_cudnn"]
        pn = [n for n in r["impls"] if n.startswith("cute_paged")]
        fmt = lambda x: f"{x:.2f}×" if x else "—"  # noqa: E731
        lines.append(
            f"| {r['shape']} | {r['num_splits']} | " + " | ".join(cells)
            + f" | {fmt(sp.get('cute'))} | {fmt(sp.get(pn[0]) if pn else None)} |"
        )
    lines.append("")
    s = meta["summary"]
    lines.append(f"Geomean speedup vs cuDNN: contiguous {s['geomean_cute_vs_cudnn']:.3f}×, paged {s['geomean_paged_vs_cudnn']:.3f}× (target ≥ 1.15×).")
    lines.append(f"Min bandwidth on big shapes (KV ≥ 256 MiB): {s['min_TBps_big']:.2f} TB/s (target ≥ 4.0).")
    lines.append("")
    for shape, ns in notes.items():
        for n in ns:
            lines.append(f"- {shape}: {n}")
    Path(path).write_text("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="substring filter on shape names")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out-dir", default=str(ROOT / "profiles" / "results"))
    ap.add_argument("--size-sweep", action="store_true",
                    help="b1 hq32 hkv8 at L 8192..131072 (34-537 MB of KV) instead of the issue shapes")
    args = ap.parse_args()
    if args.quick:
        args.repeats = 1
    if not torch.cuda.is_available():
        sys.exit("bench_decode: needs a CUDA device")
    bench, timer = make_bench(args.quick)
    t0 = time.time()
    if args.size_sweep:
        SHAPES[:] = SIZE_SWEEP_SHAPES
    precompile_all(args)
    results, notes = run_shapes(args, bench)
    sp_c = [r["speedup_vs_cudnn"].get("cute") for r in results]
    sp_p = [next((v for n, v in r["speedup_vs_cudnn"].items() if n.startswith("cute_paged")), None) for r in results]
    big = [r["impls"]["cute"]["TBps"] for r in results if r["kv_bytes"] >= BIG_BYTES]
    summary = {
        "geomean_cute_vs_cudnn": geomean(sp_c),
        "geomean_paged_vs_cudnn": geomean(sp_p),
        "min_TBps_big": min(big) if big else float("nan"),
        "targets": {"TBps_big": 4.0, "geomean_vs_cudnn": 1.15},
    }
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "timer": timer,
        "repeats": args.repeats,
        "seconds": round(time.time() - t0, 1),
        "summary": summary,
    }
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "bench_decode" + (f"_{args.tag}" if args.tag else "")
    (out_dir / f"{stem}.json").write_text(
        json.dumps({"meta": meta, "results": results, "notes": notes}, indent=1)
    )
    write_md(out_dir / f"{stem}.md", meta, results, notes)
    print(json.dumps(summary, indent=1))
    print(f"wrote {out_dir / (stem + '.json')} and .md in {meta['seconds']} s")


if __name__ == "__main__":
    main()
