"""Issue 34's variant speeds: each attention variant against the plain kernel at the same shape and the
same visible work, under the paired timer, in one process.

- forward (``flash_attn``, bf16, the forward bench's shapes): softcap 30 and a learnable sink against
  the plain call;
- decode (``decode_attn``, bf16, one new token, hq32 hkv8 D 128, 512 MiB of K/V): softcap 30 and a sink
  against the plain call on the same cache; a window of W keys over a 2W-key cache against the plain call
  on a W-key cache (equal visible keys, the window skipping the first half's tiles).

Target: every variant within 5% of its plain call (plain time / variant time >= 0.95).  Paired timer
(``timing.paired_times``): each repetition calls every side once, rotated, each after its own L2 flush;
a ratio is the median of the per-repetition ratios.  Before timing, each variant's output is compared
with a float32 reference of the same variant on one (batch, head) slice (forward) or the whole batch
(decode, ``decode_attn_reference``).

    python3 profiles/bench_variants.py [--reps 30] [--only SUBSTR] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

TARGET = 0.95
SOFTCAP = 30.0
#: decode: (B, L) for 512 MiB of bf16 K/V at hkv 8, D 128 (B * L * 8 * 128 * 2 * 2 bytes)
DECODE_HQ, DECODE_HKV, DECODE_D = 32, 8, 128
DECODE_POINTS = [(1, 131072), (8, 16384), (32, 4096)]


def _sink(h: int, device):
    import torch

    return torch.randn(h, generator=torch.Generator().manual_seed(h), device="cpu").to(device) + 2.0


def _forward_reference(q, k, v, causal, softcap=0.0, sink=None):
    """float32 attention of batch 0, query head 0 (its KV head 0): (Sq, D)."""
    import torch

    qs, ks, vs = q[0, :, 0].float(), k[0, :, 0].float(), v[0, :, 0].float()
    s = qs @ ks.t() / math.sqrt(q.shape[-1])
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if causal:
        Sq, Sk = s.shape
        keep = torch.arange(Sk, device=s.device)[None, :] <= torch.arange(Sq, device=s.device)[:, None] + Sk - Sq
        s = s.masked_fill(~keep, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink[0].float().expand(s.shape[0], 1)], dim=1)
        return torch.softmax(s, dim=1)[:, :-1] @ vs
    return torch.softmax(s, dim=1) @ vs


def _rel_err(got, want) -> float:
    return float((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-30))


def forward_rows(shapes, reps):
    import torch

    import cute_kernels
    from cute_kernels.tools.bench.timing import paired_ratio, paired_times

    rows = []
    for name, B, Hq, Hkv, S, D, causal in shapes:
        torch.manual_seed(0)
        q = torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        sink = _sink(Hq, "cuda")
        kws = {"plain": {}, "softcap": dict(softcap=SOFTCAP), "sink": dict(learnable_sink=sink)}
        calls = {n: (lambda kw=kw: cute_kernels.flash_attn(q, k, v, causal=causal, **kw)) for n, kw in kws.items()}
        checks = {n: _rel_err(fn()[0, :, 0], _forward_reference(q, k, v, causal, kws[n].get("softcap", 0.0),
                                                                  kws[n].get("learnable_sink")))
                  for n, fn in calls.items()}
        times = paired_times(calls, reps)
        row = {"kind": "forward", "shape": name, "check": checks,
               "median_us": {n: statistics.median(t) for n, t in times.items()},
               "plain_over_variant": {n: round(paired_ratio(times, "plain", n), 4) for n in ("softcap", "sink")}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def decode_rows(reps):
    import torch

    from cute_kernels.attention.decode import decode_attn, decode_attn_reference
    from cute_kernels.tools.bench.timing import paired_ratio, paired_times

    rows = []
    for B, L in DECODE_POINTS:
        torch.manual_seed(0)
        q = torch.randn(B, 1, DECODE_HQ, DECODE_D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, L, DECODE_HKV, DECODE_D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
        half = torch.full((B,), L // 2, dtype=torch.int32, device="cuda")
        sink = _sink(DECODE_HQ, "cuda")
        kws = {"plain": ({}, lens), "softcap": (dict(softcap=SOFTCAP), lens), "sink": (dict(learnable_sink=sink), lens),
               # equal visible keys: the plain call on the first L/2 keys, the window's L/2 - 1 left keys + the
               # new one over the whole cache
               "plain_half": ({}, half), "window_half": (dict(window_size=(L // 2 - 1, 0)), lens)}
        calls = {n: (lambda kw=kw, s=s: decode_attn(q, k, v, cache_seqlens=s, **kw)) for n, (kw, s) in kws.items()}
        checks = {}
        for n, (kw, s) in kws.items():
            want, _ = decode_attn_reference(q[:1], k[:1], v[:1], s[:1], **kw)
            checks[n] = _rel_err(calls[n]()[:1], want)
        times = paired_times(calls, reps)
        row = {"kind": "decode", "shape": f"b{B}_hq{DECODE_HQ}_hkv{DECODE_HKV}_L{L}_d{DECODE_D}", "check": checks,
               "median_us": {n: statistics.median(t) for n, t in times.items()},
               "plain_over_variant": {"softcap": round(paired_ratio(times, "plain", "softcap"), 4),
                                      "sink": round(paired_ratio(times, "plain", "sink"), 4),
                                      "window": round(paired_ratio(times, "plain_half", "window_half"), 4)}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--only", default="", help="substring of the shape names (forward) / 'decode'")
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_variants: needs a CUDA GPU", file=sys.stderr)
        return 2
    from cute_kernels.tools.bench.attention_shapes import select

    rows = forward_rows([s for s in select() if s[5] in (64, 96, 128, 256) and a.only in s[0]], a.reps)
    if not a.only or a.only in "decode":
        rows += decode_rows(a.reps)
    worst = min(r for row in rows for r in row["plain_over_variant"].values())
    print(f"worst plain / variant: {worst:.3f} (target >= {TARGET})")
    if a.out:
        with open(os.path.join(a.out, "bench-variants.json"), "w") as f:
            json.dump({"commit": os.environ.get("CK_COMMIT", "?"), "target": TARGET, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
