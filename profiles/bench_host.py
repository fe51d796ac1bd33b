"""Compile-cache and host-overhead measurements (issue #2).

1. Cold vs warm disk cache: two fresh processes share one empty CUTE_KERNELS_CACHE_DIR; each times its
   first ``cute_kernels.gemm`` call.  The second must load the object file instead of compiling.
2. Host time per call on a tiny problem through the public function, next to ``torch.matmul``
   (median of many back-to-back calls, wall clock, GPU work negligible).

    python3 profiles/bench_host.py            # prints a table, writes profiles/results/host-*.json
"""

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = r"""
import time, torch
t0 = time.perf_counter()
import cute_kernels
from cute_kernels.common import jit
t_import = time.perf_counter() - t0
a = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
b = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t0 = time.perf_counter(); cute_kernels.gemm(a, b); torch.cuda.synchronize(); t_first = time.perf_counter() - t0
print("RESULT", t_import, t_first, jit.stats["compiles"], jit.stats["disk_hits"])
"""


def first_call(cache_dir):
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=cache_dir, PYTHONPATH=os.path.join(HERE, ".."))
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT")][0].split()
    return dict(import_s=float(line[1]), first_call_s=float(line[2]), compiles=int(line[3]), disk_hits=int(line[4]))


def host_overhead():
    import statistics

    import torch

    import cute_kernels

    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
    res = {}
    for name, fn in {"torch.matmul": lambda: torch.matmul(a, b),
                     "cute_kernels.gemm": lambda: cute_kernels.gemm(a, b),
                     "cute_kernels.gemm(out=)": lambda: cute_kernels.gemm(a, b, out=out),
                     "x.add_(1)": lambda: out.add_(1)}.items():
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        per = []
        for _ in range(20):
            t0 = time.perf_counter()
            for _ in range(200):
                fn()
            per.append((time.perf_counter() - t0) / 200 * 1e6)
            torch.cuda.synchronize()
        res[name] = statistics.median(per)
    return res


def main():
    with tempfile.TemporaryDirectory() as d:
        cold = first_call(d)
        warm = first_call(d)
    host = host_overhead()
    print(f"first call, empty disk cache : {cold['first_call_s']*1e3:8.1f} ms  (compiles {cold['compiles']})")
    print(f"first call, warm disk cache  : {warm['first_call_s']*1e3:8.1f} ms  (compiles {warm['compiles']}, disk hits {warm['disk_hits']})")
    for k, v in host.items():
        print(f"host time per call {k:26s}: {v:6.1f} us")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    import datetime

    import torch
    with open(os.path.join(HERE, "results", f"host-{datetime.date.today().isoformat()}.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "cold": cold, "warm": warm, "host_us": host}, f, indent=1)


if __name__ == "__main__":
    main()
