"""The layout explorer on the CPU: known CuTe algebra results, the sm90 wgmma accumulator fragment,
128B-swizzle bank groups, the tile scheduler's order, and the text/SVG/PNG/CLI outputs."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cute_kernels  # noqa: F401  (sets the DSL arch before cutlass is imported)
import cutlass.cute as cute
from cute_kernels.tools import layouts_cli as cli
from layouts import explore, raster, render, tiles

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---- CuTe algebra, evaluated by the DSL --------------------------------------------------------


def test_composition_known_result():
    def f():
        A = cute.make_layout((6, 2), stride=(8, 2))
        B = cute.make_layout((4, 3), stride=(3, 1))
        R = cute.composition(A, B)
        return str(R), [R(i) for i in range(cute.size(R))], [A(B(i)) for i in range(cute.size(B))]

    text, r, ab = explore.in_dsl(f)
    assert text == "((2,2),3):((24,2),8)"
    assert r == ab  # R = A o B pointwise


def test_divides_known_results():
    def f():
        ld = cute.logical_divide(cute.make_layout((4, 2, 3), stride=(2, 1, 8)), cute.make_layout(4, stride=2))
        zd = cute.zipped_divide(cute.make_layout((8, 8), stride=(1, 8)), (2, 4))
        return str(ld), str(zd)

    assert explore.in_dsl(f) == ("((2,2),(2,3)):((4,1),(2,8))", "((2,4),(4,2)):((1,8),(2,32))")


def test_complement_known_result():
    t = explore.evaluate(lambda: cute.complement(cute.make_layout(4, stride=2), 24))
    assert t.text == "(2,3):(1,8)"
    assert t.shape == (2, 3) and t.stride == (1, 8)
    assert t.offsets == ((0, 8, 16), (1, 9, 17))


def test_evaluate_row_and_col_major():
    row = explore.evaluate(lambda: cute.make_layout((4, 8), stride=(8, 1)))
    col = explore.evaluate(lambda: cute.make_layout((4, 8)))
    assert (row.rows, row.cols) == (col.rows, col.cols) == (4, 8)
    assert all(row(r, c) == 8 * r + c and col(r, c) == r + 4 * c for r in range(4) for c in range(8))


def test_evaluate_flattens_higher_modes_and_rank1():
    t = explore.evaluate(lambda: cute.make_layout((2, 3, 4)))
    assert (t.rows, t.cols) == (2, 12) and t(1, 5) == 1 + 2 * 5
    v = explore.evaluate(lambda: cute.make_layout(5, stride=3))
    assert (v.rows, v.cols) == (5, 1) and [v(r, 0) for r in range(5)] == [0, 3, 6, 9, 12]


# ---- wgmma fragments ---------------------------------------------------------------------------


@pytest.mark.parametrize("atom_n", [128, 64])
def test_wgmma_accumulator_fragment(atom_n, c_fragment):
    # the default MmaTile's atom is 64 x 128: the module's fragment (seconds to evaluate), not a second one
    mma = tiles.MmaTile(atom_n=atom_n)
    own = c_fragment if mma == tiles.MmaTile() else explore.mma_fragment_ownership(mma, "C")
    assert own.tile_shape == (64, atom_n) and own.num_threads == 128 and not own.broadcast
    for t in range(128):
        w, lane = divmod(t, 32)
        rows = {16 * w + lane // 4, 16 * w + lane // 4 + 8}
        cols = {(lane % 4) * 2 + e + 8 * j for e in (0, 1) for j in range(atom_n // 8)}
        mine = own.elements_of(t)
        assert {(r, c) for r, c, _ in mine} == {(r, c) for r in rows for c in cols}
        assert [v for *_, v in mine] == list(range(atom_n // 2))  # each thread holds N/2 accumulators
    # register order: v = 4 j + 2 (row + 8) + (col % 2), as the PTX fragment figure numbers them
    assert own.value[0][:4] == (0, 1, 0, 1) and own.value[8][:2] == (2, 3) and own.value[0][8] == 4


def test_wgmma_tiled_c_covers_both_warpgroups():
    own = explore.mma_fragment_ownership(tiles.MmaTile(), "C", tiled=True)
    assert own.tile_shape == (128, 128) and own.num_threads == 256
    assert own.thread[64][0] == 128 and own.thread[0][0] == 0


def test_wgmma_smem_operands_are_owned_by_the_warpgroup():
    a = explore.mma_fragment_ownership(tiles.MmaTile(), "A")
    assert a.tile_shape == (64, 16) and a.broadcast
    assert {o for row in a.owners for o in row} == {128}
    assert sorted(v for row in a.value for v in row) == list(range(64 * 16))
    b = explore.mma_fragment_ownership(tiles.MmaTile(atom_n=64), "B")
    assert b.tile_shape == (64, 16) and b.broadcast


# ---- shared-memory banks -----------------------------------------------------------------------


def test_sw128_atom_rows_hit_distinct_bank_groups():
    atom = explore.evaluate(lambda: tiles.make_smem_layout_atom("K_SW128", "bfloat16"), elem_bytes=2)
    assert (atom.rows, atom.cols) == (8, 64) and atom.swizzle == "S<3,4,3>"
    # chunk j of row r sits in 16-byte group j ^ r: each column of chunks covers all 8 groups
    groups = [[atom(r, 8 * j) * 2 // 16 % 8 for j in range(8)] for r in range(8)]
    assert groups == [[j ^ r for j in range(8)] for r in range(8)]
    assert all(sorted(col) == list(range(8)) for col in zip(*groups))


@pytest.mark.parametrize("operand,major", [("A", "k"), ("B", "k"), ("A", "mn")])
def test_smem_bank_pattern_conflict_free(operand, major):
    t = tiles.GemmTiles(tile_mnk=(128, 128, 64), mma=tiles.MmaTile(a_major=major, b_major=major))
    bp = explore.smem_bank_pattern(t, operand, stage=1)
    rows = bp.atom_rows()
    assert len(rows) == 8 and all(sorted(col[:8]) == list(range(8)) for col in zip(*rows))
    assert bp.conflict_free()
    assert bp.offsets[0][0] == 128 * 64  # stage 1 starts one (128x64) stage in
    assert 0 <= bp.bank(3, 17) < 32


def test_epilogue_bank_pattern():
    bp = explore.smem_bank_pattern(tiles.GemmTiles(), "epi")
    assert bp.swizzle == "S<2,4,3>" and bp.conflict_free()
    assert len(bp.chunk_groups[0]) == 4  # 32 bf16 = 64 bytes per line


# ---- tile scheduler ----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    mt=st.integers(1, 13), nt=st.integers(1, 13), cm=st.sampled_from([1, 2]), cn=st.sampled_from([1, 2]),
    swizzle=st.integers(1, 5), along_m=st.booleans(),
)
def test_raster_order_is_a_permutation(mt, nt, cm, cn, swizzle, along_m):
    r = raster.cta_raster_order((mt, nt), (cm, cn), swizzle, along_m, num_ctas=2 * cm * cn)
    inside = [mn for i, mn in enumerate(r.order) if r.in_bounds(i)]
    assert sorted(inside) == [(m, n) for m in range(mt) for n in range(nt)]
    assert len(set(r.order)) == len(r.order)
    assert sorted(i for row in r.visit for i in row) == [i for i in range(len(r.order)) if r.in_bounds(i)]


def test_raster_formulas():
    plain = raster.cta_raster_order((3, 4))
    assert list(plain.order) == [(m, n) for n in range(4) for m in range(3)]  # swizzle 1: column-major
    grouped = raster.cta_raster_order((4, 4), swizzle=2, num_ctas=3)
    assert list(grouped.order[:6]) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert grouped.tiles_of_cta(1) == [grouped.order[i] for i in (1, 4, 7, 10, 13)]
    clustered = raster.cta_raster_order((4, 2), cluster_mn=(2, 1))
    assert list(clustered.order[:4]) == [(0, 0), (1, 0), (2, 0), (3, 0)]  # CTA rank along M in a cluster
    assert raster.tile_coord(5, (3, 4)) == (2, 1)
    # swizzle 1 along N: row-major (the scheduler's fast-divmod decode)
    assert list(raster.cta_raster_order((2, 3), raster_along_m=False).order) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    # a partial last strip is padded to the swizzle width (DSL PersistentTileSchedulerParams): 3 x 5
    # tiles, swizzle 2 -> 18 work units, strip 2 = columns 4 and (padding) 5, walked row by row
    order = raster.scheduler_cluster_order((3, 5), (1, 1), 2, True)
    assert len(order) == 18 and list(order[:6]) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert list(order[12:]) == [(0, 4), (0, 5), (1, 4), (1, 5), (2, 4), (2, 5)]
    order = raster.scheduler_cluster_order((5, 3), (1, 1), 2, False)  # along N: strips of 2 rows
    assert len(order) == 18 and list(order[:6]) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    with pytest.raises(ValueError):
        raster.cta_raster_order((4, 4), cluster_mn=(2, 1), num_ctas=3)


# ---- rendering and CLI -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def c_fragment():
    return explore.mma_fragment_ownership(tiles.MmaTile(), "C")


def test_text_render(c_fragment):
    text = render.to_text(c_fragment)
    assert "TV layout C" in text and " 0:0 " in text
    assert len(text.splitlines()) == 64 + 6


def test_svg_is_xml_and_small(c_fragment):
    svg = render.to_svg(c_fragment)
    assert svg._repr_svg_() is svg.data
    root = ET.fromstring(svg.data)
    assert root.tag.endswith("svg")
    assert len(svg.data.encode()) < 300_000
    small = render.to_svg(raster.cta_raster_order((4, 5), swizzle=2, num_ctas=6))
    assert sum(1 for e in ET.fromstring(small.data).iter() if e.tag.endswith("path")) >= 2


def test_png(tmp_path, c_fragment):
    data = render.to_png(c_fragment)
    assert data.startswith(PNG_MAGIC) and len(data) < 300_000
    assert render.save(raster.cta_raster_order((4, 4)), tmp_path / "r.png") == "png"
    assert (tmp_path / "r.png").read_bytes().startswith(PNG_MAGIC)


def test_cli_writes_files(tmp_path, capsys):
    svg, png = tmp_path / "banks.svg", tmp_path / "raster.png"
    assert cli.main(["gemm", "--what", "banks", "--out", str(svg)]) == 0
    ET.parse(svg)
    assert cli.main(["gemm", "--what", "raster", "--problem", "1024,1024", "--swizzle", "2", "--out", str(png)]) == 0
    assert png.read_bytes().startswith(PNG_MAGIC) and png.stat().st_size < 300_000
    assert cli.main(["gemm", "--what", "layout", "--layout", "(4,8):(8,1)"]) == 0
    out = capsys.readouterr().out
    assert "layout (4,8):(8,1)" in out and "31" in out
    assert cli.main(["layouts", "gemm", "--what", "mma-a", "--tile", "128,128,64", "--format", "svg"]) == 0
    ET.fromstring(capsys.readouterr().out)


def test_cli_raster_from_plan(capsys):
    """--plan M,N,K draws the order gemm() runs: its tiles, cluster, fitted swizzle and direction;
    explicit flags still win."""
    assert cli.main(["gemm", "--what", "raster", "--plan", "4096,4096,4096"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head == "tile order 32x16 tiles, 132 CTAs, swizzle 8, along N, cluster 2x1"
    assert cli.main(["gemm", "--what", "raster", "--plan", "16384,4400,4096"]) == 0
    assert capsys.readouterr().out.startswith("tile order 64x35 tiles, 132 CTAs, swizzle 6, along M, cluster 1x2")
    assert cli.main(["gemm", "--what", "raster", "--plan", "4096,4096,4096", "--swizzle", "2", "--raster", "m"]) == 0
    assert "swizzle 2, along M" in capsys.readouterr().out.splitlines()[0]
    with pytest.raises(SystemExit) as e:
        cli.main(["gemm", "--what", "raster", "--plan", "128,4096,4096"])
    assert e.value.code == 2 and "split-K" in capsys.readouterr().err


def test_cli_split_k_plan_tiles(capsys):
    """--plan of a split-K problem still draws its tiles: M = 16 runs transposed with 128 x 16 tiles
    (wgmma 64 x 16), the MN-major weight as A."""
    assert cli.main(["gemm", "--what", "mma-c", "--plan", "16,4096,4096"]) == 0
    out = capsys.readouterr().out
    assert out.strip()
    assert cli._gemm_tiles(cli.build_parser().parse_args(["gemm", "--plan", "16,4096,4096"])).tile_mnk == (128, 16, 64)


@pytest.mark.parametrize("argv, words", [
    (["attention"], "invalid choice: 'attention'"),
    (["gemm", "--tile", "100,256,64"], "multiple"),  # not a multiple of the MMA tile
    (["gemm", "--what", "raster", "--format", "png"], "--out"),  # png needs --out
    (["gemm", "--tile", "128,256"], "expected 3 comma-separated integers"),
    (["gemm", "--tile", "0,0,0"], "expected positive integers"),
    (["gemm", "--what", "smem-a", "--stage", "9"], "stage 9 out of range"),
    (["gemm", "--what", "raster", "--swizzle", "0"], "argument --swizzle: must be >= 1"),
    (["gemm", "--what", "raster", "--cluster", "2,1", "--num-ctas", "3"], "multiple of the cluster size"),
    (["gemm", "--what", "layout", "--layout", "(4,8:(1"], "cannot parse layout"),
    (["gemm", "--what", "raster", "--problem", "512,512", "--out", "/nonexistent-dir/x.svg"], "nonexistent-dir"),
])
def test_cli_errors_one_line(capsys, argv, words):
    """A bad argument: exit status 2 and one line on stderr naming the problem, no traceback."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("cute-kernels layouts: error: ") and err.count("\n") == 1, err
    assert words in err, err


def test_tour_notebook_runs():
    """layouts/tour.ipynb stays runnable: every code cell executes in order on the CPU (no Jupyter
    needed), and the outputs are not stored in the file (it stays small and diff-able)."""
    import json
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "layouts", "tour.ipynb")
    nb = json.load(open(path))
    ns: dict = {}
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert not cell["outputs"], "strip the notebook's outputs before committing"
            exec(compile("".join(cell["source"]), path, "exec"), ns)
    assert ns["plan"]["kernel"] == "gemm_sm90" and ns["order"].swizzle == ns["sw"]
