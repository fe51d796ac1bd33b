"""Host time per call and first-call time of every public op (issue #19), in one process, on a GPU.

1. Host time per call: tiny problems (GPU work of a few microseconds), N back-to-back calls per round,
   the median over rounds of the wall time per call (the device is synchronized between rounds, never
   inside one).  Every round times every variant once, the order rotated round by round, and the
   overhead over bare is the median of the per-round differences: the device machine's host drifts
   by microseconds between blocks of rounds, which unpaired medians took for differences between
   variants.  For each op, side by side:

   * the public op (``gemm``, ``decode_attn``, ``flash_attn``, ``merge_states``), allocating its
     outputs and with ``out=`` where it takes one;
   * ``bare``: the compiled kernel(s) the op runs for that call, called directly with prepared
     arguments (every buffer allocated beforehand) -- the floor of a launch through TVM-FFI;
   * ``bare+alloc``: the same plus the ``torch.empty`` calls the op itself makes for that variant
     (its outputs, the split decode's partial states), sizes passed positionally (the fastest form:
     a tuple or a ``torch.Size`` costs more to parse);
   * the PyTorch counterpart: ``torch.matmul`` (``out=`` for gemm's ``out=``), SDPA on the cuDNN backend
     (the backend chosen once, outside the timed loop) for decode_attn / flash_attn, the torch
     reference merge for merge_states.

   * ``key``: building the fast path's call-metadata key and looking it up (no launch);
   * ``floor``: the least any Python fast path keyed on call metadata can do on this host: a dict
     keyed on the first tensor's shape, dtype and device (the fewest facts that tell two launchers
     apart; no strides, no other argument, no checks), then the op's launcher.  Its overhead over the
     bare reference, beside the op's, bounds what a public op written in Python can reach here.

   Targets (issue #19): public <= bare+alloc + 3 us, and public <= the PyTorch counterpart.
2. First call: per op, a fresh process with an empty cache directory (compiles), then another one on
   the same, now warm, directory (loads); each times ``import cute_kernels`` on its own, then the
   first call (synchronized).  Target: warm first call <= 50 ms.  A third process profiles the warm
   first call (cProfile, the top entries by cumulative time) to show where that time goes.

    python3 profiles/bench_host.py                 # table on stdout, JSON in profiles/results/
    python3 profiles/bench_host.py --out DIR --rounds 25 --calls 200 --no-first-call

Writes ``DIR/host-<date>-<commit>.json`` (commit: ``CK_COMMIT``, else ``git rev-parse``).  Without a
CUDA device it says so and exits 0.  About 1-2 minutes on an H200 (the cold first calls compile).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGET_VS_BARE_US = 3.0
TARGET_FIRST_CALL_MS = 50.0


# ------------------------------------------------------------------------------------------ timing
def host_us(variants: dict, calls: int, rounds: int) -> tuple[dict, dict]:
    """Per variant: the median (and min) over ``rounds`` of the wall time per call of ``calls``
    back-to-back calls, every round timing each variant once, in an order rotated round by round (so
    a drift of the host's speed reaches every variant alike); the per-round times (for paired
    differences); the time the final synchronize waited (the GPU's backlog: large means the GPU, not
    the host, set the pace).  Returns ``(times, failed)``: a variant that raises is dropped, its error
    in ``failed``."""
    import torch

    live, failed = dict(variants), {}
    for name, fn in list(live.items()):
        try:
            for _ in range(calls):
                fn()
        except Exception as e:  # noqa: BLE001 - one variant failing must not lose the others
            failed[name] = f"{type(e).__name__}: {str(e)[:120]}"
            del live[name]
    torch.cuda.synchronize()
    per = {name: [] for name in live}
    sync = {name: [] for name in live}
    names = list(live)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = live[name]
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            per[name].append((t1 - t0) / calls * 1e6)
            sync[name].append((time.perf_counter() - t1) * 1e6)
    res = {name: {"median_us": statistics.median(per[name]), "min_us": min(per[name]), "rounds_us": per[name],
                  "sync_wait_us": statistics.median(sync[name])} for name in names}
    return res, failed


def floor_variant(launcher, t, *args):
    """The ``floor`` variant (module doc): select ``launcher`` by ``t``'s shape, dtype and device, call
    it with ``args``."""
    table = {(t.shape, t.dtype, t.get_device()): launcher}
    return lambda: table[(t.shape, t.dtype, t.get_device())](*args)


# ---------------------------------------------------------------------------------- the problems
def gemm_cases(dev):
    """(name, {variant: callable}, notes) for two tiny GEMMs: M <= 64 (the transposed plan) and 256 x
    256 x 128 (the persistent kernel)."""
    import torch

    from cute_kernels import gemm
    from cute_kernels.common import jit
    from cute_kernels.gemm import host as GH
    from cute_kernels.gemm import launch as GL
    from cute_kernels.gemm import plan as GP

    out = []
    for m, n, k in ((64, 64, 64), (256, 256, 128)):
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        d = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        gemm(a, b, out=d)
        gemm(a, b)
        p = GP.plan(a, b, d)
        fn, ws, views = p.fn, (), False
        if isinstance(fn, GL.SwappedLauncher):
            views = not fn.torch_order
            fn = fn.fn
        if isinstance(fn, GL.WorkspaceLauncher):
            ws = fn.workspace(a.device)
            fn = fn.fn
        raw = jit.direct(fn)
        notes = [f"plan {p.kind}" + (" (operands as .mT views, made once for bare)" if views else "")]

        def args(o, a=a, b=b, views=views):
            return (b.mT, a.mT, o.mT, o.mT) if views else (a, b, o, o)

        prepared = args(d)

        def bare(raw=raw, prepared=prepared, ws=ws):
            raw(*prepared, *ws, 1.0, 0.0)

        def bare_alloc(raw=raw, ws=ws, shape=(m, n)):  # positional sizes: the fastest torch.empty form
            raw(*args(torch.empty(*shape, device=dev, dtype=torch.bfloat16)), *ws, 1.0, 0.0)

        la, lo = GH._launchers[GH._key(a, b, None, None, 0.0, None)], GH._launchers[GH._key(a, b, d, None, 0.0, None)]
        out.append((f"gemm {m}x{n}x{k}", {
            "key": lambda a=a, b=b, d=d: GH._launchers.get(GH._key(a, b, d, None, 0.0, None)),
            "launcher": lambda a=a, b=b, la=la: la(a, b, None, None, 1.0, 0.0),
            "launcher_out": lambda a=a, b=b, d=d, lo=lo: lo(a, b, d, None, 1.0, 0.0),
            "floor": floor_variant(la, a, a, b, None, None, 1.0, 0.0),
            "floor_out": floor_variant(lo, a, a, b, d, None, 1.0, 0.0),
            "public": lambda a=a, b=b: gemm(a, b),
            "public_out": lambda a=a, b=b, d=d: gemm(a, b, out=d),
            "bare": bare, "bare_alloc": bare_alloc,
            "torch": lambda a=a, b=b: torch.matmul(a, b),
            "torch_out": lambda a=a, b=b, d=d: torch.matmul(a, b, out=d),
        }, notes))
    return out


def _sdpa(qt, kt, vt, Hq, Hkv, notes):
    """SDPA on the cuDNN backend (the backend chosen once: the returned callable runs inside a
    ``sdpa_kernel`` block the caller opens), GQA natively or as expanded heads; None if unavailable."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional.scaled_dot_product_attention
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        if Hq == Hkv:
            try:
                F(qt, kt, vt)
                return lambda: F(qt, kt, vt)
            except Exception as e:  # noqa: BLE001
                notes.append(f"cuDNN SDPA unavailable ({type(e).__name__}: {str(e)[:100]})")
                return None
        try:
            F(qt, kt, vt, enable_gqa=True)
            return lambda: F(qt, kt, vt, enable_gqa=True)
        except Exception as e:  # noqa: BLE001
            notes.append(f"cuDNN SDPA enable_gqa failed ({type(e).__name__}); expanded K/V heads")
        ke, ve = kt.repeat_interleave(Hq // Hkv, 1), vt.repeat_interleave(Hq // Hkv, 1)
        try:
            F(qt, ke, ve)
            return lambda: F(qt, ke, ve)
        except Exception as e:  # noqa: BLE001
            notes.append(f"cuDNN SDPA unavailable ({type(e).__name__}: {str(e)[:100]})")
            return None


def decode_cases(dev):
    """One sequence, 8 query heads on 2 KV heads, D 128, 256 cached tokens: the planner's split
    count, and 4 forced splits (the decode kernel + its merge)."""
    import torch

    from cute_kernels import decode_attn
    from cute_kernels.attention import decode as DE
    from cute_kernels.attention import decode_plan as DP
    from cute_kernels.common import jit
    from cute_kernels.common.softmax import LOG2_E

    B, Hq, Hkv, D, L = 1, 8, 2, 128, 256
    q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, L, Hkv, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, L, Hkv, D, device=dev, dtype=torch.bfloat16)
    s = torch.full((B,), L, device=dev, dtype=torch.int32)
    o = torch.empty_like(q)
    out = []
    for splits in (None, 4):
        decode_attn(q, k, v, cache_seqlens=s, num_splits=splits)
        decode_attn(q, k, v, cache_seqlens=s, num_splits=splits, out=o)
        cfg, P = DP.plan(q, k, None, splits, True)
        fn = DE.get_decode_kernel(cfg)
        raw = jit.direct(fn)
        lse = torch.empty(B, Hq, 1, device=dev, dtype=torch.float32)
        f32 = dict(device=dev, dtype=torch.float32)
        parts = (torch.empty(P, B, 1, Hq, D, **f32), torch.empty(P, B, 1, Hq, **f32)) if P > 1 else (None, None)
        scale = D ** -0.5 * LOG2_E
        notes = [f"num_splits {P}" + (" (decode kernel + merge kernel)" if P > 1 else "")]

        def bare(raw=raw, parts=parts):
            raw(q, k, v, s, None, o, lse, *parts, scale)

        def bare_alloc(raw=raw, P=P):  # what decode_attn() allocates: out (and the partial states)
            ps = (torch.empty(P, B, 1, Hq, D, **f32), torch.empty(P, B, 1, Hq, **f32)) if P > 1 else (None, None)
            raw(q, k, v, s, None, torch.empty(B, 1, Hq, D, device=dev, dtype=torch.bfloat16), lse, *ps, scale)

        def bare_alloc_out(raw=raw, P=P):  # what decode_attn(out=) allocates: the partial states
            ps = (torch.empty(P, B, 1, Hq, D, **f32), torch.empty(P, B, 1, Hq, **f32)) if P > 1 else (None, None)
            raw(q, k, v, s, None, o, lse, *ps, scale)

        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        sd = _sdpa(qt, kt, vt, Hq, Hkv, notes)
        la = DE._launchers[DE._key(q, k, v, s, None, None, None, splits, True)]
        lo = DE._launchers[DE._key(q, k, v, s, None, o, None, splits, True)]
        variants = {
            "key": lambda splits=splits: DE._launchers.get(DE._key(q, k, v, s, None, o, None, splits, True)),
            "launcher": lambda la=la: la(q, k, v, None, False, D ** -0.5, s, None, None),
            "launcher_out": lambda lo=lo: lo(q, k, v, o, False, D ** -0.5, s, None, None),
            "floor": floor_variant(la, q, q, k, v, None, False, D ** -0.5, s, None, None),
            "floor_out": floor_variant(lo, q, q, k, v, o, False, D ** -0.5, s, None, None),
            "public": lambda splits=splits: decode_attn(q, k, v, cache_seqlens=s, num_splits=splits),
            "public_out": lambda splits=splits: decode_attn(q, k, v, cache_seqlens=s, num_splits=splits, out=o),
            "bare": bare, "bare_alloc": bare_alloc, "bare_alloc_out": bare_alloc_out,
        }
        if sd is not None:
            variants["torch"] = sd
        out.append((f"decode_attn B{B} H{Hq}/{Hkv} L{L} splits={splits or 'auto'}", variants, notes))
    return out


def flash_cases(dev):
    import torch

    from cute_kernels import flash_attn
    from cute_kernels.attention import forward as FW
    from cute_kernels.attention import forward_host as FH
    from cute_kernels.common import jit
    from cute_kernels.common.softmax import LOG2_E

    B, S, H, D = 1, 128, 8, 128
    q, k, v = (torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    flash_attn(q, k, v)
    flash_attn(q, k, v, out=o)
    cfg = FW.plan(q.dtype, D, False)
    raw = jit.direct(FW.get_forward_kernel(cfg))
    lse = torch.empty(B, H, S, device=dev, dtype=torch.float32)
    scale = D ** -0.5 * LOG2_E

    def bare():
        raw(q, k, v, o, lse, FW.tile_counter(q.device, cfg.tile.dynamic), scale)

    def bare_alloc():  # flash_attn() allocates its output (the LSE nobody asked for is a scratch buffer)
        raw(q, k, v, torch.empty(B, S, H, D, device=dev, dtype=torch.bfloat16), lse,
            FW.tile_counter(q.device, cfg.tile.dynamic), scale)

    notes = []
    sd = _sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), H, H, notes)
    la = FW._launchers[FH.dense_key(q, k, v, None, False, (-1, -1))]
    lo = FW._launchers[FH.dense_key(q, k, v, o, False, (-1, -1))]
    variants = {"key": lambda: FW._launchers.get(FH.dense_key(q, k, v, o, False, (-1, -1))),
                "launcher": lambda: la(q, k, v, None, False, D ** -0.5),
                "launcher_out": lambda: lo(q, k, v, o, False, D ** -0.5),
                "floor": floor_variant(la, q, q, k, v, None, False, D ** -0.5),
                "floor_out": floor_variant(lo, q, q, k, v, o, False, D ** -0.5),
                "public": lambda: flash_attn(q, k, v), "public_out": lambda: flash_attn(q, k, v, out=o),
                "bare": bare, "bare_alloc": bare_alloc, "bare_alloc_out": bare}
    if sd is not None:
        variants["torch"] = sd
    return [(f"flash_attn B{B} S{S} H{H} D{D}", variants, notes)]


def merge_cases(dev):
    import torch

    from cute_kernels import merge_states
    from cute_kernels.attention import merge as ME
    from cute_kernels.common import jit

    P, B, S, H, D = 2, 1, 1, 8, 128
    op = torch.randn(P, B, S, H, D, device=dev)
    lp = torch.randn(P, B, S, H, device=dev)
    merge_states(op, lp)
    raw = jit.direct(ME.get_merge_kernel(ME.MergeConfig("float32", "float32", D)))
    la = ME._launchers[ME._key(op, lp)]
    o, lo = torch.empty(B, S, H, D, device=dev), torch.empty(B, S, H, device=dev)

    def bare_alloc():
        raw(op, lp, torch.empty(B, S, H, D, device=dev), torch.empty(B, S, H, device=dev))

    return [(f"merge_states P{P} (B{B}, S{S}, H{H}, D{D}) fp32", {
        "key": lambda: ME._launchers.get(ME._key(op, lp)), "launcher": lambda: la(op, lp),
        "floor": floor_variant(la, op, op, lp),
        "public": lambda: merge_states(op, lp), "bare": lambda: raw(op, lp, o, lo), "bare_alloc": bare_alloc,
        "torch": lambda: ME.merge_states_torch(op, lp)}, ["torch: merge_states_torch, the reference"])]


def measure_host(dev, calls, rounds, ops):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    makers = {"gemm": gemm_cases, "decode_attn": decode_cases, "flash_attn": flash_cases, "merge_states": merge_cases}
    for op in ops:
        try:
            cases = makers[op](dev)
        except Exception as e:  # noqa: BLE001 - one op failing must not lose the others
            rows.append({"op": op, "case": op, "error": f"{type(e).__name__}: {e}"})
            print(f"{op}: setup failed: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        for name, variants, notes in cases:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):  # (no effect outside SDPA)
                times, failed = host_us(variants, calls, rounds)
            notes += [f"{var} failed: {err}" for var, err in failed.items()]
            torch.cuda.synchronize()
            rows.append({"op": op, "case": name, "notes": notes, "us": times, **verdicts(op, times)})
    return rows


def references(op) -> dict:
    """public variant -> (its bare reference, its PyTorch counterpart): what the op itself allocates
    is in its bare+alloc; gemm(out=) allocates nothing and has torch.matmul(out=)."""
    if op == "gemm":
        return {"public": ("bare_alloc", "torch"), "public_out": ("bare", "torch_out")}
    return {"public": ("bare_alloc", "torch"), "public_out": ("bare_alloc_out", "torch")}


def verdicts(op, times) -> dict:
    """Per public variant: overhead over its bare reference (target <= 3 us; the median of the paired
    per-round differences) and the ratio to the PyTorch counterpart (target <= 1)."""
    med = {k: v["median_us"] for k, v in times.items()}
    res = {}
    for var, (bare_key, torch_key) in references(op).items():
        if var not in med:
            continue
        r = {"us": med[var], "bare_ref": bare_key, "torch_ref": torch_key}
        if bare_key in med:  # paired: the median of the per-round differences (same rounds, same drift)
            over = statistics.median(a - b for a, b in zip(times[var]["rounds_us"], times[bare_key]["rounds_us"]))
            r.update(over_bare_us=over, ok_vs_bare=over <= TARGET_VS_BARE_US)
            floor = "floor_out" if var == "public_out" else "floor"
            if floor in med:
                r["floor_over_bare_us"] = statistics.median(
                    a - b for a, b in zip(times[floor]["rounds_us"], times[bare_key]["rounds_us"]))
        if torch_key in med:
            r.update(vs_torch=med[var] / med[torch_key], ok_vs_torch=med[var] <= med[torch_key])
        res[var] = r
    return {"verdict": res}


# -------------------------------------------------------------------------------------- first call
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
t_torch = time.perf_counter() - t0
import cute_kernels
from cute_kernels.common import jit
t_import = time.perf_counter() - t0
dev = torch.device("cuda")
torch.empty(1, device=dev); torch.cuda.synchronize()  # the CUDA context is not the first call's
bf = torch.bfloat16
SETUP
torch.cuda.synchronize()
prof = None
if "--profile" in sys.argv:
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
t1 = time.perf_counter()
CALL
torch.cuda.synchronize()
t_first = time.perf_counter() - t1
if prof is not None:
    prof.disable()
t2 = time.perf_counter()
CALL
torch.cuda.synchronize()
t_second = time.perf_counter() - t2
res = dict(torch_import_s=t_torch, import_s=t_import, first_call_ms=t_first * 1e3, second_call_ms=t_second * 1e3,
           **{k: jit.stats[k] for k in ("compiles", "disk_hits", "compile_seconds")})
if prof is not None:
    import io, pstats
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
    res["profile"] = s.getvalue().splitlines()[-32:]
print("RESULT " + json.dumps(res))
"""

FIRST = {
    "gemm": ("a = torch.randn(256, 128, device=dev, dtype=bf); b = torch.randn(128, 256, device=dev, dtype=bf)",
             "cute_kernels.gemm(a, b)"),
    "gemm_skinny": ("a = torch.randn(16, 4096, device=dev, dtype=bf); b = torch.randn(4096, 4096, device=dev, dtype=bf)",
                    "cute_kernels.gemm(a, b)"),
    "decode_attn": ("q = torch.randn(1, 1, 8, 128, device=dev, dtype=bf); k = torch.randn(1, 256, 2, 128, device=dev, "
                    "dtype=bf); s = torch.full((1,), 256, device=dev, dtype=torch.int32)",
                    "cute_kernels.decode_attn(q, k, k, cache_seqlens=s)"),
    "flash_attn": ("q = torch.randn(1, 128, 8, 128, device=dev, dtype=bf)", "cute_kernels.flash_attn(q, q, q)"),
    "merge_states": ("o = torch.randn(2, 1, 1, 8, 128, device=dev); l = torch.randn(2, 1, 1, 8, device=dev)",
                     "cute_kernels.merge_states(o, l)"),
}


def first_call(op, cache_dir, profile=False):
    setup, call = FIRST[op]
    code = CHILD.replace("SETUP", setup).replace("CALL", call)
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=cache_dir, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code] + (["--profile"] if profile else []), env=env, capture_output=True,
                       text=True, timeout=600)
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode or not lines:
        return {"error": (r.stderr or r.stdout)[-800:]}
    return json.loads(lines[-1][len("RESULT "):])


def measure_first(ops):
    res = {}
    for op in ops:
        with tempfile.TemporaryDirectory() as d:
            cold = first_call(op, d)
            warm = first_call(op, d)
            prof = first_call(op, d, profile=True)
        warm_ms = warm.get("first_call_ms")
        res[op] = {"cold": cold, "warm": warm, "warm_profile": prof.get("profile", prof.get("error")),
                   "ok_warm_first_call": warm_ms is not None and warm_ms <= TARGET_FIRST_CALL_MS}
        print(f"first call {op}: cold {cold.get('first_call_ms', float('nan')):.1f} ms, warm "
              f"{warm.get('first_call_ms', float('nan')):.1f} ms (import {warm.get('import_s', float('nan')):.2f} s)",
              file=sys.stderr)
    return res


# ------------------------------------------------------------------------------------------- report
def commit() -> str:
    if os.environ.get("CK_COMMIT"):
        return os.environ["CK_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def markdown(rows, first) -> str:
    def f(x):
        return "" if x is None else f"{x:.1f}"

    out = ["| case | variant | us/call | launcher | bare | bare ref | torch | over bare ref | floor over bare ref | key "
           "| vs torch | ok |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['case']} | error: {r['error'][:80]} | | | | | | | | | | |")
            continue
        us = {k: v["median_us"] for k, v in r["us"].items()}
        for var, v in r["verdict"].items():
            ok = v.get("ok_vs_bare", True) and v.get("ok_vs_torch", True)
            ratio = "" if "vs_torch" not in v else "%.2fx" % v["vs_torch"]
            out.append(f"| {r['case']} | {'out=' if var == 'public_out' else 'alloc'} | {f(v['us'])} | "
                       f"{f(us.get('launcher_out' if var == 'public_out' else 'launcher'))} | {f(us.get('bare'))} | {f(us.get(v['bare_ref']))} | {f(us.get(v['torch_ref']))} | "
                       f"{f(v.get('over_bare_us'))} | {f(v.get('floor_over_bare_us'))} | {f(us.get('key'))} | {ratio} | "
                       f"{'yes' if ok else 'NO'} |")
    if first:
        out += ["", "| op | import s | cold first call ms (compiles) | warm first call ms (disk hits) | second call ms | ok |",
                "|---|---:|---:|---:|---:|:---:|"]
        for op, r in first.items():
            c, w = r["cold"], r["warm"]
            out.append(f"| {op} | {w.get('import_s', float('nan')):.2f} | {c.get('first_call_ms', float('nan')):.1f} "
                       f"({c.get('compiles', '?')}) | {w.get('first_call_ms', float('nan')):.1f} ({w.get('disk_hits', '?')}) | "
                       f"{w.get('second_call_ms', float('nan')):.2f} | {'yes' if r['ok_warm_first_call'] else 'NO'} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="directory of the JSON record")
    ap.add_argument("--calls", type=int, default=200, help="back-to-back calls per round")
    ap.add_argument("--rounds", type=int, default=15, help="rounds (the median is reported)")
    ap.add_argument("--ops", default="gemm,decode_attn,flash_attn,merge_states")
    ap.add_argument("--no-first-call", action="store_true", help="skip the fresh-process first-call measurements")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench_host: torch is not installed; nothing measured")
        return 0
    if not torch.cuda.is_available():
        print("bench_host: needs a CUDA device (an H100 / H200); nothing measured")
        return 0
    sys.path.insert(0, ROOT)
    ops = [o for o in args.ops.split(",") if o]
    t0 = time.perf_counter()
    dev = torch.device("cuda")
    rows = measure_host(dev, args.calls, args.rounds, ops)
    first = {} if args.no_first_call else measure_first([o for o in FIRST if o.split("_skinny")[0] in ops])
    rec = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit(),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "python": platform.python_version(),
           "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
           "calls_per_round": args.calls, "rounds": args.rounds,
           "targets": {"over_bare_alloc_us": TARGET_VS_BARE_US, "vs_torch": 1.0, "warm_first_call_ms": TARGET_FIRST_CALL_MS},
           "host": rows, "first_call": first, "seconds": time.perf_counter() - t0}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"host-{datetime.date.today().isoformat()}-{rec['commit']}.json")
    with open(path, "w") as fh:
        json.dump(rec, fh, indent=1)
    print(markdown(rows, first))
    print(f"\nwrote {path} ({rec['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
