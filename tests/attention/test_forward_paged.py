"""flash_attn with a paged K/V cache (block_table, seqused_k).

CPU: every bad argument of the paged API raises naming it, before any launch (shape errors before
device errors); the page-size rule; checked mode's reading of lengths and page ids; plans and compile
keys (the page size is in them, lengths never); the pure-torch paged reference (gather the pages, then
the dense / packed reference) against the contiguous K/V it was made from.
GPU (``-m gpu``): page sizes 16, 48, 64, 256 with shuffled pages, bitwise equal to the dense kernel on
each sequence's contiguous K/V, dense and packed q, causal and windowed, empty and length-1 sequences;
chunked prefill against the cache equals one dense prefill; out-of-range lengths / page ids stay in
bounds (unchecked) and raise (checked); NaN in pages no sequence uses never reaches O; a CUDA graph
replayed with shorter lengths and other pages.  Outputs are NaN-poisoned before every launch.
"""

from __future__ import annotations

import pytest
import torch

from cute_kernels.attention import forward as FW
from cute_kernels.attention.forward import flash_attn
from cute_kernels.common import jit
from cute_kernels.testing import count_launches
from _check import assert_raises_before_any_launch
from test_forward_varlen import check_window_result, cu_seqlens, window_reference


HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
NAN = float("nan")
PAGE_SIZES = (16, 48, 64, 256)


# ------------------------------------------------------------------------------------------ paged caches
def make_paged(lens_k, page_size, Hkv, D, dtype=torch.bfloat16, device="cpu", seed=0, extra_pages=3,
               extra_cols=1, tail=1e3, unused=0.0):
    """A shuffled page pool holding one contiguous K/V per sequence: ``(k_pages, v_pages, block_table,
    seqused_k, ks, vs)`` with ``ks[b]`` / ``vs[b]`` (L_b, Hkv, D) the sequence's keys.  Rows of a last
    page past the length hold ``tail`` (finite, large: masking must remove them), pages no sequence
    uses hold ``unused`` (NaN to check they are never read), block-table columns past a sequence's
    pages hold out-of-range ids (never read).  Pages 0 and ``num_pages - 1`` are always unused: an
    address that falls back to page 0 (or the last page) by mistake reads NaN."""
    assert extra_pages >= 2
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // page_size) for n in lens_k]
    num_pages = sum(need) + extra_pages
    perm = 1 + torch.randperm(num_pages - 2, generator=g)
    width = max(need + [1]) + extra_cols
    kp = torch.full((num_pages, page_size, Hkv, D), unused)
    vp = torch.full((num_pages, page_size, Hkv, D), unused)
    bt = torch.full((len(lens_k), width), -7, dtype=torch.int32)
    ks, vs, nxt = [], [], 0
    for b, n in enumerate(lens_k):
        k = torch.randn(n, Hkv, D, generator=g)
        v = torch.randn(n, Hkv, D, generator=g)
        for p in range(need[b]):
            page = int(perm[nxt])
            nxt += 1
            bt[b, p] = page
            rows = slice(p * page_size, min((p + 1) * page_size, n))
            cnt = rows.stop - rows.start
            kp[page].fill_(tail)
            vp[page].fill_(tail)
            kp[page, :cnt] = k[rows]
            vp[page, :cnt] = v[rows]
        ks.append(k.to(dtype).to(device))
        vs.append(v.to(dtype).to(device))
    sk = torch.tensor(lens_k, dtype=torch.int32)
    return kp.to(dtype).to(device), vp.to(dtype).to(device), bt.to(device), sk.to(device), ks, vs


def gather_pages(k_pages, block_table, seqused_k):
    """The pure-torch inverse of :func:`make_paged`: each sequence's (L_b, Hkv, D) keys from its pages."""
    ps = k_pages.shape[1]
    out = []
    for b, n in enumerate(seqused_k.tolist()):
        ids = block_table[b, : -(-n // ps)].long()
        out.append(k_pages[ids].reshape(-1, *k_pages.shape[2:])[:n])
    return out


def paged_reference(q, k_pages, v_pages, block_table, seqused_k, cu_q=None, causal=False, window=(-1, -1)):
    """float32 reference: gather the pages, then the dense reference per sequence (q dense (B, Sq, Hq,
    D): o (B, Sq, Hq, D), lse (B, Hq, Sq); packed with ``cu_q``: o (total_q, Hq, D), lse (Hq, total_q))."""
    ks, vs = gather_pages(k_pages, block_table, seqused_k), gather_pages(v_pages, block_table, seqused_k)
    if cu_q is None:
        outs = [window_reference(q[b:b + 1], ks[b][None], vs[b][None], causal, window) for b in range(q.shape[0])]
        return torch.cat([o for o, _ in outs]), torch.cat([l for _, l in outs])
    o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device)
    c = cu_q.tolist()
    for b in range(len(c) - 1):
        if c[b + 1] > c[b]:
            ob, lb = window_reference(q[None, c[b]:c[b + 1]], ks[b][None], vs[b][None], causal, window)
            o[c[b]:c[b + 1]], lse[:, c[b]:c[b + 1]] = ob[0], lb[0]
    return o, lse


def test_gather_pages_inverts_make_paged():
    for ps in PAGE_SIZES:
        kp, vp, bt, sk, ks, vs = make_paged([0, 1, ps - 1, ps, 3 * ps + 5], ps, 2, 64, unused=NAN)
        for got, want in zip(gather_pages(kp, bt, sk) + gather_pages(vp, bt, sk), ks + vs):
            assert torch.equal(got, want)


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (5, 2))])
def test_paged_reference_is_the_contiguous_reference(causal, window):
    kp, vp, bt, sk, ks, vs = make_paged([7, 40, 1], 16, 2, 64)
    q = torch.randn(3, 9, 4, 64).bfloat16()
    o, lse = paged_reference(q, kp, vp, bt, sk, causal=causal, window=window)
    for b in range(3):
        ro, rl = window_reference(q[b:b + 1], ks[b][None], vs[b][None], causal, window)
        assert torch.equal(o[b:b + 1], ro) and torch.equal(lse[b:b + 1], rl)
    cq = cu_seqlens([2, 0, 5])
    qp = torch.randn(7, 4, 64).bfloat16()
    o, lse = paged_reference(qp, kp, vp, bt, sk, cq, causal, window)
    ro, rl = window_reference(qp[None, 2:7], ks[2][None], vs[2][None], causal, window)
    assert torch.equal(o[2:7], ro[0]) and torch.equal(lse[:, 2:7], rl[0])


# ------------------------------------------------------------------------------------------ CPU: validation
_DROP = object()


def _paged_kw(**over):
    kp, vp, bt, sk, _, _ = make_paged([5, 20], 16, 2, 64)
    kw = dict(q=torch.randn(2, 3, 4, 64).bfloat16(), k=kp, v=vp, block_table=bt, seqused_k=sk)
    kw.update(over)
    return {a: b for a, b in kw.items() if b is not _DROP}


def _bf(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


BAD_PAGED = [
    ("seqused-without-bt", dict(block_table=_DROP), ValueError, "seqused_k is given without block_table"),
    ("bt-without-seqused", dict(seqused_k=_DROP), ValueError, "block_table is given without seqused_k"),
    ("cu-k-with-bt", dict(cu_seqlens_k=torch.tensor([0, 5, 25], dtype=torch.int32)), ValueError,
     "cu_seqlens_k cannot be used with block_table"),
    ("max-k-past-capacity", dict(max_seqlen_k=49), ValueError, r"max_seqlen_k \(49\) must be at most the paged capacity 48"),
    ("max-k-float", dict(max_seqlen_k=20.0), TypeError, "max_seqlen_k must be a Python int"),
    ("max-k-negative", dict(max_seqlen_k=-1), ValueError, "max_seqlen_k must be >= 0"),
    ("max-k-accepted", dict(max_seqlen_k=48), ValueError, "q is on cpu"),  # a hint within the capacity: fine
    ("max-q-without-cu-q", dict(max_seqlen_q=3), ValueError, "max_seqlen_q is given without cu_seqlens_q"),
    ("bt-not-tensor", dict(block_table=[[0, 1], [2, 3]]), TypeError, "block_table must be a torch.Tensor"),
    ("seqused-not-tensor", dict(seqused_k=[5, 20]), TypeError, "seqused_k must be a torch.Tensor"),
    ("bt-rank", dict(block_table=torch.zeros(4, dtype=torch.int32)), ValueError, "block_table must be 2-d"),
    ("seqused-rank", dict(seqused_k=torch.zeros(2, 1, dtype=torch.int32)), ValueError, "seqused_k must be 1-d"),
    ("k-rank", dict(k=_bf(5, 16, 64), v=_bf(5, 16, 64)), ValueError, "k must be 4-d"),
    ("q-rank", dict(q=_bf(6, 4, 64)), ValueError, "q must be 4-d"),
    ("bt-batch", dict(block_table=torch.zeros(3, 2, dtype=torch.int32)), ValueError, r"block_table must be \(2, max_pages\)"),
    ("bt-no-pages", dict(block_table=torch.zeros(2, 0, dtype=torch.int32)), ValueError, "block_table needs at least one page"),
    ("seqused-batch", dict(seqused_k=torch.zeros(3, dtype=torch.int32)), ValueError, r"seqused_k must be \(2,\)"),
    ("no-pages", dict(k=_bf(0, 16, 2, 64), v=_bf(0, 16, 2, 64)), ValueError, "k has no pages"),
    ("page-size-8", dict(k=_bf(4, 8, 2, 64), v=_bf(4, 8, 2, 64)), ValueError, "k page_size .* multiple of 16 from 16 to 256, got 8"),
    ("page-size-24", dict(k=_bf(4, 24, 2, 64), v=_bf(4, 24, 2, 64)), ValueError, "page_size .* got 24"),
    ("page-size-272", dict(k=_bf(2, 272, 2, 64), v=_bf(2, 272, 2, 64)), ValueError, "page_size .* got 272"),
    ("head-dim", dict(q=_bf(2, 3, 4, 80)), ValueError, "q head_dim must be one of"),
    ("k-head-dim", dict(k=_bf(4, 16, 2, 128), v=_bf(4, 16, 2, 128)), ValueError, r"k head_dim \(128\)"),
    ("v-shape", dict(v=_bf(5, 16, 2, 64)), ValueError, "v shape"),
    ("gqa", dict(k=_bf(6, 16, 3, 64), v=_bf(6, 16, 3, 64)), ValueError, "multiple of k/v heads"),
    ("out-shape", dict(out=_bf(2, 4, 4, 64)), ValueError, "out shape"),
    ("q-dtype", dict(q=torch.randn(2, 3, 4, 64)), TypeError, "q must be float16 or bfloat16"),
    ("k-dtype", dict(k=torch.randn(6, 16, 2, 64), v=torch.randn(6, 16, 2, 64)), TypeError, "k dtype"),
    ("bt-int64", dict(block_table=torch.zeros(2, 3, dtype=torch.int64)), TypeError, "block_table must be int32"),
    ("seqused-float", dict(seqused_k=torch.tensor([5.0, 20.0])), TypeError, "seqused_k must be int32"),
    ("bt-strided", dict(block_table=torch.zeros(2, 6, dtype=torch.int32)[:, ::2]), ValueError,
     "block_table must be contiguous in its last dim"),
    ("seqused-strided", dict(seqused_k=torch.zeros(4, dtype=torch.int32)[::2]), ValueError,
     "seqused_k must be contiguous"),
    ("k-stride", dict(k=_bf(6, 16, 2, 128)[..., ::2]), ValueError, "k must be contiguous in the head dim"),
    ("window", dict(window_size=(-3, 0)), ValueError, r"window_size \(-3, 0\) is empty"),
    ("cpu", dict(), ValueError, "q is on cpu"),
]


@pytest.mark.parametrize("over,exc,match", [c[1:] for c in BAD_PAGED], ids=[c[0] for c in BAD_PAGED])
def test_paged_bad_inputs_raise_before_any_launch(over, exc, match):
    kw = _paged_kw(**over)
    assert_raises_before_any_launch(exc, match, flash_attn, kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)


BAD_PAGED_VARLEN = [
    ("cu-q-int64", dict(cu_seqlens_q=torch.tensor([0, 3, 8])), TypeError, "cu_seqlens_q must be int32"),
    ("cu-q-rank", dict(cu_seqlens_q=torch.zeros(1, 3, dtype=torch.int32)), ValueError, "cu_seqlens_q must be 1-d"),
    ("cu-q-batch", dict(cu_seqlens_q=torch.tensor([0, 8], dtype=torch.int32)), ValueError,
     r"block_table must be \(1, max_pages\)"),
    ("max-q-missing", dict(max_seqlen_q=_DROP), ValueError, "max_seqlen_q is required"),
    ("max-q-tensor", dict(max_seqlen_q=torch.tensor(5)), TypeError, "max_seqlen_q must be a Python int"),
    ("q-rank-4", dict(q=_bf(1, 8, 4, 64)), ValueError, "q must be 3-d"),
    ("out-rank", dict(out=_bf(8, 256)), ValueError, "out must be 3-d"),
    ("cpu", dict(), ValueError, "q is on cpu"),
]


@pytest.mark.parametrize("over,exc,match", [c[1:] for c in BAD_PAGED_VARLEN], ids=[c[0] for c in BAD_PAGED_VARLEN])
def test_paged_varlen_bad_inputs_raise_before_any_launch(over, exc, match):
    base = dict(q=_bf(8, 4, 64), cu_seqlens_q=cu_seqlens([3, 5]), max_seqlen_q=5)
    base.update(over)
    kw = _paged_kw(**base)
    assert_raises_before_any_launch(exc, match, flash_attn, kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)


@pytest.mark.parametrize("page_size", [16, 32, 48, 64, 80, 128, 144, 256])
def test_page_sizes_that_pass_validation(page_size):
    """Every multiple of 16 up to 256 gets past validation (CPU tensors: the device check is last)."""
    kw = _paged_kw(k=_bf(4, page_size, 2, 64), v=_bf(4, page_size, 2, 64))
    with pytest.raises(ValueError, match="q is on cpu"):
        flash_attn(kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)


def test_paged_checked_values_on_cpu():
    kp, vp, bt, sk, _, _ = make_paged([5, 20], 16, 2, 64)
    FW.check_paged_values(kp, bt, sk)  # fine (the -7 columns past the used pages are never looked at)
    cap = bt.shape[1] * 16
    for lens, match in (([-1, 20], r"seqused_k\[0\] = -1"), ([5, cap + 1], rf"seqused_k\[1\] = {cap + 1}")):
        with pytest.raises(ValueError, match=match):
            FW.check_paged_values(kp, bt, torch.tensor(lens, dtype=torch.int32))
    bad = bt.clone()
    bad[1, 1] = kp.shape[0]
    with pytest.raises(ValueError, match=r"block_table\[1\] has page ids outside"):
        FW.check_paged_values(kp, bad, sk)
    bad = bt.clone()
    bad[0, 0] = -1
    with pytest.raises(ValueError, match=r"block_table\[0\]"):
        FW.check_paged_values(kp, bad, sk)


def test_paged_plans_and_config_rules():
    from cute_kernels.attention.forward_kernel import fwd_config

    for ps in PAGE_SIZES:
        cfg = FW.plan(torch.bfloat16, 128, True, page_size=ps)
        assert cfg.paged and cfg.page_size == ps and cfg.causal
        assert cfg != FW.plan(torch.bfloat16, 128, True)
        v = FW.plan(torch.bfloat16, 128, False, varlen=True, page_size=ps)
        assert v.varlen and v.tile == FW.plan(torch.bfloat16, 128, False).tile
    for bad in (8, 24, 272):
        with pytest.raises(ValueError, match="page_size"):
            fwd_config("bfloat16", 128, False, page_size=bad)
    assert not fwd_config("bfloat16", 128, False).paged


def test_paged_plan_ignores_lengths_and_batch():
    """Lengths, batch, pages and block-table width never reach the compile key (dry run)."""
    seen = set()
    for B, Sq, lens, width in ((1, 5, [3], 1), (3, 70, [100, 0, 7], 9)):
        kp, vp, bt, sk, _, _ = make_paged(lens, 64, 2, 128, extra_cols=width)
        with jit.dry_run() as dry:
            FW._run(FW.Call(FW.PAGED, False, 0.1, block_table=bt, seqused_k=sk), _bf(B, Sq, 4, 128), kp, vp, None, None)
        seen.update(dry.seen)
    assert seen == {("flash_attn_fwd", FW.plan(torch.bfloat16, 128, False, page_size=64))}


def test_warmup_paged_spec():
    with jit.dry_run() as dry:
        FW.warmup_flash_attn(dict(dtype="bfloat16", head_dim=64, causal=True, page_size=48))
    assert dry.seen == [("flash_attn_fwd", FW.plan(torch.bfloat16, 64, True, page_size=48))]
    with pytest.raises(ValueError, match="page_size"):
        FW.warmup_flash_attn(dict(head_dim=64, page_size=40))


def test_paged_empty_problems_launch_nothing():
    kp, vp, bt, sk, _, _ = make_paged([5], 16, 2, 64)
    with count_launches() as n, jit.dry_run() as dry:
        FW._run(FW.Call(FW.PAGED, False, 0.1, block_table=bt, seqused_k=sk), _bf(1, 0, 4, 64), kp, vp, None, None)
        FW._run(FW.Call(FW.PAGED_PACKED, False, 0.1, cu_seqlens_q=cu_seqlens([0]), block_table=bt, seqused_k=sk),
                _bf(0, 4, 64), kp, vp, None, None)
        FW._run(FW.Call(FW.PAGED_PACKED, False, 0.1, cu_seqlens_q=cu_seqlens([3]), block_table=bt, seqused_k=sk),
                _bf(3, 4, 64), kp, vp, None, None)
    assert n.total() == 0 and dry.seen == []


# ------------------------------------------------------------------------------------------ GPU
def run_paged_poisoned(q, kp, vp, bt, sk, cu_q=None, max_q=None, causal=False, window=(-1, -1)):
    """flash_attn with NaN-poisoned out (rows outside packed sequences stay NaN); returns (o, lse)."""
    out = torch.full_like(q, NAN)
    kw = {} if cu_q is None else dict(cu_seqlens_q=cu_q, max_seqlen_q=max_q)
    return flash_attn(q, kp, vp, block_table=bt, seqused_k=sk, causal=causal, window_size=window, out=out,
                      return_lse=True, **kw)


def check_paged(o, lse, q, ks, vs, cu_q, causal, window, what=""):
    """Per sequence: within the reference tolerance (:func:`check_window_result`) and bitwise equal to
    the dense kernel on the sequence's contiguous K/V; packed rows outside every sequence still NaN."""
    B = len(ks)
    written = torch.zeros(q.shape[0], dtype=torch.bool, device=q.device)
    for b in range(B):
        if cu_q is None:
            qs, ob, lb = q[b:b + 1], o[b:b + 1], lse[b:b + 1]
        else:
            c0, c1 = int(cu_q[b]), int(cu_q[b + 1])
            written[c0:c1] = True
            if c1 == c0:
                continue
            qs, ob, lb = q[None, c0:c1], o[None, c0:c1], lse[None, :, c0:c1]
        tag = f"{what} seq {b} ({qs.shape[1]}x{ks[b].shape[0]})"
        if ks[b].shape[0] == 0:
            assert (ob == 0).all() and torch.isneginf(lb).all(), f"{tag}: no key must give O = 0, LSE = -inf"
            continue
        check_window_result(ob, lb, qs, ks[b][None], vs[b][None], causal, window, what=tag)
        do, dl = flash_attn(qs, ks[b][None], vs[b][None], causal=causal, window_size=window, return_lse=True)
        assert torch.equal(do, ob), f"{tag}: O differs from the dense kernel on the contiguous K/V"
        assert torch.equal(dl, lb), f"{tag}: LSE differs from the dense kernel on the contiguous K/V"
    if cu_q is not None:
        assert torch.isnan(o[~written]).all(), f"{what}: rows outside every sequence were written"


PAGED_LENS = [[1], [0, 5, 1], [16, 47, 48, 49, 64, 200], [300, 129, 1000]]


@gpu
@pytest.mark.parametrize("D", FW.HEAD_DIMS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_paged_dense_q(causal, page_size, D):
    for lens in PAGED_LENS:
        for Sq in (1, 37, 130):
            kp, vp, bt, sk, ks, vs = make_paged(lens, page_size, 2, D, device="cuda", unused=NAN)
            q = torch.randn(len(lens), Sq, 4, D, device="cuda").bfloat16()
            o, lse = run_paged_poisoned(q, kp, vp, bt, sk, causal=causal)
            check_paged(o, lse, q, ks, vs, None, causal, (-1, -1), what=f"ps={page_size} D={D} Sq={Sq} {lens}")


@gpu
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_paged_varlen_q(causal, page_size, D):
    for lens_q, lens_k in (([1], [1]), ([0, 5, 1, 3], [3, 7, 0, 3]), ([1, 127, 200, 64], [500, 127, 300, 64])):
        kp, vp, bt, sk, ks, vs = make_paged(lens_k, page_size, 2, D, device="cuda", unused=NAN)
        cq = cu_seqlens(lens_q, "cuda")
        q = torch.randn(sum(lens_q) + 3, 8, D, device="cuda").bfloat16()
        o, lse = run_paged_poisoned(q, kp, vp, bt, sk, cq, max(lens_q), causal)
        check_paged(o, lse, q, ks, vs, cq, causal, (-1, -1), what=f"ps={page_size} D={D} {lens_q}/{lens_k}")


@gpu
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("page_size", [16, 48, 256])
@pytest.mark.parametrize("causal,window", [(False, (17, 3)), (True, (64, -1)), (False, (0, 0)), (True, (300, 0)),
                                           (False, (-1, 40))])
def test_gpu_paged_window(causal, window, page_size, D):
    lens_k = [1, 90, 700]
    kp, vp, bt, sk, ks, vs = make_paged(lens_k, page_size, 2, D, device="cuda", unused=NAN)
    q = torch.randn(3, 150, 4, D, device="cuda").bfloat16()
    o, lse = run_paged_poisoned(q, kp, vp, bt, sk, causal=causal, window=window)
    check_paged(o, lse, q, ks, vs, None, causal, window, what=f"dense q ps={page_size} D={D} w={window}")
    cq = cu_seqlens([5, 90, 400], "cuda")
    qp = torch.randn(495, 4, D, device="cuda").bfloat16()
    o, lse = run_paged_poisoned(qp, kp, vp, bt, sk, cq, 400, causal, window)
    check_paged(o, lse, qp, ks, vs, cq, causal, window, what=f"packed q ps={page_size} D={D} w={window}")


@gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("page_size", [16, 48, 64, 256])
def test_gpu_chunked_prefill_equals_one_prefill(page_size, D):
    """A sequence prefilled in three chunks against the paged cache (each chunk's K/V written into its
    pages first, then its queries attend causally to everything cached) equals one dense causal
    prefill: bitwise when the chunks start on query-tile boundaries (the same tiles of every row),
    within rounding otherwise."""
    L, Hq, Hkv = 1000, 4, 2
    q = torch.randn(1, L, Hq, D, device="cuda").bfloat16()
    k = torch.randn(1, L, Hkv, D, device="cuda").bfloat16()
    v = torch.randn(1, L, Hkv, D, device="cuda").bfloat16()
    ref, ref_lse = flash_attn(q, k, v, causal=True, return_lse=True)
    pages = -(-L // page_size)
    for bounds, exact in (((0, 384, 768, L), True), ((0, 300, 701, L), False)):
        order = (1 + torch.randperm(pages, device="cuda")).int()
        # rows past the length of the last page: finite (the documented contract); the unused pages
        # (0 and the last, where a wrong address would most likely fall) NaN
        kp = torch.zeros(pages + 2, page_size, Hkv, D, device="cuda").bfloat16()
        kp[[0, pages + 1]] = NAN
        vp = kp.clone()
        bt = order[None].contiguous()
        outs, lses = [], []
        for c0, c1 in zip(bounds[:-1], bounds[1:]):
            for t in range(c0, c1):  # append the chunk's K/V to the cache
                kp[order[t // page_size], t % page_size] = k[0, t]
                vp[order[t // page_size], t % page_size] = v[0, t]
            sk = torch.tensor([c1], dtype=torch.int32, device="cuda")
            o, lse = run_paged_poisoned(q[:, c0:c1], kp, vp, bt, sk, causal=True)
            outs.append(o)
            lses.append(lse)
        o, lse = torch.cat(outs, 1), torch.cat(lses, 2)
        if exact:
            assert torch.equal(o, ref) and torch.equal(lse, ref_lse), bounds
        else:
            assert (o.float() - ref.float()).abs().max() < 2e-2 and (lse - ref_lse).abs().max() < 1e-3, bounds


@gpu
def test_gpu_paged_out_of_range_values_stay_in_bounds_and_checked_raises(monkeypatch):
    """Page ids past the pool / negative and lengths past the capacity are clamped on the device
    (results equal the call with the clamped values); checked mode raises for each."""
    D, ps = 128, 48
    kp, vp, bt, sk, ks, vs = make_paged([100, 50], ps, 2, D, device="cuda")
    q = torch.randn(2, 20, 4, D, device="cuda").bfloat16()
    bad_bt = bt.clone()
    bad_bt[0, 0], bad_bt[1, 1] = 10 ** 6, -3
    clamped_bt = bad_bt.clamp(0, kp.shape[0] - 1)
    o, lse = run_paged_poisoned(q, kp, vp, bad_bt, sk)
    eo, el = run_paged_poisoned(q, kp, vp, clamped_bt, sk)
    assert torch.equal(o, eo) and torch.equal(lse, el)
    cap = bt.shape[1] * ps
    long_sk = torch.tensor([cap + 500, -4], dtype=torch.int32, device="cuda")
    o, lse = run_paged_poisoned(q, kp, vp, clamped_bt, long_sk)
    eo, el = run_paged_poisoned(q, kp, vp, clamped_bt, torch.tensor([cap, 0], dtype=torch.int32, device="cuda"))
    assert torch.equal(o, eo) and torch.equal(lse, el)
    for args in ((bad_bt, sk), (bt, long_sk)):
        with pytest.raises(ValueError, match="block_table|seqused_k"):
            flash_attn(q, kp, vp, block_table=args[0], seqused_k=args[1], checked=True)
    monkeypatch.setenv("CUTE_KERNELS_CHECKED", "1")
    with pytest.raises(ValueError, match=r"block_table\[0\]"):
        flash_attn(q, kp, vp, block_table=bad_bt, seqused_k=sk)


@gpu
def test_gpu_paged_cuda_graph_replays_shorter_lengths():
    """Capture once; replay with shorter (and empty) lengths and a reshuffled block table written into
    the same buffers: every replay equals an eager call."""
    from conftest import capture_graph

    D, ps = 128, 64
    kp, vp, bt, sk, _, _ = make_paged([900, 500, 64], ps, 2, D, device="cuda")
    q = torch.randn(3, 100, 8, D, device="cuda").bfloat16()
    out = torch.empty_like(q)
    res = {}

    def step():
        res["o"], res["lse"] = flash_attn(q, kp, vp, block_table=bt, seqused_k=sk, causal=True, out=out,
                                          return_lse=True)

    g = capture_graph(step)
    for lens in ([1, 0, 64], [899, 129, 3], [900, 500, 64]):
        sk.copy_(torch.tensor(lens, dtype=torch.int32))
        bt.copy_(bt[torch.tensor([1, 2, 0])] if lens[0] == 1 else bt)
        out.fill_(NAN)
        g.replay()
        torch.cuda.synchronize()
        eo, el = flash_attn(q, kp, vp, block_table=bt, seqused_k=sk, causal=True, return_lse=True)
        assert torch.equal(out, eo) and torch.equal(res["lse"], el), lens

