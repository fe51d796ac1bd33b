"""Softcapping, attention sinks and FlashAttention-4's window sides in ``flash_attn`` and ``decode_attn``.

Semantics (FlashAttention's): with ``softcap > 0`` the scaled scores become ``softcap * tanh(s /
softcap)`` before the mask; ``learnable_sink`` (Hq,) float32 adds ``exp(sink_h)`` to every row's softmax
denominator (the sink is not scaled) and to its LSE, ``LSE = log(sum_j exp(s_j) + exp(sink_h))``, a row
without keys giving O = 0 and LSE = sink_h; window sides are ints or None (unbounded), negative sides
moving the window's end before the diagonal or its start after it, -1 unbounded as in
FlashAttention-2/3.

CPU: an independent float64 reference (written here) against plain softmax, against a sink seen as an
extra key of value 0, and against the kernels' algebra emulated in float64 (softcap folded into
``tanh(s * scale / softcap)`` with ``softcap * log2(e)`` as the softmax scale, the online softmax tile
by tile, the sink added once at the end, split-KV partial states with the sink in split 0 merged by the
package's merge); ``decode_attn``'s CPU path (its reference) against it; every new argument's errors,
named, before any launch; the window rule and the KV-tile walk with negative sides against brute
force; the host fast path (stubbed kernels: arguments in the kernels' order, a launcher per metadata
and softcap value, never a sink's values); plans and custom-op schemas; autograd's refusal.
GPU (``-m gpu``): the kernels on fresh random data against the float64 reference, elementwise (every
element within 2x the error of the same math done in the input dtype, per (batch, head)) and per row
(LSE, rows without keys), with ragged lengths (1, primes, off-tile sizes), GQA, causal and windows
(negative sides too), packed and paged K/V, and decode with 1 and several splits; a launcher hit with
new sink values, a sink of -inf as no sink; torch.compile(fullgraph=True) and CUDA-graph replay.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels
from cute_kernels.attention import decode as DE
from cute_kernels.attention import forward as FW
from cute_kernels.attention import forward_host as FH
from cute_kernels.attention import forward_softmax as fs
from cute_kernels.attention import forward_validate as FV
from cute_kernels.attention.merge import merge_states_torch
from cute_kernels.common import jit
from cute_kernels.common.softmax import LOG2_E
from cute_kernels.testing import count_launches
from _check import assert_raises_before_any_launch
from conftest import Stub

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
BF = torch.bfloat16
NAN = float("nan")
INF = float("inf")


# ------------------------------------------------------------------------------------------ reference
def visible(Sq, Sk, causal=False, window=(None, None), device="cpu"):
    """(Sq, Sk) bool, True = visible: query i at p = i + Sk - Sq sees key j iff p - left <= j <= p + right,
    a side of None or -1 unbounded (other negative sides: FlashAttention-4's), causal a right side of 0."""
    left, right = (None if w is None or w == -1 else w for w in window)
    if causal:
        right = 0
    i = torch.arange(Sq, device=device)[:, None]
    j = torch.arange(Sk, device=device)[None, :]
    p = i + (Sk - Sq)
    vis = torch.ones(Sq, Sk, dtype=torch.bool, device=device)
    if left is not None:
        vis &= j >= p - left
    if right is not None:
        vis &= j <= p + right
    return vis


def reference(q, k, v, causal=False, window=(None, None), scale=None, softcap=0.0, sink=None):
    """float64 attention of dense (B, Sq, Hq, D) q against (B, Sk, Hkv, D) k / v: ``(o (B, Sq, Hq, D), lse
    (B, Hq, Sq), smax)`` with ``smax`` the largest |score| after softcapping (the tolerance of tanh's
    approximation).  GQA by repeating K/V heads; a row without a visible key gets o = 0 and lse = -inf,
    or lse = its sink."""
    B, Sq, Hq, D = q.shape
    Sk, G = k.shape[1], Hq // k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    qd = q.double().permute(0, 2, 1, 3)  # (B, Hq, Sq, D)
    kd = k.double().permute(0, 2, 1, 3).repeat_interleave(G, 1)
    vd = v.double().permute(0, 2, 1, 3).repeat_interleave(G, 1)
    s = qd @ kd.transpose(-1, -2) * scale  # (B, Hq, Sq, Sk)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    smax = s.abs().max().item() if s.numel() else 0.0
    s = s.masked_fill(~visible(Sq, Sk, causal, window, q.device), -INF)
    if sink is not None:  # one more logit per row, of value 0
        col = sink.double().to(q.device)[None, :, None, None].expand(B, Hq, Sq, 1)
        s = torch.cat([s, col], -1)
        vd = torch.cat([vd, vd.new_zeros(B, Hq, 1, D)], 2)
    lse = torch.logsumexp(s, -1)  # -inf for an empty row
    p = torch.exp(s - torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)[..., None])
    o = (p @ vd).permute(0, 2, 1, 3)
    return o, lse, smax


def packed_reference(q, k, v, cu_q, cu_k, **kw):
    """Packed q (total_q, Hq, D), k / v (total_k, Hkv, D): each sequence by :func:`reference`; o (total_q,
    Hq, D), lse (Hq, total_q); rows outside every sequence 0 / -inf."""
    o = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), -INF, dtype=torch.float64, device=q.device)
    smax = 0.0
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        ob, lb, sm = reference(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]], **kw)
        o[cq[b]:cq[b + 1]], lse[:, cq[b]:cq[b + 1]], smax = ob[0], lb[0], max(smax, sm)
    return o, lse, smax


def sixteen_bit(q, k, v, causal=False, window=(None, None), scale=None, softcap=0.0, sink=None):
    """The same attention computed in the inputs' 16-bit dtype (scores, softcapped scores and
    probabilities rounded to it, P V in it): the error scale of a 16-bit implementation, the bound
    the kernels are held to (2x, per (batch, head)).  Returns (B, Sq, Hq, D) in q's dtype."""
    B, Sq, Hq, D = q.shape
    Sk, G, dt = k.shape[1], Hq // k.shape[2], q.dtype
    scale = D ** -0.5 if scale is None else scale
    qt = q.transpose(1, 2)
    kt = k.transpose(1, 2).repeat_interleave(G, 1)
    vt = v.transpose(1, 2).repeat_interleave(G, 1)
    s = ((qt @ kt.transpose(-1, -2)) * scale).to(dt)
    if softcap:
        s = (softcap * torch.tanh(s.float() / softcap)).to(dt)
    s = s.float().masked_fill(~visible(Sq, Sk, causal, window, q.device), -INF)
    if sink is not None:
        s = torch.cat([s, sink.to(dt).float()[None, :, None, None].expand(B, Hq, Sq, 1)], -1)
    p = torch.softmax(s, -1).nan_to_num(0.0).to(dt)[..., :Sk]
    return (p @ vt).transpose(1, 2)


# ------------------------------------------------------------------------------------------ CPU: semantics
def _qkv(B, Sq, Sk, Hq, Hkv, D, dtype=torch.float64, seed=0, q_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, Sq, Hq, D, generator=g) * q_scale).to(dtype)
    k = torch.randn(B, Sk, Hkv, D, generator=g).to(dtype)
    v = torch.randn(B, Sk, Hkv, D, generator=g).to(dtype)
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
def test_reference_without_variants_is_softmax_attention(causal):
    q, k, v = _qkv(2, 9, 13, 4, 2, 16)
    o, lse, _ = reference(q, k, v, causal)
    mask = visible(9, 13, causal)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(2, 2)) * 16 ** -0.5
    s = s.masked_fill(~mask, -INF)
    want = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v.repeat_interleave(2, 2))
    assert torch.allclose(o, want, atol=1e-12) and torch.allclose(lse, torch.logsumexp(s, -1), atol=1e-12)


def test_reference_sink_is_a_key_of_value_zero():
    """A sink is one more logit per row whose value vector is 0: O shrinks by l / (l + e^sink), the LSE
    is the log of the larger denominator, and a row that sees no key has O = 0 and LSE = sink."""
    q, k, v = _qkv(1, 6, 5, 2, 1, 8)
    sink = torch.tensor([0.7, -1.3], dtype=torch.float64)
    o0, l0, _ = reference(q, k, v, causal=True)
    o1, l1, _ = reference(q, k, v, causal=True, sink=sink)
    live = torch.isfinite(l0)  # (1, 2, 6): Sq > Sk, causal: the first row sees no key
    assert not live[..., 0].any() and live[..., 1:].all()
    want_lse = torch.logaddexp(l0, sink[None, :, None].expand_as(l0))
    assert torch.allclose(l1, want_lse, atol=1e-12)
    shrink = torch.exp(l0 - l1).permute(0, 2, 1)[..., None]  # (1, Sq, H, 1): l / (l + e^sink)
    assert torch.allclose(o1[:, 1:], (o0 * shrink)[:, 1:], atol=1e-12)
    assert (o1[:, 0] == 0).all() and torch.equal(l1[..., 0], sink[None])


def emulate_kernel(q, k, v, causal, scale, softcap, sink, tile_n=4, splits=1):
    """One (batch, head) of dense attention as the kernels compute it, in float64: scores
    ``tanh(s * (scale / softcap))`` with ``softcap * log2(e)`` as the softmax's base-2 scale (or ``s``
    with ``scale * log2(e)``), an online softmax over KV tiles of ``tile_n`` keys (masked scores
    -inf, max 0 for an empty row), then per split the sink (split 0 only) added to the denominator
    with the max taken over it (:func:`~cute_kernels.common.softmax.finalize_with_sink`), and the
    splits' normalized states merged by the package's merge math (``merge_states_torch``).  q (Sq, D),
    k / v (Sk, D); returns (o (Sq, D), lse (Sq,))."""
    Sq, D = q.shape
    Sk = k.shape[0]
    scale_log2 = (softcap if softcap else scale) * LOG2_E
    mask = visible(Sq, Sk, causal)
    tiles = max(1, -(-Sk // tile_n))
    per = -(-tiles // splits)
    outs, lses = [], []
    for sp in range(splits):
        m = torch.full((Sq,), -INF, dtype=torch.float64)
        l = torch.zeros(Sq, dtype=torch.float64)
        acc = torch.zeros(Sq, D, dtype=torch.float64)
        for t in range(sp * per, min((sp + 1) * per, tiles)):
            cols = slice(t * tile_n, min((t + 1) * tile_n, Sk))
            s = q @ k[cols].T
            s = torch.tanh(s * (scale / softcap)) if softcap else s
            s = s.masked_fill(~mask[:, cols], -INF)
            m_new = torch.maximum(m, s.amax(1)) if s.shape[1] else m
            m_s = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new * scale_log2)
            p = torch.exp2(s * scale_log2 - m_s[:, None])
            corr = torch.exp2(m * scale_log2 - m_s)
            l, acc, m = l * corr + p.sum(1), acc * corr[:, None] + p @ v[cols], m_new
        # the epilogue: finalize_with_sink's arithmetic, sink_log2 = -inf for splits > 0
        sink_log2 = torch.full((Sq,), -INF if sink is None or sp > 0 else sink * LOG2_E, dtype=torch.float64)
        m_s = m * scale_log2
        m_top = torch.maximum(m_s, sink_log2)
        m_top = torch.where(torch.isneginf(m_top), torch.zeros_like(m_top), m_top)
        corr = torch.exp2(m_s - m_top)
        l_all = l * corr + torch.exp2(sink_log2 - m_top)
        inv = torch.where(l_all > 0, 1.0 / l_all, torch.zeros_like(l_all))
        lse = torch.where(l_all > 0, (m_top + torch.log2(l_all)) * math.log(2.0), torch.full_like(l_all, -INF))
        outs.append(acc * (inv * corr)[:, None])
        lses.append(lse)
    o, lse = merge_states_torch(torch.stack(outs), torch.stack(lses).float())
    return o.double(), lse.double()


@pytest.mark.parametrize("softcap", [0.0, 0.8, 30.0])
@pytest.mark.parametrize("sink", [None, -2.0, 0.5, 40.0])
@pytest.mark.parametrize("splits", [1, 3])
def test_kernel_algebra_matches_the_reference(softcap, sink, splits):
    """The folded softcap, the online softmax and the sink added once (split 0 of a split-KV merge)
    give the reference, also for a sink far above every score (the max is taken with it, so the sum
    cannot overflow) and for rows without keys (causal, Sq > Sk: O = 0, LSE = sink)."""
    q, k, v = _qkv(1, 7, 5, 1, 1, 8, q_scale=3.0)
    sink_t = None if sink is None else torch.tensor([sink], dtype=torch.float64)
    o_ref, lse_ref, _ = reference(q, k, v, causal=True, scale=0.4, softcap=softcap, sink=sink_t)
    o, lse = emulate_kernel(q[0, :, 0], k[0, :, 0], v[0, :, 0], True, 0.4, softcap, sink, tile_n=2, splits=splits)
    assert torch.allclose(o, o_ref[0, :, 0], atol=1e-6), (o, o_ref[0, :, 0])
    live = torch.isfinite(lse_ref[0, 0])
    assert torch.allclose(lse[live], lse_ref[0, 0][live], atol=1e-5)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref[0, 0]))


def test_a_sink_in_every_split_would_count_it_several_times():
    """The reason a split decode adds the sink in split 0 only: the merge adds the splits' sums."""
    q, k, v = _qkv(1, 3, 12, 1, 1, 8)
    o_ref, lse_ref, _ = reference(q, k, v, sink=torch.tensor([1.0], dtype=torch.float64))
    o3, lse3 = emulate_kernel(q[0, :, 0], k[0, :, 0], v[0, :, 0], False, 8 ** -0.5, 0.0, 1.0, splits=3)
    assert torch.allclose(lse3, lse_ref[0, 0], atol=1e-5)
    # the same splits, each with the sink: the denominator has it three times
    parts = [reference(q[:, :, :, :], k[:, i * 4:(i + 1) * 4], v[:, i * 4:(i + 1) * 4],
                       sink=torch.tensor([1.0], dtype=torch.float64)) for i in range(3)]
    _, lse_bad = merge_states_torch(torch.stack([p[0][0, :, 0] for p in parts]),
                                    torch.stack([p[1][0, 0] for p in parts]).float())
    assert (lse_bad.double() - lse_ref[0, 0]).abs().min() > 1e-3


# ------------------------------------------------------------------------------------------ CPU: decode path
def _decode_inputs(B, Sq, Hq, Hkv, D, L, lens, paged=False, page=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, Hq, D, generator=g).to(BF)
    k = torch.randn(B, L, Hkv, D, generator=g).to(BF)
    v = torch.randn(B, L, Hkv, D, generator=g).to(BF)
    s = torch.tensor(lens, dtype=torch.int32)
    if not paged:
        return q, k, v, s, None, k, v
    per = -(-L // page)
    perm = torch.randperm(B * per, generator=g)
    kp = torch.zeros(B * per, page, Hkv, D, dtype=BF)
    vp = torch.zeros(B * per, page, Hkv, D, dtype=BF)
    bt = perm.view(B, per).to(torch.int32)
    kpad = torch.zeros(B, per * page, Hkv, D, dtype=BF)
    vpad = torch.zeros(B, per * page, Hkv, D, dtype=BF)
    kpad[:, :L], vpad[:, :L] = k, v
    for b in range(B):
        kp[bt[b].long()] = kpad[b].view(per, page, Hkv, D)
        vp[bt[b].long()] = vpad[b].view(per, page, Hkv, D)
    return q, kp, vp, s, bt, k, v


def decode_reference(q, k, v, lens, causal, softcap=0.0, sink=None, scale=None):
    """float64, per sequence: the new tokens are the last Sq positions of each sequence (bottom-right)."""
    B, Sq, Hq, D = q.shape
    o = torch.zeros(B, Sq, Hq, D, dtype=torch.float64)
    lse = torch.full((B, Hq, Sq), -INF, dtype=torch.float64)
    for b, L in enumerate(lens):
        ob, lb, _ = reference(q[b:b + 1], k[b:b + 1, :L], v[b:b + 1, :L], causal, scale=scale, softcap=softcap,
                              sink=sink)
        o[b], lse[b] = ob[0], lb[0]
    return o, lse


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("causal,Sq", [(True, 1), (True, 5), (False, 3)])
def test_decode_cpu_path_with_variants(paged, causal, Sq):
    """decode_attn on CPU tensors (its torch reference, the fallback path) honours softcap and sinks:
    lengths 0, 1, a prime and the capacity, GQA 4; a length-0 sequence gives O = 0, LSE = sink."""
    Hq, Hkv, D, L = 8, 2, 64, 37
    lens = [0, 1, 23, L]
    q, kc, vc, s, bt, k, v = _decode_inputs(4, Sq, Hq, Hkv, D, L, lens, paged=paged)
    sink = torch.linspace(-1.0, 2.5, Hq)
    for softcap in (0.0, 1.5):
        o, lse = cute_kernels.decode_attn(q, kc, vc, cache_seqlens=s, block_table=bt, causal=causal, softcap=softcap,
                                          learnable_sink=sink, return_lse=True)
        ro, rl = decode_reference(q, k, v, lens, causal, softcap, sink)
        assert torch.allclose(o.double(), ro, atol=2e-2, rtol=2e-2), (o.double() - ro).abs().max()
        assert torch.allclose(lse.double(), rl, atol=1e-4)
        assert (o[0] == 0).all() and torch.allclose(lse[0], sink[:, None].expand(Hq, Sq))
    o, lse = cute_kernels.decode_attn(q, kc, vc, cache_seqlens=s, block_table=bt, causal=causal, softcap=2.0,
                                      return_lse=True)
    ro, rl = decode_reference(q, k, v, lens, causal, 2.0)
    assert torch.allclose(o.double(), ro, atol=2e-2, rtol=2e-2) and torch.isneginf(lse[0]).all()
    assert torch.allclose(lse[1:].double(), rl[1:], atol=1e-4)


def test_decode_reference_function_takes_the_variants():
    q, kc, vc, s, bt, k, v = _decode_inputs(2, 2, 4, 1, 64, 20, [20, 7])
    sink = torch.tensor([0.0, 1.0, -1.0, 3.0])
    o, lse = DE.decode_attn_reference(q, kc, vc, s, None, True, 0.3, softcap=4.0, learnable_sink=sink)
    ro, rl = decode_reference(q, k, v, [20, 7], True, 4.0, sink, scale=0.3)
    assert torch.allclose(o.double(), ro, atol=1e-4) and torch.allclose(lse.double(), rl, atol=1e-4)


# ------------------------------------------------------------------------------------------ CPU: validation
def _q(*shape, device="cpu"):
    return torch.zeros(*shape, dtype=BF, device=device)


def _dense(**over):
    kw = dict(q=_q(2, 5, 8, 64), k=_q(2, 7, 2, 64), v=_q(2, 7, 2, 64))
    kw.update(over)
    return kw


def _call(kw):
    kw = dict(kw)
    return cute_kernels.flash_attn(kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)


BAD_FLASH = [  # CPU tensors: the device check comes last, so every other error is reached first
    ("softcap-negative", dict(softcap=-1.0), ValueError, "softcap must be a finite number >= 0"),
    ("softcap-nan", dict(softcap=NAN), ValueError, "softcap must be a finite number >= 0"),
    ("softcap-inf", dict(softcap=INF), ValueError, "softcap must be a finite number >= 0"),
    ("softcap-huge-int", dict(softcap=10 ** 400), ValueError, "softcap must be a finite number"),
    ("softcap-bool", dict(softcap=True), TypeError, "softcap must be a real number"),
    ("softcap-string", dict(softcap="30"), TypeError, "softcap must be a real number"),
    ("softcap-complex", dict(softcap=1j), TypeError, "softcap must be a real number"),
    ("softcap-tensor", dict(softcap=torch.tensor(30.0)), TypeError, "softcap must be a Python number"),
    ("softcap-tiny", dict(softcap=1e-45), ValueError, "softcap=1e-45 is too small for softmax_scale"),
    ("sink-list", dict(learnable_sink=[0.0] * 8), TypeError, "learnable_sink must be a torch.Tensor"),
    ("sink-shape", dict(learnable_sink=torch.zeros(2)), ValueError, r"learnable_sink must be \(8,\)"),
    ("sink-2d", dict(learnable_sink=torch.zeros(1, 8)), ValueError, r"learnable_sink must be \(8,\)"),
    ("sink-bf16", dict(learnable_sink=torch.zeros(8, dtype=BF)), TypeError, "learnable_sink must be float32"),
    ("sink-fp64", dict(learnable_sink=torch.zeros(8, dtype=torch.float64)), TypeError, "learnable_sink must be float32"),
    ("out-over-sink", "out-over-sink", ValueError, "out overlaps learnable_sink"),
    ("window-empty", dict(window_size=(3, -5)), ValueError, r"window_size \(3, -5\) is empty"),
    ("window-causal-negative", dict(window_size=(8, -2), causal=True), ValueError, "right must be 0 or -1 with causal"),
    ("window-below-limit", dict(window_size=(None, -(2 ** 30) - 1)), ValueError, "window_size right must be at least"),
    ("window-float", dict(window_size=(None, 2.0)), TypeError, "window_size right must be an int or None"),
    ("valid-then-device", dict(softcap=30, learnable_sink=torch.zeros(8), window_size=(4, -2)), ValueError,
     "q is on cpu"),
]


@pytest.mark.parametrize("over,exc,match", [c[1:] for c in BAD_FLASH], ids=[c[0] for c in BAD_FLASH])
def test_flash_attn_bad_variant_arguments(over, exc, match):
    if over == "out-over-sink":  # an out whose bytes are the sink's
        buf = torch.zeros(2 * 5 * 8 * 64 // 2, dtype=torch.float32)
        over = dict(learnable_sink=buf[:8], out=buf.view(BF).view(2, 5, 8, 64))
    for mode in ("dense", "packed", "paged"):
        kw = _dense(**over)
        if mode == "packed":
            kw = dict(kw, q=kw["q"].flatten(0, 1), k=kw["k"].flatten(0, 1), v=kw["v"].flatten(0, 1),
                      cu_seqlens_q=torch.tensor([0, 2, 10], dtype=torch.int32),
                      cu_seqlens_k=torch.tensor([0, 6, 14], dtype=torch.int32), max_seqlen_q=8, max_seqlen_k=8)
            if "out" in kw:
                kw["out"] = kw["out"].flatten(0, 1)
        elif mode == "paged":
            kw = dict(kw, k=_q(4, 16, 2, 64), v=_q(4, 16, 2, 64), block_table=torch.zeros(2, 2, dtype=torch.int32),
                      seqused_k=torch.zeros(2, dtype=torch.int32))
        q, k, v = kw.pop("q"), kw.pop("k"), kw.pop("v")
        assert_raises_before_any_launch(exc, match, cute_kernels.flash_attn, q, k, v, **kw)


def test_sink_on_another_device_is_named():
    """Fake CUDA tensors pass the device check; a sink on the CPU is named."""
    with FakeTensorMode():
        q, k = torch.empty(1, 4, 4, 64, dtype=BF, device="cuda"), torch.empty(1, 9, 2, 64, dtype=BF, device="cuda")
        sink = torch.empty(4, device="cpu")
        with pytest.raises(ValueError, match="learnable_sink is on cpu"):
            cute_kernels.flash_attn(q, k, k, learnable_sink=sink)


BAD_DECODE = [
    ("softcap-negative", dict(softcap=-3.0), ValueError, "decode_attn: softcap must be a finite number >= 0"),
    ("softcap-string", dict(softcap="3"), TypeError, "decode_attn: softcap must be a real number"),
    ("softcap-tensor", dict(softcap=torch.tensor(3.0)), TypeError, "decode_attn: softcap must be a Python number"),
    ("sink-shape", dict(learnable_sink=torch.zeros(3)), ValueError, r"decode_attn: learnable_sink must be \(8,\)"),
    ("sink-dtype", dict(learnable_sink=torch.zeros(8, dtype=torch.float16)), TypeError,
     "decode_attn: learnable_sink must be float32"),
    ("sink-type", dict(learnable_sink=3.0), TypeError, "decode_attn: learnable_sink must be a torch.Tensor"),
    ("sink-device", dict(learnable_sink=torch.zeros(8, device="meta")), ValueError,
     "decode_attn: learnable_sink is on meta, q on cpu"),
]


@pytest.mark.parametrize("over,exc,match", [c[1:] for c in BAD_DECODE], ids=[c[0] for c in BAD_DECODE])
def test_decode_attn_bad_variant_arguments(over, exc, match):
    q, kc, vc, s, _, _, _ = _decode_inputs(2, 1, 8, 2, 64, 16, [16, 3])
    assert_raises_before_any_launch(exc, match, cute_kernels.decode_attn, q, kc, vc, cache_seqlens=s, **over)


@pytest.fixture
def meta_ok(monkeypatch):
    """Meta tensors pass flash_attn's device check (the ops' fake implementations run)."""
    monkeypatch.setattr(FV, "_check_devices", lambda named: None)


def test_fake_tensors_and_op_schemas():
    """The custom ops take the new arguments (so torch.compile traces them); fake calls of every mode
    give the shapes and launch nothing."""
    for op in (torch.ops.cute_kernels.flash_attn, torch.ops.cute_kernels.flash_attn_,
               torch.ops.cute_kernels.decode_attn, torch.ops.cute_kernels.decode_attn_):
        names = [a.name for a in op.default._schema.arguments]
        tail = (["window_left", "window_right", "cache_leftpad"] if "decode" in str(op)  # (the later arguments)
                else ["deterministic"] if str(op).endswith("flash_attn") else [])
        assert names[-2 - len(tail):] == ["softcap", "learnable_sink"] + tail, names
    with FakeTensorMode(), count_launches() as n:
        q, k = torch.empty(2, 33, 8, 64, dtype=BF, device="cuda"), torch.empty(2, 70, 2, 64, dtype=BF, device="cuda")
        sink = torch.empty(8, device="cuda")
        o, lse = cute_kernels.flash_attn(q, k, k, softcap=50.0, learnable_sink=sink, window_size=(None, -3),
                                         return_lse=True)
        assert o.shape == q.shape and lse.shape == (2, 8, 33)
        out = torch.empty_like(q)
        assert cute_kernels.flash_attn(q, k, k, out=out, learnable_sink=sink) is out
        qp, kp = torch.empty(40, 8, 64, dtype=BF, device="cuda"), torch.empty(60, 2, 64, dtype=BF, device="cuda")
        cu = torch.empty(3, dtype=torch.int32, device="cuda")
        o, lse = cute_kernels.flash_attn(qp, kp, kp, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=30, max_seqlen_k=40,
                                         softcap=5.0, return_lse=True)
        assert o.shape == qp.shape and lse.shape == (8, 40)
    assert n.total() == 0


# ------------------------------------------------------------------------------------------ CPU: windows
@pytest.mark.parametrize("window,causal,want", [
    ((None, None), False, (False, None)),
    ((None, 0), False, (True, None)),
    ((-1, None), True, (True, None)),
    ((None, None), True, (True, None)),
    ((5, -3), False, (False, (5, -3))),
    ((-3, 5), False, (False, (-3, 5))),
    ((-1, -4), False, (False, (-1, -4))),
    ((-4, None), False, (False, (-4, -1))),
    ((4, None), True, (False, (4, 0))),
    ((0, 0), False, (False, (0, 0))),
    ((2, -2), False, (False, (2, -2))),
])
def test_check_window_takes_flashattention4_sides(window, causal, want):
    assert FV.check_window(window, causal, negative=True) == want


def test_backward_windows_keep_their_rule():
    """check_window without ``negative`` (the backward's) still refuses sides below -1."""
    with pytest.raises(ValueError, match="window_size left must be >= -1"):
        FV.check_window((-3, 5), False)
    assert FV.check_window((None, 4), False) == (False, (-1, 4))


NEG_WINDOWS = [(5, -3), (-3, 5), (-1, -4), (-4, -1), (0, -1), (-1, 0), (9, -9), (-2, 2), (20, -1), (-1, 20)]


@pytest.mark.parametrize("window", NEG_WINDOWS, ids=[f"w{l}_{r}" for l, r in NEG_WINDOWS])
def test_kv_tile_range_with_negative_sides_brute_force(window):
    """The kernel's KV-tile walk (kv_tile_range_window) with FlashAttention-4's negative sides: every
    visible pair of a real row lies in a visited tile, tiles n_lo .. n_hi - 1 hold only visible pairs,
    tiles outside n_min .. n_max - 1 none; the -1 sides run as the kernel's unbounded."""
    left, right = window
    tm, tn = 16, 8
    for Sq, Sk in ((1, 1), (5, 7), (16, 8), (17, 40), (33, 17), (64, 64), (40, 3)):
        vis = visible(Sq, Sk, False, window)
        for m in range(-(-Sq // tm)):
            n_min, n_max, n_lo, n_hi = fs.kv_tile_range_window_py(m, Sq, Sk, tm, tn, left, right)
            assert 0 <= n_min <= n_lo <= n_hi <= n_max <= -(-Sk // tn), (Sq, Sk, m)
            rows = vis[m * tm:(m + 1) * tm]
            for n in range(-(-Sk // tn)):
                block = rows[:, n * tn:(n + 1) * tn]
                if n >= n_max or n < n_min:
                    assert not block.any(), (Sq, Sk, m, n)
                if n_lo <= n < n_hi:
                    assert block.all() and block.shape[1] == tn, (Sq, Sk, m, n)
    assert FH.window_args(-1, -3) == (fs.WINDOW_UNBOUNDED, -3) and FH.window_args(4, -1) == (4, fs.WINDOW_UNBOUNDED)


# ------------------------------------------------------------------------------------------ CPU: plans, fast path
def test_plans_and_empty_problems():
    """A call's plan carries its variants (never the softcap value or the sinks); the dense problem
    without keys launches nothing and gives O = 0, LSE = sink."""
    sink = torch.tensor([0.5, -2.0, 1.0, 4.0])
    q, k = torch.randn(2, 3, 4, 64).to(BF), torch.zeros(2, 0, 2, 64, dtype=BF)
    out, lse = torch.full_like(q, NAN), torch.full((2, 4, 3), NAN)
    with count_launches() as n, jit.dry_run() as dry:
        FW._run(FW.Call(FW.DENSE, False, 0.1, learnable_sink=sink), q, k, k, out, lse)
    assert n.total() == 0 and dry.seen == [] and (out == 0).all()
    assert torch.equal(lse, sink[None, :, None].expand(2, 4, 3))
    k = torch.randn(2, 9, 2, 64).to(BF)
    with jit.dry_run() as dry:
        for c in (FW.Call(FW.DENSE, True, 0.1, softcap=30.0), FW.Call(FW.DENSE, False, 0.1, 4, -2, learnable_sink=sink),
                  FW.Call(FW.DENSE, True, 0.1, softcap=5, learnable_sink=sink)):
            FW._run(c, q, k, k, out, lse)
    cfgs = [cfg for _, cfg in dry.seen]
    assert [(c.softcap, c.sink, c.causal, c.window) for c in cfgs] == [
        (True, False, True, False), (False, True, False, True), (True, True, True, False)]
    assert cfgs[0].variant_args == ("softcap_scale",) and cfgs[2].variant_args == ("softcap_scale", "learnable_sink")
    assert FW.plan(BF, 64, True) == FW.plan(BF, 64, True, softcap=False, sink=False)
    with jit.dry_run() as dry:
        cute_kernels.warmup([("flash_attn", dict(head_dim=128, causal=True, softcap=True, sink=True))])
    assert dry.seen[0][1] == FW.plan(BF, 128, True, softcap=True, sink=True)
    with jit.dry_run(), pytest.raises(TypeError, match="sink must be a bool"):
        cute_kernels.warmup([("flash_attn", dict(head_dim=128, sink=1))])
    expl = DE.explain(4, 32, 8, 4096, softcap=True, sink=True)
    assert expl["config"].softcap and expl["config"].sink and expl["config"].variant_args == ("softcap_scale",
                                                                                             "learnable_sink")


def _stub_of(cfg_flags):
    (stub,) = [s for (kind, cfg), s in Stub.cache.items() if (cfg.softcap, cfg.sink) == cfg_flags]
    return stub


def test_fast_path_passes_the_variants_in_the_kernels_order(stubbed):
    """Dense, windowed, packed and paged calls: softcap enters as ``softcap * log2(e)`` (the softmax's
    scale) and ``softmax_scale / softcap`` after the mode's arguments, the sink tensor last; a repeat
    with another sink of the same metadata hits the launcher and passes the new one; another softcap
    value is another launcher; a bad softcap never hits (the checks name it)."""
    q, k = torch.randn(2, 16, 4, 64).to(BF), torch.randn(2, 24, 2, 64).to(BF)
    s1, s2 = torch.zeros(4), torch.ones(4)
    with count_launches() as n:
        cute_kernels.flash_attn(q, k, k, softcap=30.0, learnable_sink=s1, softmax_scale=0.25)
        cute_kernels.flash_attn(q, k, k, softcap=30.0, learnable_sink=s2, softmax_scale=0.25)
    assert n["flash_attn"] == 2 and len(FW._launchers) == 1
    args = _stub_of((True, True)).calls[-1]
    assert len(args) == 9 and args[6] == pytest.approx(30.0 * LOG2_E) and args[7] == pytest.approx(0.25 / 30.0)
    assert args[8] is s2
    cute_kernels.flash_attn(q, k, k, softcap=50.0, learnable_sink=s1)
    assert len(FW._launchers) == 2
    assert_raises_before_any_launch(ValueError, "softcap", cute_kernels.flash_attn, q, k, k, softcap=-30.0,
                                    learnable_sink=s1)
    cute_kernels.flash_attn(q, k, k, softcap=1e-30, learnable_sink=s1)  # fine at the default scale ...
    assert_raises_before_any_launch(ValueError, "softcap=1e-30 is too small", cute_kernels.flash_attn, q, k, k,
                                    softcap=1e-30, learnable_sink=s1, softmax_scale=1e10)  # ... a hit's scale is not
    cute_kernels.flash_attn(q, k, k, learnable_sink=s1, window_size=(7, -2))
    args = _stub_of((False, True)).calls[-1]
    assert len(args) == 10 and args[6] == pytest.approx(LOG2_E / 8) and args[7:9] == (7, -2) and args[9] is s1
    cute_kernels.flash_attn(q, k, k, softcap=2.0, causal=True)
    args = _stub_of((True, False)).calls[-1]
    assert len(args) == 8 and args[6] == pytest.approx(2.0 * LOG2_E) and args[7] == pytest.approx(0.125 / 2.0)
    qp, kp = torch.randn(40, 4, 64).to(BF), torch.randn(50, 2, 64).to(BF)
    cu_q, cu_k = torch.tensor([0, 15, 40], dtype=torch.int32), torch.tensor([0, 20, 50], dtype=torch.int32)
    Stub.cache.clear()
    for _ in range(2):
        cute_kernels.flash_attn(qp, kp, kp, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=25, max_seqlen_k=30,
                                softcap=3.0, learnable_sink=s1, window_size=(None, -1))
    args = _stub_of((True, True)).calls[-1]
    assert len(args) == 15 and args[6] is cu_q and args[10] == pytest.approx(3.0 * LOG2_E)
    assert args[11:13] == (fs.WINDOW_UNBOUNDED, fs.WINDOW_UNBOUNDED) and args[14] is s1
    pool = torch.randn(7, 16, 2, 64).to(BF)
    bt, used = torch.tensor([[3, 1], [0, 5]], dtype=torch.int32), torch.tensor([20, 9], dtype=torch.int32)
    Stub.cache.clear()
    for _ in range(2):
        cute_kernels.flash_attn(q, pool, pool, block_table=bt, seqused_k=used, learnable_sink=s2, causal=True)
    args = _stub_of((False, True)).calls[-1]
    assert len(args) == 12 and args[6] is bt and args[8] == pytest.approx(LOG2_E / 8) and args[11] is s2
    assert sum(len(s.calls) for s in Stub.cache.values()) == 2


def test_decode_fast_path_passes_the_variants(stubbed):
    q, kc, vc, s, _, _, _ = _decode_inputs(2, 1, 8, 2, 64, 40, [40, 20])
    sink = torch.zeros(8)
    for splits in (1, 3):
        Stub.cache.clear()
        with count_launches() as n:
            for _ in range(3):
                cute_kernels.decode_attn(q, kc, vc, cache_seqlens=s, num_splits=splits, softcap=10.0,
                                         learnable_sink=sink)
        assert n["decode_attn"] == 3
        (stub,) = Stub.cache.values()
        assert len(stub.calls) == 3
        *_, o_part, lse_part, scale_log2, softcap_scale, sk = stub.calls[-1]
        assert scale_log2 == pytest.approx(10.0 * LOG2_E) and softcap_scale == pytest.approx(0.125 / 10.0)
        assert sk is sink and (o_part is None) == (splits == 1)
    Stub.cache.clear()
    cute_kernels.decode_attn(q, kc, vc, cache_seqlens=s, learnable_sink=sink)
    (stub,) = Stub.cache.values()
    assert stub.calls[-1][-1] is sink and stub.calls[-1][-2] == pytest.approx(LOG2_E / 8)
    assert_raises_before_any_launch(ValueError, "softcap", cute_kernels.decode_attn, q, kc, vc, cache_seqlens=s,
                                    softcap=NAN, learnable_sink=sink)
    cute_kernels.decode_attn(q, kc, vc, cache_seqlens=s, softcap=1e-30)
    assert_raises_before_any_launch(ValueError, "softcap=1e-30 is too small", cute_kernels.decode_attn, q, kc, vc,
                                    cache_seqlens=s, softcap=1e-30, softmax_scale=1e10)


# ------------------------------------------------------------------------------------------ GPU
def _cuda_qkv(B, Sq, Sk, Hq, Hkv, D, dtype, seed, q_scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(B, Sq, Hq, D, device="cuda", generator=g) * q_scale).to(dtype)
    k = torch.randn(B, Sk, Hkv, D, device="cuda", generator=g).to(dtype)
    v = torch.randn(B, Sk, Hkv, D, device="cuda", generator=g).to(dtype)
    return q, k, v


def _sink(Hq, n_keys, seed):
    """Sinks that matter: around the log of the keys' sum of exponentials, spread +-3."""
    g = torch.Generator(device="cuda").manual_seed(seed + 7)
    return (math.log(max(n_keys, 1)) + 1.0 + 1.5 * torch.randn(Hq, device="cuda", generator=g)).float()


def check(o, lse, ref, ref_lse, o16, smax, what=""):
    """Elementwise: every |O - ref| within its (batch, head)'s bound, 2x the 16-bit computation's largest
    error there + 1e-4, or one unit of O's dtype at the head's largest |ref|.  Per row: the LSE within
    1e-3 plus tanh's approximation (``smax * 2**-10``), -inf exactly where the reference has it, O = 0 in
    rows without keys; no NaN / inf anywhere (outputs were poisoned).  o (B, S, H, D), lse (B, H, S)."""
    assert torch.isfinite(o).all(), f"{what}: NaN/inf in O"
    assert not torch.isnan(lse).any(), f"{what}: NaN in LSE"
    err = (o.double() - ref).abs()
    err16 = (o16.double() - ref).abs()
    if err.numel():
        unit = torch.finfo(o.dtype).eps * ref.abs().amax(dim=(1, 3))
        bound = torch.maximum(2 * err16.amax(dim=(1, 3)) + 1e-4, unit)  # (B, H)
        bad = err > bound[:, None, :, None]
        if bad.any():
            b, s, h, d = bad.nonzero()[0].tolist()
            raise AssertionError(f"{what}: {int(bad.sum())} elements out of bound, first (b={b}, s={s}, h={h}, d={d}): "
                                 f"|O - ref| {err[b, s, h, d]:.3g} > {bound[b, h]:.3g} (16-bit max error "
                                 f"{err16[b, :, h].max():.3g})")
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), f"{what}: -inf LSE pattern differs from the reference"
    live = torch.isfinite(ref_lse)
    if live.any():
        d = (lse.double()[live] - ref_lse[live]).abs().max().item()
        assert d <= 1e-3 + smax * 2 ** -10, f"{what}: max |dLSE| {d:.3g}"


def _run_dense(q, k, v, **kw):
    out = torch.full_like(q, NAN)
    o, lse = cute_kernels.flash_attn(q, k, v, out=out, return_lse=True, **kw)
    return o, lse


def _ref_kw(kw):
    return dict(causal=kw.get("causal", False), window=kw.get("window_size", (None, None)),
                scale=kw.get("softmax_scale"), softcap=kw.get("softcap", 0.0), sink=kw.get("learnable_sink"))


DENSE_SHAPES = [(2, 1, 1), (1, 17, 17), (2, 128, 128), (1, 97, 1031), (2, 300, 61), (1, 257, 263)]
VARIANTS = [("softcap", 2.0, False), ("sink", 0.0, True), ("both", 30.0, True), ("both-small-cap", 0.5, True)]


@gpu
@pytest.mark.parametrize("D", FW.HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name,softcap,with_sink", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_gpu_dense(D, causal, name, softcap, with_sink):
    """Dense, GQA 4 and MQA, ragged lengths (1, primes, off-tile) with Sq != Sk both ways, scores
    scaled up (q x 2) so softcapping bends them, sinks near the rows' sums."""
    if name != "both" and D in (96, 256):
        pytest.skip("one variant per config beyond D 64 / 128")
    for i, (B, Sq, Sk) in enumerate(DENSE_SHAPES):
        Hq, Hkv = (8, 2) if i % 2 else (4, 1)
        q, k, v = _cuda_qkv(B, Sq, Sk, Hq, Hkv, D, BF, seed=i, q_scale=2.0)
        kw = dict(causal=causal, softcap=softcap)
        if with_sink:
            kw["learnable_sink"] = _sink(Hq, Sk, i)
        o, lse = _run_dense(q, k, v, **kw)
        ref, ref_lse, smax = reference(q, k, v, **_ref_kw(kw))
        check(o, lse, ref, ref_lse, sixteen_bit(q, k, v, **_ref_kw(kw)), smax, f"D={D} {name} B{B} {Sq}x{Sk}")


@gpu
@pytest.mark.parametrize("window", [(None, -3), (-5, 40), (17, -17), (64, 0), (-1, -130), (200, -60)],
                         ids=lambda w: f"w{w[0]}_{w[1]}")
def test_gpu_windows_with_negative_sides(window):
    """FlashAttention-4's windows (a side of None / -1 unbounded, negative sides past the diagonal),
    with and without the variants: rows whose window is empty give O = 0 and LSE = -inf (or the sink)."""
    for i, (B, Sq, Sk) in enumerate([(2, 200, 333), (1, 129, 77), (1, 1, 64)]):
        q, k, v = _cuda_qkv(B, Sq, Sk, 8, 2, 128, BF, seed=10 + i, q_scale=2.0)
        for kw in (dict(), dict(softcap=3.0, learnable_sink=_sink(8, 64, i))):
            kw = dict(kw, window_size=window)
            o, lse = _run_dense(q, k, v, **kw)
            ref, ref_lse, smax = reference(q, k, v, **_ref_kw(kw))
            check(o, lse, ref, ref_lse, sixteen_bit(q, k, v, **_ref_kw(kw)), smax, f"window {window} {kw.keys()}")


@gpu
def test_gpu_fp16_and_sink_of_minus_inf():
    """fp16; a sink of -inf is no sink (the plain kernel's numbers, to rounding); a hit of the launcher
    with new sink values gives the new result (the values are never part of the key)."""
    q, k, v = _cuda_qkv(2, 190, 211, 8, 2, 128, torch.float16, seed=3)
    sink = _sink(8, 211, 3)
    o, lse = _run_dense(q, k, v, causal=True, learnable_sink=sink, softcap=10.0)
    kw = dict(causal=True, learnable_sink=sink, softcap=10.0)
    ref, ref_lse, smax = reference(q, k, v, **_ref_kw(kw))
    check(o, lse, ref, ref_lse, sixteen_bit(q, k, v, **_ref_kw(kw)), smax, "fp16")
    sink2 = sink - 2.0
    o2, lse2 = _run_dense(q, k, v, causal=True, learnable_sink=sink2, softcap=10.0)
    ref, ref_lse, smax = reference(q, k, v, **_ref_kw(dict(kw, learnable_sink=sink2)))
    check(o2, lse2, ref, ref_lse, sixteen_bit(q, k, v, **_ref_kw(dict(kw, learnable_sink=sink2))), smax, "fp16 hit")
    plain_o, plain_lse = _run_dense(q, k, v, causal=True)
    none_o, none_lse = _run_dense(q, k, v, causal=True, learnable_sink=torch.full((8,), -INF, device="cuda"))
    torch.testing.assert_close(none_o, plain_o, atol=1e-3, rtol=2 ** -9)
    torch.testing.assert_close(none_lse, plain_lse, atol=1e-5, rtol=1e-6)


@gpu
@pytest.mark.parametrize("causal,window", [(True, (None, None)), (False, (33, -7)), (False, (None, None))])
def test_gpu_packed(causal, window):
    """Packed sequences (empty, 1, primes, off-tile), softcap and sinks; rows outside the sequences are
    not written (NaN stays)."""
    lens_q = [0, 1, 37, 128, 131, 5]
    lens_k = [3, 1, 101, 128, 200, 0]
    Hq, Hkv, D = 8, 2, 64
    cq = torch.tensor([0, *itertools.accumulate(lens_q)], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, *itertools.accumulate(lens_k)], dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(5)
    q = (2 * torch.randn(sum(lens_q) + 4, Hq, D, device="cuda", generator=g)).to(BF)
    k = torch.randn(sum(lens_k), Hkv, D, device="cuda", generator=g).to(BF)
    v = torch.randn(sum(lens_k), Hkv, D, device="cuda", generator=g).to(BF)
    sink = _sink(Hq, 100, 5)
    kw = dict(causal=causal, window_size=window, softcap=4.0, learnable_sink=sink)
    out = torch.full_like(q, NAN)
    o, lse = cute_kernels.flash_attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max(lens_q),
                                     max_seqlen_k=max(lens_k), out=out, return_lse=True, **kw)
    ref, ref_lse, smax = packed_reference(q, k, v, cq.cpu(), ck.cpu(), **_ref_kw(kw))
    n = sum(lens_q)
    assert torch.isnan(o[n:]).all(), "rows past the sequences were written"
    c = cq.tolist()
    for b in range(len(lens_q)):
        r = slice(c[b], c[b + 1])
        if r.stop == r.start:
            continue
        o16 = sixteen_bit(q[None, r], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]], **_ref_kw(kw))
        check(o[None, r], lse[None, :, r], ref[None, r], ref_lse[None, :, r], o16, smax, f"packed seq {b}")


@gpu
@pytest.mark.parametrize("page_size", [16, 64])
def test_gpu_paged(page_size):
    """Paged K/V (shuffled pages), dense and packed q, softcap and sinks, causal (chunked prefill)."""
    from test_forward_paged import make_paged

    lens = [1, 29, 200, 64]
    Hq, Hkv, D = 8, 2, 128
    kp, vp, bt, sk, ks, vs = make_paged(lens, page_size, Hkv, D, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(9)
    Sq = 13
    q = (2 * torch.randn(len(lens), Sq, Hq, D, device="cuda", generator=g)).to(BF)
    sink = _sink(Hq, 50, 9)
    kw = dict(causal=True, softcap=6.0, learnable_sink=sink)
    o, lse = cute_kernels.flash_attn(q, kp, vp, block_table=bt, seqused_k=sk, out=torch.full_like(q, NAN),
                                     return_lse=True, **kw)
    for b, n in enumerate(lens):
        ref, ref_lse, smax = reference(q[b:b + 1], ks[b][None], vs[b][None], **_ref_kw(kw))
        o16 = sixteen_bit(q[b:b + 1], ks[b][None], vs[b][None], **_ref_kw(kw))
        check(o[b:b + 1], lse[b:b + 1], ref, ref_lse, o16, smax, f"paged seq {b} (len {n})")


@gpu
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("name,softcap,with_sink", VARIANTS[:3], ids=[v[0] for v in VARIANTS[:3]])
def test_gpu_decode(D, paged, name, softcap, with_sink):
    """decode_attn with 1 and several splits (the sink enters once: split 0's state), GQA 8, Sq 1 and 4
    (causal), lengths 0, 1, a prime, the capacity; the split results agree with each other and with
    the reference."""
    if name != "both" and (D != 128 or paged):
        pytest.skip("one variant per config beyond D 128 contiguous")
    Hq, Hkv, L = 16, 2, 1031
    lens = [0, 1, 613, L]
    for Sq in (1, 4):
        q, kc, vc, s, bt, k, v = _decode_inputs(4, Sq, Hq, Hkv, D, L, lens, paged=paged, seed=Sq)
        q, kc, vc, s = q.cuda(), kc.cuda(), vc.cuda(), s.cuda()
        bt = None if bt is None else bt.cuda()
        q = q * 2
        sink = _sink(Hq, 600, Sq) if with_sink else None
        ro, rl = decode_reference(q.cpu(), k, v, lens, True, softcap, None if sink is None else sink.cpu())
        results = []
        for splits in (1, 3, 8):
            o, lse = cute_kernels.decode_attn(q, kc, vc, cache_seqlens=s, block_table=bt, num_splits=splits,
                                              softcap=softcap, learnable_sink=sink, return_lse=True)
            results.append(o)
            for b, n in enumerate(lens):
                qb = q[b:b + 1].cpu()
                kb, vb = k[b:b + 1, :n], v[b:b + 1, :n]
                kw = dict(causal=True, softcap=softcap, sink=None if sink is None else sink.cpu())
                o16 = sixteen_bit(qb, kb, vb, **kw).cuda() if n else torch.zeros_like(q[b:b + 1])
                smax = reference(qb, kb, vb, **kw)[2]
                check(o[b:b + 1].cpu(), lse[b:b + 1].cpu(), ro[b:b + 1], rl[b:b + 1], o16.cpu(), smax,
                      f"decode D={D} splits={splits} Sq={Sq} len={n}")
        for other in results[1:]:
            torch.testing.assert_close(other, results[0], atol=2e-2, rtol=2 ** -7)


@gpu
def test_gpu_torch_compile_and_cuda_graph():
    """torch.compile(fullgraph=True) traces the custom ops with softcap and the sink (the same bits as
    eager); a CUDA graph captured with them replays with new sink values and inputs."""
    from conftest import capture_graph

    q, k, v = _cuda_qkv(2, 100, 150, 8, 2, 128, BF, seed=21, q_scale=2.0)
    sink = _sink(8, 150, 21)
    kw = dict(causal=True, softcap=20.0)
    eager = cute_kernels.flash_attn(q, k, v, learnable_sink=sink, **kw)
    compiled = torch.compile(lambda q, k, v, s: cute_kernels.flash_attn(q, k, v, learnable_sink=s, **kw), fullgraph=True)
    assert torch.equal(compiled(q, k, v, sink), eager)
    qd, kc, vc, s, _, _, _ = _decode_inputs(2, 1, 8, 2, 128, 300, [300, 17])
    qd, kc, vc, s = qd.cuda(), kc.cuda(), vc.cuda(), s.cuda()
    dec = lambda q, s_: cute_kernels.decode_attn(q, kc, vc, cache_seqlens=s, softcap=30.0, learnable_sink=s_)  # noqa: E731
    assert torch.equal(torch.compile(dec, fullgraph=True)(qd, sink), dec(qd, sink))
    out = torch.empty_like(q)
    static_sink = sink.clone()
    graph = capture_graph(lambda: cute_kernels.flash_attn(q, k, v, out=out, learnable_sink=static_sink, **kw))
    static_sink.sub_(3.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, cute_kernels.flash_attn(q, k, v, learnable_sink=sink - 3.0, **kw))
