"""Host time per call of the public ops on two source trees, interleaved finely (issue 31's judge).

Why: ``gpu_session.sh host-ab`` runs ``bench_host.py`` whole on one tree, then on the other, ~30 s
each; the H200 host changes speed in phases of seconds to minutes (bare launches 4.4-5.4 or 6.5-8.4
us), so its paired differences swung by +-1.5 us.  Here each tree lives in its own worker process
(the two packages share import names), both pinned to one core, and the driver hands out short turns:
every round each worker times every row once (``--calls`` back-to-back calls), the workers' order
flipped round by round.  A row's figure is the median over rounds of the per-round difference
after - before, with its interquartile range; the issue's bar is +0.3 us.

Rows call only the public API both trees share (``gemm``, ``decode_attn``, ``flash_attn``) on tiny
problems (the GPU work a few microseconds), outputs allocated or given (``out=``), and two rows that
alternate two calls (a model's GEMMs, decode with and without ``out=``), a decode over a cache one key
longer every call (a DynamicCache's steps: metadata never seen before), and (GPU only) a Llama layer's
seven ``patch_linear``ed linears at one token under no_grad.  The device is synchronized
after each row's calls, outside the timed span.  ``--stub``: no GPU; the kernels are replaced by a
no-op and the tensors live on the CPU (the host path's Python alone, as on a machine without a GPU).

    python3 profiles/host_ab.py --before .ab_before --after . [--rounds 40] [--calls 200] [--cpu 3] \
        [--stub] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

BAR_US = 0.3  # issue 31: every row within +0.3 us of the tree before


# ------------------------------------------------------------------------------------------- worker
def _stub_kernels(torch) -> None:
    """Every compiled kernel a no-op, CPU tensors accepted (names as both trees have them)."""
    from cute_kernels.attention import decode as DE, forward as FW
    from cute_kernels.gemm import launch as GL, plan as GP

    def stub(*a):
        return None

    check = GP.check_operands
    GP.check_operands = lambda a, b, out, c, od, allow_cpu=False: check(a, b, out, c, od, True)
    GL.compiled = lambda *key, **kw: stub
    DE._KERNEL_DEVICES = ("cuda", "cpu")
    DE.get_decode_kernel = lambda cfg: stub
    FW.get_forward_kernel = lambda cfg: stub
    try:
        from cute_kernels.attention import forward_validate as FV
        FV._check_devices = lambda named: None
    except ImportError:  # a tree before the validation module
        pass


def worker_rows(torch, cute_kernels, device: str) -> dict:
    """name -> zero-argument call (see the module doc)."""
    bf = torch.bfloat16
    gemm, decode_attn, flash_attn = cute_kernels.gemm, cute_kernels.decode_attn, cute_kernels.flash_attn
    rows = {}
    ops = [(torch.randn(m, k, dtype=bf, device=device), torch.randn(k, n, dtype=bf, device=device),
            torch.empty(m, n, dtype=bf, device=device)) for m, n, k in ((64, 64, 64), (256, 256, 128))]
    for (a, b, d), m in zip(ops, (64, 256)):
        rows[f"gemm {m} out="] = lambda a=a, b=b, d=d: gemm(a, b, out=d)
        rows[f"gemm {m} alloc"] = lambda a=a, b=b: gemm(a, b)
    B, Hq, Hkv, D, L = 1, 8, 2, 128, 256
    q = torch.randn(B, 1, Hq, D, dtype=bf, device=device)
    k, v = (torch.randn(B, L, Hkv, D, dtype=bf, device=device) for _ in range(2))
    lens, o = torch.full((B,), L, dtype=torch.int32, device=device), torch.empty_like(q)
    for sp in (None, 4):
        rows[f"decode {sp or 'auto'} out="] = lambda sp=sp: decode_attn(q, k, v, cache_seqlens=lens, num_splits=sp, out=o)
        rows[f"decode {sp or 'auto'} alloc"] = lambda sp=sp: decode_attn(q, k, v, cache_seqlens=lens, num_splits=sp)
    fq, fk, fv = (torch.randn(1, 128, 8, 128, dtype=bf, device=device) for _ in range(3))
    fo = torch.empty_like(fq)
    rows["flash out="] = lambda: flash_attn(fq, fk, fv, out=fo)
    rows["flash alloc"] = lambda: flash_attn(fq, fk, fv)
    (a1, b1, d1), (a2, b2, d2) = ops
    rows["gemm 64 / 256 alternating (2 calls)"] = lambda: (gemm(a1, b1, out=d1), gemm(a2, b2, out=d2))
    rows["decode out= / alloc alternating (2 calls)"] = lambda: (decode_attn(q, k, v, cache_seqlens=lens, out=o),
                                                               decode_attn(q, k, v, cache_seqlens=lens))
    # a DynamicCache's steps: every call one key longer (a view of a larger (B, H, L, D) buffer, transposed as
    # Transformers' layers pass it), never a length seen before: each call meets new metadata
    grow_cap = 1 << 15
    kb, vb = (torch.randn(B, Hkv, grow_cap, D, dtype=bf, device=device) for _ in range(2))
    grow = [L]

    def growing():
        n = grow[0] = grow[0] + 1 if grow[0] + 1 < grow_cap else L  # (wraps after 32k calls)
        decode_attn(q, kb[:, :, :n].transpose(1, 2), vb[:, :, :n].transpose(1, 2), cache_seqlens=lens)
    rows["decode growing cache (one key longer each call)"] = growing
    if device == "cuda":  # (stubbed, a CPU linear is F.linear's real matmul: not a host-path row)
        from cute_kernels.integrations import hf

        # a Llama layer's seven linears, patched, weights requiring grad (Transformers' default), one
        # decode token under no_grad: the eager step's per-linear host cost (kernels of a few us)
        lins = [torch.nn.Linear(256, n, bias=False).to(device=device, dtype=bf) for n in (256, 64, 64, 256, 512, 512, 256)]
        assert sum(hf.patch_linear(lin) for lin in lins) == len(lins)
        xl = torch.randn(1, 1, 256, dtype=bf, device=device)

        def linears():
            with torch.no_grad():
                for lin in lins:
                    lin(xl)
        rows["7 patched linears, M 1, no_grad (7 calls)"] = linears
    return rows


def worker(tree: str, stub: bool) -> None:
    """Serve ``round N`` lines on stdin: one JSON line {row: us per call} each."""
    tree = os.path.abspath(tree)
    sys.path.insert(0, tree)
    import torch

    import cute_kernels

    if not cute_kernels.__file__.startswith(tree):
        raise SystemExit(f"worker: imported {cute_kernels.__file__}, not the tree {tree}")
    if stub:
        _stub_kernels(torch)
    device = "cpu" if stub else "cuda"
    sync = (lambda: None) if stub else torch.cuda.synchronize
    rows = worker_rows(torch, cute_kernels, device)
    for f in rows.values():  # compile / load, fill every cache
        for _ in range(5):
            f()
    sync()
    print(json.dumps({"ready": cute_kernels.__file__}), flush=True)
    clock = time.perf_counter
    for line in sys.stdin:
        n = int(line.split()[1])
        res = {}
        for name, f in rows.items():
            t0 = clock()
            for _ in range(n):
                f()
            res[name] = (clock() - t0) / n * 1e6
            sync()
        print(json.dumps(res), flush=True)


# ------------------------------------------------------------------------------------------- driver
def start(tree: str, stub: bool, cpu: str | None):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", tree] + (["--stub"] if stub else [])
    if cpu is not None:
        cmd = ["taskset", "-c", cpu] + cmd
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line:
        raise SystemExit(f"the worker for {tree} exited before it was ready")
    return p, json.loads(line)["ready"]


def quartiles(xs):
    q1, med, q3 = statistics.quantiles(xs, n=4) if len(xs) > 1 else (xs[0],) * 3
    return q1, med, q3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=".ab_before")
    ap.add_argument("--after", default=".")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--cpu", default=None, help="pin both workers to this core (taskset)")
    ap.add_argument("--stub", action="store_true", help="no GPU: kernels stubbed, CPU tensors")
    ap.add_argument("--out", default="")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.stub)
        return 0
    sides = {"before": args.before, "after": args.after}
    procs = {}
    for side, tree in sides.items():
        procs[side], where = start(tree, args.stub, args.cpu)
        print(f"{side}: {where}", flush=True)
    times = {side: {} for side in sides}
    for r in range(args.rounds):
        for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
            p = procs[side]
            p.stdin.write(f"round {args.calls}\n")
            p.stdin.flush()
            for name, us in json.loads(p.stdout.readline()).items():
                times[side].setdefault(name, []).append(us)
    for p in procs.values():
        p.stdin.close()
        p.wait()
    rows = []
    print(f"| row | before us | after us | after - before, median of {args.rounds} paired rounds [IQR] | "
          f"within +{BAR_US} |")
    print("|---|---:|---:|---:|---|")
    for name, before in times["before"].items():
        after = times["after"].get(name)
        if after is None:
            continue
        q1, med, q3 = quartiles([a - b for a, b in zip(after, before)])
        ok = med <= BAR_US
        rows.append(dict(row=name, before_us=statistics.median(before), after_us=statistics.median(after),
                         diff_us=[q1, med, q3], ok=ok))
        print(f"| {name} | {statistics.median(before):.2f} | {statistics.median(after):.2f} | "
              f"{med:+.2f} [{q1:+.2f}, {q3:+.2f}] | {'yes' if ok else '**no**'} |", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        commit = os.environ.get("CK_COMMIT", "")
        path = os.path.join(args.out, f"host-ab-{datetime.date.today().isoformat()}-{commit or 'tree'}.json")
        with open(path, "w") as f:
            json.dump(dict(before=args.before, after=args.after, rounds=args.rounds, calls=args.calls,
                           stub=args.stub, cpu=args.cpu, rows=rows), f, separators=(",", ":"))
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
