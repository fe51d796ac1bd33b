"""Host time of the Transformers attention interface per decode call, on the CPU, kernels stubbed.

Why: an eager HF decode step calls the attention interface once per layer; its Python cost is part of
the step (issue 34's eager target).  This times ``integrations.hf.attention_forward`` on a decode step's
tensors (B 8, Hq 32 / Hkv 8, D 128, a 4096-key cache, ``cache_position`` and ``position_ids`` as HF
passes them) with ``decode_attn`` replaced by a stub returning a preallocated output, against
Transformers' own ``sdpa_attention_forward`` with ``F.scaled_dot_product_attention`` stubbed the same
way: thread CPU time, best of 5 x N calls, same process.  No GPU needed (the route is told the CPU
tensors are Hopper's).  ``--profile`` adds a cProfile of ours.  The layer object has a Llama layer's
``num_key_value_groups`` (4), so Transformers' wrapper takes its GQA branch (``use_gqa_in_sdpa``:
``enable_gqa``) as in a real GQA model; ``--layer plain`` drops it (session 25's figures: the wrapper
skips that branch).

Scenarios (the same calls for both functions):

- ``same``: one call repeated (a static cache's buffers, one kind of layer, one step);
- ``alternate``: a full layer (4096 keys, ``sliding_window=None``) and a sliding one (a 1024-key
  window buffer, ``sliding_window=1024``) in turn, as Gemma-2/3 and gpt-oss interleave them;
- ``steps``: 32 layers a step, each step's keys one longer and new tensors (a ``DynamicCache``:
  ``torch.cat`` per layer) with a new ``cache_position``: the first call of each step meets new
  metadata.

    python3 profiles/hf_host.py [--calls 20000] [--profile] [--only same|alternate|steps] [--layer gqa|plain]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def per_call_us(fn, calls: list, n: int) -> float:
    """Best of 5 rounds of ``n`` calls (``calls`` cycled: each a (q, k, v, kwargs) tuple), us per call."""
    rounds = max(1, n // len(calls))
    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time()
        for _ in range(rounds):
            for q, k, v, kw in calls:
                fn(q, k, v, kw)
        best = min(best, (time.thread_time() - t0) / (rounds * len(calls)) * 1e6)
    return best


def scenarios(torch, B=8, Hq=32, Hkv=8, D=128, L=4096, W=1024, layers=32, steps=64):
    """name -> list of (q, k, v, kwargs) calls (see the module doc)."""
    def call(kv_len, pos, window=(), buf=None):
        q = torch.randn(B, Hq, 1, D, dtype=torch.bfloat16)
        if buf is None:
            k, v = (torch.randn(B, Hkv, kv_len, D, dtype=torch.bfloat16) for _ in range(2))
        else:
            k, v = (b[:, :, :kv_len] for b in buf)
        cp = torch.tensor([pos])
        kw = dict(cache_position=cp, position_ids=cp[None].expand(B, 1))
        if window != ():
            kw["sliding_window"] = window
        return q, k, v, kw

    same = [call(L, L - 96)]
    alternate = [call(L, L - 96, None), call(W, L - 96, W)]
    alternate[1][3]["cache_position"] = alternate[0][3]["cache_position"]  # one step: one cache_position
    buf = [torch.randn(B, Hkv, L + steps, D, dtype=torch.bfloat16) for _ in range(2)]
    grown = []
    for s in range(steps):
        q, k, v, kw = call(L + s, L + s - 1, buf=buf)
        for _ in range(layers):
            grown.append((q, k[:, :], v[:, :], kw))  # (new key / value tensors per layer, as torch.cat's)
    return {"same": same, "alternate": alternate, "steps": grown}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--only", choices=["same", "alternate", "steps"])
    p.add_argument("--layer", choices=["gqa", "plain"], default="gqa")
    a = p.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    import cute_kernels.attention.decode as dec
    from cute_kernels.integrations import hf
    from cute_kernels.integrations import sdpa as S

    S._is_hopper = lambda dev: True  # the route as on the H200, for CPU tensors
    S._KERNEL_DEVICES = ("cuda", "meta", "cpu")
    B, Hq, Hkv, D = 8, 32, 8, 128
    out = torch.empty(B, 1, Hq, D, dtype=torch.bfloat16)
    dec.decode_attn = lambda *args, **kw: out
    F.scaled_dot_product_attention = lambda *args, **kw: out.transpose(1, 2)
    layer = types.SimpleNamespace(is_causal=True, training=False, config=types.SimpleNamespace())
    if a.layer == "gqa":
        layer.num_key_value_groups = Hq // Hkv
    ours = lambda q, k, v, kw: hf.attention_forward(layer, q, k, v, None, scaling=D ** -0.5, **kw)  # noqa: E731
    theirs = lambda q, k, v, kw: sdpa_attention_forward(layer, q, k, v, None, scaling=D ** -0.5, **kw)  # noqa: E731
    with torch.no_grad():
        for name, calls in scenarios(torch, B, Hq, Hkv, D).items():
            if a.only not in (None, name):
                continue
            for q, k, v, kw in calls[:2]:
                ours(q, k, v, kw), theirs(q, k, v, kw)
            hf.reset_stats()
            o = per_call_us(ours, calls, a.calls)
            assert hf.hf_stats["fallback"] == 0 and hf.hf_stats["decode_attn"] > 0, hf.hf_stats
            t = per_call_us(theirs, calls, a.calls)
            print(f"{name:9s}  cute_kernels hf.attention_forward (decode_attn stubbed): {o:6.2f} us/call   "
                  f"transformers sdpa_attention_forward (sdpa stubbed): {t:6.2f} us/call")
            if a.profile:
                import cProfile
                import pstats

                prof = cProfile.Profile()
                prof.runcall(lambda: [ours(*c) for _ in range(max(1, a.calls // len(calls))) for c in calls])
                pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
