"""``cute-kernels bench attention --backward`` (issue 32) on the CPU: the options, the shapes, the FLOP
count, the sides' autograd calls and gradient layouts (SDPA's math backend standing in for a GPU
backend), the gradient check and its tolerance, the orchestration with stand-in timers, and the
results file through records and charts; on a GPU (``gpu`` marker) the quick run itself."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cute_kernels.tools import cli
from cute_kernels.tools.bench import attention, records, results
from cute_kernels.tools.bench import attention_backward as AB

ROOT = Path(__file__).resolve().parents[2]
HAS_GPU = torch.cuda.is_available()


# ---- options, shapes, FLOPs ------------------------------------------------------------------------
def test_help_and_the_forward_help_name_it(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "attention", "--backward", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: cute-kernels bench attention --backward")
    for want in ("autograd.grad", "2.5x", "mma_only", "cuDNN", "--quick", "--shapes", "--out"):
        assert want in out, want
    with pytest.raises(SystemExit):
        cli.main(["bench", "attention", "--help"])
    assert "--backward" in capsys.readouterr().out
    assert cli.main(["bench", "--help"]) == 0
    assert "--backward" in capsys.readouterr().out


def test_arguments_parse():
    ap = AB.build_parser()
    a = ap.parse_args(["--quick", "--repeats", "2", "--only", "causal", "--out-dir", "X", "--tag", "t"])
    assert (a.quick, a.repeats, a.only, a.out, a.tag) == (True, 2, "causal", "X", "t")
    assert ap.parse_args([]).out == os.path.join("profiles", "results") and ap.parse_args([]).repeats == 3


@pytest.mark.parametrize("argv,words", [(["--shapes", "b4_h32_s4096_d128"], "--shapes"),
                                        (["--only", "nothing"], "matches no shape"),
                                        (["--repeats", "0"], "--repeats")])
def test_bad_arguments_are_one_line(capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "attention", "--backward", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "--backward" in err, err


@pytest.mark.skipif(HAS_GPU, reason="the no-GPU message")
def test_without_gpu_says_so(capsys):
    assert cli.main(["bench", "attention", "--backward", "--quick"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and "--backward: error: needs a CUDA device" in cap.err


def test_shapes_are_the_forward_bench_s():
    assert AB.select() == attention.SHAPES and len(AB.SHAPES) == 8
    assert AB.select(quick=True) == attention.QUICK and len(AB.QUICK) == 2
    names = [s[0] for s in AB.SHAPES]
    for want in ("b4_h32_s4096_d128_full", "b4_h32_s4096_d128_causal", "b8_h32_s2048_d64_full",
                 "b1_h32_s16384_d128_causal", "b2_hq32_hkv8_s8192_d128_causal", "b16_h16_s1024_d128_causal",
                 "b4_h16_s4096_d256_full", "b4_h32_s4096_d96_causal"):
        assert want in names
    assert [s[0] for s in AB.select(only="hkv8")] == ["b2_hq32_hkv8_s8192_d128_causal"]
    from layouts import attention_backward as LB

    # every shape runs our backward (D 256 too, since the head-dim split tile)
    assert all(s[5] in LB.BWD_HEAD_DIMS for s in AB.SHAPES)


def test_flop_count_is_two_and_a_half_forwards():
    fwd, _ = attention.flops_bytes(4, 32, 32, 4096, 128, False)
    f, b = AB.flops_bytes(4, 32, 32, 4096, 128, False)
    assert f == 2.5 * fwd == 2.5 * 4 * 4 * 32 * 4096 * 4096 * 128
    assert AB.flops_bytes(4, 32, 32, 4096, 128, True)[0] == f / 2  # causal square: half the pairs
    # q, out, dout read and dq written per query head; k, v read and dk, dv written per KV head
    assert b == 2.0 * 4 * 4096 * 128 * (4 * 32 + 4 * 32)
    assert AB.flops_bytes(2, 32, 8, 8192, 128, True)[1] == 2.0 * 2 * 8192 * 128 * (4 * 32 + 4 * 8)


# ---- the sides' calls, on the CPU --------------------------------------------------------------------
@pytest.fixture
def no_sync(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)


def _reference_grads(q, k, v, dout, causal):
    """float64 gradients of softmax(q k^T / sqrt(D)) v, (B, S, H, D) in and out, GQA by expansion."""
    rep = q.shape[2] // k.shape[2]
    q_, k_, v_ = (t.detach().double().requires_grad_() for t in (q, k, v))
    qh, kh, vh = q_.transpose(1, 2), k_.repeat_interleave(rep, 2).transpose(1, 2), v_.repeat_interleave(rep, 2).transpose(1, 2)
    s = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    o = (torch.softmax(s, -1) @ vh).transpose(1, 2)
    return torch.autograd.grad(o, (q_, k_, v_), dout.double())


@pytest.mark.parametrize("hq,hkv,causal", [(4, 4, False), (4, 2, True)])
def test_sdpa_side_grads_are_the_gradients_in_bshd(no_sync, hq, hkv, causal):
    """An SDPA side (the math backend standing in for cuDNN's): its timed call is autograd.grad of one
    forward, its gradients come back (B, S, H, D), GQA's dK / dV summed over the query heads."""
    from torch.nn.attention import SDPBackend

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 24, h, 16, generator=g, requires_grad=True) for h in (hq, hkv, hkv))
    dout = torch.randn(2, 24, hq, 16, generator=g)
    impls, notes = {}, []
    AB._sdpa(impls, notes, SDPBackend.MATH, "cudnn_sdpa", q, k, v, dout, causal, hq, hkv)
    run, grads = impls["cudnn_sdpa"]
    got, want = grads(), _reference_grads(q, k, v, dout, causal)
    for a, b in zip(got, want):
        assert a.shape == b.shape and torch.allclose(a.double(), b, atol=1e-4)
    assert len(run()) == 3 and len(run()) == 3  # retain_graph: the call repeats
    assert q.grad is None  # autograd.grad: nothing accumulates between the timed calls


def test_ours_rejecting_the_head_dim_is_a_note(monkeypatch, no_sync):
    import cute_kernels

    def reject(q, k, v, causal=False):
        raise ValueError("flash_attn: the backward runs head dims (64, 96, 128), got 256")

    monkeypatch.setattr(cute_kernels, "flash_attn", reject)
    impls, notes = {}, []
    q = torch.randn(1, 8, 2, 256, requires_grad=True)
    AB._ours(impls, notes, q, q, q, torch.randn(1, 8, 2, 256), False)
    assert impls == {} and len(notes) == 1 and notes[0].startswith("cute and mma_bound: skipped")


def test_missing_fa4_is_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", None)
    impls, notes = {}, []
    AB._fa4(impls, notes, None, None, None, None, True)
    assert impls == {} and notes[0].startswith("fa4: skipped")


# ---- the gradient check ----------------------------------------------------------------------------------
def _side(grads, name=None):
    fn = (lambda: None) if name is None else _named(lambda: None, name)
    return fn, (lambda: grads)


def test_compare_against_cudnn_with_a_relative_tolerance():
    base = tuple(torch.full((1, 4, 2, 8), 2.0) for _ in range(3))
    near = (base[0] + 0.05, base[1], base[2] - 0.05)  # 2.5% of max |ref| = 2
    far = (base[0], base[1] + 0.1, base[2])  # 5%
    impls = {"cute": _side(near), "mma_bound": ((lambda: None), None), "fa4": _side(far), "cudnn_sdpa": _side(base)}
    ref, diffs = AB.compare(impls)
    assert ref == "cudnn_sdpa" and set(diffs) == {"cute", "fa4"}
    assert math.isclose(diffs["cute"]["dq"], 0.025, rel_tol=1e-5) and diffs["cute"]["dk"] == 0
    row = AB.make_row("b1_h2_s4_d8_full", 1, 2, 2, 4, 8, False, {"cute": [1.0], "fa4": [1.0], "cudnn_sdpa": [1.0]},
                      ref, diffs, [])
    assert not row["impls"]["cute"]["mismatch"] and row["impls"]["fa4"]["mismatch"]
    assert "mismatch" not in row["impls"]["cudnn_sdpa"] and row["reference"] == "cudnn_sdpa"
    # without cuDNN: the first peer that ran; nothing to compare with: no reference
    assert AB.compare({"cute": _side(near), "fa2_sdpa": _side(base)})[0] == "fa2_sdpa"
    assert AB.compare({"cute": _side(near)}) == (None, {})
    nan = (base[0] * float("nan"), base[1], base[2])
    r2 = AB.make_row("x", 1, 2, 2, 4, 8, False, {"cute": [1.0]}, "cudnn_sdpa",
                     AB.compare({"cute": _side(nan), "cudnn_sdpa": _side(base)})[1], [])
    assert r2["impls"]["cute"]["mismatch"]  # NaN gradients are flagged


def test_tolerance_separates_rounding_from_a_dropped_tile():
    """GRAD_RTOL's justification, small: bf16 gradients of a flash-style computation (P and dS
    rounded to bf16 before their GEMMs) stay within it of the float64 ones; dropping 16 of 96 keys
    from every row does not."""
    g = torch.Generator().manual_seed(0)
    B, S, H, D = 1, 96, 2, 64
    q, k, v, dout = (torch.randn(B, S, H, D, generator=g).bfloat16() for _ in range(4))
    ref = _reference_grads(q, k, v, dout, True)
    scale = 1 / math.sqrt(D)
    qh, kh, vh, dh = (t.float().transpose(1, 2) for t in (q, k, v, dout))
    s = (qh @ kh.transpose(-1, -2) * scale).masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(s, -1)
    o = (p.bfloat16().float() @ vh).bfloat16().float()
    ds = (p * (dh @ vh.transpose(-1, -2) - (o * dh).sum(-1, keepdim=True))).bfloat16().float()
    flash = [(ds @ kh * scale), (ds.transpose(-1, -2) @ qh * scale), (p.bfloat16().float().transpose(-1, -2) @ dh)]
    flash = [t.transpose(1, 2).bfloat16() for t in flash]
    for a, b in zip(flash, ref):
        assert (a.double() - b).abs().max() / b.abs().max() < AB.GRAD_RTOL / 2
    kd = k.clone()
    kd[:, 40:56] = -1e4  # those keys get no weight
    bad = _reference_grads(q, kd, v, dout, True)
    assert max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(bad, ref)) > 2 * AB.GRAD_RTOL


# ---- orchestration with stand-in timers ------------------------------------------------------------------
def _named(fn, name):
    fn.name = name
    return fn


@pytest.fixture
def fake_gpu(fake_gpu, monkeypatch):
    """tests/tools/conftest.py's stand-ins, with no precompile and an MMA bound to build."""
    monkeypatch.setattr(AB, "precompile", lambda shapes: None)
    monkeypatch.setattr(AB, "bound_supported", lambda: True)
    return fake_gpu


def _stand_in_build(B, Hq, Hkv, S, D, causal, notes):
    """ours (and its bound) where the backward runs, cuDNN always, FA4 off by a gradient bug."""
    g = tuple(torch.ones(B, S, h, D) for h in (Hq, Hkv, Hkv))
    impls = {}
    if D in (64, 96, 128):
        impls["cute"] = _side(g, "cute")
        impls["mma_bound"] = (_named(lambda: None, "bound"), None)
    else:
        notes.append("cute and mma_bound: skipped, flash_attn rejects the shape")
    impls["cudnn_sdpa"] = _side(g, "cudnn")
    impls["fa4"] = _side((g[0], g[1] * 2, g[2]), "fa4")
    return impls


def _run_doc(fake_gpu, monkeypatch, cudnn=24.0):
    monkeypatch.setattr(AB, "build_impls", _stand_in_build)
    fake_gpu.update(cute=20.0, bound=15.0, cudnn=cudnn, fa4=25.0)
    shapes = [attention.parse_shape("b1_h2_s64_d128_causal"), attention.parse_shape("b1_h2_s64_d256_full")]
    return AB.run(shapes, repeats=2, quick=True)


def test_orchestration_on_cpu(fake_gpu, monkeypatch):
    doc = _run_doc(fake_gpu, monkeypatch)
    assert doc["kind"] == "attention-backward" and doc["direction"] == "backward"
    assert doc["meta"]["direction"] == "backward" and doc["meta"]["device"] == "Fake GPU"
    ok, skipped = doc["rows"]
    assert ok["flops"] == 2.5 * attention.flops_bytes(1, 2, 2, 64, 128, True)[0]
    assert ok["impls"]["cute"]["times_us"] == [20.0, 20.0] and ok["impls"]["cute"]["role"] == "ours"
    assert math.isclose(ok["impls"]["cute"]["tflops"], ok["flops"] / 20e-6 / 1e12)
    assert ok["ceiling"] == "mma_bound" and math.isclose(ok["ours_vs_ceiling"], 0.75)
    assert math.isclose(ok["ratio_vs"]["cudnn_sdpa"], 1.2) and ok["best_peer"] == "cudnn_sdpa"
    assert math.isclose(ok["ratio_vs_best_peer"], 1.2) and ok["reference"] == "cudnn_sdpa"
    assert ok["impls"]["fa4"]["mismatch"] and not ok["impls"]["cute"]["mismatch"]
    assert "cute" not in skipped["impls"] and skipped["ceiling"] is None and "fa4" in skipped["impls"]
    assert skipped["notes"] == ["cute and mma_bound: skipped, flash_attn rejects the shape"]
    s = doc["summary"]
    assert math.isclose(s["geomean_vs_cudnn_sdpa"], 1.2) and math.isclose(s["min_vs_cudnn_sdpa"], 1.2)
    assert s["cudnn_target_met"] is True and s["cudnn_shapes"] == 1
    assert s["mismatches"] == ["b1_h2_s64_d128_causal:fa4", "b1_h2_s64_d256_full:fa4"]


def test_cudnn_target_needs_every_shape_above_0_9(fake_gpu, monkeypatch):
    doc = _run_doc(fake_gpu, monkeypatch, cudnn=17.0)  # 0.85x
    assert doc["summary"]["cudnn_target_met"] is False
    rows = [{"ratio_vs": {"cudnn_sdpa": x}} for x in (1.3, 1.2, 0.89)]
    assert AB.cudnn_summary(rows)["cudnn_target_met"] is False  # geomean 1.11, one below 0.9
    rows[-1]["ratio_vs"]["cudnn_sdpa"] = 0.91
    assert AB.cudnn_summary(rows)["cudnn_target_met"] is True
    assert AB.cudnn_summary([{}]) == {"cudnn_target_met": None}


def test_results_round_trip_through_records_and_charts(fake_gpu, monkeypatch, tmp_path):
    doc = _run_doc(fake_gpu, monkeypatch)
    js, md = AB.write(doc, tmp_path / "out", tag="quick")
    assert js.name == f"attention-backward-quick-{doc['meta']['date']}-test123.json"
    back = records.load(js)
    assert back["kind"] == "attention-backward" and back["rows"][0]["ratio_vs"] == doc["rows"][0]["ratio_vs"]
    text = md.read_text()
    for want in ("# Attention backward bf16", "Fake GPU", "test123", "x cudnn_sdpa", "| b1_h2_s64_d128_causal | 1.20x |",
                 "target met", "MISMATCH", "b1_h2_s64_d256_full: cute and mma_bound: skipped", "mma_bound (ceiling)"):
        assert want in text, want
    assert text == AB.markdown(json.loads(js.read_text()))
    pytest.importorskip("matplotlib")
    from cute_kernels.tools import charts

    written = charts.make([js], tmp_path / "charts")
    names = {p.name for p in written}
    assert f"{js.stem}-ratios.png" in names and "roofline.png" in names
    tables = (tmp_path / "charts" / "tables.md").read_text()
    assert "Attention backward bf16" in tables and f"`{js.name}`" in tables


# ---- profiles ---------------------------------------------------------------------------------------------
def test_profiles_wrapper_and_gpu_step():
    text = (ROOT / "profiles" / "bench_attention.py").read_text()
    assert "--backward" in text
    script = (ROOT / "profiles" / "gpu_session.sh").read_text()
    line = next(ln for ln in script.splitlines() if ln.strip().startswith("bench-attention-backward)"))
    assert "profiles/bench_attention.py --backward" in line and "${BENCH_BWD_S:-420}" in line
    assert '--out-dir "$OUT"' in line
    p = subprocess.run([sys.executable, str(ROOT / "profiles" / "bench_attention.py"), "--backward", "--help"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert p.returncode == 0 and p.stdout.startswith("usage: bench_attention.py --backward"), p.stderr[-2000:]


# ---- on the GPU --------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")
def test_backward_quick_on_gpu(tmp_path):
    """``cute-kernels bench attention --backward --quick`` end to end: two timed shapes with ours, its
    gradients within the tolerance of cuDNN's, the MMA bound where the configuration has it."""
    t0 = time.time()
    env = {**os.environ, "CK_COMMIT": os.environ.get("CK_COMMIT", "gputest")}
    p = subprocess.run([sys.executable, "-m", "cute_kernels", "bench", "attention", "--backward", "--quick", "--out",
                        str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=420, check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (js,) = tmp_path.glob("attention-backward-quick-*.json")
    doc = records.load(js)
    assert len(doc["rows"]) == 2 and doc["meta"]["device"] == torch.cuda.get_device_name()
    for r in doc["rows"]:
        o = r["impls"][r["ours"]]
        assert o["median_us"] > 0 and not o.get("mismatch"), r
        if AB.bound_supported():
            assert r["ours_vs_ceiling"] > 0, r
    assert js.with_suffix(".md").exists() and time.time() - t0 < 420
    assert results.RATE[doc["kind"]] == ("tflops", "TFLOP/s")
