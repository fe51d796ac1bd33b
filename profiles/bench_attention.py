"""Attention forward (prefill) benchmark: cute-kernels ``flash_attn`` vs cuDNN SDPA, FlashAttention-2
SDPA (torch's flash backend) and FlashAttention-4 (``flash_attn.cute``), one process, one harness.

Timing: ``triton.testing.do_bench`` median with its L2 flush before every call (cold L2); without
triton, CUDA events around each call after writing a 512 MB buffer.  Each shape runs ``--repeats``
interleaved rounds (every implementation once per round, the order rotated per round); the reported
time is the median over the rounds and every ratio is taken within this run.

FLOPs count only the unmasked (q, k) pairs: 4 * B * Hq * Sq * Sk * D (two GEMMs of 2 flops per
multiply-add), halved for causal square problems.  bf16 throughout.

Each implementation's output is compared once, before timing, with the first one that ran (ours):
the max |difference| is recorded and a row whose difference exceeds ``MISMATCH_ATOL`` is flagged.

Inputs: ours and FA4 take (B, S, H, D) contiguous tensors; the SDPA backends get contiguous
(B, H, S, D) copies (their native layout; made once, untimed).  GQA: SDPA with ``enable_gqa=True``,
else K/V heads expanded (noted).  Every shape here is square, so SDPA's top-left ``is_causal`` is the
same mask as our bottom-right one.

The ``mma_bound`` column is our kernel compiled with ``mma_only=True``: the mask and the softmax
removed (P = S), the same tiles, loads and two GEMMs: the bound the softmax overlap of part 2 aims at.
It is not a peer and its output is not attention (not compared).

    python profiles/bench_attention.py            # the six issue shapes -> profiles/results/
    python profiles/bench_attention.py --quick    # 1 round, short do_bench
    python profiles/bench_attention.py --only s4096

Writes profiles/results/attention-<date>-<commit>.json and .md (``--tag`` appends a suffix;
``CK_COMMIT`` names the commit when the device copy's .git is stale).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "profiles"))

from timing import make_bench, precompile_and_report, rotated  # noqa: E402

import cute_kernels  # noqa: E402
from cute_kernels.attention import forward as FW  # noqa: E402

DTYPE = torch.bfloat16
#: name, B, Hq, Hkv, S (= Sq = Sk), D, causal
SHAPES = [
    ("b4_h32_s4096_d128_full", 4, 32, 32, 4096, 128, False),
    ("b4_h32_s4096_d128_causal", 4, 32, 32, 4096, 128, True),
    ("b8_h32_s2048_d64_full", 8, 32, 32, 2048, 64, False),
    ("b1_h32_s16384_d128_causal", 1, 32, 32, 16384, 128, True),
    ("b2_hq32_hkv8_s8192_d128_causal", 2, 32, 8, 8192, 128, True),
    ("b16_h16_s1024_d128_causal", 16, 16, 16, 1024, 128, True),
]
OURS = "cute"
#: not a peer: our kernel without the softmax (two back-to-back GEMMs), the bound of part 2
BOUND = "mma_bound"
PEERS = ("cudnn_sdpa", "fa2_sdpa", "fa4")
MISMATCH_ATOL = 2e-2  # bf16 outputs of randn inputs are O(0.1); kernels agree to ~1e-3


def flops(B, Hq, S, D, causal) -> float:
    f = 4.0 * B * Hq * S * S * D
    return f / 2 if causal else f


# ---------------------------------------------------------------------------------------- implementations
def build_impls(B, Hq, Hkv, S, D, causal, notes):
    """{name: (run, output getter (B, S, Hq, D))}, inputs allocated once."""
    torch.manual_seed(0)
    q = torch.randn(B, S, Hq, D, device="cuda", dtype=DTYPE)
    k = torch.randn(B, S, Hkv, D, device="cuda", dtype=DTYPE)
    v = torch.randn(B, S, Hkv, D, device="cuda", dtype=DTYPE)
    impls = {}

    out = torch.empty_like(q)
    impls[OURS] = (lambda: cute_kernels.flash_attn(q, k, v, causal=causal, out=out), lambda: out)
    # the MMA bound: the same kernel with the mask and softmax compiled out (P = S), same tiles and loads
    bound_cfg = dataclasses.replace(FW.plan(q.dtype, D, causal), mma_only=True)
    bound_fn, bound_out, bound_lse = FW.get_forward_kernel(bound_cfg), torch.empty_like(q), torch.empty(
        B, Hq, S, device="cuda", dtype=torch.float32)
    impls[BOUND] = (lambda: bound_fn(q, k, v, bound_out, bound_lse, 1.0), lambda: bound_out)

    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional.scaled_dot_product_attention
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))

    def sdpa_impl(backend, name):
        def make(kk, vv, gqa):
            def run():
                with sdpa_kernel(backend):
                    return F(qt, kk, vv, is_causal=causal, enable_gqa=gqa)

            return run

        variants = [(kt, vt, Hq != Hkv, "")]
        if Hq != Hkv:
            variants.append((kt.repeat_interleave(Hq // Hkv, 1), vt.repeat_interleave(Hq // Hkv, 1), False,
                             "K/V heads expanded (reads Hq/Hkv x more K/V)"))
        for kk, vv, gqa, what in variants:
            run = make(kk, vv, gqa)
            try:
                run()
                torch.cuda.synchronize()
            except Exception as e:
                notes.append(f"{name}{' (enable_gqa)' if gqa else ''}: {type(e).__name__}: {str(e)[:140]}")
                continue
            if what:
                notes.append(f"{name}: {what}")
            impls[name] = (run, lambda run=run: run().transpose(1, 2))
            return

    sdpa_impl(SDPBackend.CUDNN_ATTENTION, "cudnn_sdpa")
    sdpa_impl(SDPBackend.FLASH_ATTENTION, "fa2_sdpa")

    fa4, why = None, ""
    for mod in ("flash_attn.cute.interface", "flash_attn.cute"):
        try:
            fa4 = __import__(mod, fromlist=["flash_attn_func"]).flash_attn_func
            break
        except Exception as e:
            why = f"{type(e).__name__}: {str(e)[:100]}"
    if fa4 is None:
        notes.append(f"fa4: skipped, flash_attn.cute.interface.flash_attn_func not importable ({why})")
    else:

        def run_fa4():
            r = fa4(q, k, v, causal=causal)
            return r[0] if isinstance(r, tuple) else r

        try:
            run_fa4()
            torch.cuda.synchronize()
            impls["fa4"] = (run_fa4, run_fa4)
        except Exception as e:
            notes.append(f"fa4: {type(e).__name__}: {str(e)[:160]}")
    return impls


# ---------------------------------------------------------------------------------------- main
def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def selected(args):
    return [s for s in SHAPES if not args.only or args.only in s[0]]


def precompile(args):
    """Compile the configurations this run needs in parallel processes (disk cache), before timing."""
    cfgs = [FW.plan(DTYPE, D, causal) for _, _, _, _, _, D, causal in selected(args)]
    cfgs += [dataclasses.replace(c, mma_only=True) for c in cfgs]
    precompile_and_report(FW.precompile, cfgs)


def run_shapes(args, bench):
    results = []
    for name, B, Hq, Hkv, S, D, causal in selected(args):
        notes = []
        impls = build_impls(B, Hq, Hkv, S, D, causal, notes)
        for fn, _ in impls.values():
            fn()
        torch.cuda.synchronize()
        # correctness: each against the first implementation that ran (ours), once, untimed
        first = next(iter(impls))
        base = impls[first][1]().float()
        diffs = {n: (get().float() - base).abs().max().item() if n != BOUND else 0.0 for n, (_, get) in impls.items()}
        del base
        times = {n: [] for n in impls}
        for r in range(args.repeats):
            for n, (fn, _) in rotated(impls.items(), r):
                times[n].append(bench(fn))
        fl = flops(B, Hq, S, D, causal)
        row = {"shape": name, "B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "causal": causal, "flops": fl,
               "reference": first, "impls": {}, "notes": notes}
        for n, ts in times.items():
            med = statistics.median(ts)
            row["impls"][n] = {"times_us": ts, "median_us": med, "tflops": fl / (med * 1e-6) / 1e12,
                               "max_abs_diff_vs_ref": diffs[n], "mismatch": diffs[n] > MISMATCH_ATOL}
        ours = row["impls"].get(OURS)
        peers = {p: row["impls"][p] for p in PEERS if p in row["impls"]}
        if ours:
            ours["ratio_vs"] = {p: v["median_us"] / ours["median_us"] for p, v in peers.items()}
            if peers:
                best = min(peers, key=lambda p: peers[p]["median_us"])
                ours["best_peer"] = best
                ours["ratio_vs_best_peer"] = peers[best]["median_us"] / ours["median_us"]
        results.append(row)
        line = "  ".join(f"{n}={v['median_us']:.0f}us/{v['tflops']:.0f}TF{'!' if v['mismatch'] else ''}"
                         for n, v in row["impls"].items())
        print(f"{name:32s} {line}", flush=True)
        for nt in notes:
            print(f"    note: {nt}", flush=True)
        del impls
        torch.cuda.empty_cache()
    return results


def summarize(results):
    ours = [r["impls"][OURS] for r in results if OURS in r["impls"]]
    s = {f"geomean_vs_{p}": geomean([o.get("ratio_vs", {}).get(p) for o in ours]) for p in PEERS}
    s["geomean_vs_best_peer"] = geomean([o.get("ratio_vs_best_peer") for o in ours])
    s["min_vs_fa2_sdpa"] = min((o["ratio_vs"]["fa2_sdpa"] for o in ours if "fa2_sdpa" in o.get("ratio_vs", {})),
                               default=None)
    s["targets"] = {"part 1": ">= 1.0x fa2_sdpa on every shape"}
    s["mismatches"] = [f"{r['shape']}:{n}" for r in results for n, v in r["impls"].items() if v["mismatch"]]
    return s


def write_md(path, meta, results, summary):
    names = []
    for r in results:
        names += [n for n in r["impls"] if n not in names]
    peers = [p for p in PEERS if p in names]
    fmt = lambda x: f"{x:.2f}x" if x else "-"  # noqa: E731
    lines = [f"# Attention forward, {meta['device']}, {meta['date']}, commit {meta['commit']}", "",
             f"{meta['timer']}; {meta['repeats']} interleaved rounds, median; bf16.  FLOPs = 4·B·Hq·Sq·Sk·D, "
             "halved for causal.  Ratios = peer time / our time, same run.", "",
             "| shape | " + " | ".join(f"{n} TFLOP/s" for n in names) + " | "
             + " | ".join(f"x {p}" for p in peers) + " | x best peer |",
             "|---|" + "---|" * (len(names) + len(peers) + 1)]
    for r in results:
        cells = []
        for n in names:
            v = r["impls"].get(n)
            cells.append("-" if not v else f"{v['tflops']:.0f}" + (" (MISMATCH)" if v["mismatch"] else ""))
        o = r["impls"].get(OURS, {})
        cells += [fmt(o.get("ratio_vs", {}).get(p)) for p in peers]
        cells.append(f"{fmt(o.get('ratio_vs_best_peer'))} ({o.get('best_peer', '-')})")
        lines.append(f"| {r['shape']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Geomean of our ratio: " + ", ".join(f"{p} {fmt(summary.get(f'geomean_vs_{p}'))}" for p in peers)
                 + f", best peer {fmt(summary['geomean_vs_best_peer'])}; "
                 f"min vs fa2_sdpa {fmt(summary['min_vs_fa2_sdpa'])} (part-1 target >= 1.0x on every shape).")
    lines.append("")
    lines += [f"Max |O - O_{OURS}| (checked once before timing; MISMATCH above {MISMATCH_ATOL}):", "",
              "| shape | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for r in results:
        lines.append(f"| {r['shape']} | " + " | ".join(
            f"{r['impls'][n]['max_abs_diff_vs_ref']:.1e}" if n in r["impls"] else "-" for n in names) + " |")
    lines.append("")
    lines.append(f"`{BOUND}`: our kernel with the mask and softmax compiled out (P = S): the MMA bound, not a peer.")
    for r in results:
        for n in r["notes"]:
            lines.append(f"- {r['shape']}: {n}")
    Path(path).write_text("\n".join(lines) + "\n")
    return "\n".join(lines)


def commit_name() -> str:
    c = os.environ.get("CK_COMMIT")
    if c:
        return c
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=ROOT).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 round, short do_bench")
    ap.add_argument("--only", default="", help="substring filter on shape names")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out-dir", default=str(ROOT / "profiles" / "results"))
    args = ap.parse_args()
    if args.quick:
        args.repeats = 1
    if not torch.cuda.is_available():
        sys.exit("bench_attention: needs a CUDA device")
    bench, timer = make_bench(args.quick)
    t0 = time.time()
    precompile(args)
    results = run_shapes(args, bench)
    summary = summarize(results)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(), "timer": timer,
            "repeats": args.repeats, "date": datetime.date.today().isoformat(), "commit": commit_name(),
            "seconds": None}
    meta["seconds"] = round(time.time() - t0, 1)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"attention-{meta['date']}-{meta['commit']}" + (f"-{args.tag}" if args.tag else "")
    (out_dir / f"{stem}.json").write_text(json.dumps({"meta": meta, "summary": summary, "results": results}, indent=1))
    print(write_md(out_dir / f"{stem}.md", meta, results, summary))
    print(f"wrote {out_dir / stem}.json and .md in {meta['seconds']} s")


if __name__ == "__main__":
    main()
