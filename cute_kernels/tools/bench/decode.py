"""Decode-attention benchmark: ``decode_attn`` (contiguous and paged) vs cuDNN SDPA, FlashAttention-2
SDPA and FlashAttention-4 (``flash_attn.cute``), one process, one timer.

Timing: ``triton.testing.do_bench`` median with its L2 flush before every call (cold L2).  Each shape
runs ``--repeats`` interleaved rounds (every implementation once per round, the order rotated); the
figure is the median over the rounds and ratios are taken within the run.  Bandwidth = KV bytes read
/ time with KV bytes = 2 * B * L * Hkv * D * 2 (bf16 K and V, each byte once).  The ceiling beside
the figures is a bare read of the same number of bytes, timed in the same rounds (:mod:`.ceiling`).

The kernel measured is ``decode_attn`` as a user calls it (its default plan).  Peers that are not
installed (FA4) are skipped with a note.

    cute-kernels bench decode [--quick] [--shapes b1_hq32_hkv8_L32768,...] [--size-sweep] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import re

from ..args import OneLineParser, int_in
from . import results

SHAPES = [
    # name, B, Hq, Hkv, L, page size of our paged run
    ("b1_hq32_hkv8_L32768", 1, 32, 8, 32768, 16),
    ("b1_hq32_hkv32_L131072", 1, 32, 32, 131072, 16),
    ("b8_hq32_hkv8_L8192", 8, 32, 8, 8192, 16),
    ("b32_hq32_hkv8_L4096", 32, 32, 8, 4096, 16),
    ("b4_hq64_hkv8_L65536", 4, 64, 8, 65536, 16),
    ("b64_hq32_hkv8_L2048_paged16", 64, 32, 8, 2048, 16),
]
#: ``--quick``: two small shapes
QUICK = [("b1_hq32_hkv8_L8192", 1, 32, 8, 8192, 16), ("b8_hq32_hkv8_L4096", 8, 32, 8, 4096, 16)]
#: ``--size-sweep``: one sequence at growing length (KV bytes 34, 67, 134, 268, 537 MB)
SIZE_SWEEP_SHAPES = [(f"b1_hq32_hkv8_L{L}", 1, 32, 8, L, 16) for L in (8192, 16384, 32768, 65536, 131072)]
BIG_BYTES = 256 * 1024 * 1024  # "big shapes": at least 256 MiB of KV
D = 128
OURS, READ = "cute", "read KV"
PEERS = ("cudnn_sdpa", "fa2_sdpa", "fa4")
_NAME = re.compile(r"^b(\d+)_hq(\d+)_hkv(\d+)_L(\d+)(?:_paged(\d+))?$")


def parse_shape(name: str) -> tuple:
    """``b{B}_hq{Hq}_hkv{Hkv}_L{L}[_paged{P}]`` -> (name, B, Hq, Hkv, L, page size (default 16))."""
    m = _NAME.match(name.strip())
    if not m:
        raise ValueError(f"--shapes: expected b<B>_hq<Hq>_hkv<Hkv>_L<L>[_paged<P>], got {name!r}")
    b, hq, hkv, L, page = (int(x) if x else None for x in m.groups())
    if min(b, hq, hkv, L) < 1 or hq % hkv or (page is not None and page < 1):
        raise ValueError(f"--shapes: {name!r}: sizes must be >= 1 and hq a multiple of hkv")
    return (name.strip(), b, hq, hkv, L, page or 16)


def select(shapes_arg: str = "", only: str = "", quick: bool = False, size_sweep: bool = False) -> list[tuple]:
    """The shapes of a run: ``--shapes`` (names of the default set or any name in the grammar of
    :func:`parse_shape`), else the quick, size-sweep or default set, filtered by the ``--only`` substring."""
    if shapes_arg:
        shapes = [parse_shape(s) for s in shapes_arg.split(",") if s.strip()]
    else:
        shapes = QUICK if quick else SIZE_SWEEP_SHAPES if size_sweep else SHAPES
    return [s for s in shapes if not only or only in s[0]]


def flops_bytes(B: int, Hq: int, Hkv: int, L: int, D: int = D) -> tuple[float, float]:
    """QK and PV FLOPs of one query token per sequence; bf16 K and V bytes read once."""
    return 4.0 * B * Hq * L * D, 2.0 * B * L * Hkv * D * 2


# ---------------------------------------------------------------------------------------- inputs
def to_paged(k, v, page_size, seed=0):
    """A paged copy of contiguous (B, L, H, D) caches: pages in a random order, and the block table."""
    import torch

    B, L, H, Dd = k.shape
    pps = -(-L // page_size)
    n_pages = B * pps
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n_pages, generator=g).to(k.device)
    kp = torch.empty(n_pages, page_size, H, Dd, dtype=k.dtype, device=k.device)
    vp = torch.empty_like(kp)
    pad = pps * page_size - L
    kk = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).reshape(n_pages, page_size, H, Dd)
    vv = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).reshape(n_pages, page_size, H, Dd)
    kp[perm] = kk
    vp[perm] = vv
    return kp, vp, perm.view(B, pps).to(torch.int32).contiguous()


def _sdpa_impl(impls, notes, backend, name, qt, kt, vt, Hq, Hkv):
    import torch
    from torch.nn.attention import sdpa_kernel

    F = torch.nn.functional.scaled_dot_product_attention

    def run_gqa():
        with sdpa_kernel(backend):
            return F(qt, kt, vt, enable_gqa=True)

    try:
        run_gqa()
        torch.cuda.synchronize()
        impls[name] = (run_gqa, lambda: run_gqa().transpose(1, 2))
        return
    except Exception as e:  # noqa: BLE001 - expanded heads as a fallback (reads Hq/Hkv x more bytes)
        notes.append(f"{name}: enable_gqa failed ({type(e).__name__}: {str(e)[:120]}); expanded K/V heads")
    ke = kt.repeat_interleave(Hq // Hkv, 1)
    ve = vt.repeat_interleave(Hq // Hkv, 1)

    def run_exp():
        with sdpa_kernel(backend):
            return F(qt, ke, ve)

    try:
        run_exp()
        torch.cuda.synchronize()
        impls[name] = (run_exp, lambda: run_exp().transpose(1, 2))
    except Exception as e2:  # noqa: BLE001 - the peer cannot run this shape: a note
        notes.append(f"{name}: unavailable ({type(e2).__name__}: {str(e2)[:120]})")


def make_inputs(B, Hq, Hkv, L, D=D):
    """(q (B, 1, Hq, D), K and V caches (B, L, Hkv, D), lengths (B,) all L): bf16 randn, seed 0."""
    import torch

    torch.manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(B, 1, Hq, D, device="cuda", dtype=dt)
    k = torch.randn(B, L, Hkv, D, device="cuda", dtype=dt)
    v = torch.randn(B, L, Hkv, D, device="cuda", dtype=dt)
    return q, k, v, torch.full((B,), L, dtype=torch.int32, device="cuda")


def ours_impl(q, k, v, seqlens):
    """(callable, output getter): ``decode_attn`` on a contiguous cache as a user calls it (its
    default plan), into an output allocated once."""
    import torch

    from ...attention.decode import decode_attn

    out = torch.empty_like(q)
    return (lambda: decode_attn(q, k, v, cache_seqlens=seqlens, out=out)), (lambda: out)


def build_impls(B, Hq, Hkv, L, page, notes):
    """{name: (callable, output getter)} with inputs allocated once: ours contiguous (``cute``) and
    paged (``cute_paged<page>``), then the peers that run here (a note for each that does not)."""
    import torch
    from torch.nn.attention import SDPBackend

    from ...attention.decode import decode_attn

    q, k, v, seqlens = make_inputs(B, Hq, Hkv, L)
    impls = {OURS: ours_impl(q, k, v, seqlens)}
    kp, vp, bt = to_paged(k, v, page)
    out_p = torch.empty_like(q)
    impls[f"cute_paged{page}"] = (lambda: decode_attn(q, kp, vp, cache_seqlens=seqlens, block_table=bt, out=out_p),
                                  lambda: out_p)
    # torch SDPA baselines want (B, H, L, D): contiguous copies (not timed)
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    _sdpa_impl(impls, notes, SDPBackend.CUDNN_ATTENTION, "cudnn_sdpa", qt, kt, vt, Hq, Hkv)
    _sdpa_impl(impls, notes, SDPBackend.FLASH_ATTENTION, "fa2_sdpa", qt, kt, vt, Hq, Hkv)
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # noqa: BLE001 - not installed (or broken): skipped with a note
        notes.append(f"fa4: skipped, flash_attn.cute not importable ({type(e).__name__}: {str(e)[:100]})")
        return impls

    def fa4(ns):
        def run():
            r = flash_attn_func(q, k, v, causal=False, num_splits=ns)
            return r[0] if isinstance(r, tuple) else r

        return run

    for ns in (0, 1):
        try:
            fa4(ns)()
            torch.cuda.synchronize()
            impls["fa4"] = (fa4(ns), fa4(ns))
            if ns == 1:
                notes.append("fa4: num_splits=0 (auto) failed, using 1")
            break
        except Exception as e:  # noqa: BLE001 - recorded as a note
            notes.append(f"fa4 num_splits={ns}: {type(e).__name__}: {str(e)[:160]}")
    return impls


# ---------------------------------------------------------------------------------------- run
def precompile_all(shapes) -> None:
    """Compile every config the run needs in parallel processes (disk cache), before timing."""
    import torch

    from ...attention import decode as DA
    from ...attention.decode_plan import plan
    from .timing import precompile_and_report

    cfgs = []
    for _name, B, Hq, Hkv, L, page in shapes:
        q = torch.empty(B, 1, Hq, D, dtype=torch.bfloat16, device="meta")
        for paged in (False, True):
            k = torch.empty(B if not paged else 1, L if not paged else page, Hkv, D, dtype=torch.bfloat16,
                            device="meta")
            bt = torch.empty(B, -(-L // page), dtype=torch.int32, device="meta") if paged else None
            cfgs.append(plan(q, k, bt, None, True)[0])
    precompile_and_report(DA.precompile, cfgs)


def num_splits(B: int, Hq: int, Hkv: int, L: int) -> int:
    """The KV split count ``decode_attn``'s plan takes for a contiguous cache of this shape."""
    import torch

    from ...attention.decode_plan import plan

    return plan(torch.empty(B, 1, Hq, D, dtype=torch.bfloat16, device="cuda"),
                torch.empty(B, L, Hkv, D, dtype=torch.bfloat16, device="meta"), None, None, True)[1]


def run(shapes, repeats: int = 3, quick: bool = False) -> dict:
    """Benchmark ``shapes`` (tuples of :data:`SHAPES`); returns the results document."""
    import torch

    from .ceiling import bare_read, start_run
    from .progress import Progress
    from .timing import time_rounds

    bench, timer, roofs = start_run("bench decode", quick)
    precompile_all(shapes)
    rows = []
    with Progress(len(shapes) * repeats * 7, "bench decode") as prog:
        for name, B, Hq, Hkv, L, page in shapes:
            notes: list[str] = []
            impls = build_impls(B, Hq, Hkv, L, page, notes)
            fl, kv_bytes = flops_bytes(B, Hq, Hkv, L)
            ref = next((impls[rn][1]().float() for rn in ("fa2_sdpa", "cudnn_sdpa") if rn in impls), None)
            for fn, _ in impls.values():
                fn()
            torch.cuda.synchronize()
            errs = {n: (get().float() - ref).abs().max().item() for n, (_, get) in impls.items()} if ref is not None \
                else {}
            del ref
            read_fn, read_what = bare_read(int(kv_bytes), bench, quick)
            todo = {n: fn for n, (fn, _) in impls.items()}
            todo[READ] = read_fn
            times = time_rounds(todo, bench, repeats, tick=lambda n, s=name: prog.step(f"{s} {n}"))
            row = {"shape": name, "params": {"B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "D": D, "page": page},
                   "flops": fl, "bytes": kv_bytes, "kv_bytes": kv_bytes, "bound": "memory", "ceiling": READ,
                   "impls": {}, "notes": notes}
            for n, ts in times.items():
                role = "ours" if n == OURS else "ceiling" if n == READ else "peer" if n in PEERS else "variant"
                extra = {"what": read_what} if n == READ else {"max_abs_err_vs_sdpa": errs.get(n)}
                row["impls"][n] = results.impl_entry(role, ts, None if n == READ else fl, kv_bytes, **extra)
            row["num_splits"] = num_splits(B, Hq, Hkv, L)
            rows.append(row)
            line = "  ".join(f"{n}={v['median_us']:.1f}us/{v['TBps']:.2f}TB/s" for n, v in row["impls"].items())
            prog.note(f"{name:30s} splits={row['num_splits']:3d}  {line}")
            for nt in notes:
                prog.note(f"    note: {nt}")
            del impls, todo, read_fn
            torch.cuda.empty_cache()
    doc = results.document("decode", results.run_meta(timer, repeats, quick=quick, head_dim=D), rows, roofs)
    s = doc["summary"]
    paged = [next((r["impls"][n]["median_us"] for n in r["impls"] if n.startswith("cute_paged")), None)
             for r in doc["rows"]]
    s["geomean_paged_vs_cudnn_sdpa"] = results.geomean(
        r["impls"]["cudnn_sdpa"]["median_us"] / p for r, p in zip(doc["rows"], paged)
        if p and "cudnn_sdpa" in r["impls"])
    big = [r["impls"][OURS]["TBps"] for r in doc["rows"] if r["kv_bytes"] >= BIG_BYTES and OURS in r["impls"]]
    s["min_TBps_big"] = min(big) if big else None
    return doc


def build_parser(prog: str = "cute-kernels bench decode") -> argparse.ArgumentParser:
    ap = OneLineParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"two small shapes ({', '.join(s[0] for s in QUICK)}), one round, short do_bench")
    ap.add_argument("--repeats", type=int_in(1), default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--shapes", default="",
                    help="comma-separated b<B>_hq<Hq>_hkv<Hkv>_L<L>[_paged<P>] (default: the six issue shapes)")
    ap.add_argument("--only", default="", help="substring filter on shape names")
    ap.add_argument("--size-sweep", action="store_true",
                    help="b1 hq32 hkv8 at L 8192..131072 (34-537 MB of KV) instead of the issue shapes")
    ap.add_argument("--tag", default="", help="suffix of the file names after the kind")
    ap.add_argument("--out", "--out-dir", dest="out", default=os.path.join("profiles", "results"),
                    help="folder for the JSON and markdown (default profiles/results)")
    return ap


def main(argv: list[str] | None = None, prog: str = "cute-kernels bench decode") -> int:
    ap = build_parser(prog)
    args = ap.parse_args(argv)
    try:
        shapes = select(args.shapes, args.only, args.quick, args.size_sweep)
    except ValueError as e:
        ap.error(str(e))
    if not shapes:
        ap.error(f"--only {args.only!r} matches no shape")
    if results.cuda_missing(prog):
        return 2
    doc = run(shapes, 1 if args.quick else args.repeats, args.quick)
    tag = args.tag or ("quick" if args.quick else "size-sweep" if args.size_sweep else "")
    return results.publish(doc, args.out, tag)
