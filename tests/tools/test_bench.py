"""``cute-kernels bench``: argument parsing, the results documents (ratios, files, metadata), the
reading of recorded results, and each benchmark's orchestration on the CPU with stand-in timers; on
a GPU (``gpu`` marker) the quick runs themselves."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cute_kernels.tools import cli
from cute_kernels.tools.bench import (
    attention,
    ceiling,
    decode,
    gemm,
    progress,
    records,
    results,
    timing,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "profiles" / "results"
HAS_GPU = torch.cuda.is_available()


# ---- shapes ----------------------------------------------------------------------------------------
def test_gemm_shapes_parse_and_reject():
    assert gemm.parse_shapes("8192x8192x8192, 1000x3000x520") == [(8192, 8192, 8192), (1000, 3000, 520)]
    for bad in ("12x3", "0x4x4", "4x4x-1", "axbxc", ","):
        with pytest.raises(ValueError, match="--shapes"):
            gemm.parse_shapes(bad)


def test_decode_and_attention_shape_names():
    assert decode.parse_shape("b64_hq32_hkv8_L2048_paged16") == ("b64_hq32_hkv8_L2048_paged16", 64, 32, 8, 2048, 16)
    assert decode.parse_shape("b1_hq32_hkv8_L32768")[-1] == 16  # default page size of the paged column
    with pytest.raises(ValueError, match="multiple"):
        decode.parse_shape("b1_hq30_hkv8_L128")
    # every default name parses back to its own tuple (the names are the shapes)
    for s in decode.SHAPES[:5]:
        assert decode.parse_shape(s[0]) == s
    for s in attention.SHAPES:
        assert attention.parse_shape(s[0]) == s
    assert attention.parse_shape("b2_hq32_hkv8_s8192_d128_causal")[1:] == (2, 32, 8, 8192, 128, True)
    with pytest.raises(ValueError, match="--shapes"):
        attention.parse_shape("b4_h32_s4096_d128")


def test_attention_default_set_has_the_new_head_dims():
    dims = {(s[5], s[6]) for s in attention.SHAPES}
    assert (256, False) in dims and (96, True) in dims
    assert len(attention.QUICK) == 2 and len(decode.QUICK) == 2 and len(gemm.QUICK) == 2


def test_select_filters():
    assert [s[0] for s in decode.select(only="b1_")] == ["b1_hq32_hkv8_L32768", "b1_hq32_hkv32_L131072"]
    assert decode.select(quick=True) == decode.QUICK
    assert [s[0] for s in attention.select("b4_h16_s4096_d256_full")] == ["b4_h16_s4096_d256_full"]


def test_flop_and_byte_counts():
    assert gemm.flops_bytes(2, 3, 5) == (60.0, 2.0 * (10 + 15 + 6))
    f, b = attention.flops_bytes(1, 2, 1, 8, 64, causal=True)
    assert f == 4 * 2 * 8 * 8 * 64 / 2 and b == 2 * 8 * 64 * (2 * 2 + 2 * 1)
    assert decode.flops_bytes(2, 32, 8, 1024) == (4.0 * 2 * 32 * 1024 * 128, 2.0 * 2 * 1024 * 8 * 128 * 2)


# ---- results documents -----------------------------------------------------------------------------
def _row(ours, peers, ceiling_t=None):
    impls = {"ours": results.impl_entry("ours", ours, 1e12, 1e9)}
    for n, ts in peers.items():
        impls[n] = results.impl_entry("peer", ts, 1e12, 1e9)
    if ceiling_t:
        impls["ceil"] = results.impl_entry("ceiling", ceiling_t, 1e12, 1e9)
    return {"shape": "s", "impls": impls}


def test_ratios_are_per_round_against_the_round_best_peer():
    ours, p1, p2 = [10.0, 12.0, 11.0], [11.0, 11.0, 13.0], [12.0, 10.0, 12.5]
    row = results.finish_row(_row(ours, {"p1": p1, "p2": p2}, [9.0, 9.5, 9.0]))
    # independent: per round, min over peers / ours, then the median
    want = statistics.median(min(a, b) / o for a, b, o in zip(p1, p2, ours))
    assert math.isclose(row["ratio_vs_best_peer"], want)
    assert math.isclose(row["ratio_vs"]["p2"], statistics.median(b / o for b, o in zip(p2, ours)))
    assert row["best_peer"] == "p1"  # the lower median time (11.0 < 12.0)
    assert row["ceiling"] == "ceil" and math.isclose(row["ours_vs_ceiling"], 9.0 / 11.0)
    e = row["impls"]["ours"]
    assert math.isclose(e["tflops"], 1e12 / 11e-6 / 1e12) and math.isclose(e["TBps"], 1e9 / 11e-6 / 1e12)


def test_ratio_falls_back_to_medians_when_rounds_differ():
    row = results.finish_row(_row([10.0], {"p": [20.0, 30.0, 40.0]}))
    assert math.isclose(row["ratio_vs_best_peer"], 3.0)
    with pytest.raises(ValueError, match="role"):
        results.impl_entry("hero", [1.0], None, None)


def test_geomean():
    assert math.isclose(results.geomean([2.0, 8.0, None, float("nan")]), 4.0)
    assert results.geomean([]) is None


def test_run_meta_names_device_date_versions_commit(monkeypatch):
    monkeypatch.setenv("CK_COMMIT", "abc1234")
    meta = results.run_meta("a timer", 3, quick=True)
    assert meta["commit"] == "abc1234" and meta["timer"] == "a timer" and meta["quick"] is True
    assert meta["device"] == (torch.cuda.get_device_name() if HAS_GPU else "cpu")
    assert meta["versions"]["torch"] == torch.__version__ and "python" in meta["versions"]
    assert len(meta["date"]) == 10 and meta["date"][4] == "-"


def test_commit_name_from_git(monkeypatch):
    monkeypatch.delenv("CK_COMMIT", raising=False)
    got = results.commit_name(ROOT)
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                         check=False).stdout.strip()
    assert got == (out or "unknown")


def test_write_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("CK_COMMIT", "abc1234")
    row = _row([10.0, 11.0], {"cuBLAS": [12.0, 12.0]}, [8.0, 8.0])
    row.update(shape="64x64x64", flops=1e12, bytes=1e9, bound="compute", notes=["a note"])
    doc = results.document("gemm", results.run_meta("t", 2), [row], {"read_TBps": 4.0, "matmul_TFLOPs": 700.0},
                           ["quack: skipped"])
    js, md = results.write(doc, tmp_path / "out", tag="quick")
    assert js.name == f"gemm-quick-{doc['meta']['date']}-abc1234.json" and md.suffix == ".md"
    back = records.load(js)
    assert back["rows"][0]["ratio_vs_best_peer"] == doc["rows"][0]["ratio_vs_best_peer"]
    assert back["source"] == js.name and back["kind"] == "gemm"
    text = md.read_text()
    for want in (doc["meta"]["device"], doc["meta"]["date"], "abc1234", "torch " + torch.__version__,
                 "quack: skipped", "64x64x64: a note", "read 4.00 TB/s", "x best peer"):
        assert want in text, want
    # ours first: the median of 10 and 11 us, 1e12 FLOPs / 10.5 us = 95238 TFLOP/s; x best peer: median(12/10, 12/11)
    assert "| 64x64x64 | compute | 10.5 (95238) | 12.0 (83333) | 8.0 (125000) | 1.15x (cuBLAS) | 0.76x (ceil) |" in text


def test_ridge_and_gemm_bound():
    assert math.isclose(results.ridge({"read_TBps": 4.0, "matmul_TFLOPs": 800.0}), 200.0)
    f, b = gemm.flops_bytes(64, 4096, 4096)
    assert f / b < results.ridge(None)  # a decode-time GEMM is bandwidth-bound
    f, b = gemm.flops_bytes(4096, 4096, 4096)
    assert f / b > results.ridge(None)


# ---- recorded results --------------------------------------------------------------------------------
README_CHART_RECORDS = ["gemm-2026-11-30-8a2ffbe.json", "attention-2026-12-01-72063b4.json",
                        "bench_decode-2026-11-30-6f63ae9-cand-cpasync.json", "read-ceiling-2026-11-30-234c05e.json"]


def test_latest_records_are_the_documented_ones():
    names = [p.name for p in records.latest(RESULTS)]
    assert names == README_CHART_RECORDS


def test_latest_records_without_git(tmp_path):
    """A copy of the records outside any git repository (a tarball, ``git archive``) names the same
    files: same-date runs of equal size are not told apart by git history but by the manifest."""
    import shutil

    copy = tmp_path / "results"
    shutil.copytree(RESULTS, copy)
    assert subprocess.run(["git", "rev-parse", "--git-dir"], cwd=copy, capture_output=True).returncode != 0
    assert [p.name for p in records.latest(copy)] == README_CHART_RECORDS


def test_every_named_record_is_of_its_kind_and_cited():
    """Each file the manifest names exists, reads as the kind it is named for, and is cited by the
    README or profiles/README.md (the figures there come from it)."""
    named = records.manifest(RESULTS)["latest"]
    assert {"gemm", "attention", "attention-varlen", "decode", "model-decode", "read-ceiling"} <= set(named)
    assert [p.name for p in records.latest(RESULTS, list(named))] == list(named.values())
    cited = (ROOT / "README.md").read_text() + (ROOT / "profiles" / "README.md").read_text()
    for kind, name in named.items():
        assert Path(name).stem in cited, (kind, name)


def test_manifest_errors_are_one_line(tmp_path):
    import shutil

    with pytest.raises(ValueError, match="cannot read the manifest"):
        records.latest(tmp_path)
    m = records.manifest(RESULTS)
    shutil.copy(RESULTS / m["latest"]["gemm"], tmp_path)
    shutil.copy(RESULTS / m["latest"]["decode"], tmp_path)
    (tmp_path / records.MANIFEST).write_text(json.dumps({"latest": {"gemm": m["latest"]["decode"]}, "charts": ["gemm"]}))
    with pytest.raises(ValueError, match="is a 'decode' record, named as 'gemm'"):
        records.latest(tmp_path)
    (tmp_path / records.MANIFEST).write_text(json.dumps({"latest": {"gemm": "gone.json"}, "charts": ["gemm"]}))
    with pytest.raises(ValueError, match="gone.json: cannot read"):
        records.latest(tmp_path)
    (tmp_path / records.MANIFEST).write_text(json.dumps({"latest": {"gemm": m["latest"]["gemm"]}, "charts": ["gemm"]}))
    with pytest.raises(ValueError, match="names no 'decode' record"):
        records.latest(tmp_path, ["decode"])
    (tmp_path / records.MANIFEST).write_text(json.dumps({"latest": {"gemm": m["latest"]["gemm"]}, "charts": ["x"]}))
    with pytest.raises(ValueError, match='"charts" must list kinds'):
        records.latest(tmp_path)


def test_old_formats_read_into_the_schema():
    raw = json.loads((RESULTS / "gemm-2026-11-30-8a2ffbe.json").read_text())
    doc = records.load(RESULTS / "gemm-2026-11-30-8a2ffbe.json")
    assert doc["kind"] == "gemm" and doc["meta"]["date"] == "2026-11-30" and doc["meta"]["commit"] == "8a2ffbe"
    assert len(doc["rows"]) == len(raw["rows"]) == 9
    for r, old in zip(doc["rows"], raw["rows"]):
        assert r["shape"] == "x".join(map(str, old["shape"]))
        assert math.isclose(r["impls"]["cute-kernels"]["median_us"], old["cute-kernels"]["ms"] * 1e3)
        assert r["ratio_vs_best_peer"] == old["cute-kernels"]["ratio_vs_best_peer"]
    dec = records.load(RESULTS / "bench_decode-2026-11-30-6f63ae9-cand-cpasync.json")
    assert dec["meta"]["commit"] == "6f63ae9" and dec["rows"][0]["impls"]["cute"]["role"] == "ours"
    assert dec["rows"][0]["impls"]["cute_cpasync"]["role"] == "variant"
    att = records.load(RESULTS / "attention-2026-12-01-d6ec147.json")
    assert att["rows"][0]["ceiling"] == "mma_bound" and att["rows"][0]["ours_vs_ceiling"] < 1


def test_bare_reads_become_the_ceiling_of_matching_rows():
    docs = [records.load(RESULTS / n) for n in ("bench_decode-2026-11-30-6f63ae9-cand-cpasync.json",
                                                "read-ceiling-2026-11-30-234c05e.json")]
    records.attach_ceilings(docs)
    raw = json.loads((RESULTS / "read-ceiling-2026-11-30-234c05e.json").read_text())
    want = next(r for r in raw["rows"] if r["label"] == "decode b1 hq32 hkv8 L32768" and "do_bench_us" in r)
    best = min(v for k, v in want["do_bench_us"].items() if k == "torch.sum" or k.startswith("triton"))
    row = docs[0]["rows"][0]
    assert row["ceiling"].startswith("bare read") and math.isclose(row["impls"][row["ceiling"]]["median_us"], best)
    assert math.isclose(row["ours_vs_ceiling"], best / row["impls"]["cute"]["median_us"])
    roofs = records.roofs(docs)
    assert roofs["read_TBps"] > 4 and "read-ceiling" in roofs["how"]


def test_unknown_files_are_refused(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"rows": [{"variants": {}}]}))
    with pytest.raises(ValueError, match="not a benchmark results file"):
        records.load(p)
    p.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        records.load(p)


# ---- the command ---------------------------------------------------------------------------------------
def test_bench_usage_and_bad_kind(capsys):
    assert cli.main(["bench", "--help"]) == 0
    assert "gemm" in capsys.readouterr().out
    assert cli.main(["bench"]) == 2  # no kind: the usage, on stderr
    cap = capsys.readouterr()
    assert cap.out == "" and "usage: cute-kernels bench" in cap.err
    assert cli.main(["bench", "nothing"]) == 2
    assert "unknown kind 'nothing'" in capsys.readouterr().err
    assert cli.main(["bench", "all", "--shapes", "1x1x1"]) == 2


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_bench_all_help(capsys, flag, monkeypatch):
    """``bench all --help`` prints the options ``all`` passes on and runs nothing."""
    import cute_kernels.tools.bench as B

    monkeypatch.setattr(B, "_module", lambda k: pytest.fail(f"ran {k}"))
    assert cli.main(["bench", "all", flag]) == 0
    cap = capsys.readouterr()
    assert cap.out.startswith("usage: cute-kernels bench all") and cap.err == ""
    for opt in ("--quick", "--out DIR", "--repeats N"):
        assert opt in cap.out


def test_bench_bad_option_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "gemm", "--shapes", "12x3"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--shapes" in err


@pytest.mark.skipif(HAS_GPU, reason="the no-GPU message")
def test_bench_without_gpu_says_so(capsys):
    for kind in ("gemm", "attention", "decode", "gaps"):
        assert cli.main(["bench", kind, "--quick"]) == 2
        cap = capsys.readouterr()
        assert cap.out == "" and cap.err.count("\n") == 1 and "error: needs a CUDA device" in cap.err, cap


def test_bench_model_missing_is_a_note(monkeypatch, capsys):
    import cute_kernels.tools.bench as B

    real = B._module
    monkeypatch.setattr(B, "_module", lambda k: None if k == "model" else real(k))
    assert cli.main(["bench", "model"]) == 0
    assert "skipped" in capsys.readouterr().out


def test_bench_all_runs_every_kind_with_the_shared_options(monkeypatch):
    import cute_kernels.tools.bench as B

    calls = []

    class Kind:
        def __init__(self, k):
            self.k = k

        def main(self, argv, prog=None):
            calls.append((self.k, argv))
            return 0 if self.k != "decode" else 1

    monkeypatch.setattr(B, "_module", Kind)
    assert B.main(["all", "--quick", "--out", "X"]) == 1  # the worst status
    assert calls == [(k, ["--quick", "--out", "X"]) for k in B.KINDS]
    calls.clear()
    assert B.main(["all", "--repeats", "2"]) == 1
    assert calls[-1] == ("model", ["--rounds", "2"]) and calls[0] == ("gemm", ["--repeats", "2"])


def test_bench_all_failure_is_on_stderr(monkeypatch, capsys):
    import cute_kernels.tools.bench as B

    class Broken:
        def main(self, argv, prog=None):
            raise RuntimeError("boom")

    monkeypatch.setattr(B, "_module", lambda k: Broken())
    assert B.main(["all", "--quick"]) == 1
    cap = capsys.readouterr()
    assert "failed: RuntimeError: boom" in cap.err and "failed" not in cap.out


def test_missing_peer_is_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "quack", None)  # import quack.* raises ImportError
    notes = []
    impls = gemm.peer_impls(True, notes)
    assert list(impls) == ["cuBLAS"] and notes and notes[0].startswith("quack: skipped")


def test_progress_plain_lines(capsys):
    with progress.Progress(4, "x", plain=True) as p:
        for i in range(4):
            p.step(f"s{i}")
        p.note("hello")
    out = capsys.readouterr().out
    assert "[x] 4/4 s3" in out and "hello" in out


def test_rotated_rounds():
    assert timing.rotated("abc", 1) == ["b", "c", "a"] and timing.rotated([], 3) == []
    order = []
    ts = timing.time_rounds({"a": 1, "b": 2, "c": 3}, lambda fn: order.append(fn) or float(fn), 3)
    assert order == [1, 2, 3, 2, 3, 1, 3, 1, 2] and ts == {"a": [1.0] * 3, "b": [2.0] * 3, "c": [3.0] * 3}


# ---- orchestration on the CPU, stand-in timers -------------------------------------------------------------
def _named(fn, name):
    fn.name = name
    return fn


def test_gemm_orchestration_on_cpu(fake_gpu, monkeypatch):
    import cute_kernels

    monkeypatch.setattr(gemm, "precompile", lambda shapes: None)
    monkeypatch.setattr(cute_kernels, "gemm", lambda a, b: torch.matmul(a, b))
    monkeypatch.setitem(sys.modules, "quack", None)
    monkeypatch.setattr(ceiling, "bare_read", lambda nbytes, bench, quick=False: (_named(lambda: None, "read"), "r"))
    monkeypatch.setattr(ceiling, "matmul_same_flops", lambda fl: (_named(lambda: None, "mm"), fl / 2))
    fake_gpu.update(read=4.0, mm=3.0)
    doc = gemm.run([(64, 256, 128), (512, 512, 2048)], repeats=2, quick=True, device="cpu")
    assert doc["meta"]["device"] == "Fake GPU" and doc["meta"]["commit"] == "test123"
    assert any("quack: skipped" in n for n in doc["notes"])
    small, big = doc["rows"]
    assert small["bound"] == "memory" and small["ceiling"] == "read A+B"  # 64x256x128: 30 FLOP/byte
    assert big["bound"] == "compute" and big["ceiling"] == "cublas_same_flops"
    assert small["impls"]["cute-kernels"]["times_us"] == [10.0, 10.0] and small["ratio_vs_best_peer"] == 1.0
    assert math.isclose(small["ours_vs_ceiling"], 0.4)
    assert math.isclose(big["impls"]["cublas_same_flops"]["median_us"], 6.0)  # 3 us for half the FLOPs
    assert "geomean_vs_best_peer" in doc["summary"]


def test_decode_orchestration_on_cpu(fake_gpu, monkeypatch):
    def build(B, Hq, Hkv, L, page, notes):
        out = torch.zeros(B, 1, Hq, 128)
        notes.append("fa4: skipped")
        return {"cute": (_named(lambda: out, "cute"), lambda: out),
                f"cute_paged{page}": (_named(lambda: out, "paged"), lambda: out),
                "cudnn_sdpa": (_named(lambda: out, "cudnn"), lambda: out)}

    monkeypatch.setattr(decode, "build_impls", build)
    monkeypatch.setattr(decode, "precompile_all", lambda shapes: None)
    monkeypatch.setattr(decode, "num_splits", lambda *a: 7)
    monkeypatch.setattr(ceiling, "bare_read", lambda nbytes, bench, quick=False: (_named(lambda: None, "read"), "r"))
    fake_gpu.update(cute=8.0, paged=9.0, cudnn=10.0, read=6.0)
    doc = decode.run(decode.QUICK[:1], repeats=3, quick=True)
    (row,) = doc["rows"]
    assert row["num_splits"] == 7 and row["ceiling"] == "read KV" and row["notes"] == ["fa4: skipped"]
    assert math.isclose(row["ratio_vs_best_peer"], 10.0 / 8.0) and math.isclose(row["ours_vs_ceiling"], 0.75)
    assert row["impls"]["cute_paged16"]["role"] == "variant"
    assert math.isclose(row["impls"]["cute"]["TBps"], row["kv_bytes"] / 8e-6 / 1e12)
    assert math.isclose(doc["summary"]["geomean_paged_vs_cudnn_sdpa"], 10.0 / 9.0)


def test_attention_orchestration_on_cpu(fake_gpu, monkeypatch):
    def build(B, Hq, Hkv, S, D, causal, notes):
        out = torch.zeros(B, S, Hq, D)
        impls = {}
        if D in (64, 128):
            impls["cute"] = (_named(lambda: out, "cute"), lambda: out)
            impls["mma_bound"] = (_named(lambda: out, "bound"), lambda: out)
        else:
            notes.append("cute and mma_bound: skipped")
        impls["fa4"] = (_named(lambda: out + 1, "fa4"), lambda: out + 1)  # differs by 1: a mismatch
        return impls

    monkeypatch.setattr(attention, "build_impls", build)
    monkeypatch.setattr(attention, "precompile", lambda shapes: None)
    monkeypatch.setattr(ceiling, "matmul_same_flops", lambda fl: (_named(lambda: None, "mm"), fl * 2))
    fake_gpu.update(cute=20.0, bound=16.0, fa4=18.0, mm=5.0)
    shapes = [attention.parse_shape("b1_h2_s64_d128_causal"), attention.parse_shape("b1_h2_s64_d256_full")]
    doc = attention.run(shapes, repeats=1, quick=True)
    ok, skipped = doc["rows"]
    assert ok["ceiling"] == "mma_bound" and math.isclose(ok["ours_vs_ceiling"], 0.8)
    assert math.isclose(ok["ratio_vs_best_peer"], 0.9) and ok["impls"]["fa4"]["mismatch"]
    assert math.isclose(ok["impls"]["cublas_same_flops"]["median_us"], 2.5)  # twice the FLOPs in 5 us
    assert "cute" not in skipped["impls"] and skipped["ceiling"] == "cublas_same_flops"
    assert skipped["notes"] == ["cute and mma_bound: skipped"] and "fa4" in skipped["impls"]
    assert doc["summary"]["mismatches"] == ["b1_h2_s64_d128_causal:fa4"]


# ---- on the GPU ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("kind,limit_s", [("gemm", 60), ("decode", 120), ("attention", 180)])
def test_bench_quick_on_gpu(kind, limit_s, tmp_path):
    """``cute-kernels bench KIND --quick`` end to end: the gemm run within a minute (compiles included;
    the limits of the others leave room for a cold compile cache; not checked when xdist shares the
    GPU between workers), two timed shapes with ours, a ceiling, metadata and a markdown file."""
    t0 = time.time()
    env = {**os.environ, "CK_COMMIT": os.environ.get("CK_COMMIT", "gputest")}
    p = subprocess.run([sys.executable, "-m", "cute_kernels", "bench", kind, "--quick", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=limit_s + 120, check=False)
    dt = time.time() - t0
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (js,) = tmp_path.glob(f"{kind}-quick-*.json")
    doc = records.load(js)
    assert len(doc["rows"]) == 2 and doc["meta"]["device"] == torch.cuda.get_device_name()
    for r in doc["rows"]:
        assert r["impls"][r["ours"]]["median_us"] > 0 and r["ours_vs_ceiling"] > 0, r
    assert js.with_suffix(".md").exists() and doc["roofs"]["read_TBps"] > 1
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) <= 1:  # alone on the GPU: the time counts
        assert dt < limit_s, f"bench {kind} --quick took {dt:.0f} s"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")
def test_bench_train_quick_on_gpu(tmp_path):
    """``cute-kernels bench train --quick`` end to end (1 layer, length 1024, ~50 GB of device memory for
    five model copies): ours ran its kernels (no fallback note), every side that ran has a split whose
    attention part is named kernels (so the categoriser knows each backend's names), ours' attention
    and GEMM kernels are recognized as ours, and the ratios are filled in."""
    pytest.importorskip("transformers", minversion="5")
    env = {**os.environ, "CK_COMMIT": os.environ.get("CK_COMMIT", "gputest")}
    p = subprocess.run([sys.executable, "-m", "cute_kernels", "bench", "train", "--quick", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=600, check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (js,) = tmp_path.glob("train-quick-*.json")
    doc = records.load(js)
    (row,) = doc["rows"]
    assert row["ours"] in ("cute_kernels", "cute_kernels+gemm"), row
    assert not [n for n in row["notes"] if "did not run" in n or "no gemm" in n or "loss" in n], row["notes"]
    ran = {n: e for n, e in row["impls"].items() if "median_us" in e}
    assert {"cute_kernels", "cute_kernels+gemm", "sdpa_flash"} <= set(ran), row["impls"]
    for name, e in ran.items():
        sp = e["split"]
        assert sp["attention"] > 0 and sp["gemm"] > 0 and sp["rest"] > 0, (name, sp)
    for name in ("cute_kernels", "cute_kernels+gemm"):
        assert all("cute_kernelsattention" in n for n, _ in ran[name]["split"]["top"]["attention"]), ran[name]["split"]
    assert any("cute_kernelsgemm" in n for n, _ in ran["cute_kernels+gemm"]["split"]["top"]["gemm"])
    assert not any("cute_kernelsgemm" in n for n, _ in ran["cute_kernels"]["split"]["top"]["gemm"])
    assert row["attention_ratio"] > 0 and row["ratio_vs_best_peer"] > 0 and row["memory"]["peak"] > 0
    assert js.with_suffix(".md").exists()
