"""``cute-kernels bench gaps`` (issue 36) on the CPU: the paired timer's rotation, flushes and ratio
arithmetic with stand-in timers, the case list against the issue's table, the warm-up entries
(planned, nothing compiled), the command's options, and the whole run's orchestration with stand-in
builders and timers through the results files and the charts."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch

from cute_kernels.tools import cli
from cute_kernels.tools.bench import decode, gaps, gemm, records, results, timing

HAS_GPU = torch.cuda.is_available()

#: the issue's table: (workload, figure before the work, target)
ISSUE_ROWS = [
    ("decode b1 hq32 hkv8 L32768 d128", 0.88, 0.95),
    ("decode b8 hq32 hkv8 L8192 d128", 0.955, 0.97),
    ("decode b4 hq32 hkv4 L16384 d64", 0.82, 0.93),
    ("GEMM 4097x127x1000 (N not a multiple of 8)", 0.45, 1.0),
    ("GEMM batched 3 x 1000^3", 0.87, 1.0),
    ("GEMM 1024x1024x32768", 0.95, 1.0),
    ("GEMM 512x4096x14336", 0.97, 1.0),
    ("forward b3 hq24 hkv8 s5000 d96 full", 0.875, 1.0),
    ("forward b32 hq32 hkv8 s512 d128 causal", 0.93, 1.0),
]


# ---- the cases -----------------------------------------------------------------------------------------
def test_cases_are_the_issue_rows():
    assert [(c.workload, c.now, c.target) for c in gaps.CASES] == ISSUE_ROWS
    assert [c.family for c in gaps.CASES] == ["decode"] * 3 + ["gemm"] * 4 + ["forward"] * 2
    # each row its own sizes: the decode head dims, the GEMM batches
    assert [c.params["D"] for c in gaps.CASES[:3]] == [128, 128, 64]
    assert [c.params["batch"] for c in gaps.CASES[3:7]] == [None, 3, None, None]
    assert [c.params for c in gaps.CASES[3:7]][0] == {"batch": None, "M": 4097, "N": 127, "K": 1000}
    assert [c.reference for c in gaps.CASES] == [gaps.READ_MERGE] * 3 + ["cuBLAS"] * 4 + ["fa4", "cudnn_sdpa"]
    names = [c.name for c in gaps.CASES]
    assert len(set(names)) == 9 and names[4] == "gemm_b3_1000x1000x1000"
    assert names[0] == "decode_b1_hq32_hkv8_L32768_d128" and names[8] == "forward_b32_hq32_hkv8_s512_d128_causal"
    assert [c.name for c in gaps.select("decode")] == names[:3] and gaps.select("nothing") == []


def test_warmup_entries_plan_every_row_without_compiling():
    import cute_kernels
    from cute_kernels.common import jit

    entries = gaps.warmup_entries(gaps.CASES)
    kinds = [name for name, _ in entries]
    assert kinds.count("decode_attn") == 3 and kinds.count("gemm") == 4 and kinds.count("flash_attn") == 2
    assert {e.head_dim for n, e in entries if n == "merge_states"} <= {64, 128}
    specs = [s for n, s in entries if n == "gemm"]
    assert specs[1] == {"m": 1000, "n": 1000, "k": 1000, "batch": 3} and "batch" not in specs[0]
    assert gaps.warmup_entries(gaps.CASES[:2] * 2) == gaps.warmup_entries(gaps.CASES[:2])  # each entry once
    with jit.dry_run() as d:  # warmup takes every entry (planned; nothing compiled)
        assert cute_kernels.warmup(entries) == len(entries)
    assert {"decode_attn", "flash_attn_fwd"} <= {name for name, _ in d.seen}


def test_helpers_take_the_rows_sizes():
    assert gemm.flops_bytes(2, 3, 5, batch=3) == (3 * 60.0, 3 * 2.0 * (10 + 15 + 6))
    assert decode.flops_bytes(1, 32, 4, 16, D=64) == (4.0 * 32 * 16 * 64, 2.0 * 16 * 4 * 64 * 2)
    ref = torch.ones(4, 4)
    assert gemm.rel_error(ref * 1.001, ref) < 2e-2
    with pytest.raises(RuntimeError, match="wrong result"):
        gemm.rel_error(ref * 1.5, ref)


def test_checked_difference():
    ref = torch.linspace(-1.0, 1.0, 64)
    assert gaps.checked_difference(ref.bfloat16(), ref, "r") < 1e-2  # bf16 rounding passes
    with pytest.raises(RuntimeError, match="wrong result.*against r"):
        gaps.checked_difference(torch.zeros(64), ref * 0.05, "r")  # zeros fail, however small the values


# ---- the builders, on the CPU (decode_attn's torch path; stand-ins for what needs CUDA) ------------------------
def _cpu_decode_inputs(B, Hq, Hkv, L, D):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*s, generator=g).bfloat16() for s in ((B, 1, Hq, D), (B, L, Hkv, D), (B, L, Hkv, D)))
    return q, k, v, torch.full((B,), L, dtype=torch.int32)


@pytest.mark.parametrize("L", [4096, 256])  # split (a merge to time) and not
def test_build_decode(fake_gpu, monkeypatch, L):
    from cute_kernels.attention.decode import explain
    from cute_kernels.tools.bench import ceiling

    asked = {}

    def bare_read(nbytes, bench, quick=False):
        asked["read"] = nbytes
        return _named("read"), "a read"

    def merge_alone(*args):
        asked["merge"] = args
        return _named("merge")

    monkeypatch.setattr(decode, "make_inputs", _cpu_decode_inputs)
    monkeypatch.setattr(ceiling, "bare_read", bare_read)
    monkeypatch.setattr(gaps, "merge_alone", merge_alone)
    case = gaps.Case("decode", "small", {"B": 2 if L == 256 else 1, "Hq": 8, "Hkv": 2, "L": L, "D": 64},
                     gaps.READ_MERGE, 0.9, 0.9)
    notes = []
    built = gaps.build_decode(case, None, True, notes)
    splits = explain(case.params["B"], 8, 2, L, head_dim=64)["num_splits"]
    fl, nb = decode.flops_bytes(case.params["B"], 8, 2, L, 64)
    assert (built.flops, built.nbytes, asked["read"]) == (fl, nb, int(nb)) and built.extra["num_splits"] == splits
    assert built.errors["cute"] < 1e-2 and built.roles["cute"] == "ours"
    if L == 4096:
        assert splits > 1 and list(built.impls) == ["cute", gaps.READ, gaps.MERGE] and asked["merge"] == (splits, 1, 8, 64)
    else:
        assert splits == 1 and list(built.impls) == ["cute", gaps.READ] and "merge" not in asked
        assert notes and "no merge" in notes[0]
    # a kernel writing nothing is not timed
    monkeypatch.setattr(decode, "ours_impl", lambda q, k, v, s: (lambda: None, lambda: torch.zeros_like(q)))
    with pytest.raises(RuntimeError, match="wrong result"):
        gaps.build_decode(case, None, True, [])


def test_build_forward_picks_ours_and_the_peers(fake_gpu, monkeypatch):
    from cute_kernels.tools.bench import attention

    out = torch.randn(1, 16, 2, 64)
    calls = []

    def build(B, Hq, Hkv, S, D, causal, notes, bound=True):
        assert not bound  # no MMA bound to compile
        notes.append("fa4: skipped")
        impls = {"cudnn_sdpa": (lambda: calls.append("cudnn"), lambda: out + 1e-4),
                 "fa2_sdpa": (lambda: calls.append("fa2"), lambda: out)}
        if D != 256:
            impls["cute"] = (lambda: calls.append("cute"), lambda: out)
        return impls

    monkeypatch.setattr(attention, "build_impls", build)
    case = gaps.CASES[7]  # against FA4, which is missing here: checked against cuDNN
    built = gaps.build_forward(case, None, False, [])
    assert list(built.impls) == ["cute", "cudnn_sdpa"] and built.extra["checked_against"] == "cudnn_sdpa"
    assert built.roles == {"cute": "ours", "cudnn_sdpa": "peer"} and built.errors["cute"] < 1e-3
    assert (built.flops, built.nbytes) == attention.flops_bytes(3, 24, 8, 5000, 96, False)
    assert calls == ["cute", "cudnn"]  # each run once before the check; FA2 not timed
    with pytest.raises(RuntimeError, match="cannot run"):
        gaps.build_forward(case._replace(params={**case.params, "D": 256}), None, False, [])


# ---- the paired timer ------------------------------------------------------------------------------------
def test_paired_times_rotate_and_time_each_call_alone():
    calls, timed = [], []
    impls = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    speeds = {"a": 1.0, "b": 2.0, "c": 3.0}

    def time_one(fn):
        n_before = len(calls)
        fn()
        timed.append(calls[n_before])  # exactly one call per timing
        assert len(calls) == n_before + 1
        return speeds[calls[-1]]

    ticks = []
    times = timing.paired_times(impls, 4, time_one=time_one, warmup=2, tick=ticks.append)
    assert calls[:6] == ["a", "a", "b", "b", "c", "c"]  # warm-up, untimed
    assert timed == list("abc" "bca" "cab" "abc")  # repetition r: rotated left by r
    assert times == {"a": [1.0] * 4, "b": [2.0] * 4, "c": [3.0] * 4} and ticks == timed


def test_default_paired_timer_flushes_before_every_call(monkeypatch):
    log = []
    monkeypatch.setattr(timing, "zero_flush", lambda: (lambda: log.append("flush")))

    def event_us(fn, flush):
        flush()
        fn()
        return 5.0

    monkeypatch.setattr(timing, "event_us", event_us)
    times = timing.paired_times({"x": lambda: log.append("x"), "y": lambda: log.append("y")}, 2, warmup=0)
    assert log == ["flush", "x", "flush", "y", "flush", "y", "flush", "x"] and times == {"x": [5.0] * 2, "y": [5.0] * 2}


def test_event_us_order(monkeypatch):
    """flush, the lead spin, start event, the call, end event, wait: the call alone between the events."""
    log = []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.name = "start" if not any(e.startswith("event") for e in log) else "end"
            log.append(f"event {self.name}")

        def record(self):
            log.append(f"record {self.name}")

        def synchronize(self):
            log.append("sync")

        def elapsed_time(self, other):
            return 0.25  # milliseconds

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(f"sleep {cycles}"))
    us = timing.event_us(lambda: log.append("call"), lambda: log.append("flush"))
    assert us == 250.0
    assert log == ["flush", f"sleep {timing.LEAD_CYCLES}", "event start", "event end", "record start", "call",
                   "record end", "sync"]


def test_paired_ratio_is_the_median_of_per_repetition_ratios():
    t = {"ours": [10.0, 20.0, 30.0], "ref": [9.0, 22.0, 27.0], "read": [5.0, 5.0, 5.0], "merge": [1.0, 2.0, 3.0]}
    assert math.isclose(timing.paired_ratio(t, "ref", "ours"), 0.9)  # median(0.9, 1.1, 0.9)
    # not the ratio of the medians (22 / 20)
    assert not math.isclose(timing.paired_ratio(t, "ref", "ours"),
                            statistics.median(t["ref"]) / statistics.median(t["ours"]))
    # a sum of names per repetition: (read + merge) / ours = median(6/10, 7/20, 8/30)
    assert math.isclose(timing.paired_ratio(t, ("read", "merge"), "ours"), 0.35)
    assert math.isclose(timing.paired_ratio(t, "ours", ["read", "merge"]), 20.0 / 7.0)
    with pytest.raises(ValueError, match="repetitions"):
        timing.paired_ratio({"a": [1.0, 2.0], "b": [1.0]}, "a", "b")
    with pytest.raises(ValueError, match="repetitions"):
        timing.paired_ratio({"a": [1.0, 2.0], "b": [1.0]}, ("a", "b"), "a")


# ---- the command -----------------------------------------------------------------------------------------
def test_cli_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "gaps", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: cute-kernels bench gaps")
    for opt in ("--repeats", "--only", "--quick", "--out", "paired"):
        assert opt in out
    assert cli.main(["bench", "--help"]) == 0
    assert "gaps" in capsys.readouterr().out


def test_gaps_is_not_part_of_all():
    import cute_kernels.tools.bench as B

    assert "gaps" not in B.KINDS and "gaps" in B.ALONE


def test_bad_only_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "gaps", "--only", "nothing"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--only" in err


# ---- orchestration on the CPU, stand-in builders and timers --------------------------------------------------
def _named(name):
    fn = lambda: None  # noqa: E731
    fn.name = name
    return fn


def _stub_builders(monkeypatch):
    """Builders of stand-in calls, named for the fake timer: the d64 decode row plans one split (no
    merge), the batched GEMM fails, FA4 is missing."""
    def build_decode(case, bench, quick, notes):
        impls = {"cute": _named("dec"), gaps.READ: _named("read")}
        if case.params["D"] == 128:
            impls[gaps.MERGE] = _named("merge")
        else:
            notes.append("one split")
        return gaps.Built(impls, {"cute": "ours", gaps.READ: "ceiling", gaps.MERGE: "ceiling"}, 1e9, 2e7,
                          {"cute": 1e-3}, {"num_splits": 8 if case.params["D"] == 128 else 1})

    def build_gemm(case, bench, quick, notes):
        if case.params["batch"]:
            raise RuntimeError("wrong result: rel err 0.5")
        return gaps.Built({"cute-kernels": _named("ck"), "cuBLAS": _named("cublas")},
                          {"cute-kernels": "ours", "cuBLAS": "peer"}, 2e9, 1e8)

    def build_forward(case, bench, quick, notes):
        notes.append("fa4: skipped")
        return gaps.Built({"cute": _named("fwd"), "cudnn_sdpa": _named("cudnn")},
                          {"cute": "ours", "cudnn_sdpa": "peer"}, 1e9, 1e8, {"cute": 2e-3})

    monkeypatch.setattr(gaps, "build_decode", build_decode)
    monkeypatch.setattr(gaps, "build_gemm", build_gemm)
    monkeypatch.setattr(gaps, "build_forward", build_forward)
    monkeypatch.setattr(gaps, "precompile", lambda cases: None)
    stand_in = timing.make_bench(True)[0]  # fake_gpu's: the time set for the call's name
    real = timing.paired_times
    monkeypatch.setattr(timing, "paired_times", lambda impls, reps, tick=None: real(impls, reps, stand_in, tick=tick))


def test_gaps_orchestration_on_cpu(fake_gpu, monkeypatch, tmp_path):
    _stub_builders(monkeypatch)
    fake_gpu.update(dec=10.0, read=8.0, merge=1.5, ck=10.0, cublas=11.0, fwd=10.0, cudnn=9.3)
    doc = gaps.run(gaps.CASES, repeats=3)
    assert doc["kind"] == "gaps" and doc["meta"]["device"] == "Fake GPU" and doc["meta"]["timer"] == gaps.TIMER
    assert doc["meta"]["repeats"] == 3 and doc["meta"]["bare_read_chosen_by"] == "stand-in timer"
    rows = {r["workload"]: r for r in doc["rows"]}
    assert [r["workload"] for r in doc["rows"]] == [w for w, *_ in ISSUE_ROWS]

    d1 = rows["decode b1 hq32 hkv8 L32768 d128"]
    assert d1["impls"]["cute"]["times_us"] == [10.0] * 3 and d1["impls"][gaps.READ_MERGE]["times_us"] == [9.5] * 3
    assert math.isclose(d1["ratio"], 0.95) and d1["met"] is True  # (8 + 1.5) / 10 reaches 0.95
    assert math.isclose(d1["also"]["of read KV"], 0.8) and d1["ceiling"] == gaps.READ_MERGE
    assert math.isclose(d1["impls"]["cute"]["TBps"], 2e7 / 10e-6 / 1e12) and d1["num_splits"] == 8
    assert d1["impls"]["cute"]["error_vs_reference"] == 1e-3 and d1["target"] == 0.95 and d1["issue_now"] == 0.88
    d2 = rows["decode b8 hq32 hkv8 L8192 d128"]
    assert math.isclose(d2["ratio"], 0.95) and d2["met"] is False  # target 0.97
    d3 = rows["decode b4 hq32 hkv4 L16384 d64"]
    assert math.isclose(d3["ratio"], 0.8) and gaps.MERGE not in d3["impls"] and d3["notes"] == ["one split"]

    g = rows["GEMM 512x4096x14336"]
    assert math.isclose(g["ratio"], 1.1) and g["met"] is True and g["reference"] == "cuBLAS"
    assert math.isclose(g["impls"]["cute-kernels"]["tflops"], 2e9 / 10e-6 / 1e12)
    bad = rows["GEMM batched 3 x 1000^3"]
    assert bad["met"] is False and bad["ratio"] is None and "wrong result" in bad["error"]

    f8 = rows["forward b3 hq24 hkv8 s5000 d96 full"]
    assert f8["ratio"] is None and f8["met"] is None and math.isclose(f8["also"]["x cudnn_sdpa"], 0.93)
    assert "fa4: not timed here, the target is not judged" in f8["notes"]
    f9 = rows["forward b32 hq32 hkv8 s512 d128 causal"]
    assert math.isclose(f9["ratio"], 0.93) and f9["met"] is False and f9["also"] == {}

    s = doc["summary"]
    assert s["targets_judged"] == 8 and s["targets_met"] == 4  # d1 and three 2-D GEMMs
    assert s["not_met"] == ["decode b8 hq32 hkv8 L8192 d128", "decode b4 hq32 hkv4 L16384 d64",
                            "GEMM batched 3 x 1000^3", "forward b32 hq32 hkv8 s512 d128 causal"]

    js, md = results.write(doc, tmp_path, to_markdown=gaps.markdown)
    text = md.read_text()
    assert "| decode b1 hq32 hkv8 L32768 d128 | 10.0 (2.00 TB/s) | read KV + merge | 9.5 (2.11 TB/s) | " \
           "0.950 of ceiling | >= 0.95 | yes | 0.800 of read KV | 0.88 of bare read |" in text
    assert "| GEMM 512x4096x14336 | 10.0 (200 TFLOP/s) | cuBLAS | 11.0 (182 TFLOP/s) | 1.100x | >= 1.0 | yes | - " \
           "| 0.97x |" in text
    assert "| forward b3 hq24 hkv8 s5000 d96 full | 10.0 (100 TFLOP/s) | fa4 | - | - | >= 1.0 | not judged | " \
           "0.930x cudnn_sdpa | 0.875x |" in text
    assert "Targets met: 4 of 8 judged (9 rows); not met: decode b8" in text and "wrong result" in text
    back = records.load(js)
    assert back["kind"] == "gaps" and back["rows"][0]["ratio"] == doc["rows"][0]["ratio"]
    assert json.loads(js.read_text())["schema"] == results.SCHEMA


def test_charts_draw_a_gaps_file(fake_gpu, monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    from cute_kernels.tools import charts

    _stub_builders(monkeypatch)
    fake_gpu.update(dec=10.0, read=8.0, merge=1.5, ck=10.0, cublas=11.0, fwd=10.0, cudnn=9.3)
    js, _ = results.write(gaps.run(gaps.CASES, repeats=2), tmp_path / "res", to_markdown=gaps.markdown)
    written = charts.make([js], tmp_path / "charts")
    assert {p.name for p in written} == {f"{js.stem}-gaps.png", "tables.md"}
    assert (tmp_path / "charts" / f"{js.stem}-gaps.png").stat().st_size > 10 * 1024
    tables = (tmp_path / "charts" / "tables.md").read_text()
    assert "| GEMM 512x4096x14336 | cuBLAS | 1.100 | 1.0 | yes |" in tables
    assert "| forward b3 hq24 hkv8 s5000 d96 full | fa4 | - | 1.0 | not judged |" in tables


def test_main_writes_the_files(fake_gpu, monkeypatch, tmp_path, capsys):
    _stub_builders(monkeypatch)
    assert cli.main(["bench", "gaps", "--only", "gemm_1024", "--repeats", "2", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("gaps-*-test123.json")
    doc = records.load(js)
    assert [r["shape"] for r in doc["rows"]] == ["gemm_1024x1024x32768"] and doc["meta"]["repeats"] == 2
    assert js.with_suffix(".md").read_text().startswith("# Issue 36 gaps")
    assert "wrote" in capsys.readouterr().out
