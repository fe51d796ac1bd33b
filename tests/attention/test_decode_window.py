"""decode_attn's sliding windows (``window_size``) and left padding (``cache_leftpad``).

Semantics (FlashAttention-3's ``flash_attn_with_kvcache``): new token ``t`` of ``Sq`` sits at cache
position ``p = L - Sq + t`` (L = cache_seqlens[b], bottom-right like the causal mask) and sees key ``j``
when ``cache_leftpad[b] <= j < L``, ``j >= p - left`` (left >= 0) and ``j <= p + right`` (right >= 0);
causal is a right side of 0.  Positions are cache positions with or without a padding (FA3's reference
shifts keys and length by the padding, which leaves ``p - j`` unchanged).

CPU: every new argument's errors, named, before any launch; checked mode's device-value checks (the
padding within [0, L]; only the pages the kernel reads are checked); the float32 reference and the CPU
path against a float64 brute force written key by key from the definition above (windows smaller and
larger than the cache, causal or not, paddings 0 / some / all, ragged lengths 0, 1, 17, primes, paged);
nothing below the first visible key is read (NaN there and in freed pages changes nothing); the host
fast path (stubbed kernels: the arguments in the kernel's order, a launcher per window, a hit with new
padding values); plans (splits over a window's span, the plain configuration untouched); the custom ops
(opcheck, torch.compile(fullgraph=True)); the new configurations compile for sm_90a without local memory.

GPU (``-m gpu``): the kernel against the reference elementwise (per-row tolerance, exact zeros and -inf
LSEs for rows without keys), with NaN in every cache position the kernel must not read (padding, below
the window, past the length, freed pages) and NaN-poisoned outputs and workspaces, contiguous (TMA and
cp.async loads) and paged caches, 1 / several / planned splits; bitwise equality with the plain kernel
where the window / padding bound nothing; bad device values; CUDA-graph replay.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import cute_kernels
from cute_kernels.attention import decode as DE
from cute_kernels.attention import decode_plan as DP
from cute_kernels.attention.decode import decode_attn, decode_attn_reference, decode_attn_workspace
from cute_kernels.common.softmax import LOG2_E
from cute_kernels.testing import count_launches
from _check import RTOL, assert_close_elementwise, assert_raises_before_any_launch
from conftest import Stub, precompile_for_module_gpu_tests

gpu = pytest.mark.gpu
BF = torch.bfloat16
INF = float("inf")
NAN = float("nan")


# ------------------------------------------------------------------------------------------ helpers
def sides(causal, window):
    """(left, right) with -1 for unbounded (None and -1), causal a right side of 0."""
    left, right = (-1 if w is None else int(w) for w in window)
    if causal:
        right = 0
    return left, right


def first_key(L, Sq, left, lp):
    """The first cache position any new token of a sequence sees (L when none)."""
    lp = min(max(lp, 0), L)
    return lp if left < 0 else min(max(lp, L - Sq - left, 0), L)


def brute(q, k, v, lens, causal=True, window=(-1, -1), leftpad=None, scale=None, softcap=0.0, sink=None):
    """float64, key by key from the definition: contiguous k / v (B, Lmax, Hkv, D); (o, lse (B, Hq, Sq))."""
    B, Sq, Hq, D = q.shape
    G = Hq // k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    left, right = sides(causal, window)
    o = torch.zeros(B, Sq, Hq, D, dtype=torch.float64)
    lse = torch.full((B, Hq, Sq), -INF, dtype=torch.float64)
    for b in range(B):
        L = int(lens[b])
        lp = 0 if leftpad is None else int(leftpad[b])
        for t in range(Sq):
            p = L - Sq + t
            vis = [j for j in range(L) if j >= lp and (left < 0 or j >= p - left) and (right < 0 or j <= p + right)]
            for h in range(Hq):
                sk = None if sink is None else float(sink[h])
                if not vis:
                    lse[b, h, t] = -INF if sk is None else sk
                    continue
                idx = torch.tensor(vis)
                s = (k[b, idx, h // G].double() @ q[b, t, h].double()) * scale
                if softcap:
                    s = softcap * torch.tanh(s / softcap)
                m = s.max().item() if sk is None else max(s.max().item(), sk)
                e = torch.exp(s - m)
                l_sum = e.sum() + (0.0 if sk is None else torch.exp(torch.tensor(sk - m, dtype=torch.float64)))
                o[b, t, h] = (e / l_sum) @ v[b, idx, h // G].double()
                lse[b, h, t] = m + torch.log(l_sum)
    return o, lse


def make(B, Sq, Hq, Hkv, D, lens, Lmax, seed=0, dtype=BF):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, Hq, D, generator=g).to(dtype)
    k = torch.randn(B, Lmax, Hkv, D, generator=g).to(dtype)
    v = torch.randn(B, Lmax, Hkv, D, generator=g).to(dtype)
    return q, k, v, torch.tensor(lens, dtype=torch.int32)


def leftpads(mode, lens, seed=0):
    """None, or the (B,) int32 padding: "zero", "some" (random in [0, L]), "all" (= L)."""
    if mode is None:
        return None
    g = torch.Generator().manual_seed(seed + 7)
    if mode == "zero":
        return torch.zeros(len(lens), dtype=torch.int32)
    if mode == "all":
        return torch.tensor(lens, dtype=torch.int32)
    return torch.tensor([int(torch.randint(0, L + 1, (1,), generator=g)) for L in lens], dtype=torch.int32)


def poison(k, v, lens, Sq, left, pads):
    """NaN in every position of k / v the kernel must not read: below each sequence's first visible key
    and from its length on.  Returns the first visible keys."""
    firsts = []
    for b, L in enumerate(lens):
        f = first_key(L, Sq, left, 0 if pads is None else int(pads[b]))
        k[b, :f], v[b, :f], k[b, L:], v[b, L:] = NAN, NAN, NAN, NAN
        firsts.append(f)
    return firsts


def to_pages(k, v, page_size, firsts=None, seed=0):
    """Contiguous -> shuffled pages (page 0 a spare full of NaN, never assigned) + block table; with
    ``firsts`` the entries of pages wholly below a sequence's first visible key are -1 (freed)."""
    B, Lmax, H, D = k.shape
    pps = -(-Lmax // page_size)
    pad = pps * page_size - Lmax
    kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).reshape(B * pps, page_size, H, D)
    vp = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).reshape(B * pps, page_size, H, D)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(B * pps, generator=g) + 1  # page 0 stays a spare
    k_pages = torch.full((B * pps + 1, page_size, H, D), NAN, dtype=k.dtype)
    v_pages = torch.full((B * pps + 1, page_size, H, D), NAN, dtype=k.dtype)
    k_pages[perm], v_pages[perm] = kp, vp
    bt = perm.view(B, pps).to(torch.int32).contiguous()
    if firsts is not None:
        for b, f in enumerate(firsts):
            bt[b, : f // page_size] = -1
    return k_pages, v_pages, bt


def check_close(out, lse, ref_o, ref_lse, what=""):
    """Every element within ``tol * max |ref|`` of its query row (+ one rounding to the dtype); rows that
    see no key exactly 0; the LSE within 2e-3 with the same -inf pattern."""
    ref_o, ref_lse = ref_o.to(out.device).float(), ref_lse.to(out.device).float()
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    tol = 2e-2 if out.dtype == torch.bfloat16 else 4e-3
    row_scale = ref_o.abs().amax(-1, keepdim=True)
    assert_close_elementwise(out.float(), ref_o, atol=tol * row_scale, rtol=RTOL[out.dtype], regions=[],
                             what=f"{what} (per-row tolerance {tol} x max |ref| of the row)")
    if lse is not None:
        empty = torch.isneginf(ref_lse)
        assert torch.equal(torch.isneginf(lse), empty), f"{what}: -inf LSE pattern differs"
        if (~empty).any():
            d = (lse[~empty] - ref_lse[~empty]).abs().amax().item()
            assert d < 2e-3, f"{what}: LSE error {d:.3g}"
        assert (out.float()[empty.permute(0, 2, 1)] == 0).all(), f"{what}: rows without keys must be 0"


# ------------------------------------------------------------------------------------------ CPU: errors
def _base():
    q, k, v, s = make(2, 1, 8, 2, 64, [5, 9], 9)
    return (q, k, v), dict(cache_seqlens=s)


BAD = [
    ("window-str", dict(window_size="4"), TypeError, "decode_attn: window_size must be a \\(left, right\\) pair"),
    ("window-len3", dict(window_size=(1, 2, 3)), TypeError, "decode_attn: window_size must be a \\(left, right\\)"),
    ("window-tensor", dict(window_size=torch.tensor([4, 0])), TypeError, "decode_attn: window_size must be"),
    ("window-float", dict(window_size=(1.5, 0)), TypeError, "decode_attn: window_size left must be an int or None"),
    ("window-bool", dict(window_size=(4, True)), TypeError, "decode_attn: window_size right must be an int or None"),
    ("window-neg", dict(window_size=(-2, 0)), ValueError, "decode_attn: window_size left must be >= -1"),
    ("window-neg-right", dict(window_size=(4, -3), causal=False), ValueError,
     "decode_attn: window_size right must be >= -1"),
    ("window-causal-right", dict(window_size=(4, 3)), ValueError,
     "decode_attn: window_size right must be 0 or -1 with causal=True"),
    ("window-huge", dict(window_size=(2 ** 31, 0)), ValueError, "decode_attn: window_size left must be at most 2\\*\\*30"),
    ("leftpad-list", dict(cache_leftpad=[0, 1]), TypeError, "decode_attn: cache_leftpad must be a torch.Tensor"),
    ("leftpad-int64", dict(cache_leftpad=torch.zeros(2, dtype=torch.int64)), TypeError,
     "decode_attn: cache_leftpad must be int32"),
    ("leftpad-float", dict(cache_leftpad=torch.zeros(2)), TypeError, "decode_attn: cache_leftpad must be int32"),
    ("leftpad-len", dict(cache_leftpad=torch.zeros(3, dtype=torch.int32)), ValueError,
     "decode_attn: cache_leftpad must be \\(2,\\)"),
    ("leftpad-2d", dict(cache_leftpad=torch.zeros(2, 1, dtype=torch.int32)), ValueError,
     "decode_attn: cache_leftpad must be \\(2,\\)"),
    ("leftpad-strided", dict(cache_leftpad=torch.zeros(4, dtype=torch.int32)[::2]), ValueError,
     "decode_attn: cache_leftpad must be contiguous"),
    ("leftpad-meta", dict(cache_leftpad=torch.zeros(2, dtype=torch.int32, device="meta")), ValueError,
     "decode_attn: cache_leftpad is on meta, q on cpu"),
]


@pytest.mark.parametrize("name,over,exc,match", BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_raise_before_any_launch(name, over, exc, match):
    args, kw = _base()
    assert_raises_before_any_launch(exc, match, decode_attn, *args, **kw, **over)


def test_out_must_not_overlap_the_padding():
    args, kw = _base()
    buf = torch.zeros(2 * 8 * 64, dtype=BF)
    pad = buf[:4].view(torch.int32)  # the first 8 bytes of out
    assert_raises_before_any_launch(ValueError, "out .*cache_leftpad", decode_attn, *args, **kw,
                                    out=buf.view(2, 1, 8, 64), cache_leftpad=pad)


def test_checked_mode_padding_values():
    (q, k, v), kw = _base()
    for bad, b in (([0, 10], 1), ([-1, 0], 0), ([6, 0], 0)):
        with pytest.raises(ValueError, match=rf"decode_attn: cache_leftpad\[{b}\] = {bad[b]} is outside \[0, "):
            decode_attn(q, k, v, **kw, cache_leftpad=torch.tensor(bad, dtype=torch.int32), checked=True)
    o = decode_attn(q, k, v, **kw, cache_leftpad=torch.tensor([5, 9], dtype=torch.int32), checked=True)
    assert (o == 0).all()  # a padding of the whole length: no keys


def test_checked_mode_checks_only_the_pages_read():
    """A sliding-window server may free the pages below the window (block-table entries -1): checked
    mode accepts them, as it does pages wholly below the padding; a bad id among the pages read raises."""
    Sq, lens, L = 2, [40, 23], 48
    q, k, v, s = make(2, Sq, 8, 2, 64, lens, L, seed=3)
    pads = torch.tensor([3, 17], dtype=torch.int32)
    firsts = poison(k, v, lens, Sq, 10, pads)
    kp, vp, bt = to_pages(k, v, 8, firsts)
    assert (bt == -1).any()
    o = decode_attn(q, kp, vp, cache_seqlens=s, block_table=bt, window_size=(10, 0), cache_leftpad=pads,
                    checked=True)
    ro, _ = brute(q, k, v, lens, True, (10, 0), pads)
    assert torch.isfinite(o).all() and torch.allclose(o.double(), ro, atol=2e-2, rtol=2e-2)
    bad = bt.clone()
    bad[0, firsts[0] // 8] = -1  # the page of the first key read
    with pytest.raises(ValueError, match=r"block_table\[0\] has page ids outside .* among the \d+ pages it reads"):
        decode_attn(q, kp, vp, cache_seqlens=s, block_table=bad, window_size=(10, 0), cache_leftpad=pads, checked=True)
    with pytest.raises(ValueError, match=r"block_table\[0\]"):  # without the window every page is read
        decode_attn(q, kp, vp, cache_seqlens=s, block_table=bt, checked=True)


# ------------------------------------------------------------------------------------------ CPU: semantics
WINDOWS = [  # (causal, window_size)
    (True, (-1, -1)), (True, (0, 0)), (True, (1, None)), (True, (5, -1)), (True, (16, 0)), (True, (100, 0)),
    (False, (-1, -1)), (False, (0, 0)), (False, (3, 2)), (False, (-1, 4)), (False, (6, None)), (False, (2, 40)),
]


@pytest.mark.parametrize("paged", [0, 8], ids=["contiguous", "paged8"])
@pytest.mark.parametrize("Sq", [1, 3])
@pytest.mark.parametrize("causal,window", WINDOWS, ids=[f"{'causal' if c else 'full'}-{w}" for c, w in WINDOWS])
def test_reference_and_cpu_path_match_brute_force(paged, Sq, causal, window):
    """Ragged lengths (0, 1, 17, primes, the capacity), paddings none / 0 / some / all; NaN below each
    first visible key and past each length (never read); the CPU path equals the reference."""
    lens, L = [0, 1, 17, 23, 37, 36], 37
    left, _ = sides(causal, window)
    for mode in (None, "zero", "some", "all"):
        q, k, v, s = make(len(lens), Sq, 8, 2, 64, lens, L, seed=Sq)
        pads = leftpads(mode, lens, seed=Sq)
        ro, rl = brute(q, k, v, lens, causal, window, pads)
        firsts = poison(k, v, lens, Sq, left, pads)
        kc, vc, bt = (k, v, None) if not paged else to_pages(k, v, paged, firsts)
        o, lse = decode_attn_reference(q, kc, vc, s, bt, causal, None, window_size=window, cache_leftpad=pads)
        what = f"mode={mode}"
        assert torch.isfinite(o).all(), what
        assert torch.allclose(o.double(), ro, atol=1e-4, rtol=1e-4), (what, (o.double() - ro).abs().max())
        assert torch.equal(torch.isneginf(lse), torch.isneginf(rl)), what
        fin = ~torch.isneginf(rl)
        assert torch.allclose(lse[fin].double(), rl[fin], atol=1e-4), what
        o2, lse2 = decode_attn(q, kc, vc, cache_seqlens=s, block_table=bt, causal=causal, window_size=window,
                               cache_leftpad=pads, return_lse=True)
        assert torch.equal(o2, o.to(q.dtype)) and torch.equal(lse2, lse), what


def _fa3_visible(L, Sq, left, right, lp, local):
    """FlashAttention-3's test mask (hopper/test_util.py ``construct_local_mask`` with ``key_leftpad``, and
    its key padding mask ``lp <= j < L``), written out: keys counted from the padding (``col = j - lp``),
    ``sk = L - lp``; True = visible.  ``local``: a window (or causal) is given, else no local mask.  An
    unbounded (-1) side of a local window becomes what hopper/flash_api.cpp makes of it: left the static
    key length - 1, right ``seqlen_q - 1`` (FA3's tests draw sides >= 0 only; its mask formula reads -1
    as -1)."""
    if local and right >= 0 and left < 0 and right != 0:
        left = L + Sq  # (causal, right == 0 with left < 0, keeps the formula's causal branch)
    elif local and left >= 0 and right < 0:
        right = Sq - 1
    vis = []
    for i in range(Sq):
        row = []
        for j in range(L):
            col, sk = (j - lp if j >= lp else 2 ** 32), L - lp
            if not local:
                masked = False
            elif left < 0:
                masked = col > i + sk - Sq + right
            else:
                masked = col > min(i + sk - Sq + right, sk) or col < i + sk - Sq - left
            row.append(lp <= j < L and not masked)
        vis.append(row)
    return vis


def test_positions_are_fa3s_with_a_padding():
    """Our definition (cache positions, ``p = L - Sq + t``) and FlashAttention-3's (keys and length
    shifted by the padding) give the same visible keys for every padding, window and causal."""
    for L, Sq, lp in itertools.product((0, 1, 5, 12), (1, 3), (0, 1, 4, 12)):
        if lp > L:
            continue
        for causal, window in WINDOWS:
            left, right = sides(causal, window)
            ours = [[j >= lp and (left < 0 or j >= L - Sq + t - left) and (right < 0 or j <= L - Sq + t + right)
                     for j in range(L)] for t in range(Sq)]
            local = left >= 0 or right >= 0
            assert ours == _fa3_visible(L, Sq, left, right, lp, local), (L, Sq, lp, causal, window)


def test_variants_with_window_and_padding_match_brute_force():
    """softcap and sinks together with a window and a padding (a row without keys: 0 and its sink)."""
    lens, L, Sq = [0, 9, 31], 31, 2
    q, k, v, s = make(3, Sq, 8, 2, 64, lens, L, seed=11)
    pads = torch.tensor([0, 9, 4], dtype=torch.int32)
    sink = torch.linspace(-1.0, 2.0, 8)
    ro, rl = brute(q, k, v, lens, True, (6, 0), pads, scale=0.2, softcap=3.0, sink=sink)
    o, lse = decode_attn(q, k, v, cache_seqlens=s, window_size=(6, 0), cache_leftpad=pads, softmax_scale=0.2,
                         softcap=3.0, learnable_sink=sink, return_lse=True)
    assert torch.allclose(o.double(), ro, atol=2e-2, rtol=2e-2) and torch.allclose(lse.double(), rl, atol=1e-4)
    assert (o[:2] == 0).all() and torch.allclose(lse[1], sink[:, None].expand(8, Sq))


def test_window_equivalences():
    """A window wider than every length is no window; causal with (-1, 0) / (None, 0) is plain causal;
    a non-causal right side of 0 is causal; a padding of 0 is no padding (the reference, bitwise)."""
    lens, L = [5, 19, 0, 12], 19
    q, k, v, s = make(4, 3, 8, 4, 64, lens, L, seed=2)
    plain_c = decode_attn_reference(q, k, v, s, None, True)
    plain_f = decode_attn_reference(q, k, v, s, None, False)
    zero = torch.zeros(4, dtype=torch.int32)
    for causal, window, pads, want in ((True, (10 ** 6, 0), None, plain_c), (True, (-1, 0), None, plain_c),
                                       (True, (None, None), zero, plain_c), (False, (-1, 0), None, plain_c),
                                       (False, (50, 50), zero, plain_f), (False, (None, -1), None, plain_f)):
        got = decode_attn_reference(q, k, v, s, None, causal, window_size=window, cache_leftpad=pads)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (causal, window)


def test_unchecked_bad_paddings_are_clamped():
    """Unchecked, a padding below 0 is 0 and one past the length is the length (no keys): never an
    out-of-bounds read, on the CPU path as in the kernel."""
    lens = [8, 12, 5]
    q, k, v, s = make(3, 1, 8, 2, 64, lens, 12)
    bad = torch.tensor([-4, 10 ** 6, 2], dtype=torch.int32)
    good = torch.tensor([0, 12, 2], dtype=torch.int32)
    a = decode_attn(q, k, v, cache_seqlens=s, cache_leftpad=bad, window_size=(6, 0), return_lse=True, checked=False)
    b = decode_attn(q, k, v, cache_seqlens=s, cache_leftpad=good, window_size=(6, 0), return_lse=True, checked=False)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and (a[0][1] == 0).all()


# ------------------------------------------------------------------------------------------ CPU: host path
def test_fast_path_passes_window_and_padding_in_the_kernels_order(stubbed):
    """The kernel takes ``scale_log2, [softcap_scale], [sink], [window_left, window_right],
    [cache_leftpad]``; -1 sides as 2**30; a repeat with another padding tensor of the same metadata hits
    the launcher and passes the new one; another window is another launcher; a window that bounds
    nothing beyond causal runs the plain configuration."""
    q, k, v, s = make(2, 1, 8, 2, 64, [40, 20], 40)
    p1, p2 = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([7, 1], dtype=torch.int32)
    for splits in (1, 3):
        Stub.cache.clear()
        DE._launchers.clear()
        with count_launches() as n:
            for pad in (p1, p2, p1, p2):
                decode_attn(q, k, v, cache_seqlens=s, num_splits=splits, window_size=(8, 0), cache_leftpad=pad)
        assert n["decode_attn"] == 4 and len(DE._launchers) == 1
        (stub,) = Stub.cache.values()
        cfg = stub.key[1]
        assert cfg.window and cfg.leftpad and not cfg.causal and cfg.split == (splits > 1)
        *_, o_part, _, scale_log2, wl, wr, pad = stub.calls[-1]
        assert scale_log2 == pytest.approx(LOG2_E / 8) and (wl, wr) == (8, 0) and pad is p2
        assert (o_part is None) == (splits == 1)
    decode_attn(q, k, v, cache_seqlens=s, window_size=(None, 5), causal=False)
    assert len(DE._launchers) == 2
    *_, wl, wr = list(Stub.cache.values())[-1].calls[-1]
    assert (wl, wr) == (1 << 30, 5)
    Stub.cache.clear()
    decode_attn(q, k, v, cache_seqlens=s, window_size=(-1, 0), softcap=4.0, learnable_sink=torch.zeros(8),
                cache_leftpad=p1)
    (stub,) = Stub.cache.values()
    assert not stub.key[1].window and stub.key[1].causal and stub.key[1].leftpad
    *_, scale_log2, softcap_scale, sink, pad = stub.calls[-1]
    assert scale_log2 == pytest.approx(4.0 * LOG2_E) and softcap_scale == pytest.approx(0.125 / 4.0) and pad is p1
    Stub.cache.clear()
    decode_attn(q, k, v, cache_seqlens=s, window_size=(4, 0), softcap=4.0, learnable_sink=torch.zeros(8))
    (stub,) = Stub.cache.values()
    assert stub.calls[-1][-2:] == (4, 0) and len(stub.calls[-1]) == 14
    Stub.cache.clear()
    decode_attn(q, k, v, cache_seqlens=s, window_size=[-1, -1])  # a list: no key, validated, plain
    (stub,) = Stub.cache.values()
    assert stub.key[1].variant_args == () and len(stub.calls[-1]) == 10


def test_fast_path_never_skips_the_window_checks(stubbed):
    """A plain launcher exists; a window equal to (-1, -1) but of floats, or of numpy ints, never hits
    it unchecked (floats raise; other spellings of no window run the plain configuration)."""
    import numpy as np

    q, k, v, s = make(2, 1, 8, 2, 64, [40, 20], 40)
    decode_attn(q, k, v, cache_seqlens=s)
    decode_attn(q, k, v, cache_seqlens=s)
    assert len(DE._launchers) == 1
    assert_raises_before_any_launch(TypeError, "window_size left must be an int", decode_attn, q, k, v,
                                    cache_seqlens=s, window_size=(-1.0, -1))
    for w in (None, (-1, -1), (None, None), (np.int64(-1), -1), [-1, -1]):
        with count_launches() as n:
            decode_attn(q, k, v, cache_seqlens=s, window_size=w)
        assert n["decode_attn"] == 1
    assert all(stub.key[1].variant_args == () for stub in Stub.cache.values())


def test_fast_path_refuses_a_bad_padding_after_a_hit(stubbed):
    q, k, v, s = make(2, 1, 8, 2, 64, [40, 20], 40)
    pad = torch.tensor([0, 3], dtype=torch.int32)
    decode_attn(q, k, v, cache_seqlens=s, cache_leftpad=pad)
    decode_attn(q, k, v, cache_seqlens=s, cache_leftpad=pad)
    assert len(DE._launchers) == 1
    assert_raises_before_any_launch(TypeError, "cache_leftpad must be int32", decode_attn, q, k, v, cache_seqlens=s,
                                    cache_leftpad=pad.long())
    assert_raises_before_any_launch(ValueError, "cache_leftpad must be \\(2,\\)", decode_attn, q, k, v,
                                    cache_seqlens=s, cache_leftpad=pad[:1])
    assert_raises_before_any_launch(TypeError, "window_size left must be an int", decode_attn, q, k, v,
                                    cache_seqlens=s, cache_leftpad=pad, window_size=(True, 0))


def test_plans():
    """A window's left side bounds the split plan (the keys any row sees); a padding does not (a device
    value); a window wider than the capacity plans as none; the plain config is the one of before."""
    base = DP.explain(1, 32, 8, 131072)
    win = DP.explain(1, 32, 8, 131072, window_size=(1024, 0))
    wide = DP.explain(1, 32, 8, 131072, window_size=(10 ** 6, 0))
    pad = DP.explain(1, 32, 8, 131072, leftpad=True)
    assert win["num_splits"] < base["num_splits"] and wide["num_splits"] == pad["num_splits"] == base["num_splits"]
    assert win["config"].window and not win["config"].causal and not win["config"].leftpad
    assert pad["config"].leftpad and pad["config"].causal and not pad["config"].window
    assert base["config"] == DP.make_config(torch.bfloat16, 128, 4, False, 0, True, True, base["kv_bytes"])
    assert base["config"].variant_args == ()
    assert DP.window_capacity(131072, 1, (1024, 0), 64) == 1152 and DP.window_capacity(100, 1, (1024, 0), 64) == 100
    assert DP.window_capacity(131072, 4, None, 64) == DP.window_capacity(131072, 4, (-1, 3), 64) == 131072
    assert DP.explain(2, 8, 2, 4096, window_size=(-1, 0))["config"] == DP.explain(2, 8, 2, 4096)["config"]
    with pytest.raises(ValueError, match="window config folds causal"):
        DP.make_config(torch.bfloat16, 128, 4, False, 0, True, True, window=True)
    cfg = DP.make_config(torch.bfloat16, 128, 4, False, 0, False, True, softcap=True, sink=True, window=True,
                         leftpad=True)
    assert cfg.variant_args == ("softcap_scale", "learnable_sink", "window_left", "window_right", "cache_leftpad")


def test_custom_ops_opcheck_and_compile():
    lens = [5, 9]
    q, k, v, s = make(2, 2, 4, 2, 64, lens, 9)
    pad = torch.tensor([1, 3], dtype=torch.int32)
    torch.library.opcheck(torch.ops.cute_kernels.decode_attn, (q, k, v, s, None, 1, False, 0.125, 0.0, None, 4, 0, pad))
    out, lse = torch.empty_like(q), torch.empty(2, 4, 2)
    torch.library.opcheck(torch.ops.cute_kernels.decode_attn_,
                          (q, k, v, s, None, out, lse, None, 1, False, 0.125, 0.0, None, 4, 0, pad))
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v, s, pad: decode_attn(q, k, v, cache_seqlens=s, window_size=(4, 0),
                                                           cache_leftpad=pad, return_lse=True),
                       fullgraph=True, backend="eager")
    o, l = fn(q, k, v, s, pad)
    ro, rl = decode_attn_reference(q, k, v, s, window_size=(4, 0), cache_leftpad=pad)
    assert torch.equal(o, ro.to(q.dtype)) and torch.equal(l, rl)


def test_public_signature():
    import inspect

    sig = inspect.signature(cute_kernels.decode_attn)
    assert sig.parameters["window_size"].default == (-1, -1) and sig.parameters["cache_leftpad"].default is None
    sig = inspect.signature(decode_attn_reference)
    assert "window_size" in sig.parameters and "cache_leftpad" in sig.parameters


# ------------------------------------------------------------------------------------------ CPU: compile
COMPILES = [  # (head_dim, split, page_size, kv_bytes, flags)
    (128, True, 0, 1 << 20, dict(window=True, leftpad=True)),  # TMA loads
    (128, False, 0, 1 << 30, dict(window=True)),  # cp.async loads
    (64, True, 16, 0, dict(window=True, leftpad=True, softcap=True, sink=True)),  # paged
    (256, False, 0, 1 << 20, dict(leftpad=True)),  # causal + padding, TMA
]


@pytest.mark.parametrize("head_dim,split,page,kv_bytes,flags", COMPILES,
                         ids=[f"D{d}-{'split' if s else 'direct'}-{'paged' if p else ('tma' if b < 1 << 28 else 'cpasync')}"
                              f"-{'+'.join(f)}" for d, s, p, b, f in COMPILES])
def test_window_configs_compile_without_spills(head_dim, split, page, kv_bytes, flags):
    from cute_kernels.tools import inspect as ins

    causal = not flags.get("window", False)
    cfg = DP.make_config(torch.bfloat16, head_dim, 8, page > 0, page, causal, split, kv_bytes, **flags)
    assert cfg.tile == DP.make_config(torch.bfloat16, head_dim, 8, page > 0, page, True, split, kv_bytes).tile
    rep = ins.inspect_builder(DE.decode_builder(cfg))
    (k,) = [k for k in rep.kernels if "DecodeAttnKernel" in k.name]
    print(f"{cfg}: {rep.summary()}")
    assert k.spills == 0 and k.stack_frame == 0, rep.summary()
    assert k.instructions["HMMA"] > 0, rep.summary()
    assert (k.instructions["UTMALDG"] > 0) == (cfg.load == "tma"), rep.summary()
    _, args = DE.decode_builder(cfg)()
    assert len(args) == 11 + len(cfg.variant_args)


# ------------------------------------------------------------------------------------------ GPU
GPU_WINDOWS = [  # (causal, window_size)
    (True, (-1, -1)), (True, (0, 0)), (True, (1, None)), (True, (63, 0)), (True, (200, -1)), (True, (5000, 0)),
    (False, (0, 0)), (False, (7, 3)), (False, (-1, 2)), (False, (100, -1)), (False, (-1, -1)),
]
GPU_LENS, GPU_LMAX = [1, 17, 61, 64, 127, 1000, 4099, 0], 4100
PAD_MODES = (None, "zero", "some", "all")
SPLITS = (1, None, 5)


def _cfg(B, Sq, Hq, Hkv, D, cap, page, splits, causal, window, leftpad, softcap=False, sink=False, dtype=BF):
    """The DecodeConfig a call of these sizes runs (the real plan, on meta tensors)."""
    q = torch.empty(B, Sq, Hq, D, dtype=dtype, device="meta")
    if page:
        pps = -(-cap // page)
        k = torch.empty(B * pps + 1, page, Hkv, D, dtype=dtype, device="meta")
        bt = torch.empty(B, pps, dtype=torch.int32, device="meta")
    else:
        k, bt = torch.empty(B, cap, Hkv, D, dtype=dtype, device="meta"), None
    c, w = DP.check_window(window, causal)
    return DP.plan_uncached(q, k, bt, splits, c, softcap, sink, w, leftpad)[0]


def gpu_configs():
    cfgs = []
    for page, Sq, (causal, window), mode, splits in itertools.product((0, 16), (1, 4), GPU_WINDOWS, PAD_MODES, SPLITS):
        cfgs.append(_cfg(len(GPU_LENS), Sq, 8, 2, 128, GPU_LMAX, page, splits, causal, window, mode is not None))
    for D, dtype, splits in itertools.product((64, 256), (BF, torch.float16), (1, 4)):
        cfgs.append(_cfg(4, 3, 16, 2, D, 1031, 0, splits, True, (300, 0), True, True, True, dtype))
    for page, splits in itertools.product((0, 64), (1, None)):
        for window, pads in (((10 ** 6, 0), False), ((-1, -1), True), ((-1, -1), False)):
            cfgs.append(_cfg(3, 2, 16, 4, 128, 3000, page, splits, True, window, pads))
    cfgs.append(_cfg(2, 2, 16, 4, 128, 8192, 0, 16, True, (700, 0), True))
    for Sq, splits, (window, pads) in itertools.product((1, 3), (1, None, 16), (((4096, 0), False), ((1, 0), True),
                                                                                 ((-1, -1), True))):
        cfgs.append(_cfg(2, Sq, 16, 2, 128, 200_000, 0, splits, True, window, pads))
    return list(dict.fromkeys(cfgs))


@pytest.fixture(scope="module", autouse=True)
def _precompile_for_gpu_tests(request):
    precompile_for_module_gpu_tests(request, lambda: DE.precompile(gpu_configs()))


def _run_case(q, k, v, s, lens, Sq, causal, window, pads, page, splits, what, seed=0, **kw):
    """NaN where nothing may be read, NaN-filled out / workspace, one call, checked against the float32
    reference on the same (poisoned) cache."""
    left, _ = sides(causal, window)
    k, v = k.clone(), v.clone()
    firsts = poison(k, v, lens, Sq, left, pads)
    if page:
        kc, vc, bt = to_pages(k, v, page, firsts, seed=seed)
    else:
        kc, vc, bt = k, v, None
    dev = "cuda"
    q, kc, vc, s = q.to(dev), kc.to(dev), vc.to(dev), s.to(dev)
    bt = None if bt is None else bt.to(dev)
    pads = None if pads is None else pads.to(dev)
    out = torch.full_like(q, NAN)
    ws = None
    if splits is not None and splits > 1:
        ws = decode_attn_workspace(q, splits)
        ws.fill_(NAN)
    o, lse = decode_attn(q, kc, vc, cache_seqlens=s, block_table=bt, num_splits=splits, causal=causal,
                         window_size=window, cache_leftpad=pads, out=out, workspace=ws, return_lse=True, **kw)
    assert o.data_ptr() == out.data_ptr()
    ro, rl = decode_attn_reference(q, kc, vc, s, bt, causal, kw.get("softmax_scale"), kw.get("softcap", 0.0),
                                   kw.get("learnable_sink"), window, pads)
    torch.cuda.synchronize()
    check_close(o, lse, ro, rl, what)
    return o, lse


@gpu
@pytest.mark.parametrize("page", [0, 16], ids=["contiguous-tma", "paged16"])
@pytest.mark.parametrize("Sq", [1, 4])
@pytest.mark.parametrize("causal,window", GPU_WINDOWS, ids=[f"{'causal' if c else 'full'}-{w}" for c, w in GPU_WINDOWS])
def test_gpu_windows_and_paddings(page, Sq, causal, window):
    """Lengths 1, 17, 61, 64 (a tile), 127, 1000, 4099 (primes, > a tile), 0; GQA 4; windows smaller and
    larger than the cache; paddings none / 0 / some / all; 1, planned and 5 splits."""
    q, k, v, s = make(len(GPU_LENS), Sq, 8, 2, 128, GPU_LENS, GPU_LMAX, seed=Sq + 10 * page)
    for mode, splits in itertools.product(PAD_MODES, SPLITS):
        pads = leftpads(mode, GPU_LENS, seed=Sq)
        _run_case(q, k, v, s, GPU_LENS, Sq, causal, window, pads, page, splits,
                  f"page={page} Sq={Sq} causal={causal} window={window} pad={mode} splits={splits}")


@gpu
@pytest.mark.parametrize("D", [64, 256])
@pytest.mark.parametrize("dtype", [BF, torch.float16], ids=["bf16", "fp16"])
def test_gpu_head_dims_with_softcap_and_sink(D, dtype):
    lens = [0, 1, 613, 1031]
    q, k, v, s = make(4, 3, 16, 2, D, lens, 1031, seed=D, dtype=dtype)
    pads = torch.tensor([0, 0, 400, 17], dtype=torch.int32)
    sink = torch.linspace(-2.0, 3.0, 16, device="cuda")
    for splits in (1, 4):
        _run_case(q, k, v, s, lens, 3, True, (300, 0), pads, 0, splits, f"D={D} {dtype} splits={splits}",
                  softcap=20.0, learnable_sink=sink)


@gpu
@pytest.mark.parametrize("L", [201, 203, 205])
def test_gpu_padding_with_sink_past_one_tile(L):
    """The case of the gpt-oss padded generation that disagreed with eager on the H200 (2026-12-03,
    NOTES-decode): one new token, 8 query heads on 2 KV heads, D 64, bf16, a left padding of 37 in
    a cache of two tiles, sinks around 2 (a trained gpt-oss's are of that size), no window."""
    q, k, v, s = make(2, 1, 8, 2, 64, [L, L], L, seed=L)
    pads = torch.tensor([37, 0], dtype=torch.int32)
    sink = (torch.randn(8, generator=torch.Generator().manual_seed(L)) * 2 + 2).cuda()
    for splits in (1, None):
        _run_case(q, k, v, s, [L, L], 1, True, (-1, -1), pads, 0, splits, f"L={L} splits={splits}",
                  learnable_sink=sink)


@gpu
@pytest.mark.parametrize("L", [64, 67])
def test_gpu_sliding_layer_with_padding_and_sink(L):
    """The same generation's sliding layers, in case their steps took the padded route: a 64-key window
    ((63, 0)) with a small left padding and sinks, one token, GQA 4, D 64."""
    q, k, v, s = make(2, 1, 8, 2, 64, [L, L], L, seed=L)
    pads = torch.tensor([5, 0], dtype=torch.int32)
    sink = (torch.randn(8, generator=torch.Generator().manual_seed(L)) * 2 + 2).cuda()
    for splits in (1, None):
        _run_case(q, k, v, s, [L, L], 1, True, (63, 0), pads, 0, splits, f"L={L} splits={splits}",
                  learnable_sink=sink)


@gpu
@pytest.mark.parametrize("page", [0, 64], ids=["contiguous-tma", "paged64"])
def test_gpu_bitwise_equal_to_plain_where_nothing_is_bounded(page):
    """A window wider than the cache and a padding of zeros run the window / padding kernels over the
    same tiles and splits as the plain kernel: the same bits."""
    lens, L = [3000, 1, 1777], 3000
    q, k, v, s = make(3, 2, 16, 4, 128, lens, L, seed=4)
    q, k, v, s = q.cuda(), k.cuda(), v.cuda(), s.cuda()
    bt = None
    if page:
        kp, vp, bt = to_pages(k.cpu(), v.cpu(), page)
        k, v, bt = kp.cuda(), vp.cuda(), bt.cuda()
    zero = torch.zeros(3, dtype=torch.int32, device="cuda")
    for splits in (1, None):
        plain = decode_attn(q, k, v, cache_seqlens=s, block_table=bt, num_splits=splits, return_lse=True)
        for kw in (dict(window_size=(10 ** 6, 0)), dict(cache_leftpad=zero)):
            got = decode_attn(q, k, v, cache_seqlens=s, block_table=bt, num_splits=splits, return_lse=True, **kw)
            assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1]), (kw, splits)


@gpu
@pytest.mark.parametrize("Sq", [1, 3])
def test_gpu_long_cache_cpasync(Sq):
    """A cache over the TMA bound (cp.async loads): windows of 4096 and 1 keys and a padding of most of a
    200k-token sequence; the window plans fewer splits than the capacity would."""
    lens, L = [199_999, 65_537], 200_000
    q, k, v, s = make(2, Sq, 16, 2, 128, lens, L, seed=Sq)
    assert DP.load_for(False, DP.kv_bytes(2, k, None)) == "cpasync"
    assert _cfg(2, Sq, 16, 2, 128, L, 0, None, True, (4096, 0), False).load == "cpasync"
    pads = torch.tensor([150_000, 3], dtype=torch.int32)
    for splits in (1, None, 16):
        for window, p in (((4096, 0), None), ((1, 0), pads), ((-1, -1), pads)):
            _run_case(q, k, v, s, lens, Sq, True, window, p, 0, splits, f"Sq={Sq} window={window} splits={splits}")


@gpu
def test_gpu_bad_device_values_stay_in_bounds():
    """Unchecked: paddings below 0 / past the length are clamped (the reference clamps the same way);
    checked: ValueError naming cache_leftpad."""
    lens = [500, 64, 1]
    q, k, v, s = make(3, 2, 8, 2, 128, lens, 512, seed=8)
    q, k, v, s = q.cuda(), k.cuda(), v.cuda(), s.cuda()
    pads = torch.tensor([-(10 ** 6), 10 ** 6, 1], dtype=torch.int32, device="cuda")
    for splits in (1, 3):
        o, lse = decode_attn(q, k, v, cache_seqlens=s, window_size=(200, 0), cache_leftpad=pads, num_splits=splits,
                             return_lse=True)
        ro, rl = decode_attn_reference(q, k, v, s, window_size=(200, 0), cache_leftpad=pads)
        torch.cuda.synchronize()
        check_close(o, lse, ro, rl, f"clamped paddings, splits={splits}")
        assert (o[1:] == 0).all()
    with pytest.raises(ValueError, match="cache_leftpad"):
        decode_attn(q, k, v, cache_seqlens=s, cache_leftpad=pads, checked=True)


@gpu
def test_gpu_cuda_graph_replay_with_new_paddings():
    """Captured once (fixed splits, workspace), replayed with new lengths and paddings."""
    B, Sq, Hq, Hkv, D, L = 2, 2, 16, 4, 128, 8192
    q, k, v, s = make(B, Sq, Hq, Hkv, D, [6000, 300], L, seed=9)
    q, k, v, s = q.cuda(), k.cuda(), v.cuda(), s.cuda()
    pads = torch.tensor([100, 0], dtype=torch.int32, device="cuda")
    P = 16
    ws = decode_attn_workspace(q, P)
    out = torch.empty_like(q)
    kw = dict(num_splits=P, out=out, workspace=ws, window_size=(700, 0), cache_leftpad=pads)
    decode_attn(q, k, v, cache_seqlens=s, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attn(q, k, v, cache_seqlens=s, **kw)
    for lens, pad, seed in (([6000, 300], [100, 0], 1), ([8192, 1], [8000, 1], 2), ([17, 0], [0, 0], 3),
                            ([4097, 8000], [4000, 7999], 4)):
        q2, k2, v2, s2 = make(B, Sq, Hq, Hkv, D, lens, L, seed=seed)
        q.copy_(q2), k.copy_(k2), v.copy_(v2), s.copy_(s2), pads.copy_(torch.tensor(pad, dtype=torch.int32))
        out.fill_(NAN)
        graph.replay()
        torch.cuda.synchronize()
        ro, rl = decode_attn_reference(q, k, v, s, window_size=(700, 0), cache_leftpad=pads)
        check_close(out, None, ro, rl, f"graph replay {lens} pad={pad}")
