"""Two source trees of the package benchmarked in one device call, shapes interleaved.

Why: a restructure (or any change that should not move speed) is judged by the same shapes run on the
commit before it and on the head, under the same timer, at the same moment of the machine's drift.
Each tree runs in its own long-lived worker process (the two packages have the same import names), and
the driver alternates between them shape by shape, the order flipped every round.  Every worker also
times the peer (cuBLAS for GEMM, cuDNN SDPA for decode) in its own process, so each tree has a same-run
ratio to the peer as well as its raw time.

    git archive 4c6c103 cute_kernels layouts | (mkdir -p .ab_before && tar -x -C .ab_before)
    python3 profiles/ab_commits.py --before .ab_before --after . --out $OUT

Only the public API is called (``cute_kernels.gemm``, ``cute_kernels.decode_attn``, ``cute_kernels.flash_attn``,
``cute_kernels.flash_attn_backward``), which both trees share.  ``--what attention,attention_bwd``: the
attention bench's eight shapes (and, forward, issue 36's two), peer cuDNN SDPA (its backward through
autograd of one forward); ``err`` there is ours against cuDNN's (bf16 both).  Timer:
``triton.testing.do_bench`` median (cold L2).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys

GEMM_SHAPES = [  # the GEMM issue's nine shapes (profiles/bench_gemm.py)
    (4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096), (4096, 14336, 4096),
    (128, 4096, 4096), (1024, 1024, 32768), (4097, 4096, 4096), (1000, 3000, 520), (4096, 4096, 4100),
]
GEMM_DECODE_SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096), (64, 4096, 11008)]
DECODE_SHAPES = [  # (B, Hq, Hkv, L, page size or 0): profiles/bench_decode.py's shapes
    (1, 32, 8, 32768, 0), (1, 32, 32, 131072, 0), (8, 32, 8, 8192, 0), (32, 32, 8, 4096, 0),
    (4, 64, 8, 65536, 0), (64, 32, 8, 2048, 16),
]
HEAD_DIM = 128
ATTN_SHAPES = [  # (B, Hq, Hkv, S, D, causal): cute_kernels.tools.bench.attention_shapes.SHAPES
    (4, 32, 32, 4096, 128, False), (4, 32, 32, 4096, 128, True), (8, 32, 32, 2048, 64, False),
    (1, 32, 32, 16384, 128, True), (2, 32, 8, 8192, 128, True), (16, 16, 16, 1024, 128, True),
    (4, 16, 16, 4096, 256, False), (4, 32, 32, 4096, 96, True),
]
ATTN_EXTRA = [(32, 32, 8, 512, 128, True), (3, 24, 8, 5000, 96, False)]  # issue 36's two forward rows


# ------------------------------------------------------------------------------------------- worker
def _worker(tree: str) -> None:
    sys.path.insert(0, os.path.abspath(tree))
    import torch
    from triton.testing import do_bench

    import cute_kernels

    out = sys.stdout
    sys.stdout = sys.stderr  # compile logs and prints must not mix with the replies
    out.write(json.dumps({"ready": cute_kernels.__file__}) + "\n")
    out.flush()

    def bench(fn) -> float:
        return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3  # microseconds

    def serve(cmd) -> dict:
        """One measurement; its tensors die with the call."""
        if cmd["op"] == "gemm":
            m, n, k = cmd["shape"]
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
            ref = (a.double() @ b.double()).float()
            got = cute_kernels.gemm(a, b).float()
            err = ((got - ref).abs() / (ref.abs() + 1.0)).max().item()
            rep = dict(ours_us=bench(lambda: cute_kernels.gemm(a, b)), peer_us=bench(lambda: a @ b), err=err)
        elif cmd["op"] in ("attention", "attention_bwd"):
            rep = _serve_attention(cmd["op"], cmd["shape"], bench)
        else:
            bsz, hq, hkv, L, page = cmd["shape"]
            dt = torch.bfloat16
            q = torch.randn(bsz, 1, hq, HEAD_DIM, device="cuda", dtype=dt)
            k = torch.randn(bsz, L, hkv, HEAD_DIM, device="cuda", dtype=dt)
            v = torch.randn(bsz, L, hkv, HEAD_DIM, device="cuda", dtype=dt)
            lens = torch.full((bsz,), L, dtype=torch.int32, device="cuda")
            kw = dict(cache_seqlens=lens)
            kc, vc = k, v
            if page:  # the same K/V in shuffled pages
                npg = bsz * L // page
                perm = torch.randperm(npg, device="cuda")
                kc = torch.empty(npg, page, hkv, HEAD_DIM, device="cuda", dtype=dt)
                vc = torch.empty_like(kc)
                kc[perm] = k.reshape(npg, page, hkv, HEAD_DIM)
                vc[perm] = v.reshape(npg, page, hkv, HEAD_DIM)
                kw["block_table"] = perm.view(bsz, L // page).to(torch.int32)
            o = cute_kernels.decode_attn(q, kc, vc, **kw).float()
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            from torch.nn.attention import SDPBackend, sdpa_kernel
            from torch.nn.functional import scaled_dot_product_attention as sdpa

            ref = sdpa(qt.float(), kt.float(), vt.float(), enable_gqa=True).transpose(1, 2)
            err = (o - ref).abs().max().item()

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return sdpa(qt, kt, vt, enable_gqa=True)

            try:
                cudnn()
                peer = bench(cudnn)
            except Exception:  # cuDNN missing: the ratio column stays empty
                peer = float("nan")
            rep = dict(ours_us=bench(lambda: cute_kernels.decode_attn(q, kc, vc, **kw)), peer_us=peer, err=err,
                       kv_bytes=2 * bsz * L * hkv * HEAD_DIM * 2)
        return rep

    for line in sys.stdin:
        cmd = json.loads(line)
        torch.manual_seed(0)
        try:
            rep = serve(cmd)
        except Exception as e:  # report, keep serving
            rep = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
        torch.cuda.empty_cache()
        out.write(json.dumps(rep) + "\n")
        out.flush()


def _serve_attention(op: str, shape, bench) -> dict:
    """Forward (``attention``) or backward (``attention_bwd``) of one shape: ours and cuDNN SDPA's times,
    and ours against cuDNN's result (max |diff| over max |cuDNN|, gradients: the worst of the three)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    import cute_kernels

    bsz, hq, hkv, s, d, causal = shape
    dt = torch.bfloat16
    q = torch.randn(bsz, s, hq, d, device="cuda", dtype=dt)
    k = torch.randn(bsz, s, hkv, d, device="cuda", dtype=dt)
    v = torch.randn(bsz, s, hkv, d, device="cuda", dtype=dt)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    g = hq // hkv
    if g > 1:  # the peer on K / V heads expanded (cuDNN's SDPA may not take enable_gqa): the same for both trees
        kt, vt = kt.repeat_interleave(g, 1), vt.repeat_interleave(g, 1)

    def rel(a, b):
        return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()

    if op == "attention":
        def peer():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return sdpa(qt, kt, vt, is_causal=causal)
        err = rel(cute_kernels.flash_attn(q, k, v, causal=causal), peer().transpose(1, 2))
        return dict(ours_us=bench(lambda: cute_kernels.flash_attn(q, k, v, causal=causal)), peer_us=bench(peer),
                    err=err)
    out, lse = cute_kernels.flash_attn(q, k, v, causal=causal, return_lse=True)
    dout = torch.randn_like(q)
    grads = cute_kernels.flash_attn_backward(dout, q, k, v, out, lse, causal=causal)
    leaves = [x.detach().clone().requires_grad_() for x in (qt, kt, vt)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o_peer = sdpa(*leaves, is_causal=causal)
    dout_t = dout.transpose(1, 2)
    ref = list(torch.autograd.grad(o_peer, leaves, dout_t, retain_graph=True))
    ref[1:] = [r.unflatten(1, (hkv, g)).sum(2) for r in ref[1:]]  # the expanded heads' dK / dV summed per group
    err = max(rel(a, r.transpose(1, 2)) for a, r in zip(grads, ref))
    return dict(ours_us=bench(lambda: cute_kernels.flash_attn_backward(dout, q, k, v, out, lse, causal=causal)),
                peer_us=bench(lambda: torch.autograd.grad(o_peer, leaves, dout_t, retain_graph=True)), err=err)


# ------------------------------------------------------------------------------------------- driver
class Worker:
    def __init__(self, tree: str):
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", tree],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.info = json.loads(self.p.stdout.readline())

    def ask(self, op: str, shape) -> dict:
        self.p.stdin.write(json.dumps(dict(op=op, shape=shape)) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


def _geomean(xs):
    xs = [x for x in xs if x and math.isfinite(x) and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--before", default=".ab_before", help="tree of the earlier commit (cute_kernels/ + layouts/)")
    ap.add_argument("--after", default=".", help="tree of the later commit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--what", default="gemm,gemm_decode,decode")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--tag", default="ab-commits")
    ap.add_argument("--head", default=None, help="commit of the after tree, for the file name (default: git HEAD; "
                    "the device's copy of the tree may carry a stale .git)")
    args = ap.parse_args()
    if args.worker:
        return _worker(args.worker)
    trees = {"before": args.before, "after": args.after}
    workers = {name: Worker(t) for name, t in trees.items()}
    for name, w in workers.items():
        print(f"{name}: {w.info['ready']}", flush=True)
    jobs = [(op, s) for op, shapes in (("gemm", GEMM_SHAPES), ("gemm_decode", GEMM_DECODE_SHAPES),
                                       ("decode", DECODE_SHAPES), ("attention", ATTN_SHAPES + ATTN_EXTRA),
                                       ("attention_bwd", ATTN_SHAPES)) if op in args.what.split(",") for s in shapes]
    res: dict = {}
    for r in range(args.rounds):
        for op, shape in jobs:
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for name in order:
                rep = workers[name].ask("gemm" if op.startswith("gemm") else op, shape)
                res.setdefault((op, tuple(shape)), {}).setdefault(name, []).append(rep)
                if "error" in rep:
                    print(f"  round {r} {op} {shape} {name}: {rep['error']}", flush=True)
            b, a = (res[(op, tuple(shape))][n][-1] for n in ("before", "after"))
            if "error" not in a and "error" not in b:
                print(f"  round {r} {op} {shape}: before {b['ours_us']:.1f} us (peer {b['peer_us']:.1f}), "
                      f"after {a['ours_us']:.1f} us (peer {a['peer_us']:.1f}), err {b['err']:.1e} / {a['err']:.1e}",
                      flush=True)
    for w in workers.values():
        w.close()

    rows = []
    for (op, shape), per in res.items():
        row = dict(op=op, shape=shape)
        for name, reps in per.items():
            ok = [x for x in reps if "error" not in x]
            if not ok:
                row[name] = dict(error=reps[0]["error"])
                continue
            us = statistics.median(x["ours_us"] for x in ok)
            peer = statistics.median(x["peer_us"] for x in ok)
            row[name] = dict(us=us, peer_us=peer, vs_peer=peer / us if peer == peer else float("nan"),
                             max_err=max(x["err"] for x in ok))
        if "us" in row.get("before", {}) and "us" in row.get("after", {}):
            row["after_vs_before"] = row["before"]["us"] / row["after"]["us"]
            row["ratio_change"] = row["after"]["vs_peer"] / row["before"]["vs_peer"]
        rows.append(row)

    import torch

    sha = args.head or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                      cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    date = datetime.date.today().isoformat()
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    peer = {"gemm": "cuBLAS", "gemm_decode": "cuBLAS", "decode": "cuDNN", "attention": "cuDNN", "attention_bwd": "cuDNN"}
    lines = [f"# Before / after, {date}, {dev}, head {sha}", "",
             f"before = `{args.before}`, after = `{args.after}`; do_bench median of {args.rounds} interleaved rounds, "
             "each tree in its own process timing its peer too. speed = before us / after us; "
             "ratio change = (after's peer ratio) / (before's peer ratio).", ""]
    for op in peer:
        sel = [r for r in rows if r["op"] == op]
        if not sel:
            continue
        lines += [f"## {op} (peer: {peer[op]})", "",
                  f"| shape | before us | after us | before x{peer[op]} | after x{peer[op]} | speed | ratio change |",
                  "|---|---|---|---|---|---|---|"]
        for r in sel:
            b, a = r.get("before", {}), r.get("after", {})
            if "us" not in b or "us" not in a:
                lines.append(f"| {r['shape']} | {b.get('error', '')} | {a.get('error', '')} | | | | |")
                continue
            lines.append(f"| {'x'.join(map(str, r['shape']))} | {b['us']:.1f} | {a['us']:.1f} | {b['vs_peer']:.3f} | "
                         f"{a['vs_peer']:.3f} | {r['after_vs_before']:.3f} | {r['ratio_change']:.3f} |")
        gb = _geomean([r["before"].get("vs_peer") for r in sel if "us" in r.get("before", {})])
        ga = _geomean([r["after"].get("vs_peer") for r in sel if "us" in r.get("after", {})])
        lines += ["", f"geomean x{peer[op]}: before {gb:.3f}, after {ga:.3f} (change {ga / gb:.3f})", ""]
    text = "\n".join(lines)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"{args.tag}-{date}-{sha}")
    with open(base + ".md", "w") as f:
        f.write(text + "\n")
    with open(base + ".json", "w") as f:
        json.dump(dict(date=date, device=dev, head=sha, before=args.before, after=args.after, rows=rows), f, indent=1,
                  default=str)


if __name__ == "__main__":
    main()
