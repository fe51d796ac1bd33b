"""``bench_attention.py --varlen`` (issue 18's benchmark) on the CPU: the exact FLOP count against a
brute-force mask count, the cases and their recorded lengths, the inputs (packed, paged, dense), the
float32 reference of the correctness gate against brute-force attention, the gate itself, the call
forms given to ours and to FA4 (recorded by stand-ins), ``--list`` / ``--dry-run`` / the no-GPU exit,
and the orchestration with stand-in timers and implementations (a wrong one is not timed)."""

from __future__ import annotations

import inspect
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cute_kernels.attention import forward as FW
from cute_kernels.tools.bench import attention_varlen as AV
from cute_kernels.tools.bench import ceiling, timing

ROOT = Path(__file__).resolve().parents[2]
#: the issue's varlen lengths (log-uniform 1..8192, random.Random(0)): a change here changes the benchmark
SEED0_LENGTHS = [2016, 925, 44, 10, 100, 38, 1168, 15, 73, 192, 3579, 94, 13, 907, 263, 10, 3632, 7015, 1481,
                 3393, 16, 718, 3292, 475, 70, 2, 50, 246, 3741, 6063, 74, 2434]


# ---- FLOPs -----------------------------------------------------------------------------------------
def brute_mask(lq, lk, causal, window):
    """(lq, lk) bool mask written from the definition: query i at p = i + lk - lq sees key j when
    (not causal or j <= p) and p - left <= j (left >= 0) and j <= p + right (right >= 0)."""
    left, right = window
    m = torch.zeros(lq, lk, dtype=torch.bool)
    for i in range(lq):
        p = i + lk - lq
        for j in range(lk):
            m[i, j] = (not causal or j <= p) and (left < 0 or j >= p - left) and (right < 0 or j <= p + right)
    return m


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (0, 0), (1, -1), (-1, 2), (3, 0), (2, 5), (7, 1), (0, -1)])
def test_visible_pairs_is_the_brute_force_mask_count(causal, window):
    for lq in range(0, 10):
        for lk in range(0, 12):
            want = int(brute_mask(lq, lk, causal, window).sum())
            assert AV.visible_pairs(lq, lk, causal, window) == want, (lq, lk, causal, window)


def test_visible_pairs_closed_forms():
    for s in (1, 2, 127, 128, 1000):
        assert AV.visible_pairs(s, s, True) == s * (s + 1) // 2
        assert AV.visible_pairs(s, s + 7, False) == s * (s + 7)
    # paged: 2048 new tokens at the end of 32048 cached: row i sees 30001 + i keys
    assert AV.visible_pairs(2048, 32048, True) == sum(30001 + i for i in range(2048)) == 63_538_176
    # window 4096 (+ the diagonal) on 16384: 4097 keys once the window is full
    assert AV.visible_pairs(16384, 16384, True, (4096, 0)) == 4096 * 4097 // 2 + 4097 * (16384 - 4096)
    assert AV.visible_pairs(16384, 16384, True, (4096, -1)) == AV.visible_pairs(16384, 16384, False, (4096, 0))
    assert AV.visible_pairs(5, 3, True) == 0 + 0 + 1 + 2 + 3  # rows before the keys start see nothing


def test_the_issue_cases_and_their_flops():
    varlen, window, paged = AV.cases()
    assert varlen.mode == "varlen" and list(varlen.lens_q) == SEED0_LENGTHS == list(varlen.lens_k)
    assert min(SEED0_LENGTHS) >= 1 and max(SEED0_LENGTHS) <= 8192 and len(SEED0_LENGTHS) == 32
    for c in (varlen, paged, window):
        assert (c.Hq, c.Hkv, c.D, c.causal) == (32, 8, 128, True)
        fl, nb = AV.flops_bytes(c)
        assert fl == 4.0 * 128 * 32 * sum(AV.visible_pairs(a, b, True, c.window) for a, b in zip(c.lens_q, c.lens_k))
        assert nb == 2.0 * 128 * (2 * 32 * sum(c.lens_q) + 2 * 8 * sum(c.lens_k))
    assert AV.case_pairs(varlen) == sum(n * (n + 1) // 2 for n in SEED0_LENGTHS)
    assert (paged.mode, paged.B, paged.page, set(paged.lens_q), set(paged.lens_k)) == ("paged", 8, 64, {2048}, {32048})
    assert AV.flops_bytes(paged)[0] == 4.0 * 128 * 32 * 8 * 63_538_176
    assert (window.mode, window.B, window.lens_q, tuple(window.window)) == ("dense", 2, (16384, 16384), (4096, 0))
    assert [c.name.split("_")[0] for c in AV.select("paged,window")] == ["window4096", "paged"]
    quick = AV.cases(quick=True)
    assert [c.mode for c in quick] == ["varlen", "dense", "paged"] and all(c.max_k <= 8192 for c in quick)


def test_log_uniform_lengths():
    a = AV.log_uniform_lengths(2000, 1, 8192, 3)
    assert a == AV.log_uniform_lengths(2000, 1, 8192, 3) and min(a) >= 1 and max(a) <= 8192
    # log-uniform: about as many below sqrt(8192) ~ 90 as above
    assert 0.4 < sum(x < 90.5 for x in a) / len(a) < 0.6


def test_dense_equivalent_matches_pairs_and_tokens():
    varlen = AV.cases()[0]
    d = AV.dense_equivalent(varlen)
    assert d.mode == "dense" and d.causal and d.max_q % 128 == 0 and set(d.lens_q) == {d.max_q}
    assert (d.B, d.max_q) == (11, 3840) and d.name == "dense_b11_hq32_hkv8_s3840_d128_causal"
    assert abs(AV.case_pairs(d) / AV.case_pairs(varlen) - 1) < 0.02
    assert abs(sum(d.lens_q) / sum(varlen.lens_q) - 1) < 0.01


# ---- inputs and the reference ------------------------------------------------------------------------
SMALL = [
    AV.Case("v", "varlen", (5, 17, 1, 0, 33, 2), (5, 17, 1, 0, 33, 2), Hq=4, Hkv=2, D=16),
    AV.Case("vw", "varlen", (9, 20, 3), (9, 20, 3), Hq=4, Hkv=1, D=16, window=(4, 0)),
    AV.Case("p", "paged", (4, 4, 4), (13, 9, 4), Hq=4, Hkv=2, D=16, page=4, seed=2),
    AV.Case("w", "dense", (20, 20), (20, 20), Hq=4, Hkv=2, D=16, window=(5, 0)),
    AV.Case("d", "dense", (7,), (7,), Hq=2, Hkv=2, D=16),
]


def brute_attention(case, inp):
    """float64 attention of every (sequence, row, head) from the brute-force mask: (total_q, Hq, D)."""
    D, g = case.D, case.Hq // case.Hkv
    out = torch.zeros(sum(case.lens_q), case.Hq, D, dtype=torch.float64)
    for b, (lq, lk) in enumerate(zip(case.lens_q, case.lens_k)):
        if lq == 0 or lk == 0:
            continue
        k, v = (t.double() for t in inp["kv_seq"](b))
        m = brute_mask(lq, lk, case.causal, case.window)
        q = inp["q_flat"][case.offsets_q()[b]:case.offsets_q()[b] + lq].double()
        for h in range(case.Hq):
            s = (q[:, h] @ k[:, h // g].T) / math.sqrt(D)
            w = torch.softmax(s.masked_fill(~m, float("-inf")), -1).nan_to_num(0.0)
            out[case.offsets_q()[b]:case.offsets_q()[b] + lq, h] = w @ v[:, h // g]
    return out


def all_triples(case):
    return [(b, i, h) for b, lq in enumerate(case.lens_q) for i in range(lq) for h in range(case.Hq)]


@pytest.mark.parametrize("case", SMALL, ids=[c.name for c in SMALL])
def test_inputs_and_reference_against_brute_force(case):
    inp = AV.make_inputs(case, device="cpu", dtype=torch.float32)
    Tq = sum(case.lens_q)
    assert inp["q_flat"].shape == (Tq, case.Hq, case.D)
    for b, lk in enumerate(case.lens_k):
        k, v = inp["kv_seq"](b)
        assert k.shape == v.shape == (lk, case.Hkv, case.D)
    if case.mode == "varlen":
        assert inp["cu_q"].tolist() == case.offsets_q() and inp["cu_k"].dtype == torch.int32
    triples = all_triples(case)
    ref = AV.reference_rows(case, inp, triples)
    want = brute_attention(case, inp)
    tok = [case.offsets_q()[b] + i for b, i, _ in triples]
    torch.testing.assert_close(ref.double(), want[tok, [h for *_, h in triples]], atol=1e-5, rtol=1e-5)
    c = AV.check_rows(want.float(), inp["offs_q"], triples, ref)
    assert c["ok"] and c["rows_checked"] == len(triples) and c["max_abs_err"] < 1e-5


def test_paged_inputs_use_every_page_once_in_a_shuffled_order():
    case = SMALL[2]
    inp = AV.make_inputs(case, device="cpu", dtype=torch.float32)
    bt, kp, P = inp["block_table"], inp["kp"], case.page
    assert bt.dtype == torch.int32 and bt.shape == (3, 4) and sorted(bt.flatten().tolist()) == list(range(12))
    assert bt.flatten().tolist() != list(range(12))
    assert inp["seqused_k"].tolist() == [13, 9, 4] and inp["seqused_k"].dtype == torch.int32
    assert torch.isfinite(kp).all() and torch.isfinite(inp["vp"]).all()  # rows past seqused_k too (FA4 needs it)
    k1, _ = inp["kv_seq"](1)
    for j in range(9):
        assert torch.equal(k1[j], kp[bt[1, j // P], j % P])
    assert inp["q"].shape == (3, 4, 4, 16) and inp["q_flat"].data_ptr() == inp["q"].data_ptr()
    assert inp["cu_q"].tolist() == [0, 4, 8, 12]


def test_sample_rows_cover_ends_and_the_window_edge():
    w = AV.cases()[1]
    t = AV.sample_rows(w)
    rows = {i for _, i, _ in t}
    assert {0, 1, 16382, 16383, 4095, 4096, 4097} <= rows and {h for *_, h in t} == {0, 15, 31}
    v = AV.cases()[0]
    tv = AV.sample_rows(v)
    assert {b for b, *_ in tv} == set(range(32)) and all(0 <= i < v.lens_q[b] for b, i, _ in tv)
    assert AV.sample_rows(v) == tv  # seeded


def test_check_rows_flags_zero_nan_and_accepts_bf16_rounding():
    case = SMALL[0]
    inp = AV.make_inputs(case, device="cpu", dtype=torch.float32)
    triples = all_triples(case)
    ref = AV.reference_rows(case, inp, triples)
    good = brute_attention(case, inp).float()
    assert AV.check_rows(good.bfloat16(), inp["offs_q"], triples, ref)["ok"]
    zero = AV.check_rows(torch.zeros_like(good), inp["offs_q"], triples, ref)
    assert not zero["ok"] and zero["rows_wrong"] > 0 and len(zero["worst"]) == 3
    nan = good.clone()
    nan[3, 1, 0] = float("nan")
    c = AV.check_rows(nan, inp["offs_q"], triples, ref)
    assert not c["ok"] and c["rows_wrong"] == 1 and c["worst"][:2] == [0, 3] and c["worst"][2] == 1
    assert AV.check_rows(good, inp["offs_q"], [], ref[:0])["ok"]


def test_max_diff_and_token_to_row():
    a = torch.zeros(50, 3, 4)
    b = a.clone()
    b[7, 2, 1] = 0.5
    b[41, 0, 3] = -0.25
    d, worst = AV.max_diff(a, b, chunk=16, topk=2)
    assert d == 0.5 and worst == [(7, 2), (41, 0)]
    offs = [0, 5, 5, 22, 23, 56]
    assert [AV.token_to_row(offs, t) for t in (0, 4, 5, 21, 22, 23, 55)] == \
        [(0, 0), (0, 4), (2, 0), (2, 16), (3, 0), (4, 0), (4, 32)]


# ---- call forms ------------------------------------------------------------------------------------------
class Recorder:
    """Stands in for a function: records (args, kwargs), returns a zero output of q's shape ((out, lse) for FA4)."""

    def __init__(self, fa4=False):
        self.calls, self.fa4 = [], fa4

    def __call__(self, q, k, v, **kw):
        self.calls.append(((q, k, v), kw))
        o = torch.zeros(q.shape)
        return (o, None) if self.fa4 else (kw.get("out") if kw.get("out") is not None else o)


def test_ours_call_forms(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(FW, "flash_attn", rec)
    v, w, _ = (AV.Case(c.name, c.mode, c.lens_q, c.lens_k, 4, 2, 16, c.causal, c.window, c.page) for c in AV.cases(True))
    inp = AV.make_inputs(v, device="cpu")
    (form, run, get), = AV.ours_calls(v, inp)
    run()
    (q, k, vv), kw = rec.calls[-1]
    assert q is inp["q"] and k is inp["k"] and vv is inp["v"] and kw["out"] is get()
    assert kw["cu_seqlens_q"] is inp["cu_q"] and kw["cu_seqlens_k"] is inp["cu_k"] and kw["causal"] is True
    assert (kw["max_seqlen_q"], kw["max_seqlen_k"]) == (max(v.lens_q), max(v.lens_k)) and "window_size" not in kw
    winp = AV.make_inputs(w, device="cpu")
    (_, run, get), = AV.ours_calls(w, winp)
    run()
    (q, _, _), kw = rec.calls[-1]
    assert q is winp["q"] and kw["window_size"] == (1024, 0) and kw["causal"] is True
    assert get().shape == (4096, 4, 16)
    # the dense kernel per sequence: one call per non-empty sequence on views of the packed tensors
    rec.calls.clear()
    _, run, get = AV.dense_per_seq_call(v, inp)
    run()
    assert len(rec.calls) == sum(1 for n in v.lens_q if n)
    for ((q, k, _), kw), b in zip(rec.calls, [b for b, n in enumerate(v.lens_q) if n]):
        assert q.shape == (1, v.lens_q[b], 4, 16) and q.data_ptr() == inp["q"][v.offsets_q()[b]].data_ptr()
        assert kw["out"].data_ptr() == get()[v.offsets_q()[b]].data_ptr() and kw["causal"] is True


def test_paged_forms_wait_for_block_table(monkeypatch):
    p = AV.Case("p", "paged", (4, 4), (13, 9), 4, 2, 16, page=4)
    inp = AV.make_inputs(p, device="cpu")
    if "block_table" not in inspect.signature(FW.flash_attn).parameters:
        assert not AV.paged_supported() and AV.ours_calls(p, inp) == []

    def paged_api(q, k, v, *, causal=False, out=None, cu_seqlens_q=None, max_seqlen_q=None, max_seqlen_k=None,
                  block_table=None, seqused_k=None):
        paged_api.calls.append(dict(q=q, k=k, causal=causal, out=out, cu_seqlens_q=cu_seqlens_q,
                                    max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, block_table=block_table,
                                    seqused_k=seqused_k))
        return out if out is not None else torch.zeros(q.shape)

    paged_api.calls = []
    monkeypatch.setattr(FW, "flash_attn", paged_api)
    assert AV.paged_supported()
    forms = AV.ours_calls(p, inp)
    assert len(forms) == 6 and "(B, Sq, Hq, D)" in forms[0][0] and "total_q" in forms[2][0]
    assert [f.endswith("(no out=)") for f, *_ in forms] == [False, True] * 3
    for _, run, get in forms:
        run()
        assert get().shape == (8, 4, 16)
    calls = paged_api.calls
    for c in calls:
        assert c["k"] is inp["kp"] and c["block_table"] is inp["block_table"] and c["seqused_k"] is inp["seqused_k"]
        assert c["causal"] is True
    assert [c["out"] is None for c in calls] == [False, True] * 3
    for c in calls[:2]:
        assert c["q"] is inp["q"] and c["cu_seqlens_q"] is None and c["max_seqlen_k"] is None
    assert calls[0]["out"].shape == (2, 4, 4, 16)
    for c in calls[2:]:
        assert c["q"].shape == (8, 4, 16) and c["cu_seqlens_q"] is inp["cu_q"] and c["max_seqlen_q"] == 4
    assert [c["max_seqlen_k"] for c in calls[2:]] == [None, None, 13, 13]


def test_fa4_call_forms():
    fa4, fa4v = Recorder(fa4=True), Recorder(fa4=True)
    v, w, p = (AV.Case(c.name, c.mode, c.lens_q, c.lens_k, 4, 2, 16, c.causal, c.window, c.page) for c in AV.cases(True))
    inp = AV.make_inputs(v, device="cpu")
    (_, run), = AV.fa4_calls(v, inp, fa4, fa4v)
    assert run().shape == inp["q"].shape
    (q, k, _), kw = fa4v.calls[-1]
    assert q is inp["q"] and k is inp["k"] and kw["cu_seqlens_q"] is inp["cu_q"] and kw["cu_seqlens_k"] is inp["cu_k"]
    assert kw["max_seqlen_q"] == max(v.lens_q) and kw["causal"] is True and kw["window_size"] == (None, None)
    winp = AV.make_inputs(w, device="cpu")
    (_, run), = AV.fa4_calls(w, winp, fa4, fa4v)
    assert run().shape == (4096, 4, 16)
    (q, _, _), kw = fa4.calls[-1]
    assert q is winp["q"] and kw == {"causal": True, "window_size": (1024, 0)}
    pinp = AV.make_inputs(p, device="cpu")
    (f0, r0), (f1, r1) = AV.fa4_calls(p, pinp, fa4, fa4v)
    assert "(B, Sq, Hq, D)" in f0 and "total_q" in f1
    assert AV.fa4_calls(p, pinp, fa4, fa4v, prefer_packed_q=True)[0][0] == f1
    assert r0().shape == r1().shape == (1024, 4, 16)
    ((q0, k0, _), kw0), ((q1, _, _), kw1) = fa4v.calls[-2:]
    assert q0 is pinp["q"] and k0 is pinp["kp"] and kw0["page_table"] is pinp["block_table"]
    assert kw0["seqused_k"] is pinp["seqused_k"] and "cu_seqlens_k" not in kw0 and kw0["causal"] is True
    assert q1.shape == (1024, 4, 16) and kw1["cu_seqlens_q"] is pinp["cu_q"] and kw1["max_seqlen_q"] == 512


# ---- the command line ------------------------------------------------------------------------------------
def test_list_dry_run_and_no_gpu_exit(capsys, monkeypatch):
    assert AV.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "2016, 925, 44" in out and "dense_b11_hq32_hkv8_s3840_d128_causal" in out and "501 per sequence" in out
    assert AV.main(["--dry-run", "--only", "varlen,window"]) == 0  # full size, fake CUDA tensors
    out = capsys.readouterr().out
    assert out.count("accepted") == 4 and out.count("precompiles") == 3 and "causal=False varlen=False window=True" in out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert AV.main(["--only", "window"]) == 2
    assert "error: needs a CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        AV.main(["--only", "nothing"])
    assert e.value.code == 2


def test_profiles_wrapper_dispatches_varlen():
    p = subprocess.run([sys.executable, "profiles/bench_attention.py", "--varlen", "--list", "--quick"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "varlen_b8_logu1-2048" in p.stdout and "window1024" in p.stdout
    script = (ROOT / "profiles" / "gpu_session.sh").read_text()
    assert "bench-attention-varlen)" in script and "bench_attention.py --varlen" in script


# ---- orchestration on the CPU, stand-in implementations and timers ----------------------------------------
@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setenv("CK_COMMIT", "test123")
    for name in ("synchronize", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *a: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(ceiling, "measure_roofs", lambda bench, quick=False: {"read_TBps": 4.0, "matmul_TFLOPs": 700.0})
    monkeypatch.setattr(ceiling, "matmul_same_flops", lambda fl: (_named(lambda: None, "mm"), fl * 2))
    monkeypatch.setattr(AV, "precompile", lambda selected: None)
    speeds: dict = {}
    rounds: dict = {}

    def bench(fn):
        fn()
        n = getattr(fn, "name", None)
        rounds[n] = rounds.get(n, 0) + 1
        t = speeds.get(n, 10.0)
        return t[(rounds[n] - 1) % len(t)] if isinstance(t, list) else t

    monkeypatch.setattr(timing, "make_bench", lambda quick: (bench, "stand-in timer"))
    return speeds


def _named(fn, name):
    fn.name = name
    return fn


def _stand_in_build(case, notes):
    """Problems on the CPU; ours, the peer and the per-sequence variant compute the float64 brute
    force (bf16), the dense variants too; the ``paged`` case's ours returns zeros (wrong)."""
    problems = {"main": (case, AV.make_inputs(case, device="cpu"))}
    if case.mode == "varlen":
        d = AV.dense_equivalent(case)
        problems["dense"] = (d, AV.make_inputs(d, device="cpu"))
    fl = AV.flops_bytes(case)[0]
    impls = {}
    for key, (c, inp) in problems.items():
        o = brute_attention(c, inp).to(torch.bfloat16)
        f, nb = AV.flops_bytes(c)
        names = [("cute", "ours"), ("fa4", "peer"), ("cute_dense_per_seq", "variant")] if key == "main" else \
            [("cute_dense_eqflops", "variant"), ("fa4_dense_eqflops", "variant")]
        for n, role in names:
            if n == "cute_dense_per_seq" and c.mode != "varlen":
                continue
            out = torch.zeros_like(o) if (n == "cute" and c.mode == "paged") else \
                o + (2e-3 if n == "fa4" else 0.0)
            impls[n] = AV.Impl(_named(lambda: None, n), lambda out=out: out, key, role, f, nb, f"{n}(...)", 0.5)
    assert fl == AV.flops_bytes(case)[0]
    return problems, impls


def test_orchestration_on_cpu(fake_gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(AV, "build", _stand_in_build)
    # the dense equivalent of this small varlen case is b1 s128 (about the same pairs)
    v = AV.Case("varlen_t", "varlen", (40, 3, 90, 1, 64), (40, 3, 90, 1, 64), 4, 2, 16)
    p = AV.Case("paged_t", "paged", (4, 4), (13, 9), 4, 2, 16, page=4)
    w = AV.Case("window_t", "dense", (20, 20), (20, 20), 4, 2, 16, window=(5, 0))
    fake_gpu.update(cute=[20.0, 22.0], fa4=[18.0, 24.0], cute_dense_per_seq=40.0, cute_dense_eqflops=[10.0, 11.0],
                    fa4_dense_eqflops=9.0, mm=5.0)
    doc = AV.run([v, p, w], repeats=2, quick=True, roofs=True)
    rv, rp, rw = doc["rows"]
    assert doc["kind"] == "attention-varlen" and doc["meta"]["commit"] == "test123"
    # varlen: every impl checked and timed; the ratios per round
    assert rv["impls"]["cute"]["times_us"] == [20.0, 22.0] and rv["impls"]["cute"]["check"]["ok"]
    assert math.isclose(rv["ratio_vs_best_peer"], statistics.median([18 / 20, 24 / 22]))
    assert 1e-3 < rv["impls"]["cute"]["check"]["max_abs_diff_vs_fa4"] < 1e-2  # fa4 = ours + 2e-3, bf16
    assert not rv["impls"]["cute"]["mismatch"]
    fv, fd = AV.flops_bytes(v)[0], AV.flops_bytes(AV.dense_equivalent(v))[0]
    assert rv["impls"]["cute_dense_eqflops"]["flops"] == fd and rv["dense_eqflops"]["S"] == 128
    want = statistics.median([(fv / 20) / (fd / 10), (fv / 22) / (fd / 11)])
    assert math.isclose(rv["rate_vs_dense"]["cute / cute_dense_eqflops"], want)
    assert math.isclose(rv["rate_vs_dense"]["cute / cute_dense_per_seq"], statistics.median([40 / 20, 40 / 22]))
    assert math.isclose(rv["rate_vs_dense"]["fa4 / fa4_dense_eqflops"],
                        statistics.median([(fv / 18) / (fd / 9), (fv / 24) / (fd / 9)]))
    assert rv["meets_target_vs_dense"] == (want >= 0.95) and rv["lengths_q"] == [40, 3, 90, 1, 64]
    assert math.isclose(rv["impls"]["cublas_same_flops"]["median_us"], 2.5) and rv["ceiling"] == "cublas_same_flops"
    # paged: ours is wrong (zeros): not timed, no ratio, said so
    assert "median_us" not in rp["impls"]["cute"] and "wrong output" in rp["impls"]["cute"]["error"]
    assert rp["impls"]["cute"]["check"]["ok"] is False and rp.get("ratio_vs_best_peer") is None
    assert any("WRONG OUTPUT" in n for n in rp["notes"]) and "paged_t:cute" in doc["summary"]["wrong_outputs"]
    assert rp["impls"]["fa4"]["times_us"] == [18.0, 24.0]  # the peer was right: timed
    assert rw["impls"]["cute"]["check"]["ok"] and "rate_vs_dense" not in rw
    js, md = AV.write(doc, tmp_path)
    assert js.name == f"attention-varlen-{doc['meta']['date']}-test123.json"
    back = json.loads(js.read_text())
    assert back["rows"][0]["lengths_q"] == [40, 3, 90, 1, 64]
    text = md.read_text()
    assert text.startswith("# Attention forward bf16: packed (varlen), paged and windowed, Fake GPU")
    assert "cublas_same_flops)" in text and "rate cute / cute_dense_eqflops" in text and "WRONG" in text
    assert "lengths (q = k): [40, 3, 90, 1, 64]" in text


# ---- the real build / check / timing path with CPU kernels that honour the arguments ---------------------
def cpu_attention(q, k, v, causal, left=-1, right=-1):
    """One sequence, (Lq, Hq, D) x (Lk, Hkv, D) -> (Lq, Hq, D) float32, bottom-right mask, window sides."""
    lq, lk, g = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    p = torch.arange(lq)[:, None] + lk - lq
    j = torch.arange(lk)[None, :]
    ok = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        ok &= j <= p
    if left >= 0:
        ok &= j >= p - left
    if right >= 0:
        ok &= j <= p + right
    kk, vv = k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q.float(), kk) / math.sqrt(q.shape[-1])
    w = torch.softmax(s.masked_fill(~ok, float("-inf")), -1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", w, vv)


def cpu_flash_attn(q, k, v, *, causal=False, out=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                   max_seqlen_k=None, window_size=(-1, -1)):
    """``flash_attn``'s dense and packed forms on the CPU (no paged form: like the version before it)."""
    return _cpu_flash_attn(q, k, v, causal, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window_size)


def cpu_flash_attn_paged(q, k, v, *, causal=False, out=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                         max_seqlen_k=None, window_size=(-1, -1), block_table=None, seqused_k=None):
    """... and the paged forms (the conventions of ``flash_attn``'s docstring: max_seqlen_k refused)."""
    if block_table is None:
        return cpu_flash_attn(q, k, v, causal=causal, out=out, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                              max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, window_size=window_size)
    if max_seqlen_k is not None or cu_seqlens_k is not None:
        raise ValueError("max_seqlen_k cannot be used with block_table")
    used = seqused_k.tolist()
    ks = torch.cat([k[block_table[b].long()].flatten(0, 1)[:used[b]] for b in range(len(used))])
    vs = torch.cat([v[block_table[b].long()].flatten(0, 1)[:used[b]] for b in range(len(used))])
    ck = torch.tensor([0] + used).cumsum(0)
    if cu_seqlens_q is None:
        B, S = q.shape[:2]
        o = torch.empty_like(q) if out is None else out
        _cpu_flash_attn(q.flatten(0, 1), ks, vs, causal, o.view(B * S, *q.shape[2:]), torch.arange(B + 1) * S, ck,
                        S, max(used), window_size)
        return o
    return _cpu_flash_attn(q, ks, vs, causal, out, cu_seqlens_q, ck, max_seqlen_q, max(used), window_size)


def _cpu_flash_attn(q, k, v, causal, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window_size):
    left, right = window_size
    o = torch.empty_like(q) if out is None else out
    if cu_seqlens_q is None:
        for b in range(q.shape[0]):
            o[b] = cpu_attention(q[b], k[b], v[b], causal, left, right).to(q.dtype)
        return o
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        assert cq[b + 1] - cq[b] <= max_seqlen_q and ck[b + 1] - ck[b] <= max_seqlen_k
        o[cq[b]:cq[b + 1]] = cpu_attention(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]], causal,
                                           left, right).to(q.dtype)
    return o


def _fa4_sides(causal, window_size):
    left, right = (-1 if w is None else w for w in window_size)
    return left, (0 if causal else right)


def cpu_fa4_func(q, k, v, *, causal=False, window_size=(None, None)):
    left, right = _fa4_sides(causal, window_size)
    return torch.stack([cpu_attention(q[b], k[b], v[b], causal, left, right) for b in range(q.shape[0])]).to(q.dtype), None


def cpu_fa4_varlen(q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                   seqused_k=None, page_table=None, causal=False, window_size=(None, None)):
    left, right = _fa4_sides(causal, window_size)
    if page_table is not None:  # k/v pages: each sequence's keys gathered through its row of the table
        assert cu_seqlens_k is None
        used = seqused_k.tolist()
        ks = [k[page_table[b].long()].flatten(0, 1)[:used[b]] for b in range(len(used))]
        vs = [v[page_table[b].long()].flatten(0, 1)[:used[b]] for b in range(len(used))]
    else:
        ck = cu_seqlens_k.tolist()
        ks = [k[ck[b]:ck[b + 1]] for b in range(len(ck) - 1)]
        vs = [v[ck[b]:ck[b + 1]] for b in range(len(ck) - 1)]
    if cu_seqlens_q is None:  # dense q (B, Sq, H, D)
        return torch.stack([cpu_attention(q[b], ks[b], vs[b], causal, left, right) for b in range(q.shape[0])]
                           ).to(q.dtype), None
    cq = cu_seqlens_q.tolist()
    o = torch.empty_like(q)
    for b in range(len(cq) - 1):
        o[cq[b]:cq[b + 1]] = cpu_attention(q[cq[b]:cq[b + 1]], ks[b], vs[b], causal, left, right).to(q.dtype)
    return o, None


def test_real_rows_on_cpu_kernels(fake_gpu, monkeypatch):
    """``run`` with the real build / check / timing code, the kernels replaced by CPU ones that honour
    every argument the bench passes: each output passes the float32 gate and agrees with FA4's; the
    paged row times FA4 alone while flash_attn has no block_table; a window given as (left, -1) to our
    stand-in (a wrong kernel) is caught."""
    monkeypatch.setattr(AV, "DEVICE", "cpu")
    monkeypatch.setattr(FW, "flash_attn", cpu_flash_attn)
    monkeypatch.setattr(AV, "fa4_functions", lambda: (cpu_fa4_func, cpu_fa4_varlen, ""))
    v = AV.Case("varlen_t", "varlen", (40, 3, 90, 1, 64, 0, 7), (40, 3, 90, 1, 64, 0, 7), 4, 2, 16)
    p = AV.Case("paged_t", "paged", (6, 6), (29, 11), 4, 2, 16, page=4, seed=3)
    w = AV.Case("window_t", "dense", (50, 50), (50, 50), 4, 2, 16, window=(9, 0))
    doc = AV.run([v, p, w], repeats=2, quick=True)
    rv, rp, rw = doc["rows"]
    assert set(rv["impls"]) == {"cute", "fa4", "cute_dense_per_seq", "cute_dense_eqflops", "fa4_dense_eqflops",
                                "cublas_same_flops"}
    for r in (rv, rw):
        for n, e in r["impls"].items():
            if n != "cublas_same_flops":
                assert e["check"]["ok"] and e["median_us"] == 10.0 and not e["mismatch"], (r["shape"], n, e)
                assert e["check"]["max_abs_err"] < 2e-2
    assert rv["impls"]["cute"]["check"]["max_abs_diff_vs_fa4"] < 2e-2
    assert rv["impls"]["cute_dense_eqflops"]["check"]["max_abs_diff_vs_fa4_dense_eqflops"] < 2e-2
    assert "window_size" in rw["impls"]["cute"]["form"] and "(9, 0)" in rw["impls"]["fa4"]["form"]
    assert "cute" not in rp["impls"] and rp["impls"]["fa4"]["check"]["ok"] and rp["impls"]["fa4"]["median_us"] == 10.0
    assert any("block_table" in n for n in rp["notes"]) and doc["summary"]["wrong_outputs"] == []

    # the paged API: the first form that runs (dense q, out=)
    monkeypatch.setattr(FW, "flash_attn", cpu_flash_attn_paged)
    (rp,) = AV.run([p], repeats=1, quick=True, roofs=False)["rows"]
    e = rp["impls"]["cute"]
    assert e["check"]["ok"] and e["median_us"] == 10.0 and "(B, Sq, Hq, D)" in e["form"] and "no out" not in e["form"]
    assert e["check"]["max_abs_diff_vs_fa4"] < 2e-2 and rp["ratio_vs_best_peer"] == 1.0

    def wrong_window(q, k, v, *, window_size=(-1, -1), **kw):  # drops the window's left side
        return cpu_flash_attn(q, k, v, window_size=(-1, window_size[1]), **kw)

    monkeypatch.setattr(FW, "flash_attn", wrong_window)
    doc = AV.run([w], repeats=1, quick=True, roofs=False)
    (r,) = doc["rows"]
    assert "error" in r["impls"]["cute"] and r["impls"]["cute"]["check"]["rows_wrong"] > 0
    assert doc["summary"]["wrong_outputs"] == ["window_t:cute"] and r["impls"]["fa4"]["median_us"] == 10.0


def test_precompile_covers_what_the_calls_plan():
    """The configurations ``precompile`` compiles are those the launches of the run's calls plan (the
    launch functions under ``jit.dry_run``, small CPU tensors: plans depend on no size)."""
    from cute_kernels.common import jit

    planned = set()
    for c in AV.cases():
        causal, win = FW.check_window(tuple(c.window), c.causal)
        wl, wr = win or (-1, -1)
        with jit.dry_run() as dry:
            if c.mode == "varlen":
                q, k = torch.zeros(8, 4, c.D, dtype=torch.bfloat16), torch.zeros(8, 2, c.D, dtype=torch.bfloat16)
                cu = torch.tensor([0, 5, 8], dtype=torch.int32)
                FW._run(FW.Call(FW.PACKED, causal, 0.1, wl, wr, cu, cu, 5, 5), q, k, k, torch.empty_like(q),
                        torch.empty(4, 8))
                q, k = torch.zeros(1, 5, 4, c.D, dtype=torch.bfloat16), torch.zeros(1, 5, 2, c.D, dtype=torch.bfloat16)
                FW._run(FW.Call(FW.DENSE, True, 0.1), q, k, k, torch.empty_like(q), torch.empty(1, 4, 5))  # dense peers
            elif c.mode == "dense":
                q, k = torch.zeros(2, 9, 4, c.D, dtype=torch.bfloat16), torch.zeros(2, 9, 2, c.D, dtype=torch.bfloat16)
                FW._run(FW.Call(FW.DENSE, causal, 0.1, wl, wr), q, k, k, torch.empty_like(q), torch.empty(2, 4, 9))
            elif AV.paged_supported():  # the dense-q form, the first the bench tries
                q = torch.zeros(2, 9, 4, c.D, dtype=torch.bfloat16)
                k = torch.zeros(6, c.page, 2, c.D, dtype=torch.bfloat16)
                bt, su = torch.zeros(2, 3, dtype=torch.int32), torch.tensor([100, 50], dtype=torch.int32)
                FW._run(FW.Call(FW.PAGED, causal, 0.1, wl, wr, block_table=bt, seqused_k=su), q, k, k,
                        torch.empty_like(q), torch.empty(2, 4, 9))
        planned |= {cfg for _, cfg in dry.seen}
    got = {cfg for c in AV.cases() for cfg in AV.our_configs(c)}
    assert got == planned and len(got) == (4 if AV.paged_supported() else 3)


def test_flash_attn_takes_the_paged_forms_on_fake_tensors():
    """The real ``flash_attn`` (validation, fake tensors of the full paged case): the dense-q and
    packed-q forms with and without out= are accepted, also with max_seqlen_k (a hint within the block
    table's capacity, as FlashAttention's callers pass it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not AV.paged_supported():
        pytest.skip("flash_attn has no block_table in this version")
    p = AV.cases()[2]
    with FakeTensorMode():
        inp = AV.make_inputs(p, device="cuda")
        forms = AV.ours_calls(p, inp)
        for form, run, get in forms:
            run()
            assert get().shape == (8 * 2048, 32, 128), form
    assert len(forms) == 6 and sum("max_seqlen_k" in f for f, _, _ in forms) == 2


def test_a_failing_case_is_a_row_and_rows_are_written_as_they_finish(fake_gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(AV, "build", _stand_in_build)
    v = AV.Case("varlen_t", "varlen", (40, 3), (40, 3), 4, 2, 16)
    w = AV.Case("window_t", "dense", (20, 20), (20, 20), 4, 2, 16, window=(5, 0))
    real = AV.run_case

    def run_case(case, *a):
        if case.name == "varlen_t":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(case, *a)

    monkeypatch.setattr(AV, "run_case", run_case)
    seen = []
    doc = AV.run([v, w], repeats=1, quick=True, on_row=lambda d: seen.append(AV.write(d, tmp_path)[0]))
    bad, good = doc["rows"]
    assert bad["failed"] and bad["impls"] == {} and "illegal memory access" in bad["notes"][0]
    assert good["impls"]["cute"]["median_us"] == 10.0 and doc["summary"]["failed_cases"] == ["varlen_t"]
    assert len(seen) == 2 and seen[0] == seen[1] and len(json.loads(seen[0].read_text())["rows"]) == 2
    assert "FAILED" in AV.markdown(doc)
