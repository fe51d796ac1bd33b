"""``cute_kernels.gemm``: the host side of the Hopper GEMM (validation, config choice, launch).

The hot path is: validate (pure Python, no sync) -> build the config tuple -> dict lookup of the
compiled TVM-FFI function -> call it with the torch tensors as they are.  No ``permute``/``contiguous``
on the way: the compiled function re-views torch's (L, M, K) / (L, K, N) order itself.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import NamedTuple

import torch

from layouts import tiles as T

from ..common import jit
from ..common.arch import current_arch

_TORCH_TO_NAME = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
_IN_DTYPES = (torch.float16, torch.bfloat16)
_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------- validation (pure Python)
def _tma_ok(t: torch.Tensor, major: str) -> bool:
    """TMA needs a 16-byte aligned base and 16-byte multiples for every non-unit stride."""
    es = t.element_size()
    if t.data_ptr() % 16:
        return False
    unit = t.dim() - 1 if major == "row" else t.dim() - 2
    return all((s * es) % 16 == 0 for i, s in enumerate(t.stride()) if i != unit and t.shape[i] > 1)


def _major(t: torch.Tensor, name: str, rows: str, cols: str) -> str:
    """'row' (last dim contiguous) or 'col'; size-1 dims fit either, so prefer the TMA-compatible one."""
    cands = [m for m, d in (("row", -1), ("col", -2)) if t.stride(d) == 1 or t.shape[d] == 1]
    if not cands:
        raise ValueError(
            f"gemm: {name} of shape {tuple(t.shape)} has strides {tuple(t.stride())}; one of its last two "
            f"dimensions ({rows} or {cols}) must be contiguous (row- or column-major)"
        )
    return next((m for m in cands if _tma_ok(t, m)), cands[0])


def _canonical_strides(t: torch.Tensor, major: str) -> torch.Tensor:
    """Size-1 dims may carry any stride in torch; give them the ones the compiled layout assumes
    (unit stride 1, others 16-byte multiples).  A view, never a copy; only for degenerate shapes."""
    unit = t.dim() - 1 if major == "row" else t.dim() - 2
    want = list(t.stride())
    changed = False
    for i, n in enumerate(t.shape):
        if n == 1:
            w = 1 if i == unit else 0
            changed |= want[i] != w
            want[i] = w
    return t.as_strided(t.shape, want) if changed else t


def _check(a, b, out, c, out_dtype, allow_cpu=False):
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _IN_DTYPES:
            raise TypeError(f"gemm: {name} must be float16 or bfloat16, got {t.dtype}")
        if t.dim() not in (2, 3):
            raise ValueError(f"gemm: {name} must be 2-D (M, K)/(K, N) or 3-D batched, got {t.dim()}-D")
    if a.dtype != b.dtype:
        raise TypeError(f"gemm: a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.dim() != b.dim():
        raise ValueError(f"gemm: a is {a.dim()}-D but b is {b.dim()}-D; both 2-D or both 3-D")
    if a.device != b.device or (a.device.type != "cuda" and not allow_cpu):
        raise ValueError(f"gemm: a and b must be on the same CUDA device, got {a.device} and {b.device}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"gemm: a is (.., M, K={a.shape[-1]}) but b is (.., K={b.shape[-2]}, N)")
    if a.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"gemm: batch sizes differ: a {a.shape[0]}, b {b.shape[0]}")
    if out_dtype is not None and out_dtype not in _OUT_DTYPES:
        raise TypeError(f"gemm: out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    shape = (*a.shape[:-1], b.shape[-1])
    if out is not None:
        if tuple(out.shape) != shape:
            raise ValueError(f"gemm: out has shape {tuple(out.shape)}, expected {shape}")
        if out.dtype not in _OUT_DTYPES or (out_dtype is not None and out.dtype != out_dtype):
            raise TypeError(f"gemm: out dtype {out.dtype} does not match out_dtype {out_dtype}")
        if out.device != a.device:
            raise ValueError(f"gemm: out is on {out.device}, a on {a.device}")
    if c is not None:
        if not isinstance(c, torch.Tensor) or c.device != a.device:
            raise ValueError("gemm: c must be a tensor on a's device")
        if tuple(c.shape) != shape:
            raise ValueError(f"gemm: c has shape {tuple(c.shape)}, expected {shape}")
        if c.dtype not in _OUT_DTYPES:
            raise TypeError(f"gemm: c must be float16, bfloat16 or float32, got {c.dtype}")
    return shape


# ---------------------------------------------------------------------------- configuration
def make_gemm_tiles(tile_n: int, cluster: tuple[int, int], ab: str, a_major: str, b_major: str,
                    c_dtype: str, c_major: str = "n", pingpong: bool = False, tile_m: int = 128) -> T.GemmTiles:
    """A tile_m x tile_n x 64 CTA tile over two consumer warpgroups, as many operand stages as fit.

    The epilogue sub-tile spans both warpgroups' rows; it is 64 columns wide for 16-bit outputs (half
    the sub-tiles, so half the epilogue barriers, of a 32-wide one) when that still leaves 4 stages,
    else gcd(32, tile_n) wide (16 for tile_n = 208).
    ``tile_m = 256`` (cooperative only): each warpgroup owns two 64-row M-blocks (rows 64w.. and
    128 + 64w..) of a 256 x tile_n tile, tile_n accumulators per thread (tile_n in 128..208).
    ``pingpong``: each warpgroup owns whole 128 x tile_n tiles (tile_n <= 192: its accumulators must fit
    in registers), one-warpgroup MMA, 64-row epilogue sub-tiles, and one set of epilogue buffers per
    warpgroup.
    """
    from ..common.ring import stage_count

    if tile_m not in (128, 256) or (pingpong and tile_m != 128):
        raise ValueError(f"make_gemm_tiles: tile_m must be 128 or 256 (128 for ping-pong), got {tile_m}")
    smem = current_arch().smem_per_cta
    c_bytes = 4 if c_dtype == "float32" else 2
    per_stage = (tile_m + tile_n) * 64 * 2
    epi_m, wg_mn, bufs = (64, (1, 1), 4) if pingpong else (128, (2, 1), 2)
    epi_n = math.gcd(32, tile_n)
    if c_bytes == 2 and tile_n % 64 == 0:
        s64 = stage_count(smem, per_stage, epi_m * 64 * c_bytes * bufs)
        # ping-pong epilogues overlap the other warpgroup's mainloop: wide sub-tiles only if free
        if s64 >= 4 and (not pingpong or s64 == stage_count(smem, per_stage, epi_m * 32 * c_bytes * bufs)):
            epi_n = 64
    stages = stage_count(smem, per_stage, epi_m * epi_n * c_bytes * bufs)
    mma = T.MmaTile(ab_dtype=ab, atom_n=tile_n, warpgroups_mn=wg_mn, a_major=a_major, b_major=b_major)
    return T.GemmTiles(tile_mnk=(tile_m, tile_n, 64), cluster_mn=cluster, mma=mma, ab_stages=stages,
                       epi_tile_mn=(epi_m, epi_n), epi_stages=2, c_dtype=c_dtype, c_major=c_major,
                       pingpong=pingpong)


def default_tiles(m: int, n: int, k: int, l: int, ab: str, a_major: str, b_major: str,
                  c_dtype: str, c_major: str, pingpong: bool | None = None, stream_tiles: bool = True) -> T.GemmTiles:
    """Shape heuristic.  Pick the tile width whose last wave is fullest, weighting each wave by the
    tile's area and a small efficiency penalty for narrow wgmma (N=128 re-reads A from smem twice as
    often per FLOP as N=256).  Tiny problems that cannot fill the SMs take 128-wide tiles (and split-K).
    ``pingpong`` (default: ``PINGPONG``, env CUTE_KERNELS_PINGPONG=1): ping-pong consumers, whose
    one-warpgroup accumulators allow 192- or 128-wide tiles.
    Large A (:func:`_stream_tiles`, unless ``stream_tiles=False``): 256 x 128 tiles on an N-pair cluster,
    see there, when their waves are as full as the width choice's (never for split-K-sized grids)."""
    sms = current_arch().sm_count
    pingpong = PINGPONG if pingpong is None else pingpong
    best = None
    for tile_n, eff in ((192, 1.0), (128, 0.97)) if pingpong else ((256, 1.0), (192, 0.97), (128, 0.92)):
        n_tiles = math.ceil(m / 128) * math.ceil(n / tile_n) * l
        cost = math.ceil(n_tiles / sms) * tile_n / eff
        if n_tiles * 2 <= sms:  # split-K territory: narrow tiles give more, cheaper slices
            cost = 0 if tile_n == 128 else float("inf")
        if best is None or cost < best[0]:
            best = (cost, tile_n)
    if stream_tiles and not pingpong and _stream_tiles(m, n, k, l, ab):
        # same area as a 128 x 256 tile: take it unless its waves quantize clearly worse than the width
        # choice's.  "Clearly": the width cost ignores the HBM traffic of narrow tiles on these shapes
        # (16384x4400x4096: cost 4608 vs 4552 for 128x192, measured 644 vs 578 TFLOP/s, run 3)
        nt = math.ceil(n / 128)
        n256 = math.ceil(m / 256) * (nt + nt % 2)  # an odd tile count pads its last cluster column
        if n256 * 2 > sms and math.ceil(n256 / sms) * 256 <= 1.05 * best[0]:
            return make_gemm_tiles(128, (1, 2), ab, a_major, b_major, c_dtype, c_major, tile_m=256)
    tile_n = best[1]
    # 2x1 multicast whenever the M tiles pair up: B is loaded once per CTA pair.  Also for small
    # problems: 1000x3000x520 (session 3 run 5 tuner) 128x192 1x1 218 TFLOP/s vs 128x256 2x1 234 and
    # ping-pong 128x192 2x1 237; the old area threshold (M*N >= 2048^2) kept it at 1x1.
    cluster = (2, 1) if math.ceil(m / 128) % 2 == 0 else (1, 1)
    if _a_streams(m, k, ab):
        cluster = (1, 1)  # with the swizzled raster (default_raster): see there
    return make_gemm_tiles(tile_n, cluster, ab, a_major, b_major, c_dtype, c_major, pingpong=pingpong)


#: A (M x K) bytes above which the persistent raster must reuse A through L2 (H100/H200 L2: 50 MB).
A_STREAM_BYTES = 64 << 20


def _a_streams(m: int, k: int, ab: str) -> bool:
    return m * k * (4 if ab == "float32" else 2) >= A_STREAM_BYTES


def _stream_tiles(m: int, n: int, k: int, l: int, ab: str) -> bool:
    """Pure Python: does the A-streaming shape take 256 x 128 tiles, 1x2 cluster, raster swizzle 8?

    Why: these shapes run at the board's power cap, so TFLOP/s follows energy per FLOP, not issue
    rate (session 4, ``bench_power.py``).  ncu on 8192^3 (session 5 runs 1-2,
    ``results/gemm-ncu-2026-11-30-s5.md``): the old 128x256 1x1 swizzle-4 choice read 1.47-1.52 GB
    from HBM and 9.5-9.8 GB from L2 per call; 256x128 with the N-pair cluster (A tile multicast)
    and swizzle 8 read 1.23 GB and 7.6 GB, and ran at a ~3% higher clock under the same cap.
    do_bench (session 5 run 3): 8192^3 677 vs 647 TFLOP/s, 16384x4096x4096 665 vs 656; sustained
    (run 2): 663 vs 649 and 646 vs 635.  On 4096^3 and 4096x14336 (A fits in L2) it was not
    better (671 vs 670, 650 vs 668): those keep the width heuristic.
    An odd count of N tiles (N = 4400: 35) leaves the last cluster column's second CTA on a tile
    entirely out of bounds (TMA zero-fill, clipped stores: 1/36 of the work wasted).  Still taken from
    15 tiles up (<= 1/16 wasted): session 6 run 3, 16384x4400x4096 644 TFLOP/s vs 578 for the width
    heuristic's 128x192 (cuBLAS 691), 8192x8064x8192 688 vs 657 (cuBLAS 687)."""
    nt = math.ceil(n / 128)
    return (l == 1 and _a_streams(m, k, ab) and m >= 2048 and n >= 1024
            and (nt % 2 == 0 or nt >= 15) and ab != "float32")


def default_raster(m: int, n: int, k: int, ab: str, l: int = 1, tiles: T.GemmTiles | None = None) -> tuple[int, bool]:
    """Pure Python: (raster swizzle, along M) of the persistent tile scheduler.

    Along M with swizzle 1, each wave walks whole columns of output tiles, so all of A is re-read from
    HBM for every ~2 columns; once A no longer fits in L2 that traffic shows.  Swizzle 4 walks strips of
    4 tile columns instead, so a wave touches ~1/4 of A and its B columns stay L2-resident.  Measured
    (session 1 run 4 tuner, H200, 128x256 tiles): 8192^3 (A 128 MB) 728 TFLOP/s with (1, 1) cluster +
    swizzle 4 vs 700 with the old (2, 1) + swizzle 1; 16384x4096x4096 662 vs 623 (the tuned bench then
    read 1.00x / 1.02x cuBLAS, against 0.92-0.93x untuned); with A <= 32 MB (4096^3, 4096x14336,
    4097x4096) the two are within 1%, so those keep the old choice.  (With a (2, 1) cluster, swizzle 4
    measured worse, 648: hence the cluster change in :func:`default_tiles`.)  The plan runs the swizzle
    through :func:`fit_swizzle`, so a strip width that does not divide the cluster grid shrinks instead
    of padding it with empty-but-computed units.

    A fitting in L2 with a 2x1 cluster and more than one wave: swizzle 8 along N.  Each wave then covers
    a band of 16 M tiles (2048 rows of A, 16 MB at K = 4096) across ~8 tile columns instead of whole
    tile columns, so B is shared by more of the wave.  ``profiles/l2_model.py`` (within 3% of ncu):
    4096^3 0.149 vs 0.174 GB of HBM reads, 4096x14336 0.503 vs 0.612; never more than swizzle 1 on the
    multi-wave shapes tried (2048..8192 rows, N 4096..28672).  Measured (session 6 run 1, 5 rounds,
    same process): 4096^3 1.01x cuBLAS vs 0.98x for swizzle 1, 4096x14336 0.99x vs 0.97x; later runs
    with it as the default read 0.97-0.99x and 0.99-1.00x (on 4096^3 the gain is within the drift
    between runs; on 4096x14336 it held).  Not with a
    1x1 cluster (odd M-tile counts such as 4097): there the model has swizzle 8 along N reading more
    (4097^3-ish 0.220 vs 0.172 GB)."""
    if tiles is None:
        tiles = default_tiles(m, n, k, l, ab, "k", "mn", "bfloat16", "n", pingpong=False)
    if _stream_tiles(m, n, k, l, ab) and (tiles.tile_mnk[:2], tiles.cluster_mn) == ((256, 128), (1, 2)):
        return (8, True)  # with the 256 x 128 tiles of :func:`_stream_tiles`
    if _a_streams(m, k, ab):
        return (4, True)
    n_tiles = math.ceil(m / tiles.tile_mnk[0]) * math.ceil(n / tiles.tile_mnk[1]) * l
    if tiles.cluster_mn == (2, 1) and n_tiles > current_arch().sm_count:
        return (8, False)  # A fits in L2: the band raster (docstring, last paragraph)
    return (1, True)


def fit_swizzle(swizzle: int, along_m: bool, m: int, n: int, tile_mn: tuple[int, int],
                cluster_mn: tuple[int, int]) -> int:
    """Pure Python: the raster swizzle to run, chosen from swizzle//2..swizzle to pad the fewest units.

    Why: the DSL's persistent scheduler rounds the cluster grid across the raster direction up to whole
    strips of ``swizzle``, and the kernel runs every padding unit as a full mainloop on zero-filled
    tiles.  8192x3000 with 256x128 tiles on a 1x2 cluster has 12 cluster columns: swizzle 8 pads them to
    16 (512 cluster units for 384 real ones, a third more waves); 6 or 4 pad none.  Ties go to the
    wider strip.  A strip is never wider than the grid: with 1 cluster row (M = 256, N = 32000 under the
    band raster) swizzle 4 would schedule 4 units per real one (session 6, found by the planner fuzz
    test in tests/test_plan.py)."""
    # cluster units across the raster direction (tile count, then cluster count, rounded up)
    across = math.ceil(math.ceil(n / tile_mn[1]) / cluster_mn[1]) if along_m else \
        math.ceil(math.ceil(m / tile_mn[0]) / cluster_mn[0])
    swizzle = min(swizzle, max(1, across))
    if swizzle <= 1:
        return 1
    return min(range(max(1, swizzle // 2), swizzle + 1), key=lambda s: (math.ceil(across / s) * s - across, -s))


def _fake_args(cfg, ab_dtype, d_dtype, c_dtype):
    """Fake tensors mirroring the real ones' static facts: rank, which stride is 1, 16-B divisibility."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from .kernel import GemmSm90

    dt = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}
    M, N, K, L = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()

    def mat(dtype, rows, cols, major, tma, vec=None):
        # vec: bytes per vector of the cp.async mainloop (base and non-unit strides are multiples of it)
        align = vec if vec is not None else (16 if tma else dtype.width // 8)
        div = align // (dtype.width // 8)
        s = cute.sym_int(divisibility=div)
        stride = (s, 1) if major == "row" else (1, s)
        shape = (rows, cols)
        if cfg.a_rank == 3:
            shape, stride = (L, *shape), (cute.sym_int(divisibility=div), *stride)
        return make_fake_tensor(dtype, shape, stride, assumed_align=align)

    t = cfg.tiles
    a_major = "row" if t.mma.a_major == "k" else "col"
    b_major = "col" if t.mma.b_major == "k" else "row"
    d_major = "row" if t.c_major == "n" else "col"
    cp = cfg.mainloop == "cpasync"
    a = mat(dt[ab_dtype], M, K, a_major, True, cfg.vec_a if cp else None)
    b = mat(dt[ab_dtype], K, N, b_major, True, cfg.vec_b if cp else None)
    d = mat(dt[d_dtype], M, N, d_major, cfg.tma_store)
    c = mat(dt[c_dtype], M, N, "row", False) if cfg.has_c else mat(dt[d_dtype], M, N, d_major, False)
    if cfg.has_c:  # C may have any strides: both symbolic
        shape = (M, N) if cfg.a_rank == 2 else (L, M, N)
        c = make_fake_tensor(dt[c_dtype], shape, tuple(cute.sym_int() for _ in shape), assumed_align=dt[c_dtype].width // 8)
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)  # torch's current stream at call time
    if cp:
        from .cpasync_kernel import GemmSm90CpAsync

        return GemmSm90CpAsync(cfg), (a, b, d, c, cutlass.Float32(1.0), cutlass.Float32(0.0), stream)
    if cfg.splits > 1:  # split-K in the persistent schedule: + fp32 workspace and int32 counters
        from .kernel import GemmSm90SplitK

        ws = make_fake_tensor(cutlass.Float32, (cute.sym_int(),), (1,), assumed_align=16)
        cnt = make_fake_tensor(cutlass.Int32, (cute.sym_int(),), (1,), assumed_align=4)
        return GemmSm90SplitK(cfg), (a, b, d, c, ws, cnt, cutlass.Float32(1.0), cutlass.Float32(0.0), stream)
    return GemmSm90(cfg), (a, b, d, c, cutlass.Float32(1.0), cutlass.Float32(0.0), stream)


def compiled_gemm(cfg, ab_dtype: str, d_dtype: str, c_dtype: str):
    return jit.get_compiled("gemm_sm90", (cfg, ab_dtype, d_dtype, c_dtype),
                            lambda: _fake_args(cfg, ab_dtype, d_dtype, c_dtype))


def warmup_gemm(m: int, n: int, k: int, *, batch: int | None = None, dtype=torch.bfloat16,
                a_major: str = "row", b_major: str = "row", out_dtype=None, with_c: bool = False) -> None:
    """Compile (or load from disk) exactly what ``gemm`` will run for this problem, without running it.

    Works without a GPU (the operands are empty CPU tensors of the right layout), so a build machine
    can fill ``CUTE_KERNELS_CACHE_DIR`` for a GPU one.  Majors: 'row' or 'col' of the torch-ordered
    a (M, K) and b (K, N).
    """
    dev = "cuda" if torch.cuda.is_available() else "cpu"

    def operand(rows, cols, major):
        lead = (batch,) if batch else ()
        if major == "row":
            return torch.empty((*lead, rows, cols), dtype=dtype, device=dev)
        return torch.empty((*lead, cols, rows), dtype=dtype, device=dev).transpose(-1, -2)

    a, b = operand(m, k, a_major), operand(k, n, b_major)
    c = torch.empty((*((batch,) if batch else ()), m, n), dtype=out_dtype or dtype, device=dev) if with_c else None
    _make_plan(a, b, None, c, 1.0 if with_c else 0.0, out_dtype, allow_cpu=dev == "cpu")


def _warm(spec):
    warmup_gemm(**spec)


jit.register_warmup("gemm", _warm)


# ---------------------------------------------------------------------------- tuned choices on disk
def _tuned_choice(m, n, k, l, ab, am, bm, d_name):
    from .tune import lookup

    return lookup(m, n, k, l, ab, am, bm, d_name)


# ---------------------------------------------------------------------------- split-K
#: "cluster": K slices on the CTAs of one cluster, reduced through DSMEM (gemm_splitk_kernel.py);
#: "workspace": a batched GEMM into fp32 partials + the splitk_reduce kernel; "fixup": S CTAs per
#: tile (no cluster), the last one to finish sums the fp32 partials from a cached workspace
#: (GemmSm90SplitKFixup, splitk_fixup_choice); "persistent": the same fixup inside the persistent
#: kernel's schedule (GemmSm90SplitK: 2x1 multicast clusters, TMA-store epilogue); "auto" (default):
#: persistent where its slices are long, else cluster (auto_splitk_mode).  All deterministic.
SPLITK_MODE = os.environ.get("CUTE_KERNELS_SPLITK", "auto")
#: what the tuner times for a shape the heuristic splits ("none": the unsplit persistent kernel)
SPLITK_MODES = ("cluster", "fixup", "persistent", "none")
FORCE_SPLITS: int | None = None  # set by sweeps to pin the split count
#: Split-K B loads (cluster and fixup kernels) with the L2 evict-first hint (tma.L2_EVICT_FIRST):
#: in a split-K shape B is read once, so its lines should not displace anything.  Measured on the
#: H200 (2026-11-30, session 4 run 2, profiles/bench_l2hint.py, 128x4096x4096, microseconds):
#: do_bench 19.2 -> 18.1, read-only flush 15.4 -> 15.4 (no change, as predicted), and the realistic
#: pipeline (previous layer writes 32 MB, GEMM, next layer reads them) 44.7 -> 38.6 (cuBLAS 44.7):
#: B no longer evicts the activations.  The cost: CUDA-graph replay of the *same* call back to back,
#: where B would otherwise stay in L2, 10.8 -> 13.0.  On by default; CUTE_KERNELS_SPLITK_B_EVICT_FIRST=0
#: turns it off (e.g. a weight small enough to live in L2 and re-read at once).
SPLITK_B_EVICT_FIRST = os.environ.get("CUTE_KERNELS_SPLITK_B_EVICT_FIRST", "1") not in ("0", "")
#: Cluster split-K tile width (64, 128, 192 or 256); None: the measured default (128).  Env
#: CUTE_KERNELS_SPLITK_TILE_N pins it for a process; sweeps set the attribute.
FORCE_SPLITK_TILE_N: int | None = int(os.environ["CUTE_KERNELS_SPLITK_TILE_N"]) if os.environ.get(
    "CUTE_KERNELS_SPLITK_TILE_N") else None
#: Cluster split-K A multicast (1, 2 or 4 CTAs along N per A tile, :func:`splitk_a_mcast`); None: the
#: default below.  Env CUTE_KERNELS_SPLITK_MCAST pins it for a process; sweeps set the attribute.
FORCE_SPLITK_MCAST: int | None = int(os.environ["CUTE_KERNELS_SPLITK_MCAST"]) if os.environ.get(
    "CUTE_KERNELS_SPLITK_MCAST") else None
#: Measured off (H200, session 8 runs 1-4, 128x4096x4096, paired vs cuBLAS): halving A's L2 reads
#: changed nothing at equal CTA count (fixup 64-wide S=2: 20.7 us without, 21.4 with 2-way multicast;
#: read-only flush 18.4 / 19.9), and clusters of 4 / 8 only fit 30 / 15 at once (cluster_occupancy.py),
#: so 128 CTAs in clusters of 4 ran in two waves (25 us).  ncu: cuBLAS and ours both sit at ~2.5 TB/s
#: of DRAM with SMs active 77% of a 14 us call -- ramp and latency, not L2 bandwidth.
SPLITK_MCAST_DEFAULT = 1
#: The predicated cp.async mainloop (gemm_cpasync_kernel.py) for operands TMA cannot describe.  Its
#: first H200 run hung (the shared mainloop lost its pipeline states between persistent tiles, fixed in
#: wgmma.wgmma_mainloop); it passed tests/test_gemm_cpasync.py on the H200 on 2026-11-29 (session 2,
#: run 1) and is on by default.  CUTE_KERNELS_CPASYNC=0 turns it off (such operands then raise).
CPASYNC_ENABLED = os.environ.get("CUTE_KERNELS_CPASYNC", "1") not in ("0", "")
#: Ping-pong consumer warpgroups (GemmTiles.pingpong, gemm_kernel.GemmSm90.consumer_pingpong) for the
#: heuristic's tiles; off by default until measured.  Tuned choices on disk are cooperative, so they
#: are skipped while this is on.
PINGPONG = os.environ.get("CUTE_KERNELS_PINGPONG", "0") not in ("0", "")
#: The deferred epilogue (gemm_kernel.GemmConfig.epi_defer) wherever :func:`epi_defer_default` allows;
#: CUTE_KERNELS_EPI_DEFER=0 turns it off.
EPI_DEFER = os.environ.get("CUTE_KERNELS_EPI_DEFER", "1") not in ("0", "")


#: slices of at least this many 64-deep k-tiles go to the persistent split-K (see auto_splitk_mode)
AUTO_PERSISTENT_MIN_SLICE_KTILES = 32
#: The persistent split-K as stream-K (gemm_kernel.GemmConfig.stream_k): every cluster slot gets work,
#: in chunks of one budget.  CUTE_KERNELS_STREAM_K=1 turns it on.
STREAM_K = os.environ.get("CUTE_KERNELS_STREAM_K", "0") not in ("0", "")


def stream_k_chunks(tiles: int, k_tiles: int, clusters: int) -> int:
    """Pure Python: workspace slots per tile of the stream-K persistent kernel = chunks per tile: full
    chunks of the per-cluster budget ceil(tiles x k_tiles / clusters) plus a tail (gemm_kernel
    ``GemmSm90.stream_k_units``)."""
    budget = -(-tiles * k_tiles // clusters)
    return k_tiles // budget + (1 if k_tiles % budget else 0)


def auto_splitk_mode(m: int, n: int, k: int, l: int = 1, out_row_major: bool = True) -> str:
    """Pure Python: the split-K mode "auto" resolves to.

    Measured on the H200 (2026-11-30, session 4 run 1, do_bench, same process): 1024x1024x32768
    persistent 668 TFLOP/s (0.94x cuBLAS) vs cluster 571 (0.81x) and fixup 615; 128x4096x4096
    cluster 221 (0.97x) vs persistent 132 and fixup 106.  The persistent kernel's S partial tiles
    (S <= 8, 128x256) pay off once each slice streams long (128 k-tiles there); with 8 k-tiles per
    slice (128x4096x4096 -> S=8) the fixup dominates and the cluster pair (DSMEM reduction) wins.
    The threshold (32 k-tiles) lies between the two measured points.  The persistent kernel needs an
    unbatched problem and a row-major output; anything else takes the cluster kernel.
    """
    if l != 1 or not out_row_major:
        return "cluster"
    s = splitk_fixup_choice(m, n, k)[1]
    return "persistent" if s > 1 and math.ceil(k / 64) // s >= AUTO_PERSISTENT_MIN_SLICE_KTILES else "cluster"


def split_k_factor(m: int, n: int, k: int, l: int, tiles: T.GemmTiles, mode: str | None = None) -> int:
    """Pure Python: how many K slices make the output tiles fill the SMs (1: no split).

    Only when the tiles cannot fill half the SMs and each slice keeps >= 8 k-tiles to stream.  The
    cluster mode needs 128x128 tiles, a power-of-two slice count <= 8, no batch, and takes K tails
    (TMA zero-fills past K); the workspace mode needs whole k-tiles per slice (K % (64 * S) == 0).
    """
    mode = mode or SPLITK_MODE
    if mode == "auto":
        mode = auto_splitk_mode(m, n, k, l)
    if FORCE_SPLITS is not None:  # benchmarks / sweeps
        return FORCE_SPLITS
    if mode == "none":  # the tuner's unsplit candidate
        return 1
    sms = current_arch().sm_count
    tm, tn, tk = tiles.tile_mnk
    if mode == "cluster" and FORCE_SPLITK_TILE_N is not None:
        tn = FORCE_SPLITK_TILE_N
    n_tiles = math.ceil(m / tm) * math.ceil(n / tn) * l
    if l != 1 or n_tiles * 2 > sms:
        return 1
    k_tiles = math.ceil(k / tk)
    best = 1
    if mode == "cluster":
        if tm != 128 or tn not in (64, 128, 192, 256) or (tn != 128 and FORCE_SPLITK_TILE_N is None):
            return 1
        tn = FORCE_SPLITK_TILE_N or splitk_tile_n(m, n)
        n_tiles = math.ceil(m / tm) * math.ceil(n / tn)
        # measured (session 2 run 3, 128x4096x4096, cuBLAS 17.8-19.2 us): pairs of 64-wide tiles
        # 19.4 us, pairs of 128-wide 20.6, no split 22.0 (64-wide) / 26.7 (128-wide), clusters of 4
        # 26.5-32.2, of 8 44.4: clusters of 4-8 CTAs schedule worse than pairs, so only pairs are used.
        return 2 if k_tiles >= 16 and n_tiles * 2 <= sms else 1
    if mode in ("fixup", "persistent"):
        return splitk_fixup_choice(m, n, k)[1]
    for s in range(2, 17):
        if k % (tk * s) == 0 and k // s >= 8 * tk and n_tiles * s <= sms:
            best = s
    return best


def splitk_tile_n(m: int, n: int) -> int:
    """Pure Python: tile width of the cluster split-K kernel.  64-wide tiles when pairs of them still
    fit the SMs (twice the CTAs streaming B: 128x4096x4096 19.4 us vs 20.6 us with 128-wide pairs,
    session 2 run 3), else 128-wide (1024x1024x32768: 128-wide pairs 117 us, the best cluster variant)."""
    if FORCE_SPLITK_TILE_N is not None:
        return FORCE_SPLITK_TILE_N
    return 64 if math.ceil(m / 128) * math.ceil(n / 64) * 2 <= current_arch().sm_count else 128


def splitk_fixup_choice(m: int, n: int, k: int) -> tuple[int, int]:
    """Pure Python: (tile_n, splits) of the fixup split-K (CUTE_KERNELS_SPLITK=fixup).  The most CTAs
    up to one per SM, slices of >= 8 k-tiles, S <= 8; ties go to 256-wide tiles (the most efficient
    wgmma per SM).  FORCE_SPLITK_TILE_N (128 or 256) pins the width.  1024x1024x32768 -> 256 x S=4
    (128 CTAs, 128 k-tiles each); 128x4096x4096 -> 256 x S=8 (8 k-tiles each).  Measured (session 4 run 1):
    1024x1024x32768 615 TFLOP/s (the persistent split-K with the same split: 668), 128x4096x4096 106."""
    from .splitk_kernel import FIXUP_TILE_NS

    sms = current_arch().sm_count
    k_tiles = math.ceil(k / 64)
    best = None
    for tn in (FORCE_SPLITK_TILE_N,) if FORCE_SPLITK_TILE_N in FIXUP_TILE_NS else (256, 128):
        n_tiles = math.ceil(m / 128) * math.ceil(n / tn)
        s = max(1, min(8, sms // n_tiles, k_tiles // 8))
        if best is None or n_tiles * s > best[0]:
            best = (n_tiles * s, tn, s)
    return best[1], best[2]


def splitk_tiles(tile_n: int, ab: str, a_major: str, b_major: str, d_dtype: str, a_mcast: int = 1) -> T.GemmTiles:
    """Tiles of the cluster split-K kernel: 128 x tile_n x 64, two consumer warpgroups, and as many
    operand stages as fit (it has no epilogue buffer: the fp32 reduction tile reuses the stages).
    Each CTA streams only 16-64 k-tiles, so the deeper ring mostly shortens the pipeline fill.
    ``a_mcast``: CTAs along N that share each A tile (cluster 1 x a_mcast, see :func:`splitk_a_mcast`)."""
    from ..common.ring import stage_count
    from .splitk_kernel import stage_bytes

    # narrow tiles (the swapped skinny GEMM) are pure streaming: up to 12 stages of 18-20 KB in flight
    stages = stage_count(current_arch().smem_per_cta, stage_bytes(tile_n), 0, max_stages=12 if tile_n <= 32 else 10)
    mma = T.MmaTile(ab_dtype=ab, atom_n=tile_n, warpgroups_mn=(2, 1), a_major=a_major, b_major=b_major)
    return T.GemmTiles(tile_mnk=(128, tile_n, 64), cluster_mn=(1, a_mcast), mma=mma, ab_stages=stages,
                       epi_tile_mn=(128, min(64, tile_n)), epi_stages=1, c_dtype=d_dtype, c_major="n")


def splitk_a_mcast(m: int, n: int, tile_n: int, splits: int) -> int:
    """Pure Python: how many CTAs along N share each A tile in the cluster split-K kernel (TMA multicast).

    Why: with one 128-row M tile every one of the N/tile_n column CTAs reads the same A slice, so L2
    serves A (N/tile_n) times: 128x4096x4096 with 64-wide pairs moves 64 MB of A and 32 MB of B from L2
    to the SMs for 33 MB of HBM traffic.  Multicast to c CTAs divides the A share by c.
    ``FORCE_SPLITK_MCAST`` (env CUTE_KERNELS_SPLITK_MCAST) pins it; the cluster (splits x c) stays <= 8
    CTAs, and c <= the number of N tiles."""
    n_tiles = math.ceil(n / tile_n)
    c = FORCE_SPLITK_MCAST if FORCE_SPLITK_MCAST is not None else SPLITK_MCAST_DEFAULT
    while c > 1 and (splits * c > 8 or c > n_tiles):
        c //= 2
    return c


#: Skinny problems (M <= SKINNY_SWAP_MAX_M rows, unbatched) run transposed: out^T = b^T a^T.  Why: the
#: kernels' A tile has 128 rows; with M = 1..64 most of every A box lies past M, and the TMA unit's
#: zero fill of those rows costs as if they were read (H200, session 8 run 5, paired A/B vs cuBLAS:
#: 1x4096x4096 25.6 us, 16x 24.8, 64x 21.5, but 128x4096x4096 18.4).  Swapped, the weight b streams
#: as the 128-row A tile and M becomes a 16 / 32 / 64-wide N tile.  CUTE_KERNELS_SKINNY_SWAP=0 turns it off.
SKINNY_SWAP = os.environ.get("CUTE_KERNELS_SKINNY_SWAP", "1") not in ("0", "")
SKINNY_SWAP_MAX_M = 64
#: 32 < M <= 64: the weight tile goes to two 32-wide CTAs at once (a 1 x 2 cluster, TMA multicast)
#: instead of one 64-wide CTA, so twice the SMs stream the weight while L2 serves it once.  cuBLAS's
#: M = 64 kernel does the same (ncu, session 9 run 4: 64 x 32 tiles in 1 x 2 clusters, 128 CTAs, no
#: split).  Paired vs cuBLAS (run 5): 64x4096x4096 1.003x (64-wide DSMEM pairs: 0.946x),
#: 48x4096x4096 1.105x (1.062x), 64x4096x11008 with S = 2 1.214x (1.153x); not where the pairs alone
#: pass one wave (64x14336x4096: 0.996x vs 1.042x), which keeps the 64-wide tile.
#: CUTE_KERNELS_SKINNY_MCAST=0 turns it off.
SKINNY_MCAST = os.environ.get("CUTE_KERNELS_SKINNY_MCAST", "1") not in ("0", "")
#: K slices of the multicast pairs stay >= 64 k-tiles: 64x4096x4096 one slice 1.003x vs two 0.989x,
#: 64x4096x11008 two 1.214x vs one 1.179x (run 5)
SKINNY_MCAST_MIN_SLICE_KTILES = 64
#: The pairs take C / an fp32 output only when this is set (their GPU test,
#: test_gemm_skinny_pairs_alpha_beta, had not run yet at the end of session 9); else those keep the
#: 64-wide plan.
SKINNY_PAIRS_ANY_EPILOGUE = False


class SkinnySwap(NamedTuple):
    """The transposed skinny plan: N tile width (holding the problem's M), K slices, and the CTAs along
    N that share each weight tile by multicast (1 or 2)."""
    tile_n: int
    splits: int
    mcast: int = 1

    @property
    def fixup(self) -> bool:
        """Slices meet in an L2 workspace (fixup kernel) rather than a cluster's shared memory: beyond
        two, or two with the weight multicast too (clusters of 4 do not all fit at once)."""
        return self.splits > 2 or (self.splits > 1 and self.mcast > 1)


def skinny_swap_choice(m: int, n: int, k: int, mcast: bool = True) -> SkinnySwap | None:
    """Pure Python: the swapped skinny GEMM's (tile width, K slices, weight multicast), or None when it
    does not apply.

    The kernel's N tile is the narrowest of 16 / 32 / 64 that holds M; its 128-row tiles run along the
    problem's N, and K is split so that tiles x slices fill the SMs (slices of >= 8 k-tiles, <= 8).
    One or two slices meet in a cluster's shared memory (the DSMEM kernel), more in an L2 workspace
    (the fixup kernel: clusters of 3+ CTAs do not all fit at once, session 8 run 3); 64-wide tiles
    with short slices take at most two (measured below).  32 < M <= 64 takes two 32-wide tiles
    sharing the weight by multicast where those pairs fit in one wave (``SKINNY_MCAST``; ``mcast``
    False: not for this call -- the planner passes False with C or an fp32 output, which the pairs
    have not been GPU-tested with)."""
    if not SKINNY_SWAP or m > SKINNY_SWAP_MAX_M:
        return None
    sms = current_arch().sm_count
    tiles = math.ceil(n / 128)
    k_tiles = math.ceil(k / 64)
    if SKINNY_MCAST and mcast and m > 32 and 2 * tiles <= sms:
        return SkinnySwap(32, max(1, min(8, sms // (2 * tiles), k_tiles // SKINNY_MCAST_MIN_SLICE_KTILES)), 2)
    tn = next(t for t in (16, 32, 64) if t >= m)
    s = max(1, min(8, sms // tiles, k_tiles // 8))
    if tn == 64 and k_tiles // s < AUTO_PERSISTENT_MIN_SLICE_KTILES:
        # short slices of 64-wide partials (32 KB fp32 per CTA) cost more through the L2 workspace than
        # the extra CTAs gain: 64x4096x4096 S=2 (DSMEM pairs, 64 CTAs) 0.974x cuBLAS vs S=4 (fixup, 16
        # k-tiles per slice) 0.903x, 48x4096x4096 1.065x vs 1.017x (session 8 run 8, paired); with
        # long slices the fixup is amortised (64x4096x11008, 43 k-tiles per slice: S=4 1.136x, run 6).
        # 16/32-wide ones keep the split that fills the SMs.
        s = min(s, 2)
    return SkinnySwap(tn, s)


class SwappedLauncher:
    """Calls a kernel compiled for the transposed problem: (a, b, d, c) -> (b^T, a^T, d^T, c^T), all views."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, a, b, d, c, alpha, beta):
        self.fn(b.mT, a.mT, d.mT, c.mT, alpha, beta)


def _skinny_swapped_fn(choice, m, n, ab, am_t, bm_t, d_name, c_name, has_c, fixup: bool | None = None):
    """The plan's callable for a :class:`SkinnySwap` (or ``(tile_n, splits[, mcast])``): majors ``am_t``
    / ``bm_t`` are those of b^T and a^T; the output is written through the transposed view with
    element stores.  One or two slices meet in the DSMEM cluster kernel, unless the weight is also
    multicast (a cluster of slices x pairs > 2 would not all fit) or ``fixup`` (benchmarks) says so."""
    from .splitk_kernel import SplitKClusterConfig, SplitKFixupConfig, fixup_workspace_numel

    choice = SkinnySwap(*choice)
    tn, s, c = choice
    tiles = splitk_tiles(tn, ab, am_t, bm_t, d_name, c)
    if not (choice.fixup if fixup is None else fixup):
        cfg = SplitKClusterConfig(tiles=tiles, splits=s, has_c=has_c, a_evict_first=SPLITK_B_EVICT_FIRST)
        return SwappedLauncher(compiled_splitk_cluster(cfg, ab, d_name, c_name))
    cfg = SplitKFixupConfig(tiles=tiles, splits=s, has_c=has_c, a_evict_first=SPLITK_B_EVICT_FIRST)
    fn = compiled_splitk_fixup(cfg, ab, d_name, c_name)
    return SwappedLauncher(SplitKFixupLauncher(fn, *fixup_workspace_numel(n, m, tn, s)))


def splitk_vec_store_ok(out: torch.Tensor) -> bool:
    """Pure Python: D row-major with 16-byte aligned base and rows (the cluster kernel's vector stores)."""
    return (out.dim() == 2 and out.stride(1) == 1 and out.stride(0) % 8 == 0 and out.data_ptr() % 16 == 0)


def compiled_splitk_cluster(cfg, ab_dtype: str, d_dtype: str, c_dtype: str):
    return jit.get_compiled("gemm_sm90_splitk_cluster", (cfg, ab_dtype, d_dtype, c_dtype),
                            lambda: _fake_args_splitk(cfg, ab_dtype, d_dtype, c_dtype))


def compiled_splitk_fixup(cfg, ab_dtype: str, d_dtype: str, c_dtype: str):
    """The fixup split-K kernel (gemm_splitk_kernel.GemmSm90SplitKFixup): fn(a, b, d, c, ws, cnt, alpha, beta)."""
    return jit.get_compiled("gemm_sm90_splitk_fixup", (cfg, ab_dtype, d_dtype, c_dtype),
                            lambda: _fake_args_splitk(cfg, ab_dtype, d_dtype, c_dtype))


class SplitKFixupLauncher:
    """The plan's callable for the fixup split-K: ``(a, b, d, c, alpha, beta)`` like the other kernels,
    adding the workspace (fp32 partials + int32 counters), cached here per (device, stream): the kernel
    leaves the counters at 0 and launches on one stream are ordered.  While a CUDA graph is captured a
    fresh pair is allocated (its counters' zeroing is captured as a memset)."""

    def __init__(self, fn, ws_numel: int, n_counters: int):
        self.fn, self.ws_numel, self.n_counters, self.cache = fn, ws_numel, n_counters, {}

    def workspace(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.cuda.is_current_stream_capturing():
            return (torch.empty(self.ws_numel, dtype=torch.float32, device=device),
                    torch.zeros(self.n_counters, dtype=torch.int32, device=device))
        key = (device, torch.cuda.current_stream(device).cuda_stream)
        buf = self.cache.get(key)
        if buf is None:
            buf = self.cache[key] = (torch.empty(self.ws_numel, dtype=torch.float32, device=device),
                                     torch.zeros(self.n_counters, dtype=torch.int32, device=device))
        return buf

    def __call__(self, a, b, d, c, alpha, beta):
        ws, cnt = self.workspace(a.device)
        self.fn(a, b, d, c, ws, cnt, alpha, beta)


def _fake_args_splitk(cfg, ab_dtype, d_dtype, c_dtype):
    """A/B as for the TMA GEMM (16-byte strides); D and C with any strides (stored element-wise).
    The fixup kernel also takes its fp32 workspace and int32 counters (1-D, 16-byte aligned)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from .splitk_kernel import GemmSm90SplitKCluster, GemmSm90SplitKFixup, SplitKFixupConfig

    dt = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}
    M, N, K = cute.sym_int(), cute.sym_int(), cute.sym_int()
    t = cfg.tiles
    s_ = lambda: cute.sym_int(divisibility=8)  # noqa: E731
    a = make_fake_tensor(dt[ab_dtype], (M, K), (s_(), 1) if t.mma.a_major == "k" else (1, s_()), assumed_align=16)
    b = make_fake_tensor(dt[ab_dtype], (K, N), (1, s_()) if t.mma.b_major == "k" else (s_(), 1), assumed_align=16)
    if getattr(cfg, "vec_store", False):  # row-major, 16-byte aligned rows (splitk_vec_store_ok)
        d = make_fake_tensor(dt[d_dtype], (M, N), (s_(), 1), assumed_align=16)
    else:
        d = make_fake_tensor(dt[d_dtype], (M, N), (cute.sym_int(), cute.sym_int()), assumed_align=dt[d_dtype].width // 8)
    c = make_fake_tensor(dt[c_dtype], (M, N), (cute.sym_int(), cute.sym_int()), assumed_align=dt[c_dtype].width // 8)
    if isinstance(cfg, SplitKFixupConfig):
        ws = make_fake_tensor(cutlass.Float32, (cute.sym_int(),), (1,), assumed_align=16)
        cnt = make_fake_tensor(cutlass.Int32, (cute.sym_int(),), (1,), assumed_align=4)
        return GemmSm90SplitKFixup(cfg), (a, b, d, c, ws, cnt, cutlass.Float32(1.0), cutlass.Float32(0.0),
                                          make_fake_stream(use_tvm_ffi_env_stream=True))
    return GemmSm90SplitKCluster(cfg), (a, b, d, c, cutlass.Float32(1.0), cutlass.Float32(0.0),
                                       make_fake_stream(use_tvm_ffi_env_stream=True))


# ---------------------------------------------------------------------------- public entry
class _Plan:
    """Everything decided for one (shapes, strides, dtypes, alignment) signature: reused per call."""

    __slots__ = ("fn", "shape", "out_dtype", "splits", "reduce_fn", "a_fix", "b_fix", "d_fix", "has_c", "k0",
                 "swapped")


_plans: dict[tuple, _Plan] = {}


def _signature(a, b, out, c, beta, out_dtype):
    ptr_bits = (a.data_ptr() | b.data_ptr() | (out.data_ptr() if out is not None else 0)) & 15
    return (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, out_dtype, ptr_bits,
            None if out is None else (out.shape, out.stride(), out.dtype, out.device),
            None if c is None else (c.shape, c.stride(), c.dtype, c.device), beta != 0.0)


def _make_plan(a, b, out, c, beta, out_dtype, tiles=None, raster=None, allow_cpu=False,
               splitk_mode: str | None = None, options: tuple = ()) -> _Plan:
    """``splitk_mode``: one of SPLITK_MODES (the tuner's candidates; a tuned entry can carry one too)
    or "swap" (the transposed skinny plan, :func:`skinny_swap_choice`), else ``SPLITK_MODE``.
    ``options``: ``(GemmConfig field, value)`` pairs applied to the persistent kernel's config
    (benchmarks compare kernel variants in one process, e.g. ``(("pdl", False),)``)."""
    from .kernel import GemmConfig

    shape = _check(a, b, out, c, out_dtype, allow_cpu)
    if beta != 0.0 and c is None:
        raise ValueError("gemm: beta != 0 needs c")
    p = _Plan()
    p.shape, p.has_c, p.splits, p.reduce_fn, p.fn = shape, c is not None and beta != 0.0, 1, None, None
    p.swapped = False
    heuristic = tiles is None and not options  # the planner's own choice (not forced by a caller or a tuned entry)
    p.out_dtype = out.dtype if out is not None else (out_dtype or a.dtype)
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    l = a.shape[0] if a.dim() == 3 else 1
    p.k0 = k == 0 or m == 0 or n == 0
    if p.k0:
        return p
    a_major = _major(a, "a", "M", "K")
    b_major = _major(b, "b", "K", "N")
    # canonical-stride fixes are views; remember whether this signature needs them
    p.a_fix = a_major if _canonical_strides(a, a_major) is not a else None
    p.b_fix = b_major if _canonical_strides(b, b_major) is not b else None
    cp_async = None
    if not (_tma_ok(a, a_major) and _tma_ok(b, b_major)):
        # TMA cannot describe A or B: predicated cp.async mainloop, reading them where they are (no
        # copy).  Vector width per operand from the strides, the contiguous extent and the pointers'
        # low bits; those bits are OR-ed over a, b and out as in the plan signature, so every call that
        # reuses this plan is at least as aligned.  (1, 1) cluster, no tuned tiles, no split-K.
        if not CPASYNC_ENABLED:
            raise ValueError(
                "gemm: TMA needs 16-byte aligned data pointers and leading dimensions that are multiples "
                f"of 8 elements (a strides {tuple(a.stride())}, b strides {tuple(b.stride())}), and the "
                "cp.async mainloop for such operands is disabled (CUTE_KERNELS_CPASYNC=0)"
            )
        from .cpasync_kernel import choose_vec_bytes

        ptr_bits = (a.data_ptr() | b.data_ptr() | (out.data_ptr() if out is not None else 0)) & 15
        es = a.element_size()
        cp_async = dict(
            mainloop="cpasync",
            vec_a=choose_vec_bytes(ptr_bits, a.shape, a.stride(), es, a.dim() - (1 if a_major == "row" else 2)),
            vec_b=choose_vec_bytes(ptr_bits, b.shape, b.stride(), es, b.dim() - (1 if b_major == "row" else 2)),
        )
    ab = _TORCH_TO_NAME[a.dtype]
    d_name = _TORCH_TO_NAME[p.out_dtype]
    am, bm = ("k" if a_major == "row" else "mn"), ("mn" if b_major == "row" else "k")
    if tiles is None and cp_async is not None:
        tiles = default_tiles(m, n, k, l, ab, am, bm, d_name, "n", pingpong=False, stream_tiles=False)
    if tiles is None:
        tuned = None if PINGPONG else _tuned_choice(m, n, k, l, ab, am, bm, d_name)
        if tuned is not None:
            tiles, raster, tuned_mode = tuned
            splitk_mode = splitk_mode or tuned_mode
            heuristic = False
        if tiles is None:
            tiles = default_tiles(m, n, k, l, ab, am, bm, d_name, "n")
    mode = splitk_mode or SPLITK_MODE
    # the output as the kernels will see it (its strides pick the epilogue); allocated once per plan
    probe = out if out is not None else torch.empty(shape, dtype=p.out_dtype, device=a.device)
    if mode in ("auto", "persistent"):  # the persistent split-K needs an unbatched, row-major output
        row_ok = _major(probe, "out", "M", "N") == "row" and _canonical_strides(probe, "row") is probe
        mode = auto_splitk_mode(m, n, k, l, row_ok and a.dim() == 2) if mode == "auto" else (
            mode if row_ok and a.dim() == 2 else "cluster")
    # the transposed skinny plan: the planner's default, or a tuned entry's choice (split-K mode "swap")
    pairs_ok = SKINNY_PAIRS_ANY_EPILOGUE or (not p.has_c and p.out_dtype in (torch.float16, torch.bfloat16))
    sw = skinny_swap_choice(m, n, k, pairs_ok) if (cp_async is None and a.dim() == 2 and (
        (heuristic and mode != "none" and splitk_mode is None) or mode == "swap")) else None
    if mode == "swap" and sw is None:  # a tuned "swap" that no longer applies (e.g. SKINNY_SWAP=0)
        mode = "cluster"
    if sw is not None:  # out^T = b^T a^T: the problem's M becomes the kernel's narrow N
        p.fn = _skinny_swapped_fn(sw, m, n, ab, "mn" if b_major == "row" else "k", "k" if a_major == "row" else "mn",
                                  d_name, _TORCH_TO_NAME[c.dtype] if p.has_c else d_name, p.has_c)
        p.splits, p.d_fix, p.swapped = 1, None, True
        return p
    if cp_async is not None:
        from .cpasync_kernel import cpasync_tiles

        tiles = cpasync_tiles(tiles)
    raster = raster or default_raster(m, n, k, ab, l, tiles)  # for the tiles that run (cp.async: 1x1)
    p.splits = split_k_factor(m, n, k, l, tiles, mode) if cp_async is None else 1
    if p.splits > 1 and mode == "cluster":
        from .splitk_kernel import SplitKClusterConfig

        tn = splitk_tile_n(m, n)
        scfg = SplitKClusterConfig(tiles=splitk_tiles(tn, ab, am, bm, d_name, splitk_a_mcast(m, n, tn, p.splits)),
                                   splits=p.splits, a_rank=2, has_c=p.has_c, vec_store=splitk_vec_store_ok(probe),
                                   b_evict_first=SPLITK_B_EVICT_FIRST)
        p.fn = compiled_splitk_cluster(scfg, ab, d_name, _TORCH_TO_NAME[c.dtype] if p.has_c else d_name)
        p.splits, p.d_fix = 1, None  # one launch, D written directly with any strides
        return p
    if p.splits > 1 and mode == "fixup" and a.dim() == 2:
        from .splitk_kernel import SplitKFixupConfig, fixup_workspace_numel

        tn = splitk_fixup_choice(m, n, k)[0]
        fcfg = SplitKFixupConfig(tiles=splitk_tiles(tn, ab, am, bm, d_name), splits=p.splits, a_rank=2, has_c=p.has_c,
                                 b_evict_first=SPLITK_B_EVICT_FIRST)
        fn = compiled_splitk_fixup(fcfg, ab, d_name, _TORCH_TO_NAME[c.dtype] if p.has_c else d_name)
        p.fn = SplitKFixupLauncher(fn, *fixup_workspace_numel(m, n, tn, p.splits))
        p.splits, p.d_fix = 1, None  # one launch, D written directly with any strides
        return p
    if p.splits > 1 and mode == "persistent":  # (a unbatched, out row-major: checked above)
        tn = splitk_fixup_choice(m, n, k)[0]
        cl = (2, 1) if math.ceil(m / 128) % 2 == 0 else (1, 1)
        n_tiles = math.ceil(m / 128) * math.ceil(n / tn)
        clusters, k_tiles = current_arch().sm_count // cl[0], math.ceil(k / 64)
        total = n_tiles // cl[0] * k_tiles  # stream-K iterations: >= 1 per cluster, int32 in the kernel
        stream_k = dict(options).get("stream_k", STREAM_K) and clusters <= total < 2**31
        cfg = GemmConfig(tiles=make_gemm_tiles(tn, cl, ab, am, bm, d_name), a_rank=2, has_c=p.has_c,
                         tma_store=_tma_ok(probe, "row"), max_active_clusters=clusters,
                         splits=p.splits, **{**dict(options), "stream_k": stream_k})
        fn = compiled_gemm(cfg, ab, d_name, _TORCH_TO_NAME[c.dtype] if p.has_c else d_name)
        slots = stream_k_chunks(n_tiles // cl[0], k_tiles, clusters) if stream_k else p.splits  # per output tile
        p.fn = SplitKFixupLauncher(fn, n_tiles * slots * 128 * tn, n_tiles)
        p.splits, p.d_fix = 1, None
        return p
    if p.splits > 1:
        # partials: a batched GEMM over K slices into an fp32 (S, M, N) workspace, then one reduce
        tiles = make_gemm_tiles(tiles.tile_mnk[1], tiles.cluster_mn, ab, am, bm, "float32")
        cfg = GemmConfig(tiles=tiles, a_rank=3, has_c=False, tma_store=True,
                         raster_swizzle=fit_swizzle(raster[0], raster[1], m, n, tiles.tile_mnk[:2], tiles.cluster_mn),
                         raster_along_m=raster[1], max_active_clusters=current_arch().sm_count // (tiles.cluster_mn[0] * tiles.cluster_mn[1]))
        p.fn = compiled_gemm(cfg, ab, "float32", "float32")
        from .splitk_reduce import compiled_reduce

        p.reduce_fn = compiled_reduce(d_name, _TORCH_TO_NAME[c.dtype] if p.has_c else None)
        p.d_fix = None
        return p
    d_major = _major(probe, "out", "M", "N")
    p.d_fix = d_major if _canonical_strides(probe, d_major) is not probe else None
    if tiles.pingpong and p.has_c and tiles.tile_mnk[1] > 128:  # C's registers: 192 wide spills
        tiles = make_gemm_tiles(128, tiles.cluster_mn, ab, am, bm, tiles.c_dtype, tiles.c_major, pingpong=True)
    if tiles.tile_mnk[0] == 256 and p.has_c and tiles.tile_mnk[1] == 192:  # 24 B spill with C at 232 regs
        tiles = make_gemm_tiles(160, tiles.cluster_mn, ab, am, bm, tiles.c_dtype, tiles.c_major, tile_m=256)
    if d_major == "col":
        tiles = make_gemm_tiles(tiles.tile_mnk[1], tiles.cluster_mn, ab, am, bm, d_name, "m",
                                pingpong=tiles.pingpong, tile_m=tiles.tile_mnk[0])
    cfg = GemmConfig(
        tiles=tiles, a_rank=a.dim(), has_c=p.has_c, tma_store=_tma_ok(probe, d_major),
        raster_swizzle=fit_swizzle(raster[0], raster[1], m, n, tiles.tile_mnk[:2], tiles.cluster_mn),
        raster_along_m=raster[1],
        max_active_clusters=current_arch().sm_count // (tiles.cluster_mn[0] * tiles.cluster_mn[1]),
        **(cp_async or {}),
    )
    # options (benchmarks, tests) first; the deferred epilogue's default then sees the final config,
    # unless the options set it themselves
    # (stream_k belongs to the persistent split-K only: an unsplit plan ignores it)
    cfg = dataclasses.replace(cfg, **{k_: v for k_, v in options if k_ != "stream_k"})
    if "epi_defer" not in dict(options):
        cfg = dataclasses.replace(cfg, epi_defer=EPI_DEFER and epi_defer_default(cfg, m, n, l))
    p.fn = compiled_gemm(cfg, ab, d_name, _TORCH_TO_NAME[c.dtype] if p.has_c else d_name)
    return p


def epi_defer_default(cfg, m: int, n: int, l: int) -> bool:
    """Pure Python: the deferred epilogue where it can run (``gemm_kernel.epi_defer_ok``) and some CTA
    gets more than one tile, i.e. there is a next mainloop to hide the stores under.  Measured (session
    7 run 2, paired A/B under do_bench's flush, vs cuBLAS): 4096^3 1.012x vs 0.997x without it,
    4096x14336x4096 1.014x vs 0.986x, 16384x4096x4096 1.037x vs 1.017x, 8192^3 1.031x vs 1.021x,
    8192x8192x1024 1.068x vs 1.000x; one-wave shapes unchanged (1000x3000x520, 2048^3)."""
    from .kernel import epi_defer_ok

    tm, tn, _ = cfg.tiles.tile_mnk
    return epi_defer_ok(cfg) and math.ceil(m / tm) * math.ceil(n / tn) * l > current_arch().sm_count


def explain(m: int, n: int, k: int, *, batch: int | None = None, dtype=torch.bfloat16, a_major: str = "row",
            b_major: str = "row", out_dtype=None, with_c: bool = False) -> list[dict]:
    """What ``gemm`` would run for this problem, on any machine: no GPU, nothing compiled.

    Runs the real planning code (:func:`_make_plan`: heuristics, tuned entries on disk, split-K mode,
    raster fit) on meta tensors under :class:`jit.dry_run`, and returns one dict per kernel the call
    would launch: its name, its full compile configuration, and for the GEMM kernels the derived
    facts a person asks first (tile, cluster, stages, raster as run, work units per SM).  Operands are
    taken 16-byte aligned; ``a_major`` / ``b_major`` = "row" or "col" (strides of a contiguous buffer
    of that order; a leading dimension that breaks TMA's 16-byte rule shows the cp.async path)."""
    from ..common import jit

    def operand(rows, cols, major):
        shape = (rows, cols) if batch is None else (batch, rows, cols)
        t = torch.empty(shape, dtype=dtype, device="meta")
        return t if major == "row" else t.mT.contiguous().mT

    for name, v in (("a_major", a_major), ("b_major", b_major)):
        if v not in ("row", "col"):
            raise ValueError(f"explain: {name} must be 'row' or 'col', got {v!r}")
    for name, v in (("m", m), ("n", n), ("k", k), ("batch", 0 if batch is None else batch)):
        if v < 0:
            raise ValueError(f"explain: {name} must be >= 0, got {v}")
    a, b = operand(m, k, a_major), operand(k, n, b_major)
    c = torch.empty(*a.shape[:-1], n, dtype=out_dtype or dtype, device="meta") if with_c else None
    with jit.dry_run() as dry:
        plan = _make_plan(a, b, None, c, 1.0 if with_c else 0.0, out_dtype, allow_cpu=True)
    out = []
    sms = current_arch().sm_count
    for name, cfg in dry.seen:
        cfg = cfg[0] if isinstance(cfg, tuple) and cfg and hasattr(cfg[0], "tiles") else cfg
        row = {"kernel": name, "config": cfg}
        tiles = getattr(cfg, "tiles", None)
        if tiles is not None:
            tm, tn = tiles.tile_mnk[:2]
            pm, pn = (n, m) if plan.swapped else (m, n)  # the kernel's M and N
            units = math.ceil(pm / tm) * math.ceil(pn / tn) * (batch or 1) * max(1, getattr(cfg, "splits", 1))
            if plan.swapped:
                row["operands"] = "swapped: out^T = b^T a^T (the problem's M is the kernel's N)"
            row.update(tile_mnk=tiles.tile_mnk, cluster_mn=tiles.cluster_mn, ab_stages=tiles.ab_stages,
                       pingpong=tiles.pingpong, splits=getattr(cfg, "splits", 1), work_units=units,
                       units_per_sm=round(units / sms, 2))
            if hasattr(cfg, "raster_swizzle"):
                row.update(raster=(cfg.raster_swizzle, "M" if cfg.raster_along_m else "N"),
                           mainloop=cfg.mainloop, tma_store=cfg.tma_store,
                           epilogue=("deferred (stored under the next tile's mainloop)" if cfg.epi_defer
                                     else "per tile" if cfg.tma_store else "per tile, direct stores"),
                           pdl=cfg.pdl and cfg.mainloop == "tma")
        out.append(row)
    return out


def _gemm_impl(a, b, out, c, alpha, beta, out_dtype, tiles=None, raster=None, splitk_mode=None, options=()):
    sig = _signature(a, b, out, c, beta, out_dtype)
    # explicit tiles / split-K mode / kernel options (tuner, tests, benchmarks): cached too, own key
    key = sig if tiles is None and splitk_mode is None and not options else (sig, tiles, raster, splitk_mode, options)
    p = _plans.get(key)
    if p is None:
        p = _make_plan(a, b, out, c, beta, out_dtype, tiles, raster, splitk_mode=splitk_mode, options=options)
        _plans[key] = p
    if out is None:
        out = torch.empty(p.shape, dtype=p.out_dtype, device=a.device)
    if p.k0:
        if out.numel():
            out.copy_(beta * c if p.has_c else torch.zeros_like(out))
        return out
    if p.a_fix:
        a = _canonical_strides(a, p.a_fix)
    if p.b_fix:
        b = _canonical_strides(b, p.b_fix)
    if p.splits > 1:
        s = p.splits
        kc = a.shape[-1] // s
        a3 = a.unflatten(-1, (s, kc)).movedim(-2, 0)  # (S, M, Kc): a view
        b3 = b.unflatten(0, (s, kc))  # (S, Kc, N)
        ws = torch.empty((s, *p.shape), dtype=torch.float32, device=a.device)
        p.fn(a3, b3, ws, ws, 1.0, 0.0)
        p.reduce_fn(ws, out, c if p.has_c else out, float(alpha), float(beta))
        return out
    d = _canonical_strides(out, p.d_fix) if p.d_fix else out
    p.fn(a, b, d, c if p.has_c else d, float(alpha), float(beta))
    return out


def gemm(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None, out_dtype=None,
         alpha: float = 1.0, beta: float = 0.0, c: torch.Tensor | None = None, tune: bool = False) -> torch.Tensor:
    """``out = alpha * a @ b + beta * c`` on Hopper tensor cores (fp32 accumulation).

    a: (M, K) or (L, M, K); b: (K, N) or (L, K, N); fp16/bf16, each row- or column-major.
    out / out_dtype: fp16, bf16 or fp32 (default: a's dtype).  c: same shape as out, any strides.
    Under ``torch.compile`` this goes through the ``cute_kernels::gemm`` custom op.
    ``tune=True`` benchmarks candidate configs for this shape once (results persist on disk and are
    used by later calls, tuned or not); see :mod:`cute_kernels.tune`.
    """
    if tune:
        from .tune import tune_gemm

        tune_gemm(a, b, out_dtype=(out.dtype if out is not None else out_dtype))
    if torch.compiler.is_compiling():
        res = torch.ops.cute_kernels.gemm(a, b, c, float(alpha), float(beta), out_dtype)
        if out is not None:
            out.copy_(res)
            return out
        return res
    return _gemm_impl(a, b, out, c, alpha, beta, out_dtype)


@torch.library.custom_op("cute_kernels::gemm", mutates_args=())
def _gemm_op(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, alpha: float, beta: float,
             out_dtype: torch.dtype | None) -> torch.Tensor:
    return _gemm_impl(a, b, None, c, alpha, beta, out_dtype)


@_gemm_op.register_fake
def _(a, b, c, alpha, beta, out_dtype):
    return a.new_empty((*a.shape[:-1], b.shape[-1]), dtype=out_dtype or a.dtype)
