"""Does the L2 evict-first hint on streamed operands pay, and where does the gain come from?

Cases: split-K GEMM (B read once) with and without ``CUTE_KERNELS_SPLITK_B_EVICT_FIRST``; decode with
TMA K/V loads with and without ``kv_evict_first``; cuBLAS / cuDNN beside them for scale.  Four timers,
because the hint can only help by leaving other lines in L2, so *which* lines matters:

* ``do_bench``: the issues' timer.  Its flush *writes* 256 MB, so the call starts with L2 full of
  dirty lines; without the hint the kernel evicts them (HBM absorbs the write-back during the call),
  with it the streamed lines recycle among themselves and the write-back happens after the call.
  A gain here alone would be the benchmark's flush, not the kernel.
* ``clean``: read-only flush (no dirty lines): the hint should change nothing.
* ``graph``: CUDA-graph replay of 20 back-to-back calls (warm L2, steady state).
* ``pipeline``: the realistic case.  A producer writes a 32 MB activation tensor (as the previous
  layer would), then the kernel, then a consumer reads the activations back; events around the
  three, after a read-only flush.  With the hint the activations can stay in L2 for the consumer
  and their write-back leaves the kernel's window: a gain here is a gain for users.

    python3 profiles/bench_l2hint.py [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

ACT_BYTES = 32 << 20


def timers(fn, n=30):
    from triton.testing import do_bench

    from timing import bench_clean, bench_events, bench_graph, read_only_flush

    out = {"do_bench": do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3, "clean": bench_clean(fn, n),
           "graph": bench_graph(fn)}
    act = torch.empty(ACT_BYTES // 4, device="cuda", dtype=torch.float32)
    sink = torch.empty(1, device="cuda", dtype=torch.float32)

    def seq():
        act.fill_(1.0)  # the producer: 32 MB written, dirty in L2
        fn()
        torch.sum(act, dim=0, out=sink)  # the consumer reads them back

    out["pipeline"] = bench_events(seq, read_only_flush(), n)
    return out


def gemm_cases():
    import cute_kernels
    import cute_kernels.gemm.host as G

    res, default_hint = [], G.SPLITK_B_EVICT_FIRST
    for m, n, k in ((128, 4096, 4096), (1024, 1024, 32768)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = None
        for label, hint in (("ours", False), ("ours+evict_first", True)):
            G.SPLITK_B_EVICT_FIRST = hint
            G._plans.clear()
            fn = lambda: cute_kernels.gemm(a, b, out=out)  # noqa: E731
            fn()
            torch.cuda.synchronize()
            if ref is None:
                ref = out.clone()
            assert torch.equal(out, ref), "the hint changed the result"
            res.append((f"gemm {m}x{n}x{k}", label, timers(fn)))
        G.SPLITK_B_EVICT_FIRST = default_hint
        G._plans.clear()
        res.append((f"gemm {m}x{n}x{k}", "cuBLAS", timers(lambda: torch.matmul(a, b, out=out))))
    return res


def decode_cases():
    DA = importlib.import_module("cute_kernels.attention.decode")
    from cute_kernels.attention import decode as decode_attn

    res = []
    for B, Hq, Hkv, L in ((1, 32, 8, 32768), (8, 32, 8, 8192)):
        q = torch.randn(B, 1, Hq, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, L, Hkv, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, L, Hkv, 128, device="cuda", dtype=torch.bfloat16)
        s = torch.full((B,), L, dtype=torch.int32, device="cuda")
        o = torch.empty_like(q)
        name = f"decode b{B} hq{Hq} hkv{Hkv} L{L}"
        ref = None
        for label, over in (("ours (cp.async)", {}), ("ours tma", dict(load="tma")),
                            ("ours tma+evict_first", dict(load="tma", kv_evict_first=True))):
            P = DA._plan(q, k, None, None, True)[1]
            ws = DA.decode_attn_workspace(q, P)

            def fn(over=over, ws=ws, P=P):
                with DA.override_config(**over):
                    decode_attn(q, k, v, cache_seqlens=s, num_splits=P, out=o, workspace=ws)

            fn()
            torch.cuda.synchronize()
            if ref is None:
                ref = o.clone()
            assert torch.equal(o, ref), f"{label} changed the result"
            res.append((name, label, timers(fn)))
        from bench_decode import sdpa_cudnn

        try:
            res.append((name, "cuDNN", timers(sdpa_cudnn(q, k, v))))
        except Exception as e:  # noqa: BLE001
            print(name, "cuDNN failed:", e)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    rows = gemm_cases() + decode_cases()
    lines = [f"# L2 evict-first hint, {torch.cuda.get_device_name(0)}, {time.strftime('%Y-%m-%d')}, "
             f"commit {os.environ.get('CK_COMMIT', '?')} (microseconds, medians)", "",
             "| case | impl | do_bench | clean flush | graph replay | pipeline (write 32 MB, call, read 32 MB) |",
             "|---|---|---|---|---|---|"]
    for name, label, t in rows:
        lines.append(f"| {name} | {label} | {t['do_bench']:.1f} | {t['clean']:.1f} | {t['graph']:.1f} | {t['pipeline']:.1f} |")
    md = "\n".join(lines)
    print(md)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"l2hint-{time.strftime('%Y-%m-%d')}-{os.environ.get('CK_COMMIT', 'local')}.md"),
              "w") as f:
        f.write(md + "\n")


if __name__ == "__main__":
    main()
