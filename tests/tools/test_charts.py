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


def test_unknown_files_are_skipped_beside_known_ones(tmp_path):
    other = tmp_path / "model-decode-x.json"
    other.write_text(json.dumps({"meta": {}, "points": []}))
    notes = []
    written = charts.make([FIXTURES[0], other], tmp_path / "c", on_skip=notes.append)
    assert len(notes) == 1 and "model-decode-x.json" in notes[0] and any(p.suffix == ".png" for p in written)


def test_cli_charts_without_matplotlib(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import raises ImportError
    with pytest.raises(SystemExit) as e:
        cli.main(["charts", str(FIXTURES[0]), "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "pictures" in capsys.readouterr().err
