"""Decode-attention benchmark: this project (contiguous and paged) vs cuDNN SDPA, FlashAttention-2 SDPA
and FlashAttention-4 (flash_attn.cute), one process, one harness.

Timing: ``triton.testing.do_bench`` median with its L2 flush before every call (cold L2); without
triton, CUDA events around each call after writing a 512 MB buffer.  Each shape runs ``--repeats``
interleaved rounds (every implementation once per round); the reported time is the median over the
rounds and ratios are taken within this run.  Bandwidth = KV bytes read / time with
KV bytes = 2 * B * L * Hkv * D * 2 (bf16 K and V, each byte once).

    python profiles/bench_decode.py                  # the six issue shapes -> profiles/results/
    python profiles/bench_decode.py --sweep          # + tile / split sweep of this project's kernel
    python profiles/bench_decode.py --quick          # 1 round, short do_bench
    python profiles/bench_decode.py --variants --out-dir DIR   # v2 variants vs default vs cuDNN (~2-4 min)

``--variants``: every load/launch/split variant of this project's kernel against the default and cuDNN,
interleaved rounds (every implementation once per round, medians), on the issue shapes (most rounds on
b1 L32768, b8 L8192 and paged b64).  Each variant is first run once in a child process with a time
limit (a variant that hangs or differs is dropped, not timed).  Besides do_bench (whose L2 flush is a
256 MB *write*, leaving up to the whole L2 dirty for the timed call), the main variants and cuDNN are
also timed after a *read-only* L2 flush ("clean") and as CUDA-graph replays of 20 calls without flush
("graph", back-to-back: launch gaps hidden): the differences show how much of the small shapes'
time is the flush's write-back and launch overhead rather than the kernel.

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
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "profiles"))

from timing import bench_clean, bench_graph, rotated  # noqa: E402

import importlib  # noqa: E402

DA = importlib.import_module("cute_kernels.attention.decode")  # the module (the package exports the function)
from cute_kernels.attention.decode import decode_attn  # noqa: E402

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


# ---------------------------------------------------------------------------------------- timing
def make_bench(quick: bool):
    try:
        import triton.testing as tt

        def bench(fn):
            return tt.do_bench(fn, warmup=10 if quick else 25, rep=40 if quick else 120, return_mode="median") * 1e3

        return bench, "triton.testing.do_bench (median, L2 flushed per call)"
    except Exception:  # pragma: no cover - depends on the GPU machine
        from timing import bench_events

        flush = torch.empty(512 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")

        def bench(fn):
            return bench_events(fn, flush.zero_, 10 if quick else 40)

        return bench, "CUDA events (median, 512 MB write before each call)"


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


#: ``--candidate NAME``: also time our contiguous kernel under these overrides as column
#: ``cute_NAME`` (a default-to-be, measured beside the default in the same rounds)
CANDIDATES = {"tma_ef": dict(load="tma", kv_evict_first=True), "cpasync": dict(load="cpasync", kv_evict_first=False),
              "tma": dict(load="tma", kv_evict_first=False)}
_candidates: list[str] = []


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
    for cand in _candidates:
        out_x = torch.empty_like(q)

        def run_candidate(over=CANDIDATES[cand], out_x=out_x):
            with DA.override_config(**over):
                return decode_attn(q, k, v, cache_seqlens=seqlens, out=out_x)

        impls[f"cute_{cand}"] = (run_candidate, lambda out_x=out_x: out_x)
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
            o = run_gqa()
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
    modes = [None]
    if args.sweep:
        modes = ["kernel", "pdl", "fused", dict(n_tile=64, stages=4), dict(n_tile=64, stages=6),
                 dict(n_tile=128, stages=3), dict(n_tile=64, stages=2)]
    for name, B, Hq, Hkv, L, page in SHAPES:
        if args.only and args.only not in name:
            continue
        q = torch.empty(B, 1, Hq, D, dtype=DTYPE, device="meta")
        for m in modes:
            over = {} if m is None else (dict(merge_mode=m) if isinstance(m, str) else m)
            prev = DA._CONFIG_OVERRIDE
            DA._CONFIG_OVERRIDE = {**(prev or {}), **over} or None
            try:
                for paged in (False, True):
                    if paged and args.sweep:
                        continue
                    k = torch.empty(B if not paged else 1, L if not paged else page, Hkv, D, dtype=DTYPE, device="meta")
                    bt = torch.empty(B, -(-L // page), dtype=torch.int32, device="meta") if paged else None
                    cfg, P = DA._plan(q, k, bt, None, True)
                    cfgs.append(cfg)
                    if args.sweep:
                        for f in (0.5, 2):
                            cfgs.append(DA._plan(q, k, bt, max(1, int(round(P * f))), True)[0])
            finally:
                DA._CONFIG_OVERRIDE = prev
    t0 = time.time()
    errs = DA.precompile(cfgs)
    print(f"precompiled {len(set(cfgs))} configs in {time.time() - t0:.1f} s", flush=True)
    for e in errs:
        print("  precompile error:", e[:300], flush=True)


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
        row["num_splits"] = DA._plan(
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


def run_sweep(args, bench):
    """This project's kernel only (contiguous): merge modes x split counts at the default tiles, then
    tile configs at the automatic split count."""
    variants = []
    for mode in ("kernel", "pdl", "fused"):
        for f in (0.5, 1, 2):
            variants.append((dict(merge_mode=mode), f))
    for cfg in (
        dict(n_tile=64, stages=4),
        dict(n_tile=64, stages=6),
        dict(n_tile=128, stages=3),
        dict(n_tile=64, stages=2),
    ):
        variants.append((cfg, 1))
    out = []
    for name, B, Hq, Hkv, L, page in SHAPES:
        if args.only and args.only not in name:
            continue
        torch.manual_seed(0)
        q = torch.randn(B, 1, Hq, D, device="cuda", dtype=DTYPE)
        k = torch.randn(B, L, Hkv, D, device="cuda", dtype=DTYPE)
        v = torch.randn(B, L, Hkv, D, device="cuda", dtype=DTYPE)
        s = torch.full((B,), L, dtype=torch.int32, device="cuda")
        kv_bytes = 2 * B * L * Hkv * D * 2
        o = torch.empty_like(q)
        ref = None
        for cfg, f in variants:
            with DA.override_config(**cfg):
                auto = DA._plan(q, k, None, None, True)[1]
                P = max(1, int(round(auto * f)))
                if f != 1 and P == auto:
                    continue
                ws = DA.decode_attn_workspace(q, P)
                try:
                    fn = lambda: decode_attn(q, k, v, cache_seqlens=s, num_splits=P, out=o, workspace=ws)  # noqa: E731
                    fn()
                    torch.cuda.synchronize()
                    if ref is None:
                        ref = o.clone()
                    err = (o.float() - ref.float()).abs().max().item()
                    t = bench(fn)
                except Exception as e:
                    print(f"  {name} {cfg} P={P}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                full = DA.make_config(DTYPE, D, Hq // Hkv, False, 0, True, P > 1)
                rec = dict(
                    shape=name, n_tile=full.n_tile, stages=full.stages, num_threads=full.num_threads,
                    merge_mode=full.merge_mode if P > 1 else "-", num_splits=P, auto=(P == auto),
                    us=t, TBps=kv_bytes / (t * 1e-6) / 1e12, max_diff_vs_first=err,
                )
                out.append(rec)
                print(
                    f"  sweep {name:30s} tile={full.n_tile}x{full.stages} merge={rec['merge_mode']:6s} "
                    f"P={P:3d}{'*' if P == auto else ' '} {t:8.1f} us {rec['TBps']:.2f} TB/s (diff {err:.2g})",
                    flush=True,
                )
        del q, k, v
        torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------------------------------- variants
#: label -> (DecodeConfig overrides, split rule); split rule: None = automatic, ("x", f) = auto * f,
#: ("slots", k) = the largest count with batch*Hkv*count <= k*SMs (fills k CTAs per SM exactly), ("n", n)
VARIANTS = {  # the default (session 3): cp.async loads, PDL on both kernels, splits fill 1 CTA per SM
    "default": ({}, None),
    "no_pdl": (dict(pdl_in=False, merge_mode="kernel"), None),
    "fused": (dict(merge_mode="fused"), None),
    "tma": (dict(load="tma"), None),
    "tma_s6": (dict(load="tma", stages=6), None),
    "cp_s4": (dict(stages=4), None),
    "split_half": ({}, ("x", 0.5)),
    "split_x2": ({}, ("x", 2)),
    "split_fill2": ({}, ("slots", 2)),  # the session-2 default's count (2 CTAs per SM)
    "split_fill1": ({}, ("slots", 1)),  # the session-3 count (1 CTA per SM; paged default before session 4)
    "page_prefetch": (dict(page_prefetch=True), None),  # paged only: block-table entries a tile ahead
}
#: (shape name, rounds, variants); paged shapes run the paged cache (TMA falls back to cp.async there)
VARIANT_PLAN = [
    ("b1_hq32_hkv8_L32768", 7, [v for v in VARIANTS if v != "page_prefetch"]),
    ("b8_hq32_hkv8_L8192", 7, [v for v in VARIANTS if v != "page_prefetch"]),
    ("b64_hq32_hkv8_L2048_paged16", 5, ["default", "split_x2", "page_prefetch"]),
    ("b4_hq64_hkv8_L65536_paged16", 3, ["default", "split_fill1", "cp_s4"]),
    ("b1_hq32_hkv8_L32768_paged16", 5, ["default", "split_fill1", "split_x2"]),
    ("b1_hq32_hkv32_L131072_paged16", 3, ["default", "split_fill1"]),
    ("b8_hq32_hkv8_L8192_paged16", 5, ["default", "split_fill1", "split_x2"]),
    ("b1_hq32_hkv32_L131072", 3, ["default", "no_pdl", "tma", "tma_s6", "split_fill2"]),
    ("b32_hq32_hkv8_L4096", 3, ["default", "no_pdl", "tma", "split_x2"]),
    ("b4_hq64_hkv8_L65536", 3, ["default", "no_pdl", "tma", "tma_s6", "split_fill2"]),
]
#: timed also with the clean flush and as graph replays (b1/b8 only: where overheads matter)
EXTRA_TIMED = ["default", "no_pdl", "tma", "cudnn"]


def _variant_splits(rule, auto, base, sm):
    if rule is None:
        return auto
    kind, val = rule
    if kind == "x":
        return max(1, int(round(auto * val)))
    if kind == "slots":
        return max(1, (val * sm) // base)
    return int(val)


#: extra paged shapes of the variant runs only (the long single sequences where paged-16 trails
#: contiguous by 8-10%, session 3 run 4)
#: ``--size-sweep``: one sequence at growing length (KV bytes 34, 67, 134, 268, 537 MB)
SIZE_SWEEP_SHAPES = [(f"b1_hq32_hkv8_L{L}", 1, 32, 8, L, 16) for L in (8192, 16384, 32768, 65536, 131072)]

VARIANT_SHAPES = [("b4_hq64_hkv8_L65536_paged16", 4, 64, 8, 65536, 16),
                  ("b1_hq32_hkv8_L32768_paged16", 1, 32, 8, 32768, 16),
                  ("b1_hq32_hkv32_L131072_paged16", 1, 32, 32, 131072, 16),
                  ("b8_hq32_hkv8_L8192_paged16", 8, 32, 8, 8192, 16)]


def _shape(name):
    return next(sh for sh in SHAPES + VARIANT_SHAPES if sh[0] == name)


def _variant_inputs(name):
    _, B, Hq, Hkv, L, page = _shape(name)
    torch.manual_seed(0)
    q = torch.randn(B, 1, Hq, D, device="cuda", dtype=DTYPE)
    k = torch.randn(B, L, Hkv, D, device="cuda", dtype=DTYPE)
    v = torch.randn(B, L, Hkv, D, device="cuda", dtype=DTYPE)
    s = torch.full((B,), L, dtype=torch.int32, device="cuda")
    paged = "paged" in name
    kp = vp = bt = None
    if paged:
        kp, vp, bt = to_paged(k, v, page)
    return q, k, v, s, kp, vp, bt, paged


def _variant_fn(label, q, k, v, s, kp, vp, bt, paged):
    """(callable, cfg, P) for one variant; its workspace and output are allocated here (untimed)."""
    over, rule = VARIANTS[label]
    B, Hkv = q.shape[0], k.shape[2]
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    with DA.override_config(**over):
        kk = kp if paged else k
        auto = DA._plan(q, kk, bt, None, True)[1]
        P = _variant_splits(rule, auto, B * Hkv, sm)
        cfg = DA._plan(q, kk, bt, P, True)[0]
    ws = DA.decode_attn_workspace(q, P)
    o = torch.empty_like(q)
    kc, vc = (kp, vp) if paged else (k, v)

    def fn():
        with DA.override_config(**over):
            decode_attn(q, kc, vc, cache_seqlens=s, block_table=bt, num_splits=P, out=o, workspace=ws)
        return o

    return fn, cfg, P


def _variant_configs(shapes_only=""):
    cfgs = []
    for name, _, labels in VARIANT_PLAN:
        if shapes_only and shapes_only not in name:
            continue
        _, B, Hq, Hkv, L, page = _shape(name)
        paged = "paged" in name
        q = torch.empty(B, 1, Hq, D, dtype=DTYPE, device="meta")
        k = torch.empty(1 if paged else B, page if paged else L, Hkv, D, dtype=DTYPE, device="meta")
        bt = torch.empty(B, -(-L // page), dtype=torch.int32, device="meta") if paged else None
        sm = torch.cuda.get_device_properties(0).multi_processor_count
        for lab in labels:
            over, rule = VARIANTS[lab]
            with DA.override_config(**over):
                auto = DA._plan(q, k, bt, None, True)[1]
                P = _variant_splits(rule, auto, B * Hkv, sm)
                cfgs.append(DA._plan(q, k, bt, P, True)[0])
    return cfgs


def smoke_variants(args):
    """Child process: run every planned variant once per shape, compare with the default's bits.
    Prints one JSON line {"ok": [...], "bad": {...}}."""
    ok, bad = [], {}
    for name, _, labels in VARIANT_PLAN:
        if args.only and args.only not in name:
            continue
        ins = _variant_inputs(name)
        ref = None
        for lab in labels:
            key = f"{name}/{lab}"
            try:
                fn, cfg, P = _variant_fn(lab, *ins)
                out = fn().clone()
                torch.cuda.synchronize()
                if ref is None:
                    ref = out
                diff = (out.float() - ref.float()).abs().max().item()
                if not torch.isfinite(out).all() or diff > 0.05:
                    bad[key] = f"max diff vs default {diff}"
                else:
                    ok.append(key)
            except Exception as e:
                bad[key] = f"{type(e).__name__}: {str(e)[:200]}"
        del ins
        torch.cuda.empty_cache()
    print("SMOKE " + json.dumps({"ok": ok, "bad": bad}), flush=True)


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


def run_variants(args, bench):
    import subprocess

    t0 = time.time()
    cfgs = _variant_configs(args.only)
    errs = DA.precompile(cfgs)
    print(f"precompiled {len(set(cfgs))} configs in {time.time() - t0:.1f} s", flush=True)
    for e in errs:
        print("  precompile error:", e[:300], flush=True)
    # smoke test in a child process with a time limit (a hanging variant must not stall the run)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--smoke-variants"] + (["--only", args.only] if args.only else [])
    ok, bad = None, {}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.smoke_timeout)
        line = next((l for l in r.stdout.splitlines() if l.startswith("SMOKE ")), None)
        if line:
            d = json.loads(line[6:])
            ok, bad = set(d["ok"]), d["bad"]
        else:
            print("smoke child failed:\n" + r.stdout[-2000:] + r.stderr[-3000:], flush=True)
    except subprocess.TimeoutExpired:
        print(f"smoke child timed out after {args.smoke_timeout} s: timing default/no_pdl/split_* only", flush=True)
    if ok is None:  # child died or hung: only the variants that use the old kernel paths
        safe = {"default", "no_pdl", "split_half", "split_x2", "split_fill2", "cp_s4"}
        ok = {f"{n}/{l}" for n, _, ls in VARIANT_PLAN for l in ls if l in safe}
    for k_, v_ in bad.items():
        print(f"  dropped {k_}: {v_}", flush=True)

    rows = []
    for name, rounds, labels in VARIANT_PLAN:
        if args.only and args.only not in name:
            continue
        _, B, Hq, Hkv, L, page = _shape(name)
        kv_bytes = 2 * B * L * Hkv * D * 2
        ins = _variant_inputs(name)
        q, k, v = ins[0], ins[1], ins[2]
        impls = {}
        for lab in labels:
            if f"{name}/{lab}" not in ok:
                continue
            fn, cfg, P = _variant_fn(lab, *ins)
            impls[lab] = (fn, cfg, P)
        try:
            cudnn = sdpa_cudnn(q, k, v)
            torch.cuda.synchronize()
            impls["cudnn"] = (cudnn, None, None)
        except Exception as e:
            print(f"  cudnn unavailable: {e}", flush=True)
        times = {lab: [] for lab in impls}
        for r in range(rounds if not args.quick else 1):
            for lab, (fn, _, _) in rotated(impls.items(), r):
                times[lab].append(bench(fn))
        extra = {}
        if "L32768" in name or "L8192" in name:
            for lab in EXTRA_TIMED:
                if lab in impls:
                    fn = impls[lab][0]
                    try:
                        extra[lab] = (bench_clean(fn), bench_graph(fn))
                    except Exception as e:
                        print(f"  {name} {lab} clean/graph: {type(e).__name__}: {str(e)[:200]}", flush=True)
        cud = statistics.median(times["cudnn"]) if "cudnn" in times else None
        for lab, ts in times.items():
            med = statistics.median(ts)
            fn, cfg, P = impls[lab]
            rec = dict(
                shape=name, variant=lab, us=med, us_min=min(ts), TBps=kv_bytes / (med * 1e-6) / 1e12,
                vs_cudnn=(cud / med) if cud else None, splits=P,
                cfg=None if cfg is None else dict(
                    n_tile=cfg.n_tile, stages=cfg.stages, merge=cfg.merge_mode, load=cfg.load, pdl_in=cfg.pdl_in,
                ),
                clean_us=extra.get(lab, (None, None))[0], graph_us=extra.get(lab, (None, None))[1],
                kv_bytes=kv_bytes,
            )
            rows.append(rec)
            ex = ""
            if rec["clean_us"]:
                ex = f"  clean={rec['clean_us']:.1f}us graph={rec['graph_us']:.1f}us"
            print(
                f"{name:30s} {lab:14s} P={str(P):>4s} {med:8.1f} us (min {min(ts):.1f}) {rec['TBps']:.2f} TB/s"
                f"  x{rec['vs_cudnn'] or float('nan'):.3f} cuDNN{ex}",
                flush=True,
            )
        del ins, impls, q, k, v
        torch.cuda.empty_cache()
    return rows


def write_variants_md(path, meta, rows):
    lines = [f"# Decode attention variants ({meta['device']})", "",
             f"{meta['timer']}; interleaved rounds (median); bf16, D=128, q_len=1; TB/s = KV bytes / time.",
             "clean = CUDA events after a read-only 256 MB L2 flush; graph = per call of 20 back-to-back calls "
             "in one CUDA graph (no flush).", "",
             "| shape | variant | splits | load | stages | merge | pdl_in | µs | min µs | TB/s | × cuDNN | clean µs (TB/s) | graph µs (TB/s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["cfg"] or {}
        tb = lambda us: f"{us:.1f} ({r['kv_bytes'] / (us * 1e-6) / 1e12:.2f})" if us else "—"  # noqa: E731
        lines.append(
            f"| {r['shape']} | {r['variant']} | {r['splits'] if r['splits'] is not None else '—'} | {c.get('load', '—')} | "
            f"{c.get('stages', '—')} | {c.get('merge', '—')} | {c.get('pdl_in', '—')} | {r['us']:.1f} | {r['us_min']:.1f} | "
            f"{r['TBps']:.2f} | {r['vs_cudnn']:.3f} | {tb(r['clean_us'])} | {tb(r['graph_us'])} |"
            if r["vs_cudnn"] else
            f"| {r['shape']} | {r['variant']} | {r['splits']} | {c.get('load', '—')} | {c.get('stages', '—')} | "
            f"{c.get('merge', '—')} | {c.get('pdl_in', '—')} | {r['us']:.1f} | {r['us_min']:.1f} | {r['TBps']:.2f} | — | "
            f"{tb(r['clean_us'])} | {tb(r['graph_us'])} |"
        )
    # best variant per shape and the numbers with it
    lines += ["", "## Best per shape (do_bench median)", "", "| shape | best variant | TB/s | default TB/s | cuDNN TB/s | best × cuDNN |",
              "|---|---|---|---|---|---|"]
    by = {}
    for r in rows:
        by.setdefault(r["shape"], []).append(r)
    for shp, rs in by.items():
        ours = [r for r in rs if r["variant"] != "cudnn"]
        if not ours:
            continue
        best = min(ours, key=lambda r: r["us"])
        dflt = next((r for r in rs if r["variant"] == "default"), None)
        cud = next((r for r in rs if r["variant"] == "cudnn"), None)
        lines.append(
            f"| {shp} | {best['variant']} | {best['TBps']:.2f} | {dflt['TBps'] if dflt else float('nan'):.2f} | "
            f"{cud['TBps'] if cud else float('nan'):.2f} | {best['vs_cudnn'] or float('nan'):.3f} |"
        )
    Path(path).write_text("\n".join(lines) + "\n")


def write_md(path, meta, results, notes, sweep):
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
    for key, val in s.items():
        if key.startswith("geomean_cute_") and key != "geomean_cute_vs_cudnn" and val:
            lines.append(f"Candidate {key.removeprefix('geomean_').removesuffix('_vs_cudnn')}: geomean {val:.3f}× cuDNN.")
    lines.append("")
    for shape, ns in notes.items():
        for n in ns:
            lines.append(f"- {shape}: {n}")
    if sweep:
        lines += ["", "## Sweep (this project, contiguous; * = automatic split count)", "",
                  "| shape | n_tile | stages | merge | splits | µs | TB/s |", "|---|---|---|---|---|---|---|"]
        for r in sweep:
            lines.append(
                f"| {r['shape']} | {r['n_tile']} | {r['stages']} | {r['merge_mode']} | {r['num_splits']}{'*' if r['auto'] else ''} | {r['us']:.1f} | {r['TBps']:.2f} |"
            )
    Path(path).write_text("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="only sweep this project's configs (merge modes, splits, tiles)")
    ap.add_argument("--merge-mode", default=None, choices=["kernel", "pdl", "fused"], help="force the merge mode")
    ap.add_argument("--only", default="", help="substring filter on shape names")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out-dir", default=str(ROOT / "profiles" / "results"))
    ap.add_argument("--candidate", default="", help=f"comma-separated extra columns of ours: {sorted(CANDIDATES)}")
    ap.add_argument("--size-sweep", action="store_true",
                    help="b1 hq32 hkv8 at L 8192..131072 (34-537 MB of KV) instead of the issue shapes: where "
                         "does a candidate (e.g. --candidate tma_ef) stop paying?")
    ap.add_argument("--variants", action="store_true", help="v2 load/launch/split variants vs default vs cuDNN")
    ap.add_argument("--smoke-variants", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--smoke-timeout", type=int, default=150)
    args = ap.parse_args()
    if args.quick:
        args.repeats = 1
    if not torch.cuda.is_available():
        sys.exit("bench_decode: needs a CUDA device")
    if args.smoke_variants:
        smoke_variants(args)
        return
    bench, timer = make_bench(args.quick)
    t0 = time.time()
    if args.variants:
        rows = run_variants(args, bench)
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "timer": timer,
                "seconds": round(time.time() - t0, 1)}
        out_dir = Path(args.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = "bench_decode_variants" + (f"_{args.tag}" if args.tag else "")
        (out_dir / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        write_variants_md(out_dir / f"{stem}.md", meta, rows)
        print(f"wrote {out_dir / (stem + '.md')} in {meta['seconds']} s")
        return
    if args.merge_mode:
        DA._CONFIG_OVERRIDE = dict(merge_mode=args.merge_mode)
    _candidates.extend(filter(None, args.candidate.split(",")))
    if args.size_sweep:
        SHAPES[:] = SIZE_SWEEP_SHAPES
    precompile_all(args)
    if args.sweep:
        results, notes = [], {}
        sweep = run_sweep(args, bench)
    else:
        results, notes = run_shapes(args, bench)
        sweep = []
    sp_c = [r["speedup_vs_cudnn"].get("cute") for r in results]
    sp_p = [next((v for n, v in r["speedup_vs_cudnn"].items() if n.startswith("cute_paged")), None) for r in results]
    big = [r["impls"]["cute"]["TBps"] for r in results if r["kv_bytes"] >= BIG_BYTES]
    summary = {
        **{f"geomean_cute_{c}_vs_cudnn": geomean([r["speedup_vs_cudnn"].get(f"cute_{c}") for r in results])
           for c in _candidates},
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
    stem = "bench_decode" + ("_sweep" if args.sweep else "") + (f"_{args.tag}" if args.tag else "")
    (out_dir / f"{stem}.json").write_text(
        json.dumps({"meta": meta, "results": results, "notes": notes, "sweep": sweep}, indent=1)
    )
    write_md(out_dir / f"{stem}.md", meta, results, notes, sweep)
    print(json.dumps(summary, indent=1))
    print(f"wrote {out_dir / (stem + '.json')} and .md in {meta['seconds']} s")


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        sys.exit(1)
