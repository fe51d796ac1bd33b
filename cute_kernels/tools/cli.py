"""The ``cute-kernels`` command (also ``python -m cute_kernels``).

    cute-kernels demo [--cpu] [--out DIR]   GPU: each kernel against a PyTorch reference (error, speed).
                                            CPU: compile every kernel for sm_90a, print the resource
                                            report, write layout pictures to DIR.
    cute-kernels report                     the CPU compile report only (registers, spills, instructions)
    cute-kernels plan gemm M N K [...]      what gemm() runs for one problem (no GPU, nothing compiled)
    cute-kernels plan decode B HQ HKV L     what decode_attn() runs for one problem
    cute-kernels warmup gemm M N K [...]    compile what gemm() runs into the disk cache (no GPU needed)
    cute-kernels warmup decode B HQ HKV L   the same for decode_attn()
    cute-kernels warmup merge --head-dim D  the same for merge_states()
    cute-kernels tune gemm M N K            autotune the GEMM for one shape (needs a GPU); persisted
    cute-kernels layouts gemm [...]         print / draw tile layouts (cute-kernels layouts --help)
    cute-kernels bench KIND [--quick] [...] GPU: benchmark gemm|attention|decode|model|all against the
                                            peers, with the same-run ceiling; JSON + markdown to --out;
                                            gaps: issue 36's rows against their targets, paired timer
                                            (cute-kernels bench --help)
    cute-kernels charts [RESULTS...] --out DIR
                                            PNG charts (ratios to the peers, the roofline) and tables
                                            from recorded results (no GPU)

Each subcommand documents its arguments (``cute-kernels plan gemm --help``).  A bad argument, or a
problem the library rejects, is reported in one line and exits with status 2
(``CUTE_KERNELS_LOG_LEVEL=DEBUG`` shows the traceback instead).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from .args import BOUNDS_HELP, MAX_DIM, OneLineParser, check_fits, gemm_bytes, int_in, one_line

PROG = "cute-kernels"
DTYPES = ("bfloat16", "float16")
OUT_DTYPES = ("bfloat16", "float16", "float32")
_ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
#: what decode_attn accepts (its argument validation): head dims and query tokens per sequence.
DECODE_HEAD_DIMS = (64, 128, 256)
DECODE_MAX_SQ = 16
DECODE_MAX_PAGE_SIZE = 1024
#: KV splits a decode plan may be asked for (the heuristic picks at most two per SM)
DECODE_MAX_SPLITS = 1024
#: the head dims of the attention kernels whose states merge_states merges (warmup merge)
MERGE_HEAD_DIMS = (64, 96, 128, 256)


class UsageError(Exception):
    """A bad argument found after parsing; printed as ``cute-kernels: error: ...`` (status 2)."""


def _torch_dtype(name: str | None):
    import torch

    return None if name is None else getattr(torch, name)


def _add_gemm_problem(p: argparse.ArgumentParser) -> None:
    p.add_argument("m", type=int_in(0, MAX_DIM), help="rows of a and of the output")
    p.add_argument("n", type=int_in(0, MAX_DIM), help="columns of b and of the output")
    p.add_argument("k", type=int_in(0, MAX_DIM), help="the reduction length (columns of a, rows of b)")
    p.add_argument("--batch", type=int_in(1, MAX_DIM), default=None, help="batch count (default: a 2-d problem)")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="a and b element type (default bfloat16)")
    p.add_argument("--out-dtype", default=None, choices=OUT_DTYPES, help="output element type (default: --dtype)")
    p.add_argument("--a-major", default="row", choices=("row", "col"),
                   help="a (M, K) stored row-major (K contiguous) or column-major (default row)")
    p.add_argument("--b-major", default="row", choices=("row", "col"),
                   help="b (K, N) stored row-major (N contiguous) or column-major (default row)")
    p.add_argument("--with-c", action="store_true", help="alpha * a @ b + beta * c with a C operand, beta != 0")
    p.set_defaults(check=_check_gemm, check_prog=p.prog)


def _check_gemm(a: argparse.Namespace) -> None:
    """The problem's a, b, output (and c) fit in a GPU's memory (each size is bounded by its parser)."""
    dtype = getattr(a, "dtype", "bfloat16")
    out = getattr(a, "out_dtype", None) or dtype
    nbytes = gemm_bytes(a.m, a.n, a.k, getattr(a, "batch", None), _ELEM_BYTES[dtype], _ELEM_BYTES[out],
                        getattr(a, "with_c", False))
    check_fits(f"gemm {a.m}x{a.n}x{a.k}" + (f" batch {a.batch}" if getattr(a, "batch", None) else "")
               + ": a, b and the output" + (" and c" if getattr(a, "with_c", False) else ""), nbytes)


def _add_decode_problem(p: argparse.ArgumentParser) -> None:
    p.add_argument("batch", type=int_in(1, MAX_DIM), help="sequences in the batch")
    p.add_argument("heads_q", type=int_in(1, MAX_DIM), help="query heads (a multiple of heads_kv)")
    p.add_argument("heads_kv", type=int_in(1, MAX_DIM), help="key/value heads")
    p.add_argument("capacity", type=int_in(1, MAX_DIM),
                   help="KV tokens the cache holds per sequence: Lmax (contiguous) or block-table width x page size")
    p.add_argument("--head-dim", type=int, default=128, choices=DECODE_HEAD_DIMS, help="head dimension (default 128)")
    p.add_argument("--sq", type=int_in(1, DECODE_MAX_SQ), default=1,
                   help=f"new query tokens per sequence, 1..{DECODE_MAX_SQ} (default 1)")
    p.add_argument("--page-size", type=int_in(1, DECODE_MAX_PAGE_SIZE), default=None,
                   help=f"tokens per page of a paged cache, 1..{DECODE_MAX_PAGE_SIZE} (default: contiguous cache)")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="q / K / V element type (default bfloat16)")
    p.add_argument("--num-splits", type=int_in(1, DECODE_MAX_SPLITS), default=None,
                   help=f"KV splits, 1..{DECODE_MAX_SPLITS} (default: the heuristic's)")
    p.set_defaults(check=_check_decode, check_prog=p.prog)


def _check_decode(a: argparse.Namespace) -> None:
    """Heads group evenly; q, K, V, the output (and a block table) fit in a GPU's memory."""
    if a.heads_q % a.heads_kv:
        raise ValueError(f"heads_q ({a.heads_q}) must be a multiple of heads_kv ({a.heads_kv})")
    e = _ELEM_BYTES[a.dtype]
    nbytes = (2 * a.batch * a.sq * a.heads_q * a.head_dim * e + 2 * a.batch * a.capacity * a.heads_kv * a.head_dim * e
              + (a.batch * -(-a.capacity // a.page_size) * 4 if a.page_size else 0))
    check_fits(f"decode b{a.batch} hq{a.heads_q} hkv{a.heads_kv} capacity {a.capacity} D{a.head_dim}: q, K, V and "
               "the output", nbytes)


# ---- plan ----------------------------------------------------------------------------------------
def _gemm_rows(a: argparse.Namespace) -> list[dict]:
    from ..gemm import explain

    return explain(a.m, a.n, a.k, batch=a.batch, dtype=_torch_dtype(a.dtype), a_major=a.a_major,
                   b_major=a.b_major, out_dtype=_torch_dtype(a.out_dtype), with_c=a.with_c)


def _decode_row(a: argparse.Namespace) -> dict:
    from ..attention import explain as decode_explain

    return decode_explain(a.batch, a.heads_q, a.heads_kv, a.capacity, head_dim=a.head_dim, sq=a.sq,
                          page_size=a.page_size, dtype=_torch_dtype(a.dtype), num_splits=a.num_splits)


def _gemm_title(a: argparse.Namespace) -> str:
    return (f"gemm {a.m}x{a.n}x{a.k}" + (f" batch {a.batch}" if a.batch else "")
            + f" {a.dtype}, a {a.a_major}-major, b {a.b_major}-major")


def _decode_title(a: argparse.Namespace) -> str:
    return (f"decode_attn b{a.batch} hq{a.heads_q} hkv{a.heads_kv} capacity {a.capacity} D{a.head_dim} Sq{a.sq}"
            + (f" pages of {a.page_size}" if a.page_size else " contiguous"))


def _print_rows(rows: list[dict]) -> None:
    if not rows:
        print("  no kernel: an empty problem launches nothing\n")
    for row in rows:
        for key, val in row.items():
            print(f"  {key:14s} {val}")
        print()


def cmd_plan(a: argparse.Namespace) -> int:
    """Print what a call would run: the library's own planning code on meta tensors."""
    if a.kernel == "gemm":
        rows = _gemm_rows(a)
        print(_gemm_title(a) + ":")
    else:
        rows = [_decode_row(a)]
        print(_decode_title(a) + ":")
    _print_rows(rows)
    return 0


# ---- warmup --------------------------------------------------------------------------------------
def cmd_warmup(a: argparse.Namespace) -> int:
    """Compile (or load from the disk cache) exactly what a call would run, without running it."""
    from ..common import jit

    if a.kernel == "gemm":
        kernels = [r.get("kernel", "?") for r in _gemm_rows(a)]  # validates before compiling
        spec = {"m": a.m, "n": a.n, "k": a.k, "batch": a.batch, "dtype": _torch_dtype(a.dtype), "a_major": a.a_major,
                "b_major": a.b_major, "out_dtype": _torch_dtype(a.out_dtype), "with_c": a.with_c}
        todo, title = [("gemm", spec)], _gemm_title(a)
    elif a.kernel == "decode":
        row = _decode_row(a)
        splits = row.get("num_splits", 1)
        kernels = ["decode_attn" + (f" ({splits} splits + their merge)" if splits > 1 else "")]
        todo, title = [("decode_attn", row["config"])], _decode_title(a)
    else:
        from ..attention import MergeConfig

        kernels = ["merge_states"]
        todo = [("merge_states", MergeConfig(dtype_in=a.dtype, dtype_out=a.dtype, head_dim=a.head_dim))]
        title = f"merge_states {a.dtype} D{a.head_dim}"
    before = dict(jit.stats)
    t0 = time.perf_counter()
    try:
        jit.warmup(todo)
    except RuntimeError as e:  # warmup_gemm allocates real (unread) operands; a host short of memory refuses
        if "allocate" not in str(e):
            raise
        raise UsageError(f"{title}: this machine cannot allocate the operands the warm-up builds ({one_line(e)})") \
            from None
    dt = time.perf_counter() - t0
    compiled = jit.stats["compiles"] - before["compiles"]
    loaded = jit.stats["disk_hits"] - before["disk_hits"]
    where = jit.cache_dir() if jit.disk_cache_enabled() else "memory only (CUTE_KERNELS_DISK_CACHE=0)"
    print(f"{title}: {', '.join(kernels) or 'no kernel (an empty problem launches nothing)'}")
    print(f"  compiled {compiled}, loaded from disk {loaded}, in {dt:.1f} s; cache: {where}")
    return 0


# ---- tune ----------------------------------------------------------------------------------------
def cmd_tune(a: argparse.Namespace) -> int:
    import torch

    from ..common.arch import has_gpu
    from ..gemm import gemm
    from ..gemm.tune import tune_gemm

    if not has_gpu():
        raise UsageError("tune needs a CUDA GPU (use `cute-kernels plan gemm` or `warmup gemm` on the CPU)")
    dt = _torch_dtype(a.dtype)
    x = torch.randn(a.m, a.k, device="cuda", dtype=dt)
    y = torch.randn(a.k, a.n, device="cuda", dtype=dt)
    best = tune_gemm(x, y)
    print(f"best for {a.m}x{a.n}x{a.k} {a.dtype}: {best}")
    gemm(x, y)
    return 0


# ---- demo / report -------------------------------------------------------------------------------
def _demo_pictures(out_dir: str) -> list[str]:
    import os

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


def _gpu_demo() -> int:
    import torch

    from ..attention import decode_attn, decode_attn_reference
    from ..gemm import gemm
    from ..gemm.tune import bench_ms

    print(f"GPU: {torch.cuda.get_device_name(0)}")
    bad = 0
    print("\nGEMM bf16 (A row-major, B row-major), vs torch.matmul:")
    for m, n, k in [(4096, 4096, 4096), (4097, 4096, 4096), (128, 4096, 4096), (1000, 3000, 520), (7, 1000, 136)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        out = gemm(a, b)
        ref = a.double() @ b.double()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        ms = bench_ms(lambda a=a, b=b: gemm(a, b), rep_ms=50)
        ms_ref = bench_ms(lambda a=a, b=b: torch.matmul(a, b), rep_ms=50)
        ok = err < 2e-2
        bad += not ok
        tf = 2 * m * n * k / 1e9
        print(f"  {m:5d}x{n:5d}x{k:5d}: rel err {err:.1e} {'ok' if ok else 'WRONG'}; "
              f"{tf / ms:6.0f} TFLOP/s vs cuBLAS {tf / ms_ref:6.0f} ({ms_ref / ms:.2f}x)")
    try:
        print("\nDecode attention bf16 d128 (KV bytes read per second), vs float32 reference:")
        for b_, hq, hkv, L in [(1, 32, 8, 32768), (8, 32, 8, 8192)]:
            q = torch.randn(b_, 1, hq, 128, device="cuda", dtype=torch.bfloat16)
            kc = torch.randn(b_, L, hkv, 128, device="cuda", dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            lens = torch.full((b_,), L, device="cuda", dtype=torch.int32)
            o = decode_attn(q, kc, vc, cache_seqlens=lens)
            ref = decode_attn_reference(q, kc, vc, cache_seqlens=lens)[0]
            err = ((o.double() - ref.double()).norm() / ref.double().norm()).item()
            ms = bench_ms(lambda q=q, kc=kc, vc=vc, lens=lens: decode_attn(q, kc, vc, cache_seqlens=lens), rep_ms=50)
            ok = err < 2e-2
            bad += not ok
            print(f"  b{b_} hq{hq} hkv{hkv} L{L}: rel err {err:.1e} {'ok' if ok else 'WRONG'}; "
                  f"{2 * kc.numel() * 2 / ms / 1e9:.2f} TB/s")
    except Exception as e:  # noqa: BLE001 - report, don't hide
        print(f"  decode demo failed: {type(e).__name__}: {e}")
        bad += 1
    return 1 if bad else 0


def cmd_demo(a: argparse.Namespace) -> int:
    from ..common.arch import has_gpu

    if has_gpu() and not a.cpu:
        return _gpu_demo()
    import os

    from .report import compile_report

    os.makedirs(a.out, exist_ok=True)  # an unwritable --out fails here, before a minute of compiling
    print("No CUDA device (or --cpu): compiling every kernel for sm_90a (CPU-only build) instead.\n")
    compile_report()
    paths = _demo_pictures(a.out)
    print("\nLayout pictures:\n" + "\n".join(f"  {p}" for p in paths))
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    from .report import compile_report

    compile_report()
    return 0


# ---- charts --------------------------------------------------------------------------------------
DEFAULT_RESULTS = "profiles/results"


def cmd_charts(a: argparse.Namespace) -> int:
    """PNG charts and README tables from results files (no GPU; matplotlib from the pictures extra)."""
    from pathlib import Path

    from . import charts
    from .bench import records

    paths = list(a.results)
    if not paths:
        if not Path(DEFAULT_RESULTS).is_dir():
            raise UsageError(f"name the results files (no {DEFAULT_RESULTS}/ here to take the records from)")
        paths = records.latest(DEFAULT_RESULTS)  # the files its manifest names; ValueError without one
        print(f"records named by {DEFAULT_RESULTS}/{records.MANIFEST}: " + ", ".join(str(p) for p in paths))
    try:
        written = charts.make(paths, a.out, dpi=a.dpi)
    except charts.MissingExtra as e:
        raise UsageError(str(e)) from None
    for p in written:
        print(f"  {p}")
    return 0


# ---- parser --------------------------------------------------------------------------------------
def _version() -> str:
    """The installed distribution's version, else the package's own (a source tree not installed)."""
    from importlib import metadata

    try:
        return metadata.version("cute-kernels")
    except metadata.PackageNotFoundError:
        from .. import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    d = sub.add_parser("demo", help="run (GPU) or compile (CPU) every kernel",
                       description="On a GPU: each kernel against a PyTorch reference (error and speed).  "
                                   "Without one (or with --cpu): compile every kernel for sm_90a, print the "
                                   "resource report and write layout pictures to --out.")
    d.add_argument("--out", default="cute-kernels-demo", help="folder for the layout pictures (CPU demo)")
    d.add_argument("--cpu", action="store_true", help="the CPU demo even when a GPU is present")
    d.set_defaults(func=cmd_demo)

    r = sub.add_parser("report", help="compile every kernel for sm_90a and print its resources",
                       description="Compile one configuration of every kernel for sm_90a (no GPU needed) and "
                                   "print registers, spills and instruction counts (HGMMA, UTMALDG, ...).")
    r.set_defaults(func=cmd_report)

    for name, func, what in (("plan", cmd_plan, "what a call would run for one problem (no GPU, nothing compiled)"),
                             ("warmup", cmd_warmup, ("compile what a call would run into the disk cache (no GPU "
                                                     "needed)"))):
        p = sub.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".")
        ks = p.add_subparsers(dest="kernel", required=True, metavar="KERNEL")
        g = ks.add_parser("gemm", help="gemm(a, b): tiles, cluster, raster, split-K",
                          description=f"{name} for gemm(a, b) with a (M, K) and b (K, N).  {BOUNDS_HELP}")
        _add_gemm_problem(g)
        dd = ks.add_parser("decode", help="decode_attn: tiles, split count, load path",
                           description=f"{name} for decode_attn(q, k_cache, v_cache, ...).  {BOUNDS_HELP}")
        _add_decode_problem(dd)
        if name == "warmup":
            mg = ks.add_parser("merge", help="merge_states: the exact merge of attention states",
                               description="warmup for merge_states(o_parts, lse_parts): one kernel per "
                                           "element type and head dimension (any number of parts and rows).")
            mg.add_argument("--head-dim", type=int, default=128, choices=MERGE_HEAD_DIMS,
                            help="head dimension: one of the attention kernels' (default 128)")
            mg.add_argument("--dtype", default="float32", choices=OUT_DTYPES,
                            help="o_parts element type, also the output's (default float32)")
        p.set_defaults(func=func)

    t = sub.add_parser("tune", help="autotune a kernel for one shape (needs a GPU)",
                       description="Time the GEMM's candidate configurations for one shape on the GPU and "
                                   f"persist the fastest; later gemm() calls of that shape use it.  {BOUNDS_HELP}")
    t.add_argument("kernel", choices=("gemm",), help="the kernel to tune (gemm)")
    t.add_argument("m", type=int_in(1, MAX_DIM), help="rows of a")
    t.add_argument("n", type=int_in(1, MAX_DIM), help="columns of b")
    t.add_argument("k", type=int_in(1, MAX_DIM), help="the reduction length")
    t.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="a and b element type (default bfloat16)")
    t.set_defaults(func=cmd_tune, check=_check_gemm, check_prog=t.prog)

    c = sub.add_parser("charts", help="PNG charts and tables from recorded benchmark results (no GPU)",
                       description="Draw each results file's ratios to the peers (with the ceiling marked), "
                                   "the roofline of the device with every kernel's points, one summary picture "
                                   "and README tables, from files written by `cute-kernels bench` (or the older "
                                   "profiles/ scripts).  A file it cannot draw is an error and nothing is "
                                   "written.  Needs matplotlib (the pictures extra).")
    c.add_argument("results", nargs="*", metavar="RESULTS",
                   help="results JSON files of any kind `cute-kernels bench` (or profiles/read_ceiling.py) writes "
                        f"(default: the records {DEFAULT_RESULTS}/latest.json names for the README's charts)")
    c.add_argument("--out", default="charts", help="folder for the PNGs and tables.md (default ./charts)")
    c.add_argument("--dpi", type=int_in(30, 600), default=110, help="resolution of the single charts (default 110)")
    c.set_defaults(func=cmd_charts)

    # parsed by layouts_cli and bench (their own parsers and --help); listed here for the top-level help
    sub.add_parser("layouts", help="print / draw tile layouts (cute-kernels layouts --help)", add_help=False)
    sub.add_parser("bench", help="GPU: benchmark the kernels against their peers (cute-kernels bench --help)",
                   add_help=False)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for a bad argument, printed in one line)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["layouts"]:
        from . import layouts_cli

        return layouts_cli.main(argv[1:]) or 0
    if argv[:1] == ["bench"]:
        from . import bench

        return bench.main(argv[1:])
    ap = build_parser()
    args = ap.parse_args(argv)  # a bad argument: one line, SystemExit(2)
    if getattr(args, "check", None) is not None:  # bounds across arguments, before any work: as a parse error
        try:
            args.check(args)
        except ValueError as e:
            ap.exit(2, f"{args.check_prog}: error: {one_line(e)} (see {args.check_prog} --help)\n")
    try:
        return args.func(args)
    except (UsageError, ValueError, TypeError, OSError) as e:  # the library's argument checks, an --out path
        if logging.getLogger("cute_kernels").isEnabledFor(logging.DEBUG):
            raise  # CUTE_KERNELS_LOG_LEVEL=DEBUG: the whole traceback
        ap.exit(2, f"{PROG}: error: {one_line(e)}\n")


if __name__ == "__main__":
    sys.exit(main())
