"""``cute-kernels charts`` on the CPU: PNGs from the checked-in results (the latest of
``profiles/results/`` in their older formats, and small fixtures in the current schema under
``tests/tools/data/``) exist, are pictures (not blank, not one colour), and the tables carry the
recorded figures with device and date."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cute_kernels.tools import charts, cli
from cute_kernels.tools.bench import records

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "profiles" / "results"
DATA = Path(__file__).resolve().parent / "data"
FIXTURES = sorted(DATA.glob("fixture-*.json"))


def _picture_ok(path: Path, min_kb: int = 15) -> None:
    """A real picture: over ``min_kb`` KB, many colours, ink on a good part of it."""
    import numpy as np
    from matplotlib import image

    assert path.stat().st_size > min_kb * 1024, f"{path.name}: {path.stat().st_size} bytes"
    px = image.imread(path)[..., :3]
    colours = np.unique((px.reshape(-1, 3) * 255).astype(np.uint8), axis=0)
    assert len(colours) > 20, f"{path.name}: {len(colours)} colours"
    ink = (px.sum(axis=-1) < 2.9).mean()  # not white
    assert 0.02 < ink < 0.9, f"{path.name}: {ink:.1%} of the pixels drawn"


def test_fixtures_are_current_schema():
    assert {p.stem for p in FIXTURES} == {"fixture-gemm", "fixture-attention", "fixture-decode"}
    for p in FIXTURES:
        d = json.loads(p.read_text())
        assert d["schema"] == "cute-kernels-bench/1" and d["meta"]["device"] and d["meta"]["date"]


def test_charts_from_fixtures(tmp_path):
    written = charts.make(FIXTURES, tmp_path)
    names = {p.name for p in written}
    assert {"fixture-gemm-ratios.png", "fixture-attention-ratios.png", "fixture-decode-ratios.png",
            "roofline.png", "summary.png", "tables.md"} == names
    for p in written:
        if p.suffix == ".png":
            _picture_ok(p)


def test_charts_from_the_latest_records(tmp_path):
    paths = records.latest(RESULTS)
    written = charts.make(paths, tmp_path)
    summary = tmp_path / "summary.png"
    assert summary in written
    _picture_ok(summary, 50)
    assert summary.stat().st_size < 400 * 1024  # small enough for the README
    tables = (tmp_path / "tables.md").read_text()
    # figures as recorded: the GEMM file's own per-round ratio to the best peer, device, date, commit
    raw = json.loads((RESULTS / "gemm-2026-11-30-8a2ffbe.json").read_text())
    r = raw["rows"][-1]  # 4096x4096x4100, where cuBLAS loses its alignment
    assert f"| 4096x4096x4100 | {r['cute-kernels']['tflops']:.0f} | cuBLAS | " \
           f"{r['cute-kernels']['ratio_vs_best_peer']:.2f}x |" in tables
    assert "NVIDIA H200, 2026-11-30, commit 8a2ffbe" in tables
    assert "NVIDIA H200, 2026-12-01, commit 72063b4" in tables
    assert tables.count("| shape |") == 3


def test_roofs_are_stated(tmp_path):
    docs = [records.load(p) for p in FIXTURES]
    roofs = records.roofs(docs)
    assert roofs["read_TBps"] > 4 and roofs["matmul_TFLOPs"] > 700 and "how" in roofs
    # the roofline picture has the roofs' figures on it: drawn as text, so check the artist texts
    fig = charts._figure(6, 4)
    ax = fig.add_subplot()
    charts.roofline_axes(ax, docs, roofs)
    texts = " ".join(t.get_text() for t in ax.texts)
    assert f"{roofs['read_TBps']:.2f} TB/s" in texts and f"{roofs['matmul_TFLOPs']:.0f} TFLOP/s" in texts
    assert "roofs:" in texts


def test_cli_charts(tmp_path, capsys):
    assert cli.main(["charts", *map(str, FIXTURES), "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "summary.png" in out and (tmp_path / "c" / "summary.png").exists()


def test_cli_charts_bad_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("[]")
    with pytest.raises(SystemExit) as e:
        cli.main(["charts", str(bad), "--out", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a benchmark results file" in err


def test_a_file_it_cannot_draw_is_an_error_and_nothing_is_written(tmp_path, capsys):
    """A file of no known format, or of a known kind with nothing timed, beside drawable ones: one line
    on stderr, status 2, no file written (a chart set without it would look complete)."""
    other = tmp_path / "other-x.json"
    other.write_text(json.dumps({"meta": {}, "points": []}))
    empty = tmp_path / "gemm-empty.json"
    empty.write_text(json.dumps({**json.loads(FIXTURES[0].read_text()), "rows": []}))
    for bad, words in ((other, "not a benchmark results file"), (empty, "no timed row")):
        out = tmp_path / f"c-{bad.stem}"
        with pytest.raises(ValueError, match=words):
            charts.make([FIXTURES[0], bad], out)
        rc = _cli(["charts", str(FIXTURES[0]), str(bad), "--out", str(out)])
        cap = capsys.readouterr()
        assert rc == 2 and cap.out == "", (rc, cap)
        assert len(cap.err.strip().splitlines()) == 1 and words in cap.err and bad.name in cap.err, cap.err
        assert not out.exists()


def _cli(argv) -> int:
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code


def _written_by_the_library(kind: str, tmp_path: Path) -> Path:
    """A results file of ``kind`` as the library's own writer names and writes it, its content taken
    from the record of that kind (or the fixture)."""
    from cute_kernels.tools import bench_model
    from cute_kernels.tools.bench import attention_varlen, results

    named = records.manifest(RESULTS)["latest"]
    if kind == "model-decode":
        return Path(bench_model.write_results(json.loads((RESULTS / named[kind]).read_text()), str(tmp_path)) + ".json")
    if kind == attention_varlen.KIND:
        return attention_varlen.write(json.loads((RESULTS / named[kind]).read_text()), tmp_path)[0]
    if kind == "read-ceiling":  # profiles/read_ceiling.py's file
        return RESULTS / named[kind]
    if kind == "attention-backward":  # no record yet: the forward fixture's rows as backward rows
        from cute_kernels.tools.bench import attention_backward

        fwd = json.loads((DATA / "fixture-attention.json").read_text())
        rows = [attention_backward.make_row(r["shape"], *(r["params"][x] for x in ("B", "Hq", "Hkv", "S", "D", "causal")),
                                            {n: e["times_us"] for n, e in r["impls"].items()
                                             if n in ("cute", "mma_bound", *attention_backward.PEERS)},
                                            "cudnn_sdpa", {"cute": {"dq": 0.004, "dk": 0.005, "dv": 0.003}}, [])
                for r in fwd["rows"]]
        return attention_backward.write(attention_backward.document(fwd["meta"], rows, fwd["roofs"]), tmp_path)[0]
    return results.write(json.loads((DATA / f"fixture-{kind}.json").read_text()), tmp_path)[0]


@pytest.mark.parametrize("kind", ["gemm", "attention", "decode", "attention-varlen", "attention-backward", "model-decode",
                                  "read-ceiling"])
def test_every_kind_the_library_writes_is_drawn(tmp_path, capsys, kind):
    """``cute-kernels charts FILE`` on each results kind the package writes (the bench kinds, the varlen
    forward's, the backward's, the model benchmark's) and the bare-read ceilings: a picture and a table naming the file."""
    from cute_kernels.tools.bench import KINDS

    assert set(KINDS) - {"model"} | {"model-decode"} <= {"gemm", "attention", "decode", "model-decode"}
    path = _written_by_the_library(kind, tmp_path / "w")
    assert records.load(path)["kind"] == kind
    rc = _cli(["charts", str(path), "--out", str(tmp_path / "c")])
    out = capsys.readouterr().out
    assert rc == 0
    pngs = [p for p in (tmp_path / "c").glob(f"{path.stem}-*.png")]
    assert len(pngs) == 1 and str(pngs[0]) in out, (out, pngs)
    _picture_ok(pngs[0])
    assert f"`{path.name}`" in (tmp_path / "c" / "tables.md").read_text()


def test_model_table_has_the_recorded_ratios(tmp_path):
    """The model benchmark's table: our fastest configuration's tokens/s and the run's own best-vs-best
    ratio per point."""
    name = records.manifest(RESULTS)["latest"]["model-decode"]
    raw = json.loads((RESULTS / name).read_text())
    charts.make([RESULTS / name], tmp_path)
    tables = (tmp_path / "tables.md").read_text()
    for p in raw["points"]:
        assert (f"| b{p['batch']}_ctx{p['ctx']} | {p['batch'] * 1e6 / p['ours_us']:.0f} | {p['torch']} | "
                f"{p['ratio']:.2f}x | read bound |") in tables


def test_cli_charts_without_matplotlib(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import raises ImportError
    with pytest.raises(SystemExit) as e:
        cli.main(["charts", str(FIXTURES[0]), "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "pictures" in capsys.readouterr().err
