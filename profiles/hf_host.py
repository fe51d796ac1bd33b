"""Host time of the Transformers attention interface per decode call, on the CPU, kernels stubbed.

Why: an eager HF decode step calls the attention interface once per layer; its Python cost is part of
the step (issue 34's eager target).  This times ``integrations.hf.attention_forward`` on a decode step's
tensors (B 8, Hq 32 / Hkv 8, D 128, a 4096-key cache, ``cache_position`` and ``position_ids`` as HF
passes them) with ``decode_attn`` replaced by a stub returning a preallocated output, against
Transformers' own ``sdpa_attention_forward`` with ``F.scaled_dot_product_attention`` stubbed the same
way: thread CPU time, best of 5 x N calls, same process.  No GPU needed (the route is told the CPU
tensors are Hopper's).  ``--profile`` adds a cProfile of ours.

    python3 profiles/hf_host.py [--calls 20000] [--profile]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def per_call_us(fn, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time() - t0) / n * 1e6)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    import cute_kernels.attention.decode as dec
    from cute_kernels.integrations import hf
    from cute_kernels.integrations import sdpa as S

    S._is_hopper = lambda dev: True  # the route as on the H200, for CPU tensors
    S._KERNEL_DEVICES = ("cuda", "meta", "cpu")
    B, Hq, Hkv, D, L = 8, 32, 8, 128, 4096
    q = torch.randn(B, Hq, 1, D, dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, L, D, dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty(B, 1, Hq, D, dtype=torch.bfloat16)
    dec.decode_attn = lambda *args, **kw: out
    F.scaled_dot_product_attention = lambda *args, **kw: out.transpose(1, 2)
    layer = types.SimpleNamespace(is_causal=True, training=False, config=types.SimpleNamespace())
    cp = torch.tensor([4000])
    kw = dict(cache_position=cp, position_ids=cp[None].expand(B, 1))
    ours = lambda: hf.attention_forward(layer, q, k, v, None, scaling=D ** -0.5, **kw)  # noqa: E731
    theirs = lambda: sdpa_attention_forward(layer, q, k, v, None, scaling=D ** -0.5, **kw)  # noqa: E731
    with torch.no_grad():
        ours(), theirs()
        print(f"cute_kernels hf.attention_forward (decode_attn stubbed): {per_call_us(ours, a.calls):.2f} us/call")
        print(f"transformers sdpa_attention_forward (sdpa stubbed):      {per_call_us(theirs, a.calls):.2f} us/call")
        if a.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.runcall(lambda: [ours() for _ in range(a.calls)])
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
