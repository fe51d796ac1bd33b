"""``cute-kernels bench attention --backward --varlen`` (issue 33's packed backward vs FA4's) on the CPU:
the options and their dispatch, the cases (the forward varlen bench's own draws), the FLOP count, the
float32 reference, the orchestration with stand-in sides and timer (a failing FA4 backward recorded,
not fatal), the results file through records; the profiles wrapper and the GPU step."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cute_kernels.tools import cli
from cute_kernels.tools.bench import attention_varlen as AV
from cute_kernels.tools.bench import records, timing
from cute_kernels.tools.bench import attention_backward as AB
from cute_kernels.tools.bench import attention_backward_varlen as ABV

ROOT = Path(__file__).resolve().parents[2]
HAS_GPU = torch.cuda.is_available()
NAMES = ["varlen_b32_logu1-8192_hq32_hkv8_d128_causal", "manyshort_b1024_logu1-512_hq32_hkv8_d128_causal"]


# ---- options, dispatch, cases, FLOPs ---------------------------------------------------------------
def test_help_through_the_cli(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "attention", "--backward", "--varlen", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: cute-kernels bench attention --backward --varlen")
    for want in ("flash_attn_varlen_func", "autograd.grad", "paired", "2.5x", "--only", "--repeats", "--list", *NAMES):
        assert want in out, want
    with pytest.raises(SystemExit):
        cli.main(["bench", "attention", "--backward", "--help"])
    assert "--varlen" in capsys.readouterr().out  # the dense backward's help names the mode


def test_flag_order_does_not_matter_and_the_dense_parser_points_to_it(capsys):
    assert cli.main(["bench", "attention", "--varlen", "--backward", "--list", "--only", "manyshort"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(NAMES[1]) and NAMES[0] not in out
    with pytest.raises(SystemExit) as e:
        AB.main(["--varlen"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "--backward --varlen" in err


@pytest.mark.parametrize("argv,words", [(["--only", "nothing"], "matches no case"), (["--repeats", "0"], "--repeats"),
                                        (["--shapes", "b1_h2_s64_d64_full"], "--shapes")])
def test_bad_arguments_are_one_line(capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "attention", "--backward", "--varlen", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "--backward --varlen" in err, err


@pytest.mark.skipif(HAS_GPU, reason="the no-GPU message")
def test_without_gpu_says_so(capsys):
    assert cli.main(["bench", "attention", "--backward", "--varlen", "--quick"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and "--varlen: error: needs a CUDA device" in cap.err


def test_cases_are_the_forward_varlen_bench_s():
    got = ABV.select()
    assert [c.name for c in got] == NAMES
    fwd = {c.name: c for c in AV.select("varlen_b32,manyshort")}
    for c in got:  # the same length draws: identical shapes
        assert c == fwd[c.name] and c.mode == "varlen" and c.lens_q == c.lens_k
    assert got[0].B == 32 and max(got[0].lens_q) <= 8192 and got[1].B == 1024 and max(got[1].lens_q) <= 512
    (q,) = ABV.select(quick=True)
    assert q.name == "varlen_b8_logu1-2048_hq32_hkv8_d128_causal" and q == AV.select(quick=True)[0]
    assert [c.name for c in ABV.select("manyshort")] == NAMES[1:] and ABV.select("paged") == []


def test_flops_are_two_and_a_half_forwards_of_the_visible_pairs():
    c = ABV.select()[0]
    fwd, _ = AV.flops_bytes(c)
    f, b = ABV.flops_bytes(c)
    assert f == 2.5 * fwd == 2.5 * 4 * 128 * 32 * sum(n * (n + 1) // 2 for n in c.lens_q)
    assert b == 2.0 * 128 * (4 * 32 + 4 * 8) * sum(c.lens_q)


def test_list_needs_no_gpu(capsys):
    assert ABV.main(["--list"]) == 0
    out = capsys.readouterr().out
    for c in ABV.select():
        assert c.name in out and f"total_q {sum(c.lens_q)}" in out


def test_reference_sequences_and_gradients():
    c = AV.Case("tiny", "varlen", (70, 5, 130, 90), (70, 5, 130, 90), Hq=4, Hkv=2, D=16)
    assert ABV.ref_sequences(c) == [0, 3, 2]  # the shortest >= 64, the median, the longest <= 2048
    assert ABV.ref_sequences(AV.Case("s", "varlen", (5, 9), (5, 9))) == []
    inp = AV.make_inputs(c, device="cpu")
    dout = torch.randn(inp["q"].shape, dtype=inp["q"].dtype)
    got = ABV.reference_grads(c, inp, dout, 2)
    o, n = c.offsets_q()[2], 130
    q, k, v = (inp[x][o:o + n].double().transpose(0, 1).unsqueeze(0).requires_grad_() for x in "qkv")
    out = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                           is_causal=True)
    want = torch.autograd.grad(out, (q, k, v), dout[o:o + n].double().transpose(0, 1).unsqueeze(0))
    for a, b in zip(got, want):
        b = b.squeeze(0).transpose(0, 1)
        assert a.shape == b.shape and torch.allclose(a.double(), b, atol=1e-4)


# ---- orchestration with stand-ins --------------------------------------------------------------------
def _packed_attention(q, k, v, cu_q, cu_k, causal, scale_k=1.0):
    """A differentiable packed causal attention in torch (float32 inside), per sequence."""
    F = torch.nn.functional
    oq, ok_ = cu_q.tolist(), cu_k.tolist()
    g = q.shape[1] // k.shape[1]
    outs = []
    for b in range(len(oq) - 1):
        qs, ks, vs = (t[a:z].float().transpose(0, 1) for t, a, z in ((q, oq[b], oq[b + 1]), (k, ok_[b], ok_[b + 1]),
                                                                     (v, ok_[b], ok_[b + 1])))
        o = F.scaled_dot_product_attention(qs, ks.repeat_interleave(g, 0) * scale_k, vs.repeat_interleave(g, 0),
                                           is_causal=causal)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs).to(q.dtype)


@pytest.fixture
def stand_ins(fake_gpu, monkeypatch):
    """CPU inputs, ours and FA4 as torch packed attention, a timer of fixed times per side."""
    import cute_kernels

    monkeypatch.setattr(ABV, "DEVICE", "cpu")
    monkeypatch.setattr(ABV, "precompile", lambda selected: None)
    state = {"fa4_bwd_raises": False, "ours_scale_k": 1.0}

    def ours(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal):
        return _packed_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, state["ours_scale_k"])

    class Raise(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("varlen backward is not supported on SM90")

    def fa4v(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal):
        o = _packed_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal)
        return (Raise.apply(o) if state["fa4_bwd_raises"] else o), None

    monkeypatch.setattr(cute_kernels, "flash_attn", ours)
    monkeypatch.setattr(ABV, "fa4_functions", lambda: (None, fa4v, ""))
    speeds = {"cute": 20.0, "fa4": 25.0}

    def paired(impls, reps, tick=None):
        for fn in impls.values():
            fn()
        return {n: [speeds[n]] * reps for n in impls}

    monkeypatch.setattr(timing, "paired_times", paired)

    def profiled(fn, steps):  # every kernel twice per call, names longer than the split keeps
        fn()
        return [("k" * 80, 6.0), ("convert", 1.5)] * 2 * steps

    monkeypatch.setattr(timing, "profiled_kernels", profiled)
    return state


CASES = [AV.Case("varlen_tiny_b3", "varlen", (70, 5, 130), (70, 5, 130), Hq=4, Hkv=2, D=16)]


def test_orchestration_on_cpu(stand_ins, tmp_path):
    doc = ABV.run(CASES, repeats=3)
    assert doc["kind"] == "attention-backward" and doc["meta"]["mode"] == "varlen" and "paired" in doc["meta"]["timer"]
    (r,) = doc["rows"]
    assert r["flops"] == 2.5 * AV.flops_bytes(CASES[0])[0] and r["lengths_q"] == [70, 5, 130]
    o, f = r["impls"]["cute"], r["impls"]["fa4"]
    assert o["role"] == "ours" and f["role"] == "peer" and o["times_us"] == [20.0] * 3
    assert math.isclose(r["ratio_vs"]["fa4"], 1.25) and math.isclose(o["tflops"], r["flops"] / 20e-6 / 1e12)
    assert set(o["max_abs_diff_vs_fa4"]) == {"dq", "dk", "dv"} and max(o["max_abs_diff_vs_fa4"].values()) < 1e-2
    assert not o["mismatch"] and not f["mismatch"] and o["ref_sequences"] == [[0, 70], [2, 130]]
    assert o["kernels_us"] == [["k" * 72, 12.0], ["convert", 3.0]] == f["kernels_us"]
    assert max(f["ref_max_rel_err"].values()) < AB.GRAD_RTOL
    s = doc["summary"]
    assert s["fa4_target_met"] is True and math.isclose(s["min_vs_fa4"], 1.25) and s["mismatches"] == []
    js, md = ABV.write(doc, tmp_path, ABV.stem_tag())
    assert js.name.startswith("attention-backward-varlen-") and ABV.stem_tag("x", True) == "varlen-x"
    back = records.load(js)
    assert back["kind"] == "attention-backward" and back["rows"][0]["ratio_vs"] == r["ratio_vs"]
    text = md.read_text()
    for want in ("Attention backward bf16", "| varlen_tiny_b3 | 1.250x |", "target met", "ceiling: none in this mode",
                 "Failed sides: none", f"- cute, kernels per call (us, torch.profiler over {ABV.SPLIT_STEPS} calls): `{'k' * 72}` 12; `convert` 3"):
        assert want in text, want


def test_failed_fa4_backward_is_recorded_and_ours_still_timed(stand_ins):
    stand_ins["fa4_bwd_raises"] = True
    doc = ABV.run(CASES, repeats=2)
    (r,) = doc["rows"]
    assert r["impls"]["cute"]["median_us"] == 20.0 and "fa4" not in r.get("ratio_vs", {})
    f = r["impls"]["fa4"]
    assert f["error"].startswith("backward: RuntimeError: varlen backward is not supported") and "median_us" not in f
    assert any(n.startswith("fa4: FAILED, not timed") for n in r["notes"])
    s = doc["summary"]
    assert s["fa4_target_met"] is None and len(s["failed_sides"]) == 1 and "FAILED" not in s["failed_sides"][0]
    assert "max_abs_diff_vs_fa4" not in r["impls"]["cute"] and not r["impls"]["cute"]["mismatch"]  # float32 checked
    assert "Failed sides: varlen_tiny_b3:fa4: backward" in ABV.markdown(doc)


def test_wrong_gradients_are_flagged(stand_ins):
    stand_ins["ours_scale_k"] = 1.5  # a wrong softmax: off from FA4's and from the float32 reference
    doc = ABV.run(CASES, repeats=1)
    o = doc["rows"][0]["impls"]["cute"]
    assert o["mismatch"] and max(o["rel_diff_vs_ref"].values()) > AB.GRAD_RTOL
    assert max(o["ref_max_rel_err"].values()) > AB.GRAD_RTOL
    assert doc["summary"]["mismatches"] == ["varlen_tiny_b3:cute"] and doc["summary"]["fa4_target_met"] is False


def test_a_case_that_raises_becomes_a_failed_row(stand_ins, monkeypatch):
    monkeypatch.setattr(ABV, "check", lambda *a: (_ for _ in ()).throw(RuntimeError("device fault")))
    doc = ABV.run(CASES + CASES, repeats=1)
    assert [r.get("failed") for r in doc["rows"]] == [True, True] and doc["summary"]["failed_cases"] == ["varlen_tiny_b3"] * 2
    assert "device fault" in doc["rows"][0]["notes"][-1]


# ---- profiles ---------------------------------------------------------------------------------------------
def test_profiles_wrapper_and_gpu_step():
    script = (ROOT / "profiles" / "gpu_session.sh").read_text()
    line = next(ln for ln in script.splitlines() if ln.strip().startswith("bench-attention-backward-varlen)"))
    assert "profiles/bench_attention.py --backward --varlen" in line and '--out-dir "$OUT"' in line
    assert "${BENCH_BWD_VARLEN_S:-420}" in line
    assert "bench-attention-backward-varlen" in (ROOT / "profiles" / "README.md").read_text()
    p = subprocess.run([sys.executable, str(ROOT / "profiles" / "bench_attention.py"), "--varlen", "--backward", "--list"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert p.returncode == 0 and p.stdout.startswith(NAMES[0]) and NAMES[1] in p.stdout, p.stderr[-2000:]
