"""What ``gemm`` runs for one operand signature: the :class:`Plan`, one function per plan kind and the
per-signature cache.  Kinds, in the order the planner tries them: ``fake`` (fake tensors, e.g. under
``FakeTensorMode``: a result of the right shape, nothing compiled or launched), ``empty`` (M, N or K is 0),
``swapped`` (M <= 64: out^T = b^T a^T, :func:`.heuristics.skinny_swap_choice`), ``splitk-cluster`` (K
slices reduced through DSMEM), ``splitk-persistent`` (K slices in the persistent schedule, last-CTA
fixup) and ``persistent`` (TMA, or cp.async for operands TMA cannot describe).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensor

from layouts import tiles as T

from ..common.arch import current_arch
from ..common.fastpath import BoundedCache
from ..common.dtypes import HALF_TORCH, TORCH_TO_NAME
from ..testing import LAUNCHES
from . import heuristics as H
from . import launch, tuned
from .config import (GemmConfig, SplitKClusterConfig, SplitKFixupConfig, choose_vec_bytes, cpasync_tiles, epi_defer_ok,
                     fixup_parts_ok, fixup_workspace_numel)
from .validate import canonical_strides, check_operands, check_types, fits_layout, major_of, tma_ok
from .validate import ptr_bits as _ptr_bits

#: split-K modes a :class:`PlanChoice` may force: the two split-K kernels, "none" (the unsplit
#: persistent kernel) and "swap" (the transposed skinny plan); None: the planner's own choice
SPLITK_MODES = ("cluster", "persistent", "none", "swap")


@dataclass(frozen=True)
class PlanChoice:
    """Choices a caller forces instead of the planner's (the tuner's candidates, tests, benchmarks).
    Every field left at None is the planner's own choice; ``PlanChoice()`` is what ``gemm`` runs."""

    tiles: T.GemmTiles | None = None  # CTA tile / cluster of the persistent kernel
    raster: tuple[int, bool] | None = None  # (swizzle, along M) of the persistent schedule
    splitk_mode: str | None = None  # one of SPLITK_MODES
    splits: int | None = None  # K slices (1: no split)
    epi_defer: bool | None = None  # the deferred epilogue (where it can run)
    max_active_clusters: int | None = None  # persistent grid size (1: several tiles per CTA)
    b_evict_first: bool | None = None  # L2 evict-first hint on the streamed operand of split-K plans
    skinny_pairs_any_epilogue: bool = False  # the skinny multicast pairs with C / fp32 out (GPU-test switch)
    #: an operand TMA cannot describe (a stride or pointer off 16 bytes) copied per call into an aligned
    #: buffer (:func:`staged`), then the TMA kernels; None / False: the cp.async mainloop reads it in place
    stage: bool | None = None
    #: split-K in the persistent schedule: every contributor sums and stores a part of its tile
    #: (``GemmConfig.fixup_parts``) instead of the last one the whole tile; None: off
    fixup_parts: bool | None = None

    def __post_init__(self):
        if self.splitk_mode is not None and self.splitk_mode not in SPLITK_MODES:
            raise ValueError(f"PlanChoice.splitk_mode must be one of {SPLITK_MODES} or None, got {self.splitk_mode!r}")


DEFAULT_CHOICE = PlanChoice()


@dataclass
class Plan:
    """Everything decided for one (shapes, strides, dtypes, alignment) signature: reused per call."""

    shape: tuple[int, ...]
    out_dtype: torch.dtype
    has_c: bool
    kind: str = "empty"
    fn: object = None  # fn(a, b, d, c, alpha, beta)
    a_fix: str | None = None  # canonical-stride view to take of a / b / d before the call (major)
    b_fix: str | None = None
    d_fix: str | None = None
    a_stage: str | None = None  # a / b copied into an aligned buffer before the call (major), :func:`staged`
    b_stage: str | None = None
    #: (compile-cache family, config) of every kernel the plan runs
    kernels: list = field(default_factory=list)

    @property
    def swapped(self) -> bool:
        return self.kind == "swapped"

    @property
    def empty(self) -> bool:  # nothing to launch: run() fills the output with torch ops
        return self.kind == "empty" or self.kind == "fake"

    def compile(self, cfg, ab: str, d_name: str, c_name: str, swapped: bool = False):
        self.kernels.append((launch.FAMILY[type(cfg)], cfg))
        return launch.compiled(cfg, ab, d_name, c_name, swapped=swapped)


@dataclass
class _Problem:
    """The planner's view of one call: sizes, dtype names, majors and the output probe."""

    a: torch.Tensor
    b: torch.Tensor
    probe: torch.Tensor  # the output as the kernels will see it (its strides pick the epilogue)
    m: int
    n: int
    k: int
    l: int
    ab: str
    d_name: str
    c_name: str
    a_major: str  # "row" / "col" of the torch-ordered a (M, K) and b (K, N)
    b_major: str

    @property
    def am(self) -> str:  # the MMA's A major: K-major for row-major a
        return "k" if self.a_major == "row" else "mn"

    @property
    def bm(self) -> str:
        return "mn" if self.b_major == "row" else "k"


# ---------------------------------------------------------------------------- planning
def make_plan(a, b, out=None, c=None, beta: float = 0.0, out_dtype=None, choice: PlanChoice = DEFAULT_CHOICE,
              allow_cpu: bool = False) -> Plan:
    """Decide (and compile) what ``gemm(a, b, out=out, c=c, beta=beta, out_dtype=out_dtype)`` runs,
    with ``choice`` forcing some decisions.  Not cached (see :func:`plan`); ``allow_cpu``: operands
    may live on the CPU or the meta device (planning only, as ``explain`` / ``warmup_gemm`` do)."""
    shape = check_operands(a, b, out, c, out_dtype, allow_cpu)
    if beta != 0.0 and c is None:
        raise ValueError("gemm: beta != 0 needs c")
    p = Plan(shape=shape, out_dtype=out.dtype if out is not None else (out_dtype or a.dtype),
             has_c=c is not None and beta != 0.0)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if any(isinstance(t, FakeTensor) for t in (a, b, out, c)):  # the real call's checks, no compile or launch
        if k and m and n:
            major_of(a, "a", "M", "K"), major_of(b, "b", "K", "N")
            if out is not None:
                major_of(out, "out", "M", "N")
        p.kind = "fake"
        LAUNCHES["gemm:fake"] += 1
        return p
    if k == 0 or m == 0 or n == 0:
        return p
    a_major, b_major = major_of(a, "a", "M", "K"), major_of(b, "b", "K", "N")
    # canonical-stride fixes are views; remember whether this signature needs them
    p.a_fix = a_major if canonical_strides(a, a_major) is not a else None
    p.b_fix = b_major if canonical_strides(b, b_major) is not b else None
    probe = out if out is not None else torch.empty(shape, dtype=p.out_dtype, device=a.device)
    d_name = TORCH_TO_NAME[p.out_dtype]
    pr = _Problem(a, b, probe, m, n, k, a.shape[0] if a.dim() == 3 else 1, TORCH_TO_NAME[a.dtype], d_name,
                  TORCH_TO_NAME[c.dtype] if p.has_c else d_name, a_major, b_major)
    if not (tma_ok(a, a_major) and tma_ok(b, b_major)):
        if not (choice.stage if choice.stage is not None else _stage_by_default(pr)):
            return _plan_persistent(p, pr, choice, cpasync=True)
        # staged: aligned copies (allocated here as probes of their strides) run the TMA plans
        a_s = a if tma_ok(a, a_major) else staged(a, a_major, copy=False)
        b_s = b if tma_ok(b, b_major) else staged(b, b_major, copy=False)
        p.a_stage, p.b_stage = (None if a_s is a else a_major), (None if b_s is b else b_major)
        p.a_fix = None if p.a_stage else p.a_fix
        p.b_fix = None if p.b_stage else p.b_fix
        a, b = a_s, b_s
        pr = dataclasses.replace(pr, a=a, b=b)

    tiles, raster, mode, heuristic = choice.tiles, choice.raster, choice.splitk_mode, choice.tiles is None
    if tiles is None:
        t = tuned.lookup(m, n, k, pr.l, pr.ab, pr.am, pr.bm, d_name)
        if t is not None:
            tiles, raster = t.tiles, t.raster
            mode = mode or t.splitk_mode
            heuristic = False
        if tiles is None:
            tiles = H.default_tiles(m, n, k, pr.l, pr.ab, pr.am, pr.bm, d_name, "n")
    if mode is None or mode == "persistent":  # the persistent split-K needs an unbatched, row-major output
        row_ok = major_of(probe, "out", "M", "N") == "row" and canonical_strides(probe, "row") is probe
        unbatched_row = row_ok and a.dim() == 2
        mode = H.auto_splitk_mode(m, n, k, pr.l, unbatched_row) if mode is None else (
            mode if unbatched_row else "cluster")
        skinny_ok = heuristic and choice.splitk_mode is None
    else:
        skinny_ok = mode == "swap"
    if skinny_ok and a.dim() == 2:
        pairs_ok = choice.skinny_pairs_any_epilogue or (not p.has_c and p.out_dtype in HALF_TORCH)
        sw = H.skinny_swap_choice(m, n, k, pairs_ok)
        if sw is not None:
            return _plan_swapped(p, pr, sw, choice)
    if mode == "swap":  # a tuned "swap" that no longer applies
        mode = "cluster"
    splits = choice.splits if choice.splits is not None else H.split_k_factor(m, n, k, pr.l, tiles, mode)
    if splits > 1 and mode == "cluster":
        return _plan_splitk_cluster(p, pr, splits, choice)
    if splits > 1 and mode == "persistent":
        return _plan_splitk_persistent(p, pr, splits, choice)
    if splits > 1:
        raise ValueError(f"gemm plan: {splits} K slices need split-K mode 'cluster' or 'persistent', not {mode!r}")
    return _plan_persistent(p, pr, choice, tiles=tiles, raster=raster)


def _b_evict_first(choice: PlanChoice) -> bool:
    return H.SPLITK_B_EVICT_FIRST if choice.b_evict_first is None else choice.b_evict_first


def _plan_swapped(p: Plan, pr: _Problem, sw: H.SkinnySwap, choice: PlanChoice) -> Plan:
    """out^T = b^T a^T: the problem's M is the kernel's narrow N tile, the weight b^T streams as its
    A (with the evict-first hint); D is written through the transposed view with element stores.  One
    or two slices meet in the DSMEM cluster kernel, unless the weight is also multicast."""
    tn, s, mc = sw
    # majors of b^T and a^T
    tiles = H.splitk_tiles(tn, pr.ab, "mn" if pr.b_major == "row" else "k", "k" if pr.a_major == "row" else "mn",
                           pr.d_name, mc)
    # compiled with the swapped entry: it takes the problem's (a, b, d, c) and makes the transposes
    # inside the compiled function, so a call makes no .mT views on the host
    if sw.fixup:
        cfg = SplitKFixupConfig(tiles=tiles, splits=s, has_c=p.has_c, a_evict_first=_b_evict_first(choice))
        fn = launch.WorkspaceLauncher(p.compile(cfg, pr.ab, pr.d_name, pr.c_name, swapped=True),
                                      *fixup_workspace_numel(pr.n, pr.m, tn, s))
    else:
        cfg = SplitKClusterConfig(tiles=tiles, splits=s, has_c=p.has_c, a_evict_first=_b_evict_first(choice))
        fn = p.compile(cfg, pr.ab, pr.d_name, pr.c_name, swapped=True)
    p.kind, p.fn = "swapped", launch.SwappedLauncher(fn, torch_order=True)
    return p


def _plan_splitk_cluster(p: Plan, pr: _Problem, splits: int, choice: PlanChoice) -> Plan:
    """K slices on the CTAs of a cluster, reduced through DSMEM; D written directly with any strides."""
    out = pr.probe
    vec_store = out.dim() == 2 and out.stride(1) == 1 and out.stride(0) % 8 == 0 and out.data_ptr() % 16 == 0
    cfg = SplitKClusterConfig(tiles=H.splitk_tiles(H.splitk_tile_n(pr.m, pr.n), pr.ab, pr.am, pr.bm, pr.d_name),
                              splits=splits, a_rank=2, has_c=p.has_c, vec_store=vec_store,
                              b_evict_first=_b_evict_first(choice))
    p.kind, p.fn = "splitk-cluster", p.compile(cfg, pr.ab, pr.d_name, pr.c_name)
    return p


def _plan_splitk_persistent(p: Plan, pr: _Problem, splits: int, choice: PlanChoice) -> Plan:
    """K slices as work units of the persistent kernel (a unbatched, out row-major: checked by the
    caller); the last unit of a tile sums the partials from a cached workspace."""
    tn = H.persistent_splitk_choice(pr.m, pr.n, pr.k)[0]
    cl = (2, 1) if math.ceil(pr.m / 128) % 2 == 0 else (1, 1)
    n_tiles = math.ceil(pr.m / 128) * math.ceil(pr.n / tn)
    cfg = GemmConfig(tiles=H.make_gemm_tiles(tn, cl, pr.ab, pr.am, pr.bm, pr.d_name), a_rank=2, has_c=p.has_c,
                     tma_store=tma_ok(pr.probe, "row", store=True),
                     max_active_clusters=choice.max_active_clusters or current_arch().sm_count // cl[0],
                     splits=splits)
    # the shared finish where every unit has a CTA of its own (one wave: a contributor's polls find the
    # others running, not queued behind it; they are bounded either way)
    if (choice.fixup_parts and n_tiles * splits <= cfg.max_active_clusters * cl[0]
            and fixup_parts_ok(dataclasses.replace(cfg, fixup_parts=True))):
        cfg = dataclasses.replace(cfg, fixup_parts=True)
    fn = p.compile(cfg, pr.ab, pr.d_name, pr.c_name)
    p.kind, p.fn = "splitk-persistent", launch.WorkspaceLauncher(fn, n_tiles * splits * 128 * tn, n_tiles)
    return p


def _vec_bytes(pr: _Problem) -> tuple[int, int]:
    """The cp.async mainloop's vector widths for A and B (bytes): from the strides, the extents and the
    pointers' low bits, OR-ed over a, b and out as in the plan signature (a call reusing the plan is as
    aligned)."""
    a, b = pr.a, pr.b
    ptr_bits = (a.data_ptr() | b.data_ptr() | pr.probe.data_ptr()) & 15
    es = a.element_size()
    return (choose_vec_bytes(ptr_bits, a.shape, a.stride(), es, a.dim() - (1 if pr.a_major == "row" else 2)),
            choose_vec_bytes(ptr_bits, b.shape, b.stride(), es, b.dim() - (1 if pr.b_major == "row" else 2)))


def _stage_by_default(pr: _Problem) -> bool:
    """:func:`~.heuristics.stage_misaligned` for the operands TMA cannot describe."""
    vecs = _vec_bytes(pr)
    bad = [(t, v) for t, major, v in ((pr.a, pr.a_major, vecs[0]), (pr.b, pr.b_major, vecs[1])) if not tma_ok(t, major)]
    return H.stage_misaligned(pr.m, pr.n, pr.k, pr.l, pr.a.element_size(), sum(t.numel() for t, _ in bad),
                              min(v for _, v in bad))


def _plan_persistent(p: Plan, pr: _Problem, choice: PlanChoice, tiles: T.GemmTiles | None = None,
                     raster: tuple[int, bool] | None = None, cpasync: bool = False) -> Plan:
    """The persistent kernel over D's tiles.  ``cpasync``: TMA cannot describe A or B, so the cp.async
    mainloop reads them in place, with vector widths from :func:`_vec_bytes`."""
    a, probe = pr.a, pr.probe
    extra = {}
    if cpasync:
        vec_a, vec_b = _vec_bytes(pr)
        extra = dict(mainloop="cpasync", vec_a=vec_a, vec_b=vec_b)
        tiles = cpasync_tiles(choice.tiles or H.default_tiles(pr.m, pr.n, pr.k, pr.l, pr.ab, pr.am, pr.bm, pr.d_name,
                                                              "n", stream_tiles=False))
        raster = choice.raster
    raster = raster or H.default_raster(pr.m, pr.n, pr.k, pr.ab, pr.l, tiles)
    d_major = major_of(probe, "out", "M", "N")
    p.d_fix = d_major if canonical_strides(probe, d_major) is not probe else None
    t = tiles
    if t.tile_mnk[0] == 256 and p.has_c and t.tile_mnk[1] == 192:  # 24 B spill with C at 232 regs
        t = H.make_gemm_tiles(160, t.cluster_mn, pr.ab, pr.am, pr.bm, t.c_dtype, t.c_major, tile_m=256)
    if d_major == "col":
        t = H.make_gemm_tiles(t.tile_mnk[1], t.cluster_mn, pr.ab, pr.am, pr.bm, pr.d_name, "m", tile_m=t.tile_mnk[0])
    clusters = current_arch().sm_count // (t.cluster_mn[0] * t.cluster_mn[1])
    cfg = GemmConfig(tiles=t, a_rank=a.dim(), has_c=p.has_c, tma_store=tma_ok(probe, d_major, store=True),
                     raster_swizzle=H.fit_swizzle(raster[0], raster[1], pr.m, pr.n, t.tile_mnk[:2], t.cluster_mn),
                     raster_along_m=raster[1], max_active_clusters=choice.max_active_clusters or clusters, **extra)
    defer = choice.epi_defer
    if defer is None:
        defer = H.epi_defer_default(epi_defer_ok(cfg), pr.m, pr.n, pr.l, t.tile_mnk[:2])
    cfg = dataclasses.replace(cfg, epi_defer=defer)
    p.kind, p.fn = "persistent", p.compile(cfg, pr.ab, pr.d_name, pr.c_name)
    return p


# ---------------------------------------------------------------------------- the plan cache
_plans: dict[tuple, Plan] = BoundedCache()  # (prompts of every length: a key each)


def _signature(a, b, out, c, beta, out_dtype):
    ptr_bits = _ptr_bits(a, b, out)  # (0 for fake tensors, whose data_ptr() warns)
    # type(a): a fake tensor (data pointer 0) never finds a real call's plan
    return (type(a), a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, out_dtype, ptr_bits,
            None if out is None else (out.shape, out.stride(), out.dtype, out.device),
            None if c is None else (c.shape, c.stride(), c.dtype, c.device), beta != 0.0)


def plan(a, b, out=None, c=None, beta: float = 0.0, out_dtype=None, choice: PlanChoice = DEFAULT_CHOICE) -> Plan:
    """The plan ``gemm`` runs for these operands (made and compiled once per signature and choice)."""
    try:
        sig = _signature(a, b, out, c, beta, out_dtype)
    except AttributeError:  # a non-tensor operand: its own TypeError, not the signature's
        check_types(a, b, out, c)
        raise
    key = sig if choice is DEFAULT_CHOICE else (sig, choice)
    p = _plans.get(key)
    if p is None:
        p = make_plan(a, b, out, c, beta, out_dtype, choice)
        if p.kind != "fake":  # fake calls re-plan (and are counted) every time
            _plans[key] = p
    return p


def clear_plans() -> None:
    """Forget every cached plan (the tuner calls this after storing a result)."""
    _plans.clear()


def run(a, b, out=None, c=None, alpha: float = 1.0, beta: float = 0.0, out_dtype=None,
        choice: PlanChoice = DEFAULT_CHOICE) -> torch.Tensor:
    """``out = alpha * a @ b + beta * c`` through :func:`plan` (``gemm`` without the custom op;
    ``choice`` forces decisions, as the tuner and the tests do)."""
    p = plan(a, b, out, c, beta, out_dtype, choice)
    if out is None:
        out = torch.empty(p.shape, dtype=p.out_dtype, device=a.device)
    if p.empty:
        if out.numel() and p.kind == "empty":  # (a fake result has no values to write)
            out.copy_(beta * c if p.has_c else torch.zeros_like(out))
        return out
    if p.a_stage:
        a = staged(a, p.a_stage)
    elif p.a_fix and not fits_layout(a, p.a_fix):  # (size-1 strides the kernel takes as they are: no view)
        a = canonical_strides(a, p.a_fix)
    if p.b_stage:
        b = staged(b, p.b_stage)
    elif p.b_fix and not fits_layout(b, p.b_fix):
        b = canonical_strides(b, p.b_fix)
    d = canonical_strides(out, p.d_fix) if p.d_fix and not fits_layout(out, p.d_fix) else out
    LAUNCHES["gemm"] += 1
    p.fn(a, b, d, c if p.has_c else d, float(alpha), float(beta))
    return out


def staged(t: torch.Tensor, major: str, copy: bool = True) -> torch.Tensor:
    """``t`` ((L,) R, C, ``major`` "row": C contiguous; "col": R contiguous) as a view of a fresh buffer
    whose contiguous extent is padded to a multiple of 16 bytes (``copy``: with ``t``'s values; else
    uninitialized, a probe of the strides): the same logical tensor, every stride and the pointer
    aligned for TMA (the padding is never read: TMA's boxes clip at the logical extent)."""
    if major == "col":
        return staged(t.mT, "row", copy).mT
    unit = 16 // t.element_size()
    cols = t.shape[-1]
    buf = torch.empty(*t.shape[:-1], -(-cols // unit) * unit, dtype=t.dtype, device=t.device)
    view = buf[..., :cols]
    if copy:
        view.copy_(t)
    return view


# ---------------------------------------------------------------------------- the configuration buckets
def config_buckets(ab: str = "bfloat16", a_major: str = "row", b_major: str = "row", d_name: str | None = None,
                   c_name: str | None = None, *, batched: bool = False, out_major: str = "row",
                   tma_store: bool = True, vec_store: bool = True,
                   cpasync_vecs: tuple[int, int] | None = None) -> list:
    """Every kernel configuration the planner's heuristics (``PlanChoice()``, no tuned entry) can pick
    for operands with these static facts, whatever M, N, K and the batch count: the bound on what a
    sweep of sizes compiles (one compile per configuration, see ``jit.get_compiled``).  Pure Python,
    nothing compiled; a superset where a combination cannot occur.

    Facts: dtype names of A/B (``ab``), D (``d_name``, default ``ab``) and C (``c_name``: a beta * C
    term); the torch-ordered majors ("row" / "col") of a (M, K), b (K, N) and the output; a 3-D
    (``batched``) a; whether D's rows suit the TMA store (``tma_store``) and the cluster split-K's
    16-byte stores (``vec_store``); ``cpasync_vecs`` = (vec_a, vec_b) bytes when TMA cannot describe
    A or B.  The shape buckets behind the list:

    * TMA cannot describe A or B: the cp.async persistent kernel, 128 x {128, 192, 256} tiles (the
      width whose last wave is fullest), 1x1 cluster, raster swizzle 1..4 along M.
    * M <= 64, unbatched: the transposed plan, N tile 16 / 32 / 64 (M <= 16 / 32 / 64; 32 < M <= 64
      as multicast pairs of 32 without C into a 16-bit D), 1..8 K slices (from N and K), met in a
      cluster's shared memory (<= 2) or the fixup kernel's workspace.
    * Fewer output tiles than half the SMs, batch 1: split-K, in the persistent schedule (128 x
      {128, 256} tiles, 1x1 / 2x1 cluster, 2..8 slices; row-major D, slices of >= 32 k-tiles) or over a
      cluster pair (2 slices, 128 x {64, 128} tiles).
    * Else the persistent kernel: 128 x {128, 192, 256} tiles, 2x1 cluster when M's 128-row tile count
      is even (1x1 when odd or A >= 64 MB), 256 x 128 tiles in a 1x2 cluster for A >= 64 MB, M >= 2048,
      N >= 1024; raster swizzle 1..8 fitted to the grid (along N for the 2x1 cluster's multi-wave band
      raster); the deferred epilogue (16-bit D, no C) when there is more than one wave.
    """
    d_name = d_name or ab
    has_c = c_name is not None
    am = "k" if a_major == "row" else "mn"
    bm = "mn" if b_major == "row" else "k"
    sms = current_arch().sm_count
    a_rank = 3 if batched else 2
    found: dict = {}

    def add(cfg):
        found.setdefault(cfg, None)

    def persistent(t: T.GemmTiles, rasters, **extra):
        if out_major == "col":  # column-major D: the same tile with M-major epilogue sub-tiles
            t = H.make_gemm_tiles(t.tile_mnk[1], t.cluster_mn, ab, am, bm, d_name, "m", tile_m=t.tile_mnk[0])
        clusters = sms // (t.cluster_mn[0] * t.cluster_mn[1])
        for swizzle, along_m in rasters:
            cfg = GemmConfig(tiles=t, a_rank=a_rank, has_c=has_c, tma_store=tma_store, raster_swizzle=swizzle,
                             raster_along_m=along_m, max_active_clusters=clusters, **extra)
            for defer in ((False, True) if epi_defer_ok(cfg) else (False,)):
                add(dataclasses.replace(cfg, epi_defer=defer))

    along_m = [(s, True) for s in range(1, 9)]
    if cpasync_vecs is not None:
        for tn in (256, 192, 128):
            for cl in ((2, 1), (1, 1)):
                persistent(cpasync_tiles(H.make_gemm_tiles(tn, cl, ab, am, bm, d_name, "n")), along_m[:4],
                           mainloop="cpasync", vec_a=cpasync_vecs[0], vec_b=cpasync_vecs[1])
        return list(found)
    for tn in (256, 192, 128):
        persistent(H.make_gemm_tiles(tn, (2, 1), ab, am, bm, d_name, "n"), [(1, True)] + [(s, False) for s in range(1, 9)])
        persistent(H.make_gemm_tiles(tn, (1, 1), ab, am, bm, d_name, "n"), along_m[:4])
    if ab != "float32":
        persistent(H.make_gemm_tiles(128, (1, 2), ab, am, bm, d_name, "n", tile_m=256), along_m)
    # split-K: cluster pairs (batch 1; a 3-D a too), the persistent schedule (2-D a, row-major D)
    for tn in (64, 128):
        add(SplitKClusterConfig(tiles=H.splitk_tiles(tn, ab, am, bm, d_name), splits=2, a_rank=2, has_c=has_c,
                                vec_store=vec_store and out_major == "row" and not batched,
                                b_evict_first=H.SPLITK_B_EVICT_FIRST))
    if not batched and out_major == "row":
        for tn in (256, 128):
            for cl in ((2, 1), (1, 1)):
                for s in range(2, 9):
                    add(GemmConfig(tiles=H.make_gemm_tiles(tn, cl, ab, am, bm, d_name), a_rank=2, has_c=has_c,
                                   tma_store=tma_store, max_active_clusters=sms // cl[0], splits=s))
    if not batched:  # the transposed skinny plan (b^T is its A, a^T its B)
        pairs_ok = not has_c and d_name in ("float16", "bfloat16")
        choices = [H.SkinnySwap(32, s, 2) for s in range(1, 9)] if pairs_ok else []
        choices += [H.SkinnySwap(tn, s, 1) for tn in (16, 32, 64) for s in range(1, 9)]
        for sw in choices:
            tiles = H.splitk_tiles(sw.tile_n, ab, "mn" if b_major == "row" else "k", "k" if a_major == "row" else "mn",
                                   d_name, sw.mcast)
            Cfg = SplitKFixupConfig if sw.fixup else SplitKClusterConfig
            add(Cfg(tiles=tiles, splits=sw.splits, has_c=has_c, a_evict_first=H.SPLITK_B_EVICT_FIRST))
    return list(found)
