#!/usr/bin/env python3
"""GPU repro for the decode TMA load variant (``load="tma"``), one case per subprocess.

    source .device/setup.sh && python3 profiles/repro_decode_tma.py [--timeout 20] [--only a,b] [--max-hangs 2]

Why a subprocess per case: the variant hung on the H200 (session 2 run 5), and a hung kernel would
eat a whole device call.  Here a hang costs ``--timeout`` seconds (the child is killed, which tears
down its CUDA context) and the next case runs in a fresh process.  Kernels are compiled first, in
the parent (parallel processes, disk cache), so the per-case timeout measures the launch alone.

Cases go from the smallest (one KV tile) to the GPU test that hung
(``test_gpu_variants_bitwise_equal_default[1-tma]``).  Each child runs the default cp.async kernel,
then the TMA variant, and compares: bitwise equal to cp.async (the test's criterion) and close to
the float32 reference.  One line per case: PASS / MISMATCH (not bitwise equal to cp.async) / WRONG
(far from the reference) / HANG (timed out) / ERROR (exception, last lines shown) / SKIPPED.
Exit status: the number of cases that did not PASS.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("PYTHONUNBUFFERED", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

TMA = dict(load="tma")
TMA_PDL = dict(load="tma", pdl_in=True, merge_mode="pdl")
TEST_LENS = [0, 1, 7, 1000, 65537]

# name -> spec (defaults: Sq 1, Hq 16, Hkv 4, D 128, bf16, splits 1, contiguous cache)
CASES = {
    "one_tile": dict(lens=[64], Lmax=64),
    "partial_tile": dict(lens=[1], Lmax=64),
    "zero_and_one": dict(lens=[0, 1], Lmax=64),
    "phase_wrap_10_tiles": dict(lens=[640], Lmax=640),  # 10 tiles through a 3-slot ring
    "tail_box_past_Lmax": dict(lens=[1000], Lmax=1000),  # last box clipped by the tensor: zero fill
    "test_lens_p1": dict(lens=TEST_LENS, Lmax=65600, nan_tail=True),  # the test that hung
    "test_lens_auto_splits": dict(lens=TEST_LENS, Lmax=65600, nan_tail=True, splits=None),
    "test_lens_p48": dict(lens=TEST_LENS, Lmax=65600, nan_tail=True, splits=48),
    "d256_strided_sq3": dict(B=2, Sq=3, Hq=8, Hkv=2, D=256, lens=[1500, 999], Lmax=1500, strided=True),
    "d256_clamped_lengths": dict(B=2, Sq=3, Hq=8, Hkv=2, D=256, lens=[10**6, -5], Lmax=1500, strided=True),
    "d64_rows32_split4": dict(Hq=32, Hkv=1, D=64, lens=[3000, 77], Lmax=3000, splits=4),
    "tma_pdl_test_lens_p48": dict(lens=TEST_LENS, Lmax=65600, nan_tail=True, splits=48, variant=TMA_PDL),
}


def _spec(name):
    s = dict(B=None, Sq=1, Hq=16, Hkv=4, D=128, splits=1, nan_tail=False, strided=False, variant=TMA)
    s.update(CASES[name])
    s["B"] = len(s["lens"])
    return s


def _DA():
    return importlib.import_module("cute_kernels.attention.decode")


def configs_for(name):
    """The (cp.async, variant) DecodeConfigs a case uses, from shapes only (meta tensors)."""
    DA = _DA()
    s = _spec(name)
    q = torch.empty(s["B"], s["Sq"], s["Hq"], s["D"], dtype=torch.bfloat16, device="meta")
    k = torch.empty(s["B"], s["Lmax"], s["Hkv"], s["D"], dtype=torch.bfloat16, device="meta")
    base = DA._plan_uncached(q, k, None, s["splits"], True)[0]
    with DA.override_config(**s["variant"]):
        var = DA._plan_uncached(q, k, None, s["splits"], True)[0]
    return base, var


def child(name):
    DA = _DA()
    from cute_kernels.attention import decode as decode_attn
    from cute_kernels.attention.decode import decode_attn_reference

    s = _spec(name)
    B, Sq, Hq, Hkv, D, Lmax = s["B"], s["Sq"], s["Hq"], s["Hkv"], s["D"], s["Lmax"]
    g = torch.Generator(device="cuda").manual_seed(21)
    q = torch.randn(B, Sq, Hq, D, generator=g, device="cuda").to(torch.bfloat16)
    if s["strided"]:  # K and V as views of one (B, L, 2, Hkv, D) buffer
        kv = torch.randn(B, Lmax, 2, Hkv, D, generator=g, device="cuda").to(torch.bfloat16)
        k, v = kv[:, :, 0], kv[:, :, 1]
    else:
        k = torch.randn(B, Lmax, Hkv, D, generator=g, device="cuda").to(torch.bfloat16)
        v = torch.randn(B, Lmax, Hkv, D, generator=g, device="cuda").to(torch.bfloat16)
    lens = torch.tensor(s["lens"], dtype=torch.int32, device="cuda")
    if s["nan_tail"]:
        for b, L in enumerate(s["lens"]):
            k[b, L:] = float("nan")
            v[b, L:] = float("nan")
    base_cfg, var_cfg = configs_for(name)
    print(f"configs: base {base_cfg}\n         variant {var_cfg}", flush=True)
    assert var_cfg.load == "tma", var_cfg

    base, base_lse = decode_attn(q, k, v, cache_seqlens=lens, num_splits=s["splits"], return_lse=True)
    torch.cuda.synchronize()
    print("cp.async kernel done; launching the TMA variant", flush=True)
    t0 = time.perf_counter()
    with DA.override_config(**s["variant"]):
        o, l = decode_attn(q, k, v, cache_seqlens=lens, num_splits=s["splits"], return_lse=True)
        torch.cuda.synchronize()
        o2, l2 = decode_attn(q, k, v, cache_seqlens=lens, num_splits=s["splits"], return_lse=True)
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    ro, rl = decode_attn_reference(q, k, v, lens.clamp(0, Lmax))
    scale = ro.abs().amax().clamp_min(1e-3)
    err = ((o.float() - ro).abs().amax() / scale).item()
    diff = (o.float() - base.float()).abs().nan_to_num(float("inf")).amax().item()
    res = dict(
        bitwise=bool(torch.equal(o, base) and torch.equal(l, base_lse)),
        repeat_bitwise=bool(torch.equal(o, o2) and torch.equal(l, l2)),
        finite=bool(torch.isfinite(o).all()),
        lse_inf_pattern=bool(torch.equal(torch.isneginf(l), torch.isneginf(rl))),
        rel_err_vs_ref=err,
        max_abs_diff_vs_cpasync=diff,
        tma_seconds=round(dt, 3),
    )
    print("RESULT " + json.dumps(res), flush=True)


def verdict(res):
    if not (res["finite"] and res["lse_inf_pattern"] and res["rel_err_vs_ref"] < 2e-2):
        return "WRONG"
    if not (res["bitwise"] and res["repeat_bitwise"]):
        return "MISMATCH"
    return "PASS"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", help="(internal) run one case in this process")
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per case (launch only)")
    ap.add_argument("--max-hangs", type=int, default=2, help="skip the remaining cases after this many")
    ap.add_argument("--no-precompile", action="store_true")
    a = ap.parse_args()
    if a.case:
        child(a.case)
        return 0
    names = [n for n in a.only.split(",") if n] or list(CASES)
    for n in names:
        if n not in CASES:
            sys.exit(f"unknown case {n!r}; cases: {', '.join(CASES)}")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    if not a.no_precompile:
        t0 = time.perf_counter()
        cfgs = [c for n in names for c in configs_for(n)]
        errs = _DA().precompile(cfgs)
        print(f"precompiled {len(set(cfgs))} configs in {time.perf_counter() - t0:.1f} s", flush=True)
        for e in errs:
            print("  compile error:", e, flush=True)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    hangs, bad, rows = 0, 0, []
    for n in names:
        if hangs >= a.max_hangs:
            rows.append((n, "SKIPPED", f"after {hangs} hangs"))
            bad += 1
            print(f"{n:26s} SKIPPED", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            p = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--case", n],
                capture_output=True, text=True, timeout=a.timeout, env=env, cwd=ROOT,
            )
            out = p.stdout + p.stderr
            line = [x for x in out.splitlines() if x.startswith("RESULT ")]
            if p.returncode != 0 or not line:
                v, info = "ERROR", " | ".join(out.strip().splitlines()[-6:])
            else:
                res = json.loads(line[-1][7:])
                v, info = verdict(res), json.dumps(res)
        except subprocess.TimeoutExpired as e:
            hangs += 1
            so = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            v, info = "HANG", f"killed after {a.timeout:.0f} s; last output: {so.strip().splitlines()[-1:] }"
        bad += v != "PASS"
        rows.append((n, v, info))
        print(f"{n:26s} {v:8s} {time.perf_counter() - t0:5.1f} s  {info}", flush=True)
    print("\nsummary: " + ", ".join(f"{n}={v}" for n, v, _ in rows), flush=True)
    return bad


if __name__ == "__main__":
    sys.exit(main())
