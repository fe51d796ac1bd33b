"""flash_attn with packed (variable-length) sequences and sliding windows.

CPU: every bad argument of the varlen / window API raises naming it, before any launch; the float32
references (dense + window, varlen + window, per sequence) against the dense reference of
``test_forward.py`` and against brute force; plans and compile keys (max_seqlen never enters them).
GPU (``-m gpu``): varlen batches with empty, length-1, prime and off-tile sequences against the
reference elementwise (per sequence, 2x torch's own 16-bit error + 1e-4, the last query tile alone too)
and bitwise against the dense kernel on each sequence alone; rows outside the sequences untouched
(NaN-poisoned buffers); windows from 0 to past the length, with and without causal, dense and varlen;
a CUDA graph captured at max_seqlen replayed with shorter lengths; checked mode.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import cute_kernels
from cute_kernels.attention import forward as FW
from cute_kernels.attention.forward import flash_attn
from cute_kernels.common import jit
from cute_kernels.testing import count_launches
from _check import assert_raises_before_any_launch
from test_forward import attention_reference, check_result, make_qkv

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
NAN = float("nan")


# ------------------------------------------------------------------------------------------ references
def window_mask(Sq, Sk, causal=False, window_size=(-1, -1), device="cpu"):
    """(Sq, Sk) bool, True = visible: query i at p = i + Sk - Sq sees keys p - left <= j <= p + right
    (-1: unbounded; causal sets right = 0)."""
    left, right = window_size
    if causal:
        right = 0
    i = torch.arange(Sq, device=device)[:, None]
    j = torch.arange(Sk, device=device)[None, :]
    p = i + (Sk - Sq)
    vis = torch.ones(Sq, Sk, dtype=torch.bool, device=device)
    if left >= 0:
        vis &= j >= p - left
    if right >= 0:
        vis &= j <= p + right
    return vis


def window_reference(q, k, v, causal=False, window_size=(-1, -1), softmax_scale=None):
    """Dense (B, S, H, D) float32 attention under a window: (o (B, Sq, Hq, D), lse (B, Hq, Sq)); rows
    that see no key give o = 0 and lse = -inf."""
    B, Sq, Hq, D = q.shape
    Sk, G = k.shape[1], Hq // k.shape[2]
    scale = D ** -0.5 if softmax_scale is None else float(softmax_scale)
    out = torch.zeros(B, Sq, Hq, D, dtype=torch.float32, device=q.device)
    lse = torch.full((B, Hq, Sq), float("-inf"), dtype=torch.float32, device=q.device)
    if Sq == 0 or Sk == 0:
        return out, lse
    vis = window_mask(Sq, Sk, causal, window_size, q.device)
    for b in range(B):
        qf = q[b].float().transpose(0, 1)
        kf = k[b].float().transpose(0, 1).repeat_interleave(G, 0)
        vf = v[b].float().transpose(0, 1).repeat_interleave(G, 0)
        s = (qf @ kf.transpose(-1, -2) * scale).masked_fill(~vis, float("-inf"))
        l = torch.logsumexp(s, -1)
        empty = torch.isneginf(l)
        p = torch.exp(s - torch.where(empty, torch.zeros_like(l), l)[..., None])
        p = torch.where(empty[..., None], torch.zeros_like(p), p)
        out[b] = (p @ vf).transpose(0, 1)
        lse[b] = l
    return out, lse


def varlen_reference(q, k, v, cu_q, cu_k, causal=False, window_size=(-1, -1), softmax_scale=None):
    """Packed float32 reference: o (total_q, Hq, D), lse (Hq, total_q), each sequence on its own; rows
    outside every sequence are 0 / -inf."""
    total_q, Hq, D = q.shape
    out = torch.zeros(total_q, Hq, D, dtype=torch.float32, device=q.device)
    lse = torch.full((Hq, total_q), float("-inf"), dtype=torch.float32, device=q.device)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        o, l = window_reference(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal, window_size, softmax_scale)
        out[q0:q1], lse[:, q0:q1] = o[0], l[0]
    return out, lse


def sdpa_16bit_masked(q, k, v, vis, softmax_scale=None):
    """torch's own attention in the input dtype (SDPA math backend, 16-bit reductions) with a boolean
    mask; rows without a visible key are 0."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    G = q.shape[2] // k.shape[2]
    prev = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(G, 1), v.transpose(1, 2).repeat_interleave(G, 1),
                attn_mask=vis, scale=softmax_scale)
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(prev)
    o = o.transpose(1, 2)
    return torch.where(vis.any(-1)[None, :, None, None], o, torch.zeros_like(o)).nan_to_num(0.0)


def check_window_result(o, lse, q, k, v, causal, window_size, softmax_scale=None, what=""):
    """Dense (B, S, H, D) result vs the float32 window reference, by test_forward's criteria
    (:func:`check_result`: within 2x torch's 16-bit attention + 1e-4, LSE, empty rows, no NaN)."""
    ref, ref_lse = window_reference(q, k, v, causal, window_size, softmax_scale)
    Sq, Sk = q.shape[1], k.shape[1]
    if Sq == 0:
        assert not torch.isnan(lse).any(), f"{what}: NaN in LSE"
        return
    if Sk:
        o_torch = sdpa_16bit_masked(q, k, v, window_mask(Sq, Sk, causal, window_size, q.device), softmax_scale)
    else:
        o_torch = torch.zeros_like(q)
    check_result(o, lse, ref, ref_lse, o_torch, what)


def cu_seqlens(lengths, device="cpu"):
    c = [0]
    for n in lengths:
        c.append(c[-1] + n)
    return torch.tensor(c, dtype=torch.int32, device=device)


def make_packed(lens_q, lens_k, Hq, Hkv, D, dtype=torch.bfloat16, device="cpu", seed=0, pad_q=0, pad_k=0):
    """Packed q (total_q + pad_q, Hq, D), k / v, and cu_seqlens; ``pad_*`` extra (finite) rows after
    the last sequence."""
    g = torch.Generator(device=device).manual_seed(seed)
    tq, tk = sum(lens_q) + pad_q, sum(lens_k) + pad_k
    q = torch.randn(tq, Hq, D, generator=g, device=device).to(dtype)
    k = torch.randn(tk, Hkv, D, generator=g, device=device).to(dtype)
    v = torch.randn(tk, Hkv, D, generator=g, device=device).to(dtype)
    return q, k, v, cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)


def _varlen_kw(**over):
    q, k, v, cq, ck = make_packed([3, 5], [4, 6], 4, 2, 64)
    kw = dict(q=q, k=k, v=v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=5, max_seqlen_k=6)
    kw.update(over)
    return {a: b for a, b in kw.items() if b is not _DROP}


_DROP = object()


def _bf(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


# ------------------------------------------------------------------------------------------ CPU: validation
BAD_VARLEN = [
    ("cu-q-without-cu-k", dict(cu_seqlens_k=_DROP), ValueError, "cu_seqlens_q is given without cu_seqlens_k"),
    ("cu-k-without-cu-q", dict(cu_seqlens_q=_DROP), ValueError, "cu_seqlens_k is given without cu_seqlens_q"),
    ("max-without-cu", dict(cu_seqlens_q=_DROP, cu_seqlens_k=_DROP), ValueError, "max_seqlen_q is given without cu_seqlens"),
    ("cu-q-int64", dict(cu_seqlens_q=torch.tensor([0, 3, 8])), TypeError, "cu_seqlens_q must be int32"),
    ("cu-k-float", dict(cu_seqlens_k=torch.tensor([0.0, 4.0, 10.0])), TypeError, "cu_seqlens_k must be int32"),
    ("cu-q-rank", dict(cu_seqlens_q=torch.zeros(1, 3, dtype=torch.int32)), ValueError, r"cu_seqlens_q must be 1-d"),
    ("cu-q-empty", dict(cu_seqlens_q=torch.zeros(0, dtype=torch.int32)), ValueError, r"cu_seqlens_q must be 1-d"),
    ("cu-q-not-tensor", dict(cu_seqlens_q=[0, 3, 8]), TypeError, "cu_seqlens_q must be a torch.Tensor"),
    ("cu-lengths-differ", dict(cu_seqlens_k=torch.tensor([0, 10], dtype=torch.int32)), ValueError,
     r"cu_seqlens_k shape \(2,\) must equal cu_seqlens_q shape \(3,\)"),
    ("cu-strided", dict(cu_seqlens_q=torch.tensor([0, 0, 3, 0, 8, 0], dtype=torch.int32)[::2]), ValueError,
     "cu_seqlens_q must be contiguous"),
    ("max-q-missing", dict(max_seqlen_q=_DROP), ValueError, "max_seqlen_q is required"),
    ("max-k-missing", dict(max_seqlen_k=_DROP), ValueError, "max_seqlen_k is required"),
    ("max-q-negative", dict(max_seqlen_q=-1), ValueError, "max_seqlen_q must be >= 0"),
    ("max-k-float", dict(max_seqlen_k=6.0), TypeError, "max_seqlen_k must be a Python int"),
    ("max-q-tensor", dict(max_seqlen_q=torch.tensor(5)), TypeError, "max_seqlen_q must be a Python int"),
    ("max-q-bool", dict(max_seqlen_q=True), TypeError, "max_seqlen_q must be a Python int"),
    ("q-rank-4", dict(q=_bf(1, 8, 4, 64)), ValueError, "q must be 3-d"),
    ("k-rank-4", dict(k=_bf(1, 10, 2, 64)), ValueError, "k must be 3-d"),
    ("out-rank", dict(out=_bf(8, 256)), ValueError, "out must be 3-d"),
    ("head-dim", dict(q=_bf(8, 4, 80)), ValueError, "q head_dim must be one of"),
    ("gqa", dict(k=_bf(10, 3, 64), v=_bf(10, 3, 64)), ValueError, r"multiple of k/v heads"),
    ("v-shape", dict(v=_bf(9, 2, 64)), ValueError, "v shape"),
    ("out-shape", dict(out=_bf(9, 4, 64)), ValueError, "out shape"),
    ("dtype", dict(q=torch.randn(8, 4, 64)), TypeError, "q must be float16 or bfloat16"),
    # FlashAttention-4's negative sides are fine as long as the window is not empty
    ("window-empty", dict(window_size=(-2, 0)), ValueError, r"window_size \(-2, 0\) is empty"),
    ("window-right-empty", dict(window_size=(4, -5)), ValueError, r"window_size \(4, -5\) is empty"),
    ("window-negative-ok", dict(window_size=(5, -5)), ValueError, "q is on cpu"),
    ("window-below-limit", dict(window_size=(-(2 ** 30) - 1, None)), ValueError, "window_size left must be at least"),
    ("window-float", dict(window_size=(1.5, 0)), TypeError, "window_size left must be an int"),
    ("window-scalar", dict(window_size=4), TypeError, "window_size must be a"),
    ("window-causal-right", dict(window_size=(4, 2), causal=True), ValueError, "right must be 0 or -1 with causal"),
    ("cpu", dict(), ValueError, "q is on cpu"),
]


@pytest.mark.parametrize("over,exc,match", [c[1:] for c in BAD_VARLEN], ids=[c[0] for c in BAD_VARLEN])
def test_varlen_bad_inputs_raise_before_any_launch(over, exc, match):
    kw = _varlen_kw(**over)
    assert_raises_before_any_launch(exc, match, flash_attn, kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)


BAD_DENSE_WINDOW = [
    ("window-empty", (-3, 1), False, ValueError, r"window_size \(-3, 1\) is empty"),
    ("window-causal-negative-right", (4, -2), True, ValueError, "right must be 0 or -1 with causal"),
    ("window-len-3", (1, 2, 3), False, TypeError, "window_size must be a"),
    ("window-bool", (True, 0), False, TypeError, "window_size left must be an int"),
    ("window-tensor", torch.tensor([1, 2]), False, TypeError, "window_size must be a"),
    ("window-causal-right", (-1, 3), True, ValueError, "right must be 0 or -1 with causal"),
]


@pytest.mark.parametrize("window,causal,exc,match", [c[1:] for c in BAD_DENSE_WINDOW], ids=[c[0] for c in BAD_DENSE_WINDOW])
def test_dense_window_bad_inputs(window, causal, exc, match):
    q, k, v = make_qkv(2, 5, 7, 4, 2, 64)
    assert_raises_before_any_launch(exc, match, flash_attn, q, k, v, causal=causal, window_size=window)


def test_rank_3_q_without_cu_seqlens_says_so():
    q, k, v, _, _ = make_packed([3, 5], [4, 6], 4, 2, 64)
    with pytest.raises(ValueError, match=r"q must be 4-d .*3-d packed sequences need cu_seqlens_q and cu_seqlens_k"):
        flash_attn(q, k, v)


def test_varlen_shape_errors_before_device_errors():
    """CPU tensors with a bad varlen argument report it, not the device."""
    kw = _varlen_kw(max_seqlen_q=-4)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flash_attn(kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)
    kw = _varlen_kw()
    with pytest.raises(ValueError, match="q is on cpu"):
        flash_attn(kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)


def test_check_window_normalization():
    cw = FW.check_window
    assert cw((-1, -1), False) == (False, None)
    assert cw(None, False) == (False, None)
    assert cw((-1, 0), False) == (True, None)  # (-1, 0) is causal: the dense causal kernel
    assert cw((-1, -1), True) == (True, None)
    assert cw((8, -1), True) == (False, (8, 0))
    assert cw([3, 4], False) == (False, (3, 4))
    assert cw((0, 0), False) == (False, (0, 0))


def test_check_cu_seqlens_checked_mode_on_cpu():
    """The checked-mode checks themselves (they read the values on the host)."""
    FW.check_cu_seqlens(cu_seqlens([3, 0, 5]), 8, 5, "cu_seqlens_q")
    with pytest.raises(ValueError, match=r"sequence 2 has 5 queries > max_seqlen_q = 4"):
        FW.check_cu_seqlens(cu_seqlens([3, 0, 5]), 8, 4, "cu_seqlens_q")
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[-1\] = 8 exceeds the packed length 7"):
        FW.check_cu_seqlens(cu_seqlens([3, 0, 5]), 7, 5, "cu_seqlens_k")
    with pytest.raises(ValueError, match="non-decreasing"):
        FW.check_cu_seqlens(torch.tensor([0, 4, 2], dtype=torch.int32), 8, 5, "cu_seqlens_q")
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[0\] must be >= 0"):
        FW.check_cu_seqlens(torch.tensor([-1, 4], dtype=torch.int32), 8, 5, "cu_seqlens_q")


# ------------------------------------------------------------------------------------------ CPU: plans
def test_varlen_and_window_plans():
    """Varlen and window are compile-time flags; lengths, max_seqlen and window sides are not in the
    key; a window config folds causal into its right side."""
    want = FW.plan(torch.bfloat16, 128, False, varlen=True)
    seen = set()
    for lens, mq in (([3, 5], 5), ([100, 0, 1], 4097), ([7], 7)):
        q, k, v, cq, ck = make_packed(lens, lens, 4, 2, 128)
        out, lse = torch.empty_like(q), torch.empty(4, q.shape[0])
        with jit.dry_run() as dry:
            FW._run(FW.Call(FW.PACKED, False, 0.1, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=mq, max_seqlen_k=mq),
                    q, k, v, out, lse)
        seen.update(dry.seen)
    assert seen == {("flash_attn_fwd", want)} and want.varlen and want.tile == FW.plan(torch.bfloat16, 128, False).tile
    cfgs = set()
    for window in ((3, 0), (100, 7), (0, -1)):
        q, k, v = make_qkv(1, 33, 40, 4, 2, 128)
        with jit.dry_run() as dry:
            FW._run(FW.Call(FW.DENSE, False, 0.1, *window), q, k, v, torch.empty_like(q), torch.empty(1, 4, 33))
        cfgs.update(c for _, c in dry.seen)
    assert len(cfgs) == 1 and next(iter(cfgs)).window and not next(iter(cfgs)).causal
    assert FW.plan(torch.bfloat16, 128, True, window=True) == FW.plan(torch.bfloat16, 128, False, window=True)


@pytest.mark.parametrize("longest_first", [False, True])
def test_varlen_tile_order_walks_every_tile_once(longest_first):
    """The kernel's packed tile order (:func:`forward_seqlen.varlen_tile_coords`, its Python twin):
    every (m_block, head, sequence) of the real tiles exactly once, heads fastest, a sequence's tiles
    last to first when longest_first, and never more tiles than the host's grid bound; a CTA's walk
    (growing tiles: a fixed stride, or whatever a counter hands out) resuming each lookup where the
    last one found its tile gets the same coordinates as fresh lookups."""
    from cute_kernels.attention import forward_seqlen as fsl

    rng = torch.Generator().manual_seed(0)
    for lens in ([1], [0, 0, 5], [128, 129, 0, 1, 255, 256, 257], torch.randint(0, 700, (75,), generator=rng).tolist()):
        for H, tm in ((1, 128), (3, 192), (8, 64)):
            tiles = sum(-(-n // tm) for n in lens) * H
            assert tiles <= fsl.varlen_grid_bound(sum(lens), len(lens), H, tm)
            got = [fsl.varlen_tile_coords_py(t, lens, H, tm, longest_first)[:3] for t in range(tiles)]
            want = {(m, h, b) for b, n in enumerate(lens) for m in range(-(-n // tm)) for h in range(H)}
            assert len(got) == len(set(got)) and set(got) == want
            assert [h for _, h, _ in got] == [t % H for t in range(tiles)]
            for t in range(H, tiles):
                (m0, _, b0), (m1, _, b1) = got[t - H], got[t]
                assert b1 > b0 or (m1 == (m0 - 1 if longest_first else m0 + 1) and b1 == b0)
            with pytest.raises(IndexError):
                fsl.varlen_tile_coords_py(tiles, lens, H, tm, longest_first)
            for stride in (1, 5, 132):
                for first in range(min(stride, tiles)):
                    walk = list(range(first, tiles, stride))
                    scan = (0, 0)
                    for t in walk:
                        m, h, b, scan = fsl.varlen_tile_coords_py(t, lens, H, tm, longest_first, scan)
                        assert (m, h, b) == got[t] and scan[0] % 32 == 0 and scan[0] <= b
            counter = sorted(set(torch.randint(0, tiles, (min(tiles, 40),), generator=rng).tolist()))
            scan = (0, 0)
            for t in counter:  # a dynamic schedule's growing, irregular tiles
                m, h, b, scan = fsl.varlen_tile_coords_py(t, lens, H, tm, longest_first, scan)
                assert (m, h, b) == got[t]


def test_gapped_numbering_runs_every_tile_once_and_bad_lengths_stay_in_range():
    """Every (sequence, tile) of a packed problem has one number below the host's bound, and a lookup
    of each number gives it back (the gaps give a local index past their sequence's tiles); bad
    ``cu_seqlens`` (decreasing, negative, past the total) give sequences in range."""
    from cute_kernels.attention import forward_seqlen as fsl

    rng = torch.Generator().manual_seed(1)
    draws = [[1], [0, 0, 5], [128, 129, 0, 1, 255, 256, 257], [0] * 40 + [3],
             torch.randint(0, 700, (75,), generator=rng).tolist(),
             torch.randint(0, 40, (1024,), generator=rng).tolist(), torch.randint(0, 9, (1500,), generator=rng).tolist()]
    for lens in draws:
        cu = [0, *itertools.accumulate(lens)]
        for tile in (64, 128):
            bound = fsl.gapped_grid_bound(cu[-1], len(lens), tile)
            seen = []
            for t in range(bound):
                b, local = fsl.gapped_tile_coords_py(t, cu, tile, cu[-1])
                assert 0 <= b < len(lens)
                if 0 <= local and local * tile < lens[b]:
                    seen.append((b, local))
            want = [(b, n) for b, L in enumerate(lens) for n in range(-(-L // tile))]
            assert sorted(seen) == want and len(seen) == len(set(seen))
    total = 50
    for cu in ([0, 30, 10, 80, -5], [7, 7, 7], [0, 2**31 - 1, 3]):
        for t in range(fsl.gapped_grid_bound(total, len(cu) - 1, 64) + 3):
            assert 0 <= fsl.gapped_tile_coords_py(t, cu, 64, total)[0] < len(cu) - 1


def test_gapped_pays_where_rows_waste_more():
    """The packed backward's grid choice: the bench's 32 long sequences gapped, its 1024 short ones in rows
    (both measured so), one sequence always in rows (nothing to waste), rounds growing past 32 and 1024."""
    from cute_kernels.attention import forward_seqlen as fsl

    assert fsl.gapped_pays(32, 42149, 7015, 128) and not fsl.gapped_pays(1024, 83085, 511, 128)
    assert not fsl.gapped_pays(1, 5000, 5000, 128) and not fsl.gapped_pays(3, 30, 10, 128)
    assert fsl.gapped_pays(32, 32 * 100, 32 * 100, 128) and not fsl.gapped_pays(33, 33 * 100, 100, 128)
    assert fsl.gapped_pays(1025, 1025 * 10, 1025 * 10, 64)


def test_varlen_empty_problems_launch_nothing():
    """No sequence (B = 0), no query rows, or max_seqlen_q = 0: nothing planned or launched."""
    for lens_q, mq in (([], 0), ([0, 0], 0), ([3], 0)):
        q, k, v, cq, ck = make_packed(lens_q, [2] * len(lens_q), 4, 2, 64)
        with jit.dry_run() as dry:
            FW._run(FW.Call(FW.PACKED, True, 0.1, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=mq, max_seqlen_k=2),
                    q, k, v, torch.empty_like(q), torch.empty(4, q.shape[0]))
        assert dry.seen == []


def test_warmup_varlen_window_spec():
    with jit.dry_run() as dry:
        cute_kernels.warmup([("flash_attn", dict(dtype="bfloat16", head_dim=64, varlen=True, window=True, causal=True))])
    (name, cfg), = dry.seen
    assert name == "flash_attn_fwd" and cfg.varlen and cfg.window and not cfg.causal


def test_varlen_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(37, 8, 128, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(50, 2, 128, dtype=torch.bfloat16, device="cuda")
        cq = torch.empty(4, dtype=torch.int32, device="cuda")
        o, lse = flash_attn(q, k, k, cu_seqlens_q=cq, cu_seqlens_k=cq.clone(), max_seqlen_q=20, max_seqlen_k=30,
                            causal=True, window_size=(16, 0), return_lse=True)
        assert o.shape == q.shape and lse.shape == (8, 37) and lse.dtype == torch.float32
        out = torch.empty_like(q)
        r = flash_attn(q, k, k, cu_seqlens_q=cq, cu_seqlens_k=cq.clone(), max_seqlen_q=20, max_seqlen_k=30, out=out)
        assert r is out
        qd = torch.empty(2, 33, 8, 64, dtype=torch.bfloat16, device="cuda")
        kd = torch.empty(2, 40, 2, 64, dtype=torch.bfloat16, device="cuda")
        o2, lse2 = flash_attn(qd, kd, kd, window_size=(5, 5), return_lse=True)
        assert o2.shape == qd.shape and lse2.shape == (2, 8, 33)


# ------------------------------------------------------------------------------------------ CPU: references
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Sq,Sk", [(6, 6), (4, 9), (9, 4), (1, 5)])
def test_window_reference_without_window_is_the_dense_reference(causal, Sq, Sk):
    q, k, v = make_qkv(2, Sq, Sk, 4, 2, 64, dtype=torch.float32, seed=3)
    o, lse = window_reference(q, k, v, causal)
    ro, rlse = attention_reference(q, k, v, causal)
    torch.testing.assert_close(o, ro, atol=1e-6, rtol=1e-6)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(rlse))
    torch.testing.assert_close(lse[torch.isfinite(lse)], rlse[torch.isfinite(rlse)], atol=1e-6, rtol=1e-6)
    o2, _ = window_reference(q, k, v, False, (-1, 0) if causal else (-1, -1))
    torch.testing.assert_close(o2, ro, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("window", [(0, 0), (2, 1), (-1, 3), (4, -1), (0, -1), (20, 20)])
@pytest.mark.parametrize("Sq,Sk", [(6, 6), (4, 9), (9, 4)])
def test_window_reference_brute_force(window, Sq, Sk):
    """Against a loop over (query, key) pairs: visible iff p - left <= j <= p + right."""
    q, k, v = make_qkv(1, Sq, Sk, 2, 1, 64, dtype=torch.float64, seed=4)
    o, lse = window_reference(q, k, v, False, window)
    left, right = window
    for i in range(Sq):
        p = i + Sk - Sq
        keys = [j for j in range(Sk) if (left < 0 or j >= p - left) and (right < 0 or j <= p + right)]
        for h in range(2):
            if not keys:
                assert torch.isneginf(lse[0, h, i]) and (o[0, i, h] == 0).all()
                continue
            s = torch.stack([q[0, i, h].double() @ k[0, j, 0].double() for j in keys]) * 64 ** -0.5
            w = torch.softmax(s, 0)
            ref = sum(w[t] * v[0, j, 0].double() for t, j in enumerate(keys))
            assert torch.allclose(o[0, i, h].double(), ref, atol=1e-5)
            assert abs(lse[0, h, i].item() - torch.logsumexp(s, 0).item()) < 1e-5


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (3, 2)), (True, (5, -1))])
def test_varlen_reference_is_per_sequence_dense(causal, window):
    """Packed sequences (empty ones too, unequal q / k lengths): each sequence's rows equal the dense
    reference on that sequence alone; rows past the last sequence are 0 / -inf."""
    lens_q, lens_k = [3, 0, 1, 7, 5], [4, 2, 0, 7, 9]
    q, k, v, cq, ck = make_packed(lens_q, lens_k, 4, 2, 64, dtype=torch.float32, seed=5, pad_q=3)
    o, lse = varlen_reference(q, k, v, cq, ck, causal, window)
    for b in range(len(lens_q)):
        q0, q1, k0, k1 = int(cq[b]), int(cq[b + 1]), int(ck[b]), int(ck[b + 1])
        ro, rlse = window_reference(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal, window)
        assert torch.equal(o[q0:q1], ro[0]) and torch.equal(lse[:, q0:q1], rlse[0])
        if window == (-1, -1):
            ao, alse = attention_reference(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal)
            torch.testing.assert_close(o[q0:q1], ao[0], atol=1e-6, rtol=1e-6)
    assert (o[-3:] == 0).all() and torch.isneginf(lse[:, -3:]).all()


# ------------------------------------------------------------------------------------------ GPU
def run_varlen_poisoned(q, k, v, cq, ck, mq, mk, causal=False, window=(-1, -1), scale=None):
    """The public function with NaN-poisoned out; LSE through the op with a NaN-poisoned buffer."""
    out = torch.full_like(q, NAN)
    lse = torch.full((q.shape[1], q.shape[0]), NAN, dtype=torch.float32, device=q.device)
    s = q.shape[-1] ** -0.5 if scale is None else scale
    c, w = FW.check_window(window, causal)
    wl, wr = w if w is not None else (-1, -1)
    torch.ops.cute_kernels.flash_attn_(q, k, v, out, lse, c, s, wl, wr, cq, ck, mq, mk)
    return out, lse


def check_varlen(o, lse, q, k, v, cq, ck, causal, window, what="", dense_bitwise=True):
    """Per sequence: the dense criteria of :func:`check_window_result` on its rows, and (when
    ``dense_bitwise``) the same bits as the dense kernel on that sequence alone; rows outside every
    sequence still NaN (never written)."""
    cql, ckl = cq.tolist(), ck.tolist()
    written = torch.zeros(q.shape[0], dtype=torch.bool, device=q.device)
    for b in range(len(cql) - 1):
        q0, q1, k0, k1 = cql[b], cql[b + 1], ckl[b], ckl[b + 1]
        written[q0:q1] = True
        if q1 == q0:
            continue
        qs, ks, vs = q[None, q0:q1], k[None, k0:k1], v[None, k0:k1]
        ob, lb = o[None, q0:q1], lse[None, :, q0:q1]
        check_window_result(ob, lb, qs, ks, vs, causal, window, what=f"{what} seq {b} ({q1 - q0}x{k1 - k0})")
        if dense_bitwise and k1 > k0:
            do, dl = flash_attn(qs, ks, vs, causal=causal, window_size=window, return_lse=True)
            assert torch.equal(do, ob), f"{what} seq {b}: O differs from the dense kernel on the sequence alone"
            assert torch.equal(dl, lb), f"{what} seq {b}: LSE differs from the dense kernel on the sequence alone"
    assert torch.isnan(o[~written]).all(), f"{what}: rows outside every sequence were written"
    assert torch.isnan(lse[:, ~written]).all(), f"{what}: LSE of rows outside every sequence was written"


VARLEN_LENGTHS = [  # (lengths q, lengths k)
    ([1], [1]),
    ([0, 5, 0], [3, 0, 7]),
    ([1, 127, 128, 129, 2, 3], [1, 127, 128, 129, 300, 3]),
    ([17, 191, 192, 193, 0, 1], [400, 17, 257, 193, 5, 1]),
    ([1013, 509, 2, 257], [1013, 1021, 64, 31]),
    ([2048, 1, 4097], [2048, 4097, 1]),
    # 70 sequences: three 32-sequence steps of the tile lookup, empty ones at and across step edges
    ([(i * 37) % 300 if i % 31 else 0 for i in range(70)], [(i * 53) % 400 + (i % 3) for i in range(70)]),
]


@gpu
@pytest.mark.parametrize("D", FW.HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens", VARLEN_LENGTHS, ids=lambda c: f"{len(c[0])}seq-{max(c[0])}")
def test_gpu_varlen_numerics(lens, causal, D):
    lens_q, lens_k = lens
    dtype = torch.bfloat16 if D in (64, 128) else torch.float16
    q, k, v, cq, ck = make_packed(lens_q, lens_k, 8, 2, D, dtype, "cuda", seed=sum(lens_q) + D, pad_q=5, pad_k=3)
    mq, mk = max(lens_q), max(lens_k)
    o, lse = run_varlen_poisoned(q, k, v, cq, ck, mq, mk, causal)
    check_varlen(o, lse, q, k, v, cq, ck, causal, (-1, -1), what=f"varlen D={D} causal={causal}")


@gpu
def test_gpu_varlen_max_seqlen_larger_than_needed_and_out():
    """A max_seqlen above every length (extra tiles exit), out= written in place, GQA 4."""
    q, k, v, cq, ck = make_packed([300, 7, 129], [65, 1000, 129], 8, 2, 128, device="cuda", seed=3)
    out = torch.full_like(q, NAN)
    r, lse = flash_attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=1000, max_seqlen_k=2000, causal=True,
                        out=out, return_lse=True)
    assert r is out and lse.shape == (8, q.shape[0])
    o2, lse2 = run_varlen_poisoned(q, k, v, cq, ck, 300, 1000, True)
    assert torch.equal(o2, out) and torch.equal(lse2, lse)


WINDOW_CASES = [(0, 0), (0, -1), (-1, 0), (1, 1), (3, 0), (63, 64), (127, 0), (128, 128), (200, 5), (5, 200),
                (1000, -1), (-1, 1000), (5000, 5000)]


@gpu
@pytest.mark.parametrize("D", FW.HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", WINDOW_CASES, ids=lambda w: f"w{w[0]}_{w[1]}")
def test_gpu_dense_window(window, causal, D):
    if causal and window[1] > 0:
        pytest.skip("causal takes right = 0")
    for (Sq, Sk) in ((333, 777), (777, 333), (1000, 1000)):
        q, k, v = make_qkv(2, Sq, Sk, 4, 2, D, torch.bfloat16, device="cuda", seed=Sq + D)
        out = torch.full_like(q, NAN)
        o, lse = flash_attn(q, k, v, causal=causal, window_size=window, out=out, return_lse=True)
        check_window_result(o, lse, q, k, v, causal, window, what=f"window {window} causal={causal} {Sq}x{Sk}")


@gpu
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(0, 0), (1, 0), (17, 3), (128, 0), (100, 300), (2000, 2000), (-1, 50)],
                         ids=lambda w: f"w{w[0]}_{w[1]}")
def test_gpu_varlen_window(window, causal, D):
    if causal and window[1] > 0:
        pytest.skip("causal takes right = 0")
    lens_q, lens_k = [1, 0, 300, 129, 1000, 17], [5, 3, 300, 700, 1000, 0]
    q, k, v, cq, ck = make_packed(lens_q, lens_k, 4, 1, D, torch.float16, "cuda", seed=D, pad_q=7)
    o, lse = run_varlen_poisoned(q, k, v, cq, ck, max(lens_q), max(lens_k), causal, window)
    check_varlen(o, lse, q, k, v, cq, ck, causal, window, what=f"varlen window {window} causal={causal} D={D}")


@gpu
def test_gpu_varlen_zero_keys_everywhere():
    """total_k == 0 (every key length 0): O = 0 and LSE = -inf on the sequences' rows only."""
    q, k, v, cq, ck = make_packed([3, 0, 200], [0, 0, 0], 4, 2, 128, device="cuda", pad_q=2)
    o, lse = run_varlen_poisoned(q, k, v, cq, ck, 200, 0)
    assert (o[:203] == 0).all() and torch.isneginf(lse[:, :203]).all()
    assert torch.isnan(o[203:]).all() and torch.isnan(lse[:, 203:]).all()


@gpu
def test_gpu_varlen_long_sequence_is_clamped_not_oob():
    """Unchecked: a sequence longer than max_seqlen is cut to max_seqlen (its first max_seqlen_q rows
    computed against its first max_seqlen_k keys), nothing outside the tensors touched; checked mode
    raises, naming the sequence."""
    q, k, v, cq, ck = make_packed([10, 400], [10, 400], 4, 2, 64, device="cuda", seed=9)
    o, lse = run_varlen_poisoned(q, k, v, cq, ck, 256, 256)
    assert torch.isfinite(o[:10 + 256]).all() and torch.isnan(o[10 + 256:]).all()
    ref, ref_lse = window_reference(q[None, 10:266], k[None, 10:266], v[None, 10:266])
    assert (o[10:266].float() - ref[0]).abs().max() < 2e-2
    bad = cq.clone()
    bad[-1] = 10 ** 6  # past the tensor: clamped to total
    o2, _ = run_varlen_poisoned(q, k, v, bad, ck, 256, 256)
    assert torch.isfinite(o2[:266]).all()
    with pytest.raises(ValueError, match=r"sequence 1 has 400 queries > max_seqlen_q = 256"):
        flash_attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=256, max_seqlen_k=400, checked=True)


@gpu
def test_gpu_varlen_checked_env(monkeypatch):
    q, k, v, cq, ck = make_packed([10, 40], [10, 40], 4, 2, 64, device="cuda")
    monkeypatch.setenv("CUTE_KERNELS_CHECKED", "1")
    with count_launches() as n:
        with pytest.raises(ValueError, match="max_seqlen_k = 39"):
            flash_attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=40, max_seqlen_k=39)
    assert n.total() == 0
    flash_attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=40, max_seqlen_k=40)


@gpu
def test_gpu_varlen_cuda_graph_replays_shorter_lengths():
    """Capture with max_seqlen 700 / 900 and one set of lengths; replay with other (shorter, empty)
    lengths written into the same cu_seqlens buffers: every replay equals an eager call."""
    from conftest import capture_graph

    Hq, Hkv, D = 8, 2, 128
    tq, tk = 1500, 2000
    q = torch.randn(tq, Hq, D, device="cuda").bfloat16()
    k = torch.randn(tk, Hkv, D, device="cuda").bfloat16()
    v = torch.randn(tk, Hkv, D, device="cuda").bfloat16()
    cq = cu_seqlens([700, 500, 300], "cuda")
    ck = cu_seqlens([900, 800, 300], "cuda")
    out = torch.empty_like(q)
    res = {}

    def step():
        res["o"], res["lse"] = flash_attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=700, max_seqlen_k=900,
                                          causal=True, window_size=(256, 0), out=out, return_lse=True)

    g = capture_graph(step)
    for lq, lk in (([1, 0, 699], [900, 5, 1]), ([128, 129, 127], [128, 129, 900]), ([700, 500, 300], [900, 800, 300])):
        cq.copy_(cu_seqlens(lq, "cuda"))
        ck.copy_(cu_seqlens(lk, "cuda"))
        out.fill_(NAN)
        g.replay()
        torch.cuda.synchronize()
        eo, el = flash_attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=700, max_seqlen_k=900, causal=True,
                            window_size=(256, 0), return_lse=True)
        n = sum(lq)
        assert torch.equal(out[:n], eo[:n]) and torch.equal(res["lse"][:, :n], el[:, :n]), (lq, lk)
        ref, ref_lse = varlen_reference(q, k, v, cq, ck, True, (256, 0))
        assert (out[:n].float() - ref[:n]).abs().max() < 3e-2


@gpu
def test_gpu_varlen_torch_compile():
    q, k, v, cq, ck = make_packed([300, 1, 77], [500, 20, 77], 8, 1, 64, device="cuda", seed=13)

    def f(q, k, v, cq, ck):
        o, lse = flash_attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=300, max_seqlen_k=500,
                            causal=True, return_lse=True)
        return o.float() * 2, lse + 1

    torch._dynamo.reset()
    o, lse = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, cq, ck)
    eo, el = flash_attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=300, max_seqlen_k=500, causal=True,
                        return_lse=True)
    assert torch.equal(o, eo.float() * 2) and torch.equal(lse, el + 1)
    torch._dynamo.reset()


def test_math_helpers():
    assert math.isclose(window_mask(3, 5, True).float().sum().item(), 3 + 4 + 5)
