"""Same-run ceilings and the device's roofs.

- :func:`bare_read`: the fastest simple kernel that reads N bytes once (a Triton grid-stride sum over a
  float32 view, 16-byte loads, with and without the L2 ``evict_first`` policy, a few launch shapes
  tried; ``torch.sum`` without triton).  No kernel that must read those bytes can beat it under the
  same timer: the ceiling of a bandwidth-bound shape.
- :func:`matmul_same_flops`: a bf16 cuBLAS matmul of (about) the same FLOPs as a compute-bound
  problem, its time scaled to exactly those FLOPs: what the tensor cores give at that amount of work.
- :func:`measure_roofs`: the device's read and copy bandwidth and its bf16 matmul rate, measured in
  the run (the roofline's roofs).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_READER = None
#: (programs per SM, block, warps, evict_first) tried by :func:`bare_read`
READ_CONFIGS = [(16, 4096, 8, True), (32, 2048, 8, True), (16, 1024, 4, True), (16, 4096, 8, False)]


def _triton_reader():
    """``make(x, programs, block, warps, evict_first) -> fn``: a grid-stride sum of float32 ``x``."""
    global _READER
    if _READER is None:
        import triton
        import triton.language as tl

        @triton.jit
        def read_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVICT_FIRST: tl.constexpr):
            pid = tl.program_id(0)
            step = tl.num_programs(0) * BLOCK
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(pid * BLOCK, n, step):
                offs = start + tl.arange(0, BLOCK)
                if EVICT_FIRST:
                    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")
                else:
                    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
                acc += x
            tl.store(out_ptr + pid, tl.sum(acc))

        def make(x, progs, block, warps, evict_first):
            out = torch.empty(progs, dtype=torch.float32, device=x.device)
            n = x.numel()
            return lambda: read_sum[(progs,)](x, out, n, BLOCK=block, EVICT_FIRST=evict_first, num_warps=warps)

        _READER = make
    return _READER


def bare_read(nbytes: int, bench: Callable[[Callable], float], quick: bool = False) -> tuple[Callable, str]:
    """(fn, what): a callable reading ``nbytes`` of a fresh buffer once, the fastest of
    :data:`READ_CONFIGS` under ``bench`` (``torch.sum`` where triton is missing)."""
    x = torch.rand(max(1, nbytes // 4), device="cuda", dtype=torch.float32)
    sink = torch.empty((), device="cuda", dtype=torch.float32)
    cands = {"torch.sum": lambda: torch.sum(x, dim=0, out=sink)}
    try:
        make = _triton_reader()
    except ImportError:  # no triton: torch.sum is the read
        make = None
    if make is not None:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for per_sm, block, warps, ef in READ_CONFIGS[:2] if quick else READ_CONFIGS:
            progs = max(1, min(per_sm * sms, -(-x.numel() // block)))
            name = f"triton read {per_sm}/SM block {block} warps {warps}{' evict_first' if ef else ''}"
            cands[name] = make(x, progs, block, warps, ef)
    best, best_us = None, float("inf")
    for name, fn in cands.items():
        try:
            fn()
            torch.cuda.synchronize()
            us = bench(fn)
        except Exception as e:  # noqa: BLE001 - a reader that cannot run is not a candidate
            print(f"  bare read {name}: {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        if us < best_us:
            best, best_us = name, us
    if best is None:
        raise RuntimeError("no bare-read kernel ran")
    return cands[best], best


def matmul_same_flops(flops: float) -> tuple[Callable, float]:
    """(fn, its FLOPs): a square bf16 cuBLAS matmul of about ``flops`` (n rounded to 128, at least 256);
    scale its time by ``flops / its FLOPs`` to compare."""
    n = max(256, round((flops / 2) ** (1 / 3) / 128) * 128)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    return (lambda: torch.matmul(a, b, out=out)), 2.0 * n ** 3


def measure_roofs(bench: Callable[[Callable], float], quick: bool = False) -> dict:
    """The device's roofs under this run's timer: read and copy bandwidth of 1 GiB (512 MiB with
    ``quick``) and the bf16 cuBLAS rate of an 8192^3 matmul."""
    nbytes = (512 if quick else 1024) * 1024 * 1024
    fn, what = bare_read(nbytes, bench, quick)
    read_us = bench(fn)
    src = torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_us = bench(lambda: dst.copy_(src))
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    mm_us = bench(lambda: torch.matmul(a, b, out=c))
    mib = nbytes // (1024 * 1024)
    return {"read_TBps": nbytes / read_us / 1e6, "copy_TBps": 2 * nbytes / copy_us / 1e6,
            "matmul_TFLOPs": 2 * n ** 3 / mm_us / 1e6,
            "how": f"read: {what} of {mib} MiB; copy: torch copy_ of {mib} MiB, bytes read + written; "
                   f"matmul: cuBLAS bf16 {n}^3"}


def start_run(what: str, quick: bool = False):
    """The start every bench kind shares: a CUDA device (else RuntimeError naming ``what``), this run's
    timer (:func:`.timing.make_bench`) and the device's roofs measured with it and printed.  Returns
    ``(bench, timer, roofs)``."""
    from . import results, timing

    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA device")
    bench, timer = timing.make_bench(quick)
    print("measuring the roofs (read, copy, matmul)", flush=True)
    roofs = measure_roofs(bench, quick)
    print(f"roofs: {results.roof_words(roofs)}", flush=True)
    return bench, timer, roofs
