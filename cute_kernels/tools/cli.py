"""``cute-kernels`` / ``python -m cute_kernels``: demo, layouts, tune, report, warmup.

    cute-kernels demo [--out DIR]      GPU: each kernel vs a PyTorch reference (error, speed).
                                       CPU: compile every kernel for sm_90a, print the resource report,
                                       write layout pictures to DIR.
    cute-kernels layouts gemm [...]    print / draw tile layouts (see `cute-kernels layouts --help`)
    cute-kernels tune gemm M N K       autotune the GEMM for one shape (needs a GPU); persisted
    cute-kernels report                compile report only
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys


def _demo_pictures(out_dir: str) -> list[str]:
    from . import layouts_cli as lcli

    os.makedirs(out_dir, exist_ok=True)
    made = []
    # rasters: what gemm() runs (its plan) for 8192^3 (256x128 tiles, 1x2 cluster, swizzle 8 along M)
    # and 4096^3 (128x256, 2x1, swizzle 8 along N: the band raster for A that fits in L2)
    for what, name, extra in [("mma-c", "gemm_mma_c_fragment.svg", []), ("smem-a", "gemm_smem_a_swizzle.svg", []),
                              ("banks", "gemm_smem_a_banks.svg", []),
                              ("raster", "gemm_raster_8192.png", ["--plan", "8192,8192,8192"]),
                              ("raster", "gemm_raster_4096.png", ["--plan", "4096,4096,4096", "--color", "wave"])]:
        path = os.path.join(out_dir, name)
        lcli.main(["gemm", "--what", what, *extra, "--out", path])
        made.append(path)
    return made


def _bench_ms(fn):
    import torch

    try:
        from triton.testing import do_bench

        return do_bench(fn, warmup=10, rep=50, return_mode="median")
    except ImportError:
        fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(20):
            fn()
        e.record()
        e.synchronize()
        return s.elapsed_time(e) / 20


def _gpu_demo() -> int:
    import torch

    import cute_kernels

    print(f"GPU: {torch.cuda.get_device_name(0)}")
    bad = 0
    print("\nGEMM bf16 (A row-major, B row-major), vs torch.matmul:")
    for m, n, k in [(4096, 4096, 4096), (4097, 4096, 4096), (128, 4096, 4096), (1000, 3000, 520), (7, 1000, 136)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        out = cute_kernels.gemm(a, b)
        ref = a.double() @ b.double()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        ms, ms_ref = _bench_ms(lambda: cute_kernels.gemm(a, b)), _bench_ms(lambda: torch.matmul(a, b))
        ok = err < 2e-2
        bad += not ok
        tf = 2 * m * n * k / 1e9
        print(f"  {m:5d}x{n:5d}x{k:5d}: rel err {err:.1e} {'ok' if ok else 'WRONG'}; "
              f"{tf / ms:6.0f} TFLOP/s vs cuBLAS {tf / ms_ref:6.0f} ({ms_ref / ms:.2f}x)")
    try:
        DA = importlib.import_module("cute_kernels.decode_attn")

        print("\nDecode attention bf16 d128 (KV bytes read per second), vs float32 reference:")
        for b_, hq, hkv, L in [(1, 32, 8, 32768), (8, 32, 8, 8192)]:
            q = torch.randn(b_, 1, hq, 128, device="cuda", dtype=torch.bfloat16)
            kc = torch.randn(b_, L, hkv, 128, device="cuda", dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            lens = torch.full((b_,), L, device="cuda", dtype=torch.int32)
            o = cute_kernels.decode_attn(q, kc, vc, cache_seqlens=lens)
            ref = DA.decode_attn_reference(q, kc, vc, cache_seqlens=lens)
            ref = ref[0] if isinstance(ref, tuple) else ref
            err = ((o.double() - ref.double()).norm() / ref.double().norm()).item()
            ms = _bench_ms(lambda: cute_kernels.decode_attn(q, kc, vc, cache_seqlens=lens))
            ok = err < 2e-2
            bad += not ok
            print(f"  b{b_} hq{hq} hkv{hkv} L{L}: rel err {err:.1e} {'ok' if ok else 'WRONG'}; "
                  f"{2 * kc.numel() * 2 / ms / 1e9:.2f} TB/s")
    except Exception as e:  # report, don't hide
        print(f"  decode demo failed: {type(e).__name__}: {e}")
        bad += 1
    return 1 if bad else 0


def cmd_demo(args) -> int:
    from ..common.arch import has_gpu

    if has_gpu() and not args.cpu:
        return _gpu_demo()
    from .report import compile_report

    print("No CUDA device: compiling every kernel for sm_90a (CPU-only build) instead.\n")
    compile_report()
    paths = _demo_pictures(args.out)
    print("\nLayout pictures:\n" + "\n".join(f"  {p}" for p in paths))
    return 0


def cmd_tune(args) -> int:
    import torch

    import cute_kernels
    from ..gemm.tune import tune_gemm

    if args.kernel != "gemm":
        print(f"tune: unknown kernel {args.kernel!r}; known: gemm", file=sys.stderr)
        return 2
    dt = getattr(torch, args.dtype)
    a = torch.randn(args.m, args.k, device="cuda", dtype=dt)
    b = torch.randn(args.k, args.n, device="cuda", dtype=dt)
    best = tune_gemm(a, b)
    print(f"best for {args.m}x{args.n}x{args.k} {args.dtype}: {best}")
    cute_kernels.gemm(a, b)
    return 0


def cmd_plan(args) -> int:
    """Print what a call would run: the real planning code on meta tensors (see ``explain``)."""
    import torch

    if args.kernel == "gemm":
        from ..gemm.host import explain

        rows = explain(args.m, args.n, args.k, batch=args.batch, dtype=getattr(torch, args.dtype),
                       a_major=args.a_major, b_major=args.b_major,
                       out_dtype=getattr(torch, args.out_dtype) if args.out_dtype else None, with_c=args.with_c)
        print(f"gemm {args.m}x{args.n}x{args.k}" + (f" batch {args.batch}" if args.batch else "")
              + f" {args.dtype}, a {args.a_major}-major, b {args.b_major}-major:")
    else:
        from ..attention.decode import explain

        rows = [explain(args.batch, args.heads_q, args.heads_kv, args.capacity, head_dim=args.head_dim, sq=args.sq,
                        page_size=args.page_size, dtype=getattr(torch, args.dtype), num_splits=args.num_splits)]
        print(f"decode_attn b{args.batch} hq{args.heads_q} hkv{args.heads_kv} capacity {args.capacity} "
              f"D{args.head_dim} Sq{args.sq}" + (f" pages of {args.page_size}" if args.page_size else " contiguous") + ":")
    for row in rows:
        for key, val in row.items():
            print(f"  {key:14s} {val}")
        print()
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "layouts":
        from . import layouts_cli as lcli

        return lcli.main(argv[1:]) or 0
    ap = argparse.ArgumentParser(prog="cute-kernels", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run (GPU) or compile (CPU) every kernel")
    d.add_argument("--out", default="cute-kernels-demo", help="folder for layout pictures (CPU demo)")
    d.add_argument("--cpu", action="store_true", help="the CPU demo even when a GPU is present")
    sub.add_parser("layouts", help="print / draw tile layouts")
    sub.add_parser("report", help="compile every kernel for sm_90a and print resources")
    t = sub.add_parser("tune", help="autotune a kernel for one shape (GPU)")
    t.add_argument("kernel")
    t.add_argument("m", type=int)
    t.add_argument("n", type=int)
    t.add_argument("k", type=int)
    t.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    pl = sub.add_parser("plan", help="what a call would run for one problem (no GPU, nothing compiled)")
    psub = pl.add_subparsers(dest="kernel", required=True)
    pg = psub.add_parser("gemm", help="tiles, cluster, raster, split-K of gemm(a, b)")
    for name in ("m", "n", "k"):
        pg.add_argument(name, type=int)
    pg.add_argument("--batch", type=int, default=None)
    pg.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    pg.add_argument("--out-dtype", default=None, choices=["bfloat16", "float16", "float32"])
    pg.add_argument("--a-major", default="row", choices=["row", "col"])
    pg.add_argument("--b-major", default="row", choices=["row", "col"])
    pg.add_argument("--with-c", action="store_true", help="beta != 0 with a C operand")
    pd = psub.add_parser("decode", help="tiles, split count and load path of decode_attn")
    pd.add_argument("batch", type=int)
    pd.add_argument("heads_q", type=int)
    pd.add_argument("heads_kv", type=int)
    pd.add_argument("capacity", type=int, help="Lmax (contiguous) or block-table width x page size")
    pd.add_argument("--head-dim", type=int, default=128)
    pd.add_argument("--sq", type=int, default=1)
    pd.add_argument("--page-size", type=int, default=None)
    pd.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    pd.add_argument("--num-splits", type=int, default=None)
    args = ap.parse_args(argv)
    if args.cmd == "plan":
        return cmd_plan(args)
    if args.cmd == "demo":
        return cmd_demo(args)
    if args.cmd == "report":
        from .report import compile_report

        compile_report()
        return 0
    if args.cmd == "tune":
        return cmd_tune(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
