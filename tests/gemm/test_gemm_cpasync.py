"""The predicated cp.async GEMM mainloop (A/B whose strides or base pointers TMA cannot describe).

CPU: the vector-width rule, and sm_90a compiles of every vector width x operand major (SASS: HGMMA,
LDGSTS for cp.async widths, no local memory, the 168-register launch the setmaxnreg split assumes).
GPU: numerics against a float64 reference, elementwise with the tails named (``_check.check_gemm``),
output poisoned with NaN, padding of the operands' rows poisoned with NaN (an out-of-bounds read along K
would surface as NaN).
"""

import itertools

import pytest
import torch

from conftest import make_c
from _check import check_gemm

import cute_kernels
from cute_kernels.common import jit
from cute_kernels.gemm import launch
from cute_kernels.gemm import plan as P
from cute_kernels.gemm.validate import major_of, tma_ok
from cute_kernels.common.arch import current_arch
from layouts.tiles import stage_count
from cute_kernels.gemm.cpasync_kernel import GemmSm90CpAsync, choose_vec_bytes, cpasync_tiles
from cute_kernels.gemm.kernel import GemmConfig
from layouts import tiles as T


# ------------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize(
    "shape,stride,unit,ptr,want",
    [
        ((4096, 4100), (4100, 1), 1, 0, 8),  # row-major A, K = 4100: rows 8200 B apart
        ((4096, 4096), (4096, 1), 1, 0, 16),
        ((64, 4102), (4102, 1), 1, 0, 4),
        ((64, 4101), (4101, 1), 1, 0, 2),  # odd leading dimension
        ((64, 4100), (4104, 1), 1, 0, 8),  # extent 4100 -> 8-byte vectors even though rows are 16-B apart
        ((64, 4096), (4096, 1), 1, 8, 8),  # pointer only 8-byte aligned
        ((64, 4096), (4096, 1), 1, 2, 2),
        ((127, 333), (1, 127), 0, 0, 2),  # column-major, M = 127
        ((1000, 522), (1, 1000), 0, 0, 16),
        ((1, 13), (13, 1), 1, 0, 2),
        ((1, 64), (13, 1), 1, 0, 16),  # size-1 dims' strides do not count
        ((3, 64, 64), (4100, 64, 1), 2, 0, 8),  # batch stride
    ],
)
def test_vec_rule(shape, stride, unit, ptr, want):
    assert choose_vec_bytes(ptr, shape, stride, 2, unit) == want


def test_config_checks():
    tiles = T.GemmTiles(tile_mnk=(128, 128, 64), cluster_mn=(2, 1), mma=T.MmaTile(atom_n=128), ab_stages=4)
    with pytest.raises(ValueError, match="cluster"):
        GemmSm90CpAsync(GemmConfig(tiles=tiles, mainloop="cpasync"))
    assert cpasync_tiles(tiles).cluster_mn == (1, 1)
    with pytest.raises(ValueError, match="vec_a"):
        GemmSm90CpAsync(GemmConfig(tiles=cpasync_tiles(tiles), mainloop="cpasync", vec_a=32))


def cpu_plan(a, b, out=None, choice=P.PlanChoice(stage=False)):
    """The plan for CPU operands (nothing compiled) and the config of its last kernel; the cp.async
    mainloop unless ``choice`` says otherwise (the default plan stages many misaligned operands)."""
    with jit.dry_run():
        p = P.make_plan(a, b, out, choice=choice, allow_cpu=True)
    return p, p.kernels[-1][1]


def _cpu_operand(rows, cols, major, ld=None, offset=0, batch=None):
    inner, outer = (cols, rows) if major == "row" else (rows, cols)
    ld = ld or inner
    b = batch or 1
    t = torch.zeros(offset + b * outer * ld, dtype=torch.bfloat16)[offset:].view(b, outer, ld)[:, :, :inner]
    t = t if major == "row" else t.transpose(-1, -2)
    return t if batch else t[0]


def test_plan_k4100():
    """Row-major A with K = 4100 takes the cp.async mainloop: 8-byte A vectors, 16-byte B vectors,
    (1, 1) cluster, no split-K even where the TMA path would split (M = 128)."""
    for m in (4096, 128):
        p, cfg = cpu_plan(_cpu_operand(m, 4100, "row"), _cpu_operand(4100, 4096, "row"))
        assert (cfg.mainloop, cfg.vec_a, cfg.vec_b) == ("cpasync", 8, 16)
        assert cfg.tiles.cluster_mn == (1, 1) and p.kind == "persistent" and cfg.max_active_clusters > 1
    p, cfg = cpu_plan(_cpu_operand(128, 4096, "row"), _cpu_operand(4096, 4096, "row"))
    assert p.kind.startswith("splitk")  # aligned: TMA split-K


@pytest.mark.parametrize("m,n,k,staged", [
    (4096, 4096, 4100, True),  # 8-byte vectors, a 34 MB copy against a ~210 us GEMM: staged
    (128, 4096, 4100, False),  # the same A rows, a ~7 us GEMM: the 2 us copy costs more than it saves
    (1000, 3000, 522, False),  # 4-byte vectors, 1 MB copy, ~5 us GEMM: in place
    (4097, 127, 1000, True),  # B's rows 2-byte aligned (element-wide vectors): always staged
    (64, 64, 131, True),
])
def test_default_stages_by_cost(m, n, k, staged):
    """The default plan (``PlanChoice.stage`` None) stages misaligned operands as
    :func:`~cute_kernels.gemm.heuristics.stage_misaligned` decides, and says so in the plan."""
    p, cfg = cpu_plan(_cpu_operand(m, k, "row"), _cpu_operand(k, n, "row"), choice=P.DEFAULT_CHOICE)
    assert (getattr(cfg, "mainloop", "tma") == "tma") == staged, (m, n, k, cfg)
    assert bool(p.a_stage or p.b_stage) == staged


@pytest.mark.parametrize("majors", list(itertools.product(["row", "col"], repeat=2)), ids=lambda m: "".join(x[0] for x in m))
def test_stage_plans_tma_kernels(majors):
    """``PlanChoice(stage=True)``: the operands TMA cannot describe are copied into aligned buffers per
    call (``staged``: the same logical tensor, the contiguous extent padded to 16 bytes) and the TMA
    plan runs; an aligned operand is not copied.  ``stage=False``: the cp.async mainloop."""
    k, n = (1000, 127) if majors[1] == "row" else (127, 1000)  # B's contiguous extent 127: misaligned
    a = _cpu_operand(4097, k, majors[0])  # misaligned too where its contiguous extent (K or M = 4097) is odd
    b = _cpu_operand(k, n, majors[1])
    _, cfg0 = cpu_plan(a, b)
    with jit.dry_run():
        p = P.make_plan(a, b, choice=P.PlanChoice(stage=True), allow_cpu=True)
    cfg = p.kernels[-1][1]
    a_odd = not tma_ok(a, majors[0])
    assert cfg0.mainloop == "cpasync" and getattr(cfg, "mainloop", "tma") == "tma", (cfg0, cfg)
    assert p.b_stage == majors[1] and p.a_stage == (majors[0] if a_odd else None)
    for major, shape in (("row", (5, 7)), ("col", (7, 5))):
        t = torch.randn(*shape).to(torch.bfloat16)
        t = t if major == "row" else t.mT  # (5, 7) col-major: stride (1, 5)
        st = P.staged(t, major)
        assert torch.equal(st, t) and tma_ok(st, major), (major, st.stride())
        assert st.stride() == ((8, 1) if major == "row" else (1, 8))
    tb = torch.randn(3, 5, 7).to(torch.bfloat16)
    assert torch.equal(P.staged(tb, "row"), tb) and P.staged(tb, "row").stride() == (40, 8, 1)


@pytest.mark.parametrize(
    "a_args,b_args,want",
    [
        ((300, 1000, "row", None, 4), (1000, 520, "col", None, 4), (8, 8)),  # 8-byte aligned pointers
        ((300, 1000, "row", None, 1), (1000, 520, "row"), (2, 2)),  # odd pointer: OR-ed low bits
        ((264, 200, "col", 268), (200, 392, "row", 394), (8, 4)),
        ((127, 333, "col"), (333, 1001, "col"), (2, 2)),
        ((1000, 522, "row"), (522, 3000, "row"), (4, 16)),
    ],
)
def test_plan_vec_widths(a_args, b_args, want):
    _, cfg = cpu_plan(_cpu_operand(*a_args), _cpu_operand(*b_args))
    assert (cfg.mainloop, cfg.vec_a, cfg.vec_b) == ("cpasync", *want)


def test_plan_batched():
    a = _cpu_operand(201, 130, "row", batch=3)
    b = _cpu_operand(130, 264, "col", ld=132, batch=3)
    _, cfg = cpu_plan(a, b)
    assert (cfg.mainloop, cfg.a_rank, cfg.vec_a, cfg.vec_b) == ("cpasync", 3, 4, 4)


# vec_b paired with each vec_a so that both operands see every width under every major combination
_VEC_B = {16: 4, 8: 2, 4: 16, 2: 8}
# (rank, has_c, tma_store, out dtype, tile N), cycled over the cases.  (A C term with the direct-store
# epilogue at N = 256 spills in the shared consumer on the TMA path too: not a producer matter, not here.)
_VARIANTS = [
    (2, False, True, "bfloat16", 256),
    (3, True, True, "float32", 128),
    (2, False, False, "float16", 192),
    (3, False, True, "bfloat16", 192),
    (2, True, False, "bfloat16", 128),
    (3, False, False, "float32", 256),
    (2, True, True, "float16", 256),
    (3, False, True, "float32", 128),
]
COMPILE_CASES = []
for _i, ((_am, _bm), _va) in enumerate(itertools.product([("k", "k"), ("k", "mn"), ("mn", "k"), ("mn", "mn")],
                                                          [16, 8, 4, 2])):
    _r, _c, _tma, _out, _n = _VARIANTS[_i % len(_VARIANTS)]
    COMPILE_CASES.append(dict(am=_am, bm=_bm, va=_va, vb=_VEC_B[_va], rank=_r, has_c=_c, tma_store=_tma,
                              out=_out, atom_n=_n))


def _case_id(c):
    return f"{c['am']}{c['bm']}-a{c['va']}-b{c['vb']}-r{c['rank']}-{c['out']}-n{c['atom_n']}" + \
        ("-c" if c["has_c"] else "") + ("" if c["tma_store"] else "-direct")


@pytest.mark.parametrize("case", COMPILE_CASES, ids=_case_id)
def test_compiles_for_sm90a(case):
    from cute_kernels.tools import inspect as ins

    ab = "float16" if case["out"] == "float16" else "bfloat16"
    n = case["atom_n"]
    c_bytes = 4 if case["out"] == "float32" else 2
    stages = stage_count(current_arch().smem_per_cta, (128 + n) * 64 * 2, 128 * 32 * c_bytes * 2)
    tiles = T.GemmTiles(tile_mnk=(128, n, 64), cluster_mn=(1, 1),
                        mma=T.MmaTile(ab_dtype=ab, atom_n=n, a_major=case["am"], b_major=case["bm"]),
                        ab_stages=stages, epi_tile_mn=(128, 32), c_dtype=case["out"])
    cfg = GemmConfig(tiles=tiles, a_rank=case["rank"], has_c=case["has_c"], tma_store=case["tma_store"],
                     mainloop="cpasync", vec_a=case["va"], vec_b=case["vb"])
    rep = ins.inspect_builder(lambda: launch.fake_args(cfg, ab, case["out"], "float32"))
    (k,) = rep.kernels
    s = rep.summary()
    assert k.instructions["HGMMA"] > 0, s
    assert k.instructions["UTMALDG"] == 0, s
    assert k.spills == 0 and k.stack_frame == 0, s
    # setmaxnreg split 72 x 128 + 216 x 256 assumes the launch allocation of 168 x 384
    assert k.registers == 168, s
    if max(case["va"], case["vb"]) >= 4:
        assert k.instructions["LDGSTS"] > 0, s
    if min(case["va"], case["vb"]) < 4:  # the 2-byte operand goes through registers
        assert k.instructions["LDG"] > 0 and k.instructions["STS"] > 0, s
    assert "fence.proxy.async.shared::cta" in rep.ptx
    if min(case["va"], case["vb"]) >= 4:
        assert "cp.async.mbarrier.arrive.noinc" in rep.ptx


# ------------------------------------------------------------------------------------------- GPU
def _operand(shape, major, dtype, batch=None, ld=None, offset=0):
    """A (rows, cols) operand stored row- or column-major with leading dimension ``ld`` (default:
    tight) and ``offset`` elements from a 256-byte aligned allocation; fresh random values, the
    padding between rows/columns (and before the offset) is NaN."""
    rows, cols = shape
    inner, outer = (cols, rows) if major == "row" else (rows, cols)
    ld = ld or inner
    b = batch or 1
    buf = torch.full((offset + b * outer * ld,), float("nan"), device="cuda", dtype=dtype)
    store = buf[offset:].view(b, outer, ld)[:, :, :inner]
    store.copy_(torch.randn(b, outer, inner, device="cuda", dtype=dtype))
    t = store if major == "row" else store.transpose(-1, -2)
    return t if batch else t[0]


CPASYNC = P.PlanChoice(stage=False)  # misaligned operands read in place (the default stages many of them)


def _gemm(a, b, out, choice=CPASYNC, **kw):
    """gemm (``plan.run``, the cp.async mainloop where TMA cannot describe a or b unless ``choice`` says
    otherwise) into a NaN-filled ``out``; returns the config of the kernel its plan ran."""
    out.fill_(float("nan"))
    P.run(a, b, out, choice=choice, **kw)
    torch.cuda.synchronize()
    return P.plan(a, b, out, kw.get("c"), kw.get("beta", 0.0), choice=choice).kernels[-1][1]


@pytest.mark.gpu
@pytest.mark.parametrize("mnk,staged", [((4097, 127, 1000), True), ((1000, 3000, 522), False), ((67, 5, 9), True)],
                         ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else str(s))
def test_default_plan_misaligned(mnk, staged):
    """``cute_kernels.gemm`` on misaligned operands: staged or in place as the cost rule decides, right
    elementwise either way."""
    m, n, k = mnk
    a = _operand((m, k), "row", torch.bfloat16)
    b = _operand((k, n), "row", torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cute_kernels.gemm(a, b, out=out)
    torch.cuda.synchronize()
    p = P.plan(a, b, out)
    assert bool(p.a_stage or p.b_stage) == staged and (getattr(p.kernels[-1][1], "mainloop", "tma") == "tma") == staged
    check_gemm(out, a, b)


@pytest.mark.gpu
def test_cpasync_k4100():
    """The issue's example: row-major A with K = 4100 (8-byte vectors), row-major B (16-byte)."""
    m, n, k = 4096, 4096, 4100
    a = _operand((m, k), "row", torch.bfloat16)
    b = _operand((k, n), "row", torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    cfg = _gemm(a, b, out)
    assert (cfg.mainloop, cfg.vec_a, cfg.vec_b, cfg.tiles.cluster_mn) == ("cpasync", 8, 16, (1, 1))
    check_gemm(out, a, b)


MAJORS = list(itertools.product(["row", "col"], repeat=2))


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(127, 1001, 333), (1, 7, 13), (1000, 3000, 522)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("majors", MAJORS, ids=lambda m: "".join(x[0] for x in m))
def test_cpasync_shapes_majors(mnk, majors):
    m, n, k = mnk
    a = _operand((m, k), majors[0], torch.bfloat16)
    b = _operand((k, n), majors[1], torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    cfg = _gemm(a, b, out)
    tma = tma_ok(a, major_of(a, "a", "M", "K")) and tma_ok(b, major_of(b, "b", "K", "N"))
    assert (cfg.mainloop == "tma") == tma
    check_gemm(out, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(4097, 127, 1000), (127, 1001, 333), (1, 7, 13), (300, 4101, 77)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("majors", MAJORS, ids=lambda m: "".join(x[0] for x in m))
def test_staged_operands(mnk, majors):
    """``PlanChoice(stage=True)`` through ``plan.run``: NaN-padded misaligned operands copied into
    aligned buffers, the TMA kernels, the float64 reference elementwise (the staged buffers' padding is
    uninitialized: a read of it would show)."""
    m, n, k = mnk
    a = _operand((m, k), majors[0], torch.bfloat16)
    b = _operand((k, n), majors[1], torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    P.run(a, b, out, choice=P.PlanChoice(stage=True))
    torch.cuda.synchronize()
    p = P.plan(a, b, out, choice=P.PlanChoice(stage=True))
    assert all(getattr(c, "mainloop", "tma") == "tma" for _, c in p.kernels)
    check_gemm(out, a, b)


# (vec_a, vec_b) pairs: each width on each operand under each major combination
VEC_PAIRS = [(16, 8), (8, 4), (4, 2), (2, 16)]


@pytest.mark.gpu
@pytest.mark.parametrize("vecs", VEC_PAIRS, ids=lambda v: f"a{v[0]}-b{v[1]}")
@pytest.mark.parametrize("majors", MAJORS, ids=lambda m: "".join(x[0] for x in m))
def test_cpasync_vec_widths(vecs, majors):
    """Leading dimensions padded to give exactly the wanted vector width; the padding is NaN."""
    m, n, k = 264, 392, 200  # multiples of 8: the leading dimension alone sets the width

    def ld(major, rows, cols, w):
        inner = cols if major == "row" else rows
        return inner + (8 if w == 16 else w // 2)

    a = _operand((m, k), majors[0], torch.bfloat16, ld=ld(majors[0], m, k, vecs[0]))
    b = _operand((k, n), majors[1], torch.bfloat16, ld=ld(majors[1], k, n, vecs[1]))
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    cfg = _gemm(a, b, out)
    assert (cfg.mainloop, cfg.vec_a, cfg.vec_b) == ("cpasync", *vecs)
    check_gemm(out, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("offset,want", [(4, 8), (2, 4), (1, 2)])
def test_cpasync_pointer_alignment(offset, want):
    """Base pointers only 8/4/2-byte aligned (tight strides): the pointer limits the width."""
    m, n, k = 300, 520, 1000
    a = _operand((m, k), "row", torch.bfloat16, offset=offset)
    b = _operand((k, n), "col", torch.bfloat16, offset=offset)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    cfg = _gemm(a, b, out)
    assert (cfg.mainloop, cfg.vec_a, cfg.vec_b) == ("cpasync", want, want)
    check_gemm(out, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("majors", MAJORS, ids=lambda m: "".join(x[0] for x in m))
def test_cpasync_batched_fp32_out(majors):
    L, m, n, k = 3, 201, 264, 130
    a = _operand((m, k), majors[0], torch.bfloat16, batch=L, ld=(k + 1 if majors[0] == "row" else m + 3))
    b = _operand((k, n), majors[1], torch.bfloat16, batch=L, ld=(n + 2 if majors[1] == "row" else k + 2))
    out = torch.empty(L, m, n, device="cuda", dtype=torch.float32)
    cfg = _gemm(a, b, out)
    assert cfg.mainloop == "cpasync" and cfg.a_rank == 3
    check_gemm(out, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("c_kind", ["row", "transposed", "fp32"])
def test_cpasync_alpha_beta(c_kind):
    m, n, k = 333, 520, 4100
    a = _operand((m, k), "row", torch.bfloat16)
    b = _operand((k, n), "row", torch.bfloat16)
    c = make_c(c_kind, m, n)
    out = torch.empty(m, n, device="cuda", dtype=torch.float32)
    cfg = _gemm(a, b, out, alpha=0.5, beta=-1.25, c=c)
    assert cfg.mainloop == "cpasync" and cfg.has_c
    check_gemm(out, a, b, 0.5, -1.25, c)


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_cpasync_dtypes(in_dtype, out_dtype):
    m, n, k = 509, 384, 390
    a = _operand((m, k), "row", in_dtype)
    b = _operand((k, n), "col", in_dtype)
    out = torch.empty(m, n, device="cuda", dtype=out_dtype)
    cfg = _gemm(a, b, out)
    assert cfg.mainloop == "cpasync"
    check_gemm(out, a, b)


@pytest.mark.gpu
def test_cpasync_unaligned_and_col_major_out():
    """Direct-store epilogue (out rows 502 B apart) and a column-major out, on the cp.async path."""
    m, n, k = 100, 250, 222
    a = _operand((m, k), "row", torch.bfloat16)
    b = _operand((k, n), "row", torch.bfloat16)
    big = torch.full((m, 251), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = big[:, :n]
    cfg = _gemm(a, b, out)
    assert cfg.mainloop == "cpasync" and not cfg.tma_store
    check_gemm(out, a, b)
    assert torch.isnan(big[:, n]).all(), "wrote past the view"
    out_t = torch.empty(n, m, device="cuda", dtype=torch.bfloat16).t()
    cfg = _gemm(a, b, out_t)
    assert cfg.mainloop == "cpasync" and cfg.tiles.c_major == "m"
    check_gemm(out_t, a, b, what="gemm into a column-major out")


@pytest.mark.gpu
def test_cpasync_repeat_no_recompile():
    """Same signature again: no compile; other sizes that the planner maps to the same configuration
    (asserted: the cp.async plan's 1x1 cluster and 128-wide tiles up to these sizes; same alignment
    facts): no compile either, also on a cold cache."""
    from conftest import planned_configs

    from cute_kernels.common import jit

    a = _operand((512, 4100), "row", torch.bfloat16)
    b = _operand((4100, 384), "row", torch.bfloat16)
    out = torch.empty(512, 384, device="cuda", dtype=torch.bfloat16)
    cfg = _gemm(a, b, out)
    check_gemm(out, a, b)
    before = jit.stats["compiles"]
    for m in (512, 640, 1000):
        a2 = _operand((m, 4100), "row", torch.bfloat16)
        o2 = torch.empty(m, 384, device="cuda", dtype=torch.bfloat16)
        assert planned_configs(a2, b, o2) == [cfg], m
        _gemm(a2, b, o2)
        check_gemm(o2, a2, b, what=f"M={m}")
    assert jit.stats["compiles"] == before
