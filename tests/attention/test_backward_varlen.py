"""flash_attn_backward on packed (variable-length) sequences, and autograd through packed ``flash_attn``.

Packed tensors: q, out, dout (total_q, Hq, D), k, v (total_k, Hkv, D), lse / dlse (Hq, total_q) fp32,
cu_seqlens int32 (B + 1,) on the GPU, max_seqlen host ints; sequence b is rows cu[b] .. cu[b + 1] - 1,
causal / windows bottom-right per sequence.

GPU: every gradient against a float32 autograd reference computed per sequence on the dense (1, L, H, D)
slices (``test_backward.reference``), per tensor and per row (the D values of one (token, head)):
``max|g - ref| <= 2 * max|g_torch - ref| + eps``, ``g_torch`` the same math in the input dtype, ``eps`` one
machine epsilon of the row's largest reference value + 1e-4 of the problem's largest gradient + the
effect of ``out``'s rounding on Delta (``test_backward.out_rounding_effect``); rows of queries that see
no key (empty / keyless sequences, causal Sq > Sk) give dq exactly 0, rows of keys no query sees (empty
query sequences, windows) dk, dv exactly 0; fresh random inputs, NaN-poisoned given buffers.  Lengths
0 / 1 / primes / off the tile (17, 127, 129, 300, 1000), Sq != Sk per sequence, GQA 1/4/8, D 64/96/128/256,
bf16 / fp16, causal and not, windows, an LSE gradient, a learnable sink (its gradient per head) with and
without softcapping, the deterministic mode (the same bits over 3 calls, within rounding of the
default), out / lse from the real packed forward, strided views, total_q or total_k = 0, argument
checks naming the argument before any launch.  Autograd through packed ``flash_attn`` (with and without
a returned LSE), ``torch.compile(fullgraph=True)`` and CUDA-graph capture of a training step.

CPU (meta tensors, fake implementations): gradients reach packed q, k, v; paged calls still refuse.
"""

from __future__ import annotations

import bisect
import inspect
import math

import pytest
import torch

import cute_kernels
from cute_kernels.attention import backward as BW
from cute_kernels.attention import forward as FW
from cute_kernels.attention import forward_validate as FV
from cute_kernels.testing import count_launches
from _check import RTOL, assert_raises_before_any_launch
from conftest import precompile_for_module_gpu_tests
from test_backward import kv_reduce_planner, out_rounding_effect, reference
from test_flash_autograd import graph_replay_matches_eager, same_up_to_reduction_order
from test_forward_varlen import make_packed, window_mask

gpu = pytest.mark.gpu
BF, FP = torch.bfloat16, torch.float16
NAN = float("nan")
HQ = 8
#: (lengths q, lengths k): an empty query sequence with keys (3), queries without keys (1 x 0), Sq > Sk
#: causal (300 x 257: 43 rows see no key), Sq < Sk, one off-tile pair (129 x 129)
LENS_A = ([5, 0, 1, 300, 129], [17, 3, 0, 257, 129])
#: 1000 x 977 (several tiles, 23 rows without keys when causal), 127 x 129, 1 x 61, 0 x 7, a keyless 131-row
#: sequence (two query tiles), 2 x 300 (a window leaves most keys unseen)
LENS_B = ([17, 127, 1000, 1, 0, 131, 2], [17, 129, 977, 61, 7, 0, 300])
LENS = {"A": LENS_A, "B": LENS_B}


# ------------------------------------------------------------------------------------------ references
def packed_reference(q, k, v, dout, lens, causal, window, scale, dlse=None, softcap=0.0, sink=None, out=None):
    """Per sequence, ``test_backward.reference`` in float32 and in the input dtype on the dense slices,
    packed back: out (``out`` if given, else the float32 output rounded), lse, dq / dk / dv (float32 and
    in-dtype), their per-row slacks for ``out``'s rounding, and with a sink dsink (both) and its slack.
    A sequence without keys: out 0, lse -inf (the sink with one), zero gradients (d sink: its dLSE)."""
    dtype, (Tq, Hq, D), (Tk, Hkv, _) = q.dtype, q.shape, k.shape
    f32 = dict(dtype=torch.float32, device=q.device)
    R = dict(o32=torch.zeros(Tq, Hq, D, **f32), lse=torch.full((Hq, Tq), -math.inf, **f32),
             dq=torch.zeros(Tq, Hq, D, **f32), dk=torch.zeros(Tk, Hkv, D, **f32), dv=torch.zeros(Tk, Hkv, D, **f32),
             sq=torch.zeros(Tq, Hq, **f32), sk=torch.zeros(Tk, Hkv, **f32), ds=torch.zeros(Hq, **f32),
             ds16=torch.zeros(Hq, **f32), s_ds=torch.zeros(Hq, **f32))
    for name in ("dq", "dk", "dv"):
        R[name + "16"] = R[name].clone()
    ref_causal, ref_window = causal, window
    if causal and window is not None:  # causal is the window's right side 0 (test_backward's reference: no fold)
        ref_causal, ref_window = False, (window[0], 0)
    cq, ck = _offsets(lens[0]), _offsets(lens[1])
    for b in range(len(lens[0])):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        if q1 == q0:
            continue
        if k1 == k0:
            if sink is not None:
                R["lse"][:, q0:q1] = sink[:, None]
                if dlse is not None:  # lse = sink, out = 0: d sink = the rows' dLSE
                    R["ds"] += dlse[:, q0:q1].sum(-1)
                    R["ds16"] += dlse[:, q0:q1].sum(-1)
            continue
        qs, ks, vs, dos = q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], dout[None, q0:q1]
        dl = None if dlse is None else dlse[None, :, q0:q1]
        kw = dict(window=ref_window, softcap=softcap, sink=sink)
        o32, lse32, dq32, dk32, dv32, p32, *ds32 = reference(qs, ks, vs, dos, ref_causal, scale, torch.float32, dl,
                                                             True, **kw)
        _, _, dq16, dk16, dv16, *ds16 = reference(qs, ks, vs, dos, ref_causal, scale, dtype, dl, **kw)
        R["o32"][q0:q1], R["lse"][:, q0:q1] = o32[0], lse32[0]
        for name, lo, hi, g32, g16 in (("dq", q0, q1, dq32, dq16), ("dk", k0, k1, dk32, dk16), ("dv", k0, k1, dv32, dv16)):
            R[name][lo:hi], R[name + "16"][lo:hi] = g32[0].float(), g16[0].float()
        o_used = o32.to(dtype) if out is None else out[None, q0:q1]
        slack_q, slack_k = out_rounding_effect(p32, qs, ks, dos, o_used, o32, scale)
        R["sq"][q0:q1], R["sk"][k0:k1] = slack_q[0], slack_k[0]
        if sink is not None:  # the kernel's Delta reads its rounded out: d sink moves by -sum exp(sink - lse) dDelta
            R["ds"] += ds32[0].float()
            R["ds16"] += ds16[0].float()
            d_delta = torch.einsum("bqhd,bqhd->bhq", dos.float(), o_used.float() - o32.float())
            R["s_ds"] += (torch.exp(sink[None, :, None] - lse32) * d_delta).sum((0, 2))
    R["out"] = R["o32"].to(dtype) if out is None else out
    return R


def _offsets(lengths):
    c = [0]
    for n in lengths:
        c.append(c[-1] + n)
    return c


def _seq_of(row, lengths):
    return bisect.bisect_right(_offsets(lengths), row) - 1


def row_problem(name, got, ref, ref16, floor, slack, lengths):
    """What is wrong with ``got`` (None: nothing): per row (the last dim), error <= 2x torch's in-dtype
    error + one epsilon of the row's max + ``floor`` + ``slack``; the first bad row named with its sequence."""
    rows_bad = ~torch.isfinite(got.float()).all(-1)
    if rows_bad.any():
        r = [int(x) for x in rows_bad.nonzero()[0]]
        return f"{name}: {int(rows_bad.sum())} rows with NaN / Inf (first {r}, sequence {_seq_of(r[0], lengths)})"
    err = (got.float() - ref).abs().amax(-1)
    base = (ref16 - ref).abs().amax(-1)
    tol = 2 * base + torch.finfo(got.dtype).eps * ref.abs().amax(-1) + floor + slack
    bad = err > tol
    if bad.any():
        r = [int(x) for x in bad.nonzero()[0]]
        return (f"{name}: {int(bad.sum())} of {bad.numel()} rows out of bound (first {r}, sequence "
                f"{_seq_of(r[0], lengths)}); worst {float((err - tol).max()):.3e} over; max err {float(err.max()):.3e}, "
                f"torch in dtype {float(base.max()):.3e}")
    return None


def check_packed(got, R, lens, causal, window, what=""):
    """dq, dk, dv (and dsink) of ``got`` against ``R`` (:func:`packed_reference`), all problems together;
    then the rows that must be exactly 0: queries seeing no key, keys no query sees."""
    floor = 1e-4 * max(float(R[n].abs().max()) if R[n].numel() else 0.0 for n in ("dq", "dk", "dv"))
    floor = max(floor, 1e-7)
    problems = [row_problem(n, g, R[n], R[n + "16"], floor, R[s], lens[i])
                for n, g, s, i in (("dq", got[0], "sq", 0), ("dk", got[1], "sk", 1), ("dv", got[2], "sk", 1))]
    if len(got) > 3:
        dsink = got[3]
        assert dsink.shape == (HQ,) and dsink.dtype == torch.float32, (dsink.shape, dsink.dtype)
        s_floor = 1e-4 * float(R["ds"].abs().max()) + 1e-6
        problems.append(row_problem("dsink", dsink[:, None], R["ds"][:, None], R["ds16"][:, None], s_floor,
                                    R["s_ds"].abs(), [HQ]))
    problems = [p for p in problems if p]
    assert not problems, f"{what}: " + "; ".join(problems)
    cq, ck = _offsets(lens[0]), _offsets(lens[1])
    for b in range(len(lens[0])):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        vis = window_mask(q1 - q0, k1 - k0, causal, (-1, -1) if window is None else window, got[0].device)
        sees = vis.any(1)
        assert (got[0][q0:q1][~sees] == 0).all(), f"{what}: seq {b} ({q1 - q0}x{k1 - k0}): dq rows without keys not 0"
        seen = vis.any(0)
        for name, g in (("dk", got[1]), ("dv", got[2])):
            assert (g[k0:k1][~seen] == 0).all(), f"{what}: seq {b} ({q1 - q0}x{k1 - k0}): {name} of unseen keys not 0"


# ------------------------------------------------------------------------------------------ GPU: direct calls
def packed_inputs(dtype, D, G, lens, seed, dlse_on=False, sink=False):
    q, k, v, cq, ck = make_packed(lens[0], lens[1], HQ, HQ // G, D, dtype, "cuda", seed=seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    dout = torch.randn(q.shape, device="cuda", generator=g).to(dtype)
    dlse = torch.randn(HQ, q.shape[0], device="cuda", generator=g) if dlse_on else None
    sk = math.log(max(lens[1])) + 2 * torch.randn(HQ, device="cuda", generator=g) if sink else None
    return q, k, v, cq, ck, dout, dlse, sk


def run_packed(dtype, D, causal, G, lens, *, dlse_on=False, window=None, softcap=0.0, sink=False,
               deterministic=False, seed=0):
    """One backward call into NaN-poisoned dq / dk / dv against :func:`packed_reference`; returns the
    result and ``again(**over)``: the same call with allocated gradients (``over``: changed keywords)."""
    q, k, v, cq, ck, dout, dlse, sk = packed_inputs(dtype, D, G, lens, seed, dlse_on, sink)
    R = packed_reference(q, k, v, dout, lens, causal, window, D ** -0.5, dlse, softcap, sk)
    kw = dict(causal=causal, dlse=dlse, window_size=window, softcap=softcap, learnable_sink=sk,
              deterministic=deterministic, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max(lens[0]),
              max_seqlen_k=max(lens[1]))
    dq, dk, dv = torch.full_like(q, NAN), torch.full_like(k, NAN), torch.full_like(v, NAN)
    res = cute_kernels.flash_attn_backward(dout, q, k, v, R["out"], R["lse"], dq=dq, dk=dk, dv=dv, **kw)
    assert len(res) == (4 if sink else 3)
    assert res[0] is dq and res[1] is dk and res[2] is dv
    torch.cuda.synchronize()
    what = (f"{str(dtype)[6:]} D={D} G={G} {'causal' if causal else 'full'} window={window} dlse={dlse_on} "
            f"softcap={softcap} sink={sink} det={deterministic}")
    check_packed(res, R, lens, causal, window, what)

    def again(**over):
        return cute_kernels.flash_attn_backward(dout, q, k, v, R["out"], R["lse"], **{**kw, **over})

    return res, again


def test_the_length_sets_cover_both_grid_numberings():
    """LENS_B runs the main kernel's gapped numbering, LENS_A its rows per sequence (tile_n 128)."""
    from cute_kernels.attention import forward_seqlen as fsl

    def gapped(lens):
        return fsl.gapped_pays(len(lens[1]), sum(lens[1]), max(lens[1]), 128)

    assert gapped(LENS_B) and not gapped(LENS_A)
    args = (len(LENS_B[1]), sum(LENS_B[1]), max(LENS_B[1]), 128)
    assert BW.packed_numbering(False, *args) == 1 and BW.packed_numbering(True, *args) == 0  # turns: rows


#: (dtype, D, causal, GQA group, lengths, dlse): every head dim in both dtypes, GQA 1/4/8, both masks
CASES = [(BF, 128, True, 4, "A", False), (BF, 128, False, 8, "B", True), (FP, 128, True, 1, "A", False),
         (FP, 64, True, 1, "B", False), (FP, 64, False, 1, "A", True), (BF, 96, True, 8, "A", True),
         (FP, 96, False, 4, "B", False)]
#: (dtype, D, causal, window, GQA group, lengths): causal folding into a window's right side, both sides bounded
WINDOW_CASES = [(BF, 128, True, (64, -1), 4, "A"), (BF, 128, False, (32, 16), 8, "B"), (FP, 64, False, (64, 0), 1, "B"),
                (FP, 64, True, (32, 0), 1, "A")]
#: (dtype, D, causal, GQA group, lengths, dlse, softcap) with a learnable sink
SINK_CASES = [(BF, 128, True, 4, "A", True, 0.0), (FP, 64, False, 1, "B", False, 0.0), (BF, 128, True, 4, "B", True, 5.0)]
#: (dtype, D, causal, window, GQA group, lengths, dlse) in the deterministic mode
DET_CASES = [(BF, 128, True, None, 4, "A", True), (FP, 64, False, (32, 16), 1, "B", False)]
#: autograd (bf16): (D, causal, window, GQA group, lengths)
AUTOGRAD_CASES = [(128, True, None, 4, "A"), (96, True, None, 8, "B"), (128, True, (64, 0), 4, "B")]


def _plan_keys():
    """(dtype, D, causal, dlse, window, gqa, softcap, deterministic) of every backward this module runs."""
    keys = {(dt, D, c, dl, False, G > 1, False, False) for dt, D, c, G, _, dl in CASES}
    keys |= {(dt, D, c and w is None, False, True, G > 1, False, False) for dt, D, c, w, G, _ in WINDOW_CASES}
    keys |= {(dt, D, c, dl, False, G > 1, cap > 0, False) for dt, D, c, G, _, dl, cap in SINK_CASES}
    for dt, D, c, w, G, _, dl in DET_CASES:
        keys |= {(dt, D, c and w is None, dl, w is not None, G > 1, False, det) for det in (False, True)}
    for D, c, w, G, _ in AUTOGRAD_CASES:
        keys |= {(BF, D, c and w is None, dl, w is not None, G > 1, False, False) for dl in (False, True)}
    return keys


@pytest.fixture(scope="module", autouse=True)
def _precompile(request):
    """The packed backward's configurations compiled in parallel processes first (when this module's GPU
    tests run and ``bwd_plan`` takes ``varlen``; else each compiles at its first call)."""
    if "varlen" in inspect.signature(BW.bwd_plan).parameters:
        precompile_for_module_gpu_tests(request, lambda: BW.precompile(
            [BW.bwd_plan(*key, varlen=True) for key in sorted(_plan_keys(), key=str)]))


def _id(dt):
    return str(dt)[6:]


def _wid(w):
    return "nowindow" if w is None else f"w{w[0]}_{w[1]}"


@gpu
@pytest.mark.parametrize("dtype,D,causal,G,lens,dlse", CASES,
                         ids=[f"{_id(dt)}-D{D}-{'causal' if c else 'full'}-g{G}-{ln}{'-dlse' if dl else ''}"
                              for dt, D, c, G, ln, dl in CASES])
def test_packed_backward_matches_reference(dtype, D, causal, G, lens, dlse):
    run_packed(dtype, D, causal, G, LENS[lens], dlse_on=dlse, seed=D + G)


@gpu
@pytest.mark.parametrize("dtype,D,causal,window,G,lens", WINDOW_CASES,
                         ids=[f"{_id(dt)}-D{D}-{'causal' if c else 'full'}-w{w[0]}_{w[1]}-g{G}-{ln}"
                              for dt, D, c, w, G, ln in WINDOW_CASES])
def test_packed_backward_windows(dtype, D, causal, window, G, lens):
    """Sliding windows per sequence (bottom-right): unseen keys (2 x 300 under a 32-key window) get 0."""
    run_packed(dtype, D, causal, G, LENS[lens], window=window, seed=window[0] + D)


@gpu
@pytest.mark.parametrize("dtype,D,causal,G,lens,dlse,softcap", SINK_CASES,
                         ids=[f"{_id(dt)}-D{D}-{'causal' if c else 'full'}-g{G}-{ln}{'-dlse' if dl else ''}-cap{cap:g}"
                              for dt, D, c, G, ln, dl, cap in SINK_CASES])
def test_packed_backward_sink_and_softcap(dtype, D, causal, G, lens, dlse, softcap):
    """A learnable sink (a per-head logit in every row's denominator, around log(max Sk)): q, k, v's
    gradients and the sink's per head; keyless rows have lse = sink (d sink gets their dLSE)."""
    run_packed(dtype, D, causal, G, LENS[lens], dlse_on=dlse, softcap=softcap, sink=True, seed=7 + D)


@gpu
@pytest.mark.parametrize("dtype,D,causal,window,G,lens,dlse", DET_CASES,
                         ids=[f"{_id(dt)}-D{D}-{'causal' if c else 'full'}-{_wid(w)}-g{G}-{ln}" for dt, D, c, w, G, ln, _
                              in DET_CASES])
def test_packed_backward_deterministic_is_bitwise_repeatable(dtype, D, causal, window, G, lens, dlse):
    """``deterministic=True``: within the reference bound, the same bits over 3 calls, and within rounding
    of the default mode (the fp32 adds in another order)."""
    res, again = run_packed(dtype, D, causal, G, LENS[lens], dlse_on=dlse, window=window, deterministic=True,
                            seed=3 * D)
    for r in range(2):
        for name, a, b in zip(("dq", "dk", "dv"), again(), res):
            assert torch.equal(a, b), f"{name} of call {r + 2} differs from the first's bits"
    for name, a, b in zip(("dq", "dk", "dv"), again(deterministic=False), res):
        tol = 2 * RTOL[dtype] * torch.maximum(a.float().abs(), b.float().abs())
        tol = tol + torch.finfo(dtype).eps * b.float().abs().amax(-1, keepdim=True)
        assert ((a.float() - b.float()).abs() <= tol).all(), f"{name}: default and deterministic modes differ"


@gpu
@pytest.mark.parametrize("dtype,D,causal,window,G,lens,dlse", DET_CASES,
                         ids=[f"{_id(dt)}-D{D}-{'causal' if c else 'full'}-{_wid(w)}-g{G}-{ln}" for dt, D, c, w, G, ln, _
                              in DET_CASES])
def test_packed_deterministic_two_dq_warps_two_accumulators(monkeypatch, dtype, D, causal, window, G, lens, dlse):
    """``BwdTile.dq_warps = 2`` and ``dq_groups = 2`` (not the default yet) on packed sequences: the
    accumulators and semaphores of a group are batches ``g`` of the one-batch packed buffers; the planner
    patched, the deterministic checks above (reference, repeated bits)."""
    import dataclasses

    from cute_kernels.attention import backward_config as BC

    config = BC.bwd_config

    def two(*args, **kwargs):
        cfg = config(*args, **kwargs)
        return dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, dq_warps=2, dq_groups=2))

    monkeypatch.setattr(BC, "bwd_config", two)
    monkeypatch.setattr(BW, "_PLANS", {})
    res, again = run_packed(dtype, D, causal, G, LENS[lens], dlse_on=dlse, window=window, deterministic=True,
                            seed=3 * D)
    assert BW._PLANS and all(p[0].tile.dq_groups == 2 for p in BW._PLANS.values() if p[0].deterministic)
    for name, a, b in zip(("dq", "dk", "dv"), again(), res):
        assert torch.equal(a, b), f"{name} of a second call differs from the first's bits"


@gpu
@pytest.mark.parametrize("dtype,D,causal,G,lens", [(BF, 128, True, 4, "A"), (BF, 128, False, 8, "B"),
                                                   (FP, 96, True, 8, "B"), (FP, 64, False, 4, "A")],
                         ids=["bf16-D128-causal-g4-A", "bf16-D128-full-g8-B", "fp16-D96-causal-g8-B",
                              "fp16-D64-full-g4-A"])
def test_packed_kv_reduce_matches_reference(monkeypatch, dtype, D, causal, G, lens):
    """``FlashBwdConfig.kv_reduce`` (not the default yet) on packed sequences: a partial last KV tile's TMA
    reduce-add covers rows of the next sequence, which must only get zeros (every step of that tile is
    masked); the planner patched, the checks above."""
    kv_reduce_planner(monkeypatch)
    run_packed(dtype, D, causal, G, LENS[lens], seed=5 * D + G)
    assert BW._PLANS and all(p[0].kv_reduce for p in BW._PLANS.values())


@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_packed_backward_with_flash_attn_forward(causal):
    """out and lse from the real packed forward (a sequence with queries but no keys: out 0, lse -inf
    there), allocated gradients."""
    lens = LENS_A
    q, k, v, cq, ck, dout, _, _ = packed_inputs(BF, 128, 4, lens, seed=11)
    kw = dict(cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max(lens[0]), max_seqlen_k=max(lens[1]), causal=causal)
    out, lse = cute_kernels.flash_attn(q, k, v, return_lse=True, **kw)
    assert out.shape == q.shape and lse.shape == (HQ, q.shape[0]) and lse.dtype == torch.float32
    r0, r1 = 5, 6  # sequence 2: 1 query, 0 keys
    assert (out[r0:r1] == 0).all() and torch.isneginf(lse[:, r0:r1]).all()
    res = cute_kernels.flash_attn_backward(dout, q, k, v, out, lse, **kw)
    torch.cuda.synchronize()
    R = packed_reference(q, k, v, dout, lens, causal, None, 128 ** -0.5, out=out)
    check_packed(res, R, lens, causal, None, f"with the forward, causal={causal}")
    assert (res[0][r0:r1] == 0).all()


@gpu
def test_packed_backward_strided_buffers():
    """Inputs and given gradients as head-padded views of larger NaN-filled buffers, lse (Hq, total_q)
    transposed in memory, an explicit softmax_scale, max_seqlen above every length; the padding stays NaN."""
    lens, D, dt, scale = LENS_B, 64, FP, 0.3
    Tq, Tk = sum(lens[0]), sum(lens[1])
    g = torch.Generator(device="cuda").manual_seed(5)

    def view(T, H):
        return torch.randn(T, H, D + 16, device="cuda", generator=g).to(dt)[..., :D]

    q, dout, k, v = view(Tq, HQ), view(Tq, HQ), view(Tk, HQ), view(Tk, HQ)
    cq = torch.tensor(_offsets(lens[0]), dtype=torch.int32, device="cuda")
    ck = torch.tensor(_offsets(lens[1]), dtype=torch.int32, device="cuda")
    R = packed_reference(q, k, v, dout, lens, False, None, scale)
    out = torch.full((Tq, HQ, D + 8), NAN, device="cuda", dtype=dt)[..., :D]
    out.copy_(R["out"])
    lse = R["lse"].t().contiguous().t()
    bufs = [torch.full((T, HQ, D + 24), NAN, device="cuda", dtype=dt) for T in (Tq, Tk, Tk)]
    dq, dk, dv = (b[..., 8:8 + D] for b in bufs)
    res = cute_kernels.flash_attn_backward(dout, q, k, v, out, lse, softmax_scale=scale, dq=dq, dk=dk, dv=dv,
                                           cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max(lens[0]) + 64,
                                           max_seqlen_k=max(lens[1]) + 200)
    torch.cuda.synchronize()
    assert res[0] is dq and res[1] is dk and res[2] is dv
    check_packed(res, R, lens, False, None, "strided")
    for b in bufs:
        assert torch.isnan(b[..., :8]).all() and torch.isnan(b[..., 8 + D:]).all(), "wrote outside the views"


@gpu
def test_packed_backward_without_keys_or_queries():
    """total_k = 0: dq exactly 0 over a NaN-poisoned buffer, d sink = the rows' dLSE (lse = sink); total_q =
    0: dk, dv exactly 0."""
    lq = [3, 0, 200]
    q, k, v, cq, ck = make_packed(lq, [0, 0, 0], 4, 2, 64, BF, "cuda", seed=1)
    sink = torch.randn(4, device="cuda")
    dlse = torch.randn(4, q.shape[0], device="cuda")
    kw = dict(cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=200, max_seqlen_k=0)
    for with_sink in (False, True):
        lse = sink[:, None].expand(4, q.shape[0]).contiguous() if with_sink else torch.full((4, q.shape[0]), -math.inf,
                                                                                             device="cuda")
        dq = torch.full_like(q, NAN)
        res = cute_kernels.flash_attn_backward(torch.randn_like(q), q, k, v, torch.zeros_like(q), lse, dq=dq, dlse=dlse,
                                               learnable_sink=sink if with_sink else None, **kw)
        assert res[0] is dq and (dq == 0).all() and res[1].shape == k.shape and res[2].shape == v.shape
        if with_sink:
            torch.testing.assert_close(res[3], dlse.sum(-1))
    lk = [5, 0, 300]
    q, k, v, cq, ck = make_packed([0, 0, 0], lk, 4, 2, 64, BF, "cuda", seed=2)
    dk, dv = torch.full_like(k, NAN), torch.full_like(v, NAN)
    res = cute_kernels.flash_attn_backward(q.clone(), q, k, v, q.clone(), torch.zeros(4, 0, device="cuda"), dk=dk,
                                           dv=dv, causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=0,
                                           max_seqlen_k=300)
    torch.cuda.synchronize()
    assert res[0].shape == q.shape and (dk == 0).all() and (dv == 0).all()


_DROP = object()
#: (id, change to the arguments, exception, message pattern): each mistake names its argument
BAD = [
    ("lse-dense-shape", lambda a: dict(lse=a["lse"][None]), ValueError, "lse"),
    ("lse-transposed", lambda a: dict(lse=a["lse"].t().contiguous()), ValueError, "lse"),
    ("lse-fp16", lambda a: dict(lse=a["lse"].half()), TypeError, "lse"),
    ("dlse-shape", lambda a: dict(dlse=torch.zeros(4, 7, device="cuda")), ValueError, "dlse"),
    ("dout-shape", lambda a: dict(dout=a["dout"][:7]), ValueError, "dout"),
    ("dout-dtype", lambda a: dict(dout=a["dout"].half()), TypeError, "dout"),
    ("out-shape", lambda a: dict(out=a["out"][:7]), ValueError, "out"),
    ("dq-shape", lambda a: dict(dq=torch.empty(8, 2, 64, device="cuda", dtype=BF)), ValueError, "dq"),
    ("dk-shape", lambda a: dict(dk=torch.empty(10, 4, 64, device="cuda", dtype=BF)), ValueError, "dk"),
    ("dv-dtype", lambda a: dict(dv=torch.empty(10, 2, 64, device="cuda", dtype=FP)), TypeError, "dv"),
    ("cu-k-missing", lambda a: dict(cu_seqlens_k=_DROP), ValueError, "cu_seqlens"),
    ("cu-q-int64", lambda a: dict(cu_seqlens_q=a["cu_seqlens_q"].long()), TypeError, "cu_seqlens_q"),
    ("cu-lengths-differ", lambda a: dict(cu_seqlens_k=a["cu_seqlens_k"][:2]), ValueError, "cu_seqlens"),
    ("max-q-missing", lambda a: dict(max_seqlen_q=_DROP), ValueError, "max_seqlen_q"),
    ("max-q-negative", lambda a: dict(max_seqlen_q=-1), ValueError, "max_seqlen_q"),
    ("max-k-tensor", lambda a: dict(max_seqlen_k=torch.tensor(6)), TypeError, "max_seqlen_k"),
    ("q-4d-with-cu", lambda a: {n: a[n][None] for n in ("q", "out", "dout")}, ValueError, "3-d"),
    ("packed-without-cu", lambda a: dict(cu_seqlens_q=_DROP, cu_seqlens_k=_DROP, max_seqlen_q=_DROP,
                                         max_seqlen_k=_DROP), ValueError, "cu_seqlens"),
    ("kv-heads", lambda a: dict(k=a["k"][:, :1].expand(10, 3, 64).contiguous(),
                                v=a["v"][:, :1].expand(10, 3, 64).contiguous()), ValueError, "heads"),
    ("head-dim-192", lambda a: {n: torch.randn(*a[n].shape[:-1], 192, device="cuda").to(BF)
                                for n in ("q", "k", "v", "out", "dout")}, ValueError, "head_dim"),
    ("window-below-minus-1", lambda a: dict(window_size=(-2, 0)), ValueError, "window_size"),
    ("sink-shape", lambda a: dict(learnable_sink=torch.zeros(3, device="cuda")), ValueError, "learnable_sink"),
    ("deterministic-str", lambda a: dict(deterministic="yes"), TypeError, "deterministic"),
]


@gpu
@pytest.mark.parametrize("change,exc,match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_packed_backward_validation_names_the_argument(change, exc, match):
    """Packed backward mistakes raise naming the argument, before anything is planned or launched (CUDA
    tensors: as for the dense backward, the device check comes first on the CPU)."""
    q, k, v, cq, ck = make_packed([3, 5], [4, 6], 4, 2, 64, BF, "cuda")
    a = dict(dout=torch.randn_like(q), q=q, k=k, v=v, out=torch.randn_like(q), lse=torch.zeros(4, 8, device="cuda"),
             cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=5, max_seqlen_k=6)
    a = {n: t for n, t in {**a, **change(a)}.items() if t is not _DROP}
    pos = [a.pop(n) for n in ("dout", "q", "k", "v", "out", "lse")]
    assert_raises_before_any_launch(exc, match, cute_kernels.flash_attn_backward, *pos, **a)


# ------------------------------------------------------------------------------------------ GPU: autograd
def _grad_leaves(lens, D, G, seed):
    q, k, v, cq, ck, dout, _, _ = packed_inputs(BF, D, G, lens, seed)
    dlse = torch.randn(HQ, q.shape[0], device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed + 2))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), cq, ck, dout, dlse


@gpu
@pytest.mark.parametrize("D,causal,window,G,lens", AUTOGRAD_CASES,
                         ids=[f"D{D}-{'causal' if c else 'full'}-{_wid(w)}-g{G}-{ln}" for D, c, w, G, ln in AUTOGRAD_CASES])
def test_packed_autograd_matches_float32(D, causal, window, G, lens):
    """torch.autograd through packed ``flash_attn``: loss (out * dout).sum() (return_lse=False), then
    + (lse * dlse).sum() (return_lse=True; rows without keys, lse -inf, get none), against the per-sequence
    reference computed with the forward's out."""
    lens = LENS[lens]
    q, k, v, cq, ck, dout, dlse = _grad_leaves(lens, D, G, seed=D + G)
    kw = dict(cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max(lens[0]), max_seqlen_k=max(lens[1]), causal=causal,
              window_size=window)
    for dl in (None, dlse):
        with count_launches() as n:
            res = cute_kernels.flash_attn(q, k, v, return_lse=dl is not None, **kw)
        o, lse = res if dl is not None else (res, None)
        assert n["flash_attn"] == 1 and o.grad_fn is not None and o.shape == q.shape
        loss = (o.float() * dout.float()).sum()
        if dl is not None:
            assert lse.shape == (HQ, q.shape[0])
            loss = loss + (lse.nan_to_num(0.0, 0.0, 0.0) * dl).sum()
        with count_launches() as n:
            got = torch.autograd.grad(loss, (q, k, v))
        assert n["flash_attn_backward"] == 1
        R = packed_reference(q, k, v, dout, lens, causal, window, D ** -0.5, dl, out=o.detach())
        check_packed(got, R, lens, causal, window, f"autograd D={D} causal={causal} window={window} dlse={dl is not None}")


def _packed_step_inputs():
    lens = LENS_A
    q, k, v, cq, ck, _, _ = _grad_leaves(lens, 128, 4, seed=3)

    def loss(q, k, v):
        return cute_kernels.flash_attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max(lens[0]),
                                       max_seqlen_k=max(lens[1]), causal=True).float().square().sum()

    return (q, k, v), loss


@gpu
def test_packed_autograd_compile_training_step():
    """``torch.compile(fullgraph=True)`` of the packed forward + loss (AOTAutograd traces the backward):
    the same gradients as eager, up to the reduction order."""
    (q, k, v), loss = _packed_step_inputs()
    ref = torch.autograd.grad(loss(q, k, v), (q, k, v))
    torch._dynamo.reset()
    try:
        got = torch.autograd.grad(torch.compile(loss, fullgraph=True)(q, k, v), (q, k, v))
    finally:
        torch._dynamo.reset()
    for a, b in zip(got, ref):
        same_up_to_reduction_order(a, b)


@gpu
def test_packed_autograd_cuda_graph_training_step():
    """A packed forward + backward step captured in a CUDA graph, replayed on new inputs: as eager."""
    (q, k, v), loss = _packed_step_inputs()

    def step(q, k, v):
        return torch.autograd.grad(loss(q, k, v), (q, k, v))

    graph_replay_matches_eager(step, (q, k, v))


# ------------------------------------------------------------------------------------------ CPU: autograd on meta
@pytest.fixture
def meta_ok(monkeypatch):
    """Meta tensors pass the device check: the ops' fake implementations run."""
    monkeypatch.setattr(FV, "_check_devices", lambda named: None)


def test_packed_autograd_reaches_every_input(meta_ok):
    """Packed ``flash_attn`` with inputs that require grad is differentiable now: q, k, v get gradients
    of their shapes, through the output and through the returned (Hq, total_q) LSE; nothing launched."""
    qp = torch.empty(30, 8, 128, dtype=BF, device="meta", requires_grad=True)
    kp = torch.empty(50, 2, 128, dtype=BF, device="meta", requires_grad=True)
    vp = torch.empty(50, 2, 128, dtype=BF, device="meta", requires_grad=True)
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    with count_launches() as n:
        o, lse = FW.flash_attn(qp, kp, vp, cu_seqlens_q=cu, cu_seqlens_k=cu.clone(), max_seqlen_q=20, max_seqlen_k=30,
                               causal=True, window_size=(16, 0), return_lse=True)
        assert o.grad_fn is not None and o.shape == qp.shape and lse.shape == (8, 30)
        dq, dk, dv = torch.autograd.grad(o.float().sum() + lse.sum(), (qp, kp, vp))
    assert n.total() == 0
    assert dq.shape == qp.shape and dk.shape == kp.shape and dv.shape == vp.shape
    (dk2,) = torch.autograd.grad(FW.flash_attn(qp.detach(), kp, vp.detach(), cu_seqlens_q=cu, cu_seqlens_k=cu,
                                               max_seqlen_q=20, max_seqlen_k=30).float().sum(), (kp,))
    assert dk2.shape == kp.shape


def test_paged_autograd_still_refused(meta_ok):
    """Paged K/V (block_table) still has no backward: a ValueError naming it before any launch."""
    q = torch.empty(2, 40, 8, 128, dtype=BF, device="meta", requires_grad=True)
    pool = torch.empty(10, 16, 2, 128, dtype=BF, device="meta", requires_grad=True)
    with count_launches() as n, pytest.raises(ValueError, match=r"block_table \(paged K/V\) has no backward"):
        FW.flash_attn(q, pool, pool, block_table=torch.empty(2, 5, dtype=torch.int32, device="meta"),
                      seqused_k=torch.empty(2, dtype=torch.int32, device="meta"))
    assert n.total() == 0
