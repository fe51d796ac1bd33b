"""decode_attn tests.

CPU: host validation errors, checked mode, the split heuristic, the torch reference against SDPA and
the CPU path (contiguous and paged) against an independent float64 reference written here, the custom
ops' fake implementations, and every kernel configuration compiles for sm_90a with no local-memory
traffic.  GPU (``-m gpu``): numerics against a float32 reference, elementwise with a tolerance scaled
per query row (so a wrong or zeroed row fails however small its values), paged == contiguous, split
counts, determinism, CUDA-graph capture, poisoned buffers, bad device values.
"""

import itertools

import pytest
import torch

from _check import RTOL, assert_close_elementwise
from conftest import precompile_for_module_gpu_tests

from cute_kernels.attention import decode as DA
from cute_kernels.attention.decode import decode_attn, decode_attn_reference, decode_attn_workspace
from cute_kernels.attention.decode_plan import plan

gpu = pytest.mark.gpu


# ------------------------------------------------------------------------------------------ helpers
def make_inputs(B, Sq, Hq, Hkv, D, lens, dtype=torch.bfloat16, Lmax=None, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    Lmax = max(1, max(lens)) if Lmax is None else Lmax
    q = torch.randn(B, Sq, Hq, D, generator=g, device=device).to(dtype)
    k = torch.randn(B, Lmax, Hkv, D, generator=g, device=device).to(dtype)
    v = torch.randn(B, Lmax, Hkv, D, generator=g, device=device).to(dtype)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    return q, k, v, seqlens


def to_paged(k, v, page_size, seed=0, spare_pages=3):
    """Contiguous (B, Lmax, H, D) -> shuffled pages (num_pages, page_size, H, D) + block table."""
    B, Lmax, H, D = k.shape
    pps = -(-Lmax // page_size)
    pad = pps * page_size - Lmax
    kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).reshape(B * pps, page_size, H, D)
    vp = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).reshape(B * pps, page_size, H, D)
    n_pages = B * pps + spare_pages
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n_pages, generator=g)[: B * pps].to(k.device)
    k_pages = torch.randn(n_pages, page_size, H, D, device=k.device).to(k.dtype)  # junk in spares
    v_pages = torch.randn(n_pages, page_size, H, D, device=k.device).to(k.dtype)
    k_pages[perm] = kp
    v_pages[perm] = vp
    block_table = perm.view(B, pps).to(torch.int32).contiguous()
    return k_pages, v_pages, block_table


def check_close(out, lse, ref_o, ref_lse, dtype, what=""):
    """Every element of ``out`` within ``tol * max |ref|`` of its query row (b, t, h) (+ one rounding to
    ``dtype``): the scale is per row, not the whole tensor's, so a zeroed or wrong row fails even where
    its values are small next to other rows' (a long sequence's averages next to a one-key row); rows
    that see no key must be exactly 0; the LSE within 2e-3 with the same -inf pattern."""
    assert out.dtype == dtype
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    row_scale = ref_o.abs().amax(-1, keepdim=True)  # (B, Sq, Hq, 1)
    assert_close_elementwise(out, ref_o.to(out.device), atol=tol * row_scale, rtol=RTOL[dtype], regions=[],
                             what=f"{what}: (per-row tolerance {tol} x max |ref| of the row)")
    if lse is not None:
        empty = torch.isneginf(ref_lse)
        assert torch.equal(torch.isneginf(lse), empty), f"{what}: -inf LSE pattern differs"
        assert torch.isfinite(lse[~empty]).all()
        d = (lse[~empty] - ref_lse[~empty]).abs().amax().item() if (~empty).any() else 0.0
        assert d < 2e-3, f"{what}: LSE error {d:.3g}"
    # rows that see no key: exactly zero
    if lse is not None:
        B, Hq, Sq = ref_lse.shape
        empty_rows = torch.isneginf(ref_lse).permute(0, 2, 1)  # (B, Sq, Hq)
        assert (out.float()[empty_rows] == 0).all(), f"{what}: rows with no keys must be 0"


# ------------------------------------------------------------------------------------------ CPU
def _base(**over):
    q, k, v, s = make_inputs(2, 1, 8, 2, 128, [5, 9])
    kw = dict(q=q, k_cache=k, v_cache=v, cache_seqlens=s)
    kw.update(over)
    return kw


def _call(kw):
    kw = dict(kw)
    return decode_attn(kw.pop("q"), kw.pop("k_cache"), kw.pop("v_cache"), **kw)


BAD_INPUTS = [
    (lambda: _base(q=torch.randn(2, 1, 8, 128)), TypeError, "float16 or bfloat16"),
    (lambda: _base(q=torch.randn(2, 1, 8, 128, dtype=torch.float16)), TypeError, "dtype"),
    (lambda: _base(q=torch.randn(2, 17, 8, 128, dtype=torch.bfloat16)), ValueError, "seqlen_q"),
    (lambda: _base(q=torch.randn(2, 8, 128, dtype=torch.bfloat16)), ValueError, "batch, seqlen_q"),
    (lambda: _base(q=torch.randn(2, 1, 8, 96, dtype=torch.bfloat16)), ValueError, "head_dim"),
    (lambda: _base(q=torch.randn(2, 1, 7, 128, dtype=torch.bfloat16)), ValueError, "multiple of heads_kv"),
    (lambda: _base(q=torch.randn(2, 1, 8, 256, dtype=torch.bfloat16)[..., ::2]), ValueError, "contiguous in the head dim"),
    (lambda: _base(k_cache=torch.randn(2, 9, 2, 256, dtype=torch.bfloat16)[..., ::2]), ValueError, "contiguous in the head dim|shapes differ"),
    (lambda: _base(k_cache=torch.randn(2, 9, 2, 256, dtype=torch.bfloat16)[..., ::2],
                   v_cache=torch.randn(2, 9, 2, 256, dtype=torch.bfloat16)[..., ::2]), ValueError, "contiguous in the head dim"),
    (lambda: _base(v_cache=torch.randn(2, 8, 2, 128, dtype=torch.bfloat16)), ValueError, "shapes differ"),
    (lambda: _base(cache_seqlens=torch.tensor([5, 9])), TypeError, "int32"),
    (lambda: _base(cache_seqlens=torch.tensor([5, 9, 1], dtype=torch.int32)), ValueError, "cache_seqlens must be"),
    (lambda: _base(block_table=torch.zeros(2, 3, dtype=torch.int64)), TypeError, "block_table must be int32"),
    (lambda: _base(block_table=torch.zeros(3, 3, dtype=torch.int32)), ValueError, "block_table must be"),
    (lambda: _base(out=torch.empty(2, 1, 8, 64, dtype=torch.bfloat16)), ValueError, "out must be"),
    (lambda: _base(out=torch.empty(2, 1, 8, 128, dtype=torch.float16)), ValueError, "out must be"),
    (lambda: _base(workspace=torch.empty(10, dtype=torch.float16)), ValueError, "workspace must be"),
    (lambda: _base(num_splits=0), ValueError, "num_splits"),
    (lambda: _base(softmax_scale=-1.0), ValueError, "softmax_scale"),
    (lambda: _base(workspace=torch.empty(10), num_splits=4), ValueError, "workspace has"),
]


@pytest.mark.parametrize("make,exc,match", BAD_INPUTS, ids=[f"bad{i}" for i in range(len(BAD_INPUTS))])
def test_bad_inputs(make, exc, match):
    with pytest.raises(exc, match=match):
        _call(make())


def test_empty_batch():
    q, k, v, s = make_inputs(1, 1, 8, 2, 64, [3])
    out = decode_attn(q[:0], k[:0], v[:0], cache_seqlens=s[:0])
    assert out.shape == (0, 1, 8, 64)


def test_contiguous_cache_batch_mismatch():
    q, k, v, s = make_inputs(2, 1, 8, 2, 128, [5, 9])
    with pytest.raises(ValueError, match="batch"):
        decode_attn(q, k[:1], v[:1], cache_seqlens=s)


def test_checked_mode_lengths(monkeypatch):
    q, k, v, _ = make_inputs(2, 1, 8, 2, 64, [5, 9])
    with pytest.raises(ValueError, match="exceed the cache capacity"):
        decode_attn(q, k, v, cache_seqlens=torch.tensor([5, 10], dtype=torch.int32), checked=True)
    with pytest.raises(ValueError, match="negative"):
        decode_attn(q, k, v, cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32), checked=True)
    monkeypatch.setenv("CUTE_KERNELS_CHECKED", "1")
    with pytest.raises(ValueError, match="exceed the cache capacity"):
        decode_attn(q, k, v, cache_seqlens=torch.tensor([5, 10], dtype=torch.int32))
    # explicit checked=False wins over the environment
    decode_attn(q, k, v, cache_seqlens=torch.tensor([5, 9], dtype=torch.int32), checked=False)


def test_checked_mode_pages():
    q, k, v, s = make_inputs(2, 1, 8, 2, 64, [30, 17], Lmax=32)
    kp, vp, bt = to_paged(k, v, 16)
    decode_attn(q, kp, vp, cache_seqlens=s, block_table=bt, checked=True)  # fine
    bad = bt.clone()
    bad[1, 1] = kp.shape[0]
    with pytest.raises(ValueError, match="page ids outside"):
        decode_attn(q, kp, vp, cache_seqlens=s, block_table=bad, checked=True)
    bad = bt.clone()
    bad[0, 0] = -1
    with pytest.raises(ValueError, match="page ids outside"):
        decode_attn(q, kp, vp, cache_seqlens=s, block_table=bad, checked=True)
    # an unused page may hold anything
    ok = bt.clone()
    s2 = torch.tensor([30, 16], dtype=torch.int32)
    ok[1, 1] = 10**6
    decode_attn(q, kp, vp, cache_seqlens=s2, block_table=ok, checked=True)
    with pytest.raises(ValueError, match="exceed the cache capacity"):
        decode_attn(q, kp, vp, cache_seqlens=torch.tensor([33, 1], dtype=torch.int32), block_table=bt, checked=True)


def _sdpa_reference(q, k, v, lens, causal, scale):
    """Independent float64 reference from torch SDPA with an explicit mask."""
    B, Sq, Hq, D = q.shape
    Hkv = k.shape[2]
    out = torch.zeros(B, Sq, Hq, D, dtype=torch.float64)
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        qb = q[b].double().transpose(0, 1)  # (Hq, Sq, D)
        kb = k[b, :L].double().transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        vb = v[b, :L].double().transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        mask = torch.ones(Sq, L, dtype=torch.bool)
        if causal:
            mask = torch.arange(L)[None, :] <= (L - Sq + torch.arange(Sq))[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale)
        o = torch.where(mask.any(-1)[None, :, None], o, torch.zeros_like(o))
        out[b] = o.transpose(0, 1)
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Sq,G", [(1, 1), (4, 4), (3, 8)])
def test_reference_matches_sdpa(causal, Sq, G):
    Hkv = 2
    q, k, v, s = make_inputs(3, Sq, Hkv * G, Hkv, 64, [0, 2, 37], dtype=torch.float32, Lmax=40)
    out, lse = decode_attn_reference(q, k, v, s, causal=causal, softmax_scale=0.3)
    ref = _sdpa_reference(q, k, v, [0, 2, 37], causal, 0.3)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    assert torch.isneginf(lse[0]).all() and torch.isfinite(lse[2]).all()
    if causal and Sq > 2:  # L=2 < Sq: the first new tokens see nothing
        assert torch.isneginf(lse[1, :, 0]).all()


def _naive_attention(q, k_cache, v_cache, lens, block_table=None, causal=True, scale=None):
    """Independent float64 reference, one (sequence, query, head) at a time: softmax(q k^T * scale) v over
    the keys the query sees, each K/V row fetched by hand (paged: page ``block_table[b, j // page_size]``,
    row ``j % page_size``).  Query t of Sq sits at position L - Sq + t; causal: it sees keys 0..L - Sq + t.
    Returns out (B, Sq, Hq, D) and the natural-log LSE (B, Hq, Sq); a row that sees no key: 0 and -inf."""
    B, Sq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    G = Hq // Hkv
    scale = D ** -0.5 if scale is None else scale
    out = torch.zeros(B, Sq, Hq, D, dtype=torch.float64)
    lse = torch.full((B, Hq, Sq), float("-inf"), dtype=torch.float64)
    for b in range(B):
        L = int(lens[b])
        rows = []
        for j in range(L):
            if block_table is None:
                rows.append((k_cache[b, j], v_cache[b, j]))
            else:
                page_size = k_cache.shape[1]
                page = int(block_table[b, j // page_size])
                rows.append((k_cache[page, j % page_size], v_cache[page, j % page_size]))
        for t in range(Sq):
            seen = min(L, L - Sq + t + 1) if causal else L
            if seen <= 0:
                continue
            keys = torch.stack([r[0] for r in rows[:seen]]).double()  # (seen, Hkv, D)
            vals = torch.stack([r[1] for r in rows[:seen]]).double()
            for h in range(Hq):
                s = (keys[:, h // G] @ q[b, t, h].double()) * scale  # (seen,)
                m = s.max()
                w = torch.exp(s - m)
                out[b, t, h] = (w / w.sum()) @ vals[:, h // G]
                lse[b, h, t] = m + torch.log(w.sum())
    return out, lse


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("causal,Sq,G,dtype", [(True, 1, 4, torch.bfloat16), (True, 3, 4, torch.bfloat16),
                                               (True, 4, 1, torch.float16), (False, 2, 4, torch.bfloat16)],
                         ids=["causal-sq1", "causal-sq3", "causal-sq4-mha-fp16", "full-sq2"])
def test_cpu_path_and_paged_reference(paged, causal, Sq, G, dtype):
    """decode_attn on CPU tensors (the CPU path) and decode_attn_reference (the GPU tests' reference)
    against the independent float64 reference above: ragged lengths 0, 1, 2 (< Sq: the first queries see
    nothing), 16 / 17 (a page boundary), 30 and the full capacity 32; the paged cache in shuffled pages of
    16 with junk in the spare pages; GQA (G = 4) and MHA; causal with Sq > 1 and a full mask."""
    lens = [0, 1, 2, 16, 17, 30, 32]
    Hkv = 2
    q, k, v, s = make_inputs(len(lens), Sq, Hkv * G, Hkv, 64, lens, dtype=dtype, Lmax=32, seed=Sq + 10 * G)
    bt = None
    if paged:
        k, v, bt = to_paged(k, v, 16, seed=Sq)
    scale = None if causal else 0.3
    out, lse = decode_attn(q, k, v, cache_seqlens=s, block_table=bt, causal=causal, softmax_scale=scale,
                           return_lse=True)
    ro, rl = _naive_attention(q, k, v, lens, bt, causal, scale)
    assert torch.isneginf(rl).any() and (~torch.isneginf(rl)).any()  # empty rows and seen rows both present
    # the CPU path: float32 math, one rounding to the output dtype
    assert_close_elementwise(out, ro, atol=1e-5, rtol=RTOL[dtype], regions=[], what="CPU path")
    torch.testing.assert_close(lse.double(), rl, atol=1e-5, rtol=1e-5)
    empty = torch.isneginf(rl).permute(0, 2, 1)  # (B, Sq, Hq)
    assert (out[empty] == 0).all()
    # the float32 reference the GPU tests compare against
    fo, fl = decode_attn_reference(q, k, v, s, bt, causal, scale)
    torch.testing.assert_close(fo.double(), ro, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fl.double(), rl, atol=1e-5, rtol=1e-5)


def test_naive_reference_is_not_vacuous():
    """The check above fails on a zeroed row, on the keys of another sequence's pages, and on a
    query seeing one key too many (the causal offset)."""
    lens = [5, 17, 30]
    q, k, v, s = make_inputs(3, 2, 8, 2, 64, lens, Lmax=32)
    kp, vp, bt = to_paged(k, v, 16)
    out = decode_attn(q, kp, vp, cache_seqlens=s, block_table=bt)
    ro, _ = _naive_attention(q, kp, vp, lens, bt)
    assert_close_elementwise(out, ro, atol=1e-5, rtol=RTOL[q.dtype], regions=[])
    bad = out.clone()
    bad[2, 1, 7] = 0
    with pytest.raises(AssertionError):
        assert_close_elementwise(bad, ro, atol=1e-5, rtol=RTOL[q.dtype], regions=[])
    swapped = bt.clone()
    swapped[1, 0], swapped[2, 0] = bt[2, 0], bt[1, 0]
    wrong_pages, _ = _naive_attention(q, kp, vp, lens, swapped)
    with pytest.raises(AssertionError):
        assert_close_elementwise(out, wrong_pages, atol=1e-5, rtol=RTOL[q.dtype], regions=[])
    one_more, _ = _naive_attention(q, k, v, [L + 1 for L in lens], None)  # contiguous: rows up to Lmax exist
    with pytest.raises(AssertionError):
        assert_close_elementwise(out, one_more, atol=1e-5, rtol=RTOL[q.dtype], regions=[])


def test_opcheck_custom_ops():
    q, k, v, s = make_inputs(2, 1, 4, 2, 64, [5, 9])
    torch.library.opcheck(torch.ops.cute_kernels.decode_attn, (q, k, v, s, None, 1, True, 0.125))
    out = torch.empty_like(q)
    lse = torch.empty(2, 4, 1)
    torch.library.opcheck(torch.ops.cute_kernels.decode_attn_, (q, k, v, s, None, out, lse, None, 1, True, 0.125))


def test_split_heuristic():
    arch_sms = 132
    # one (batch, head) pair per... few pairs: fill the SMs
    s = DA.choose_num_splits(1, 8, 1, 32768, 64, arch_sms, 1)
    assert 8 <= s <= 64 and 8 * s <= 2 * arch_sms
    # enough pairs already: no split
    assert DA.choose_num_splits(64, 8, 1, 2048, 64, arch_sms, 1) == 1
    # never more splits than tiles
    assert DA.choose_num_splits(1, 1, 1, 100, 64, arch_sms, 1) <= 2
    # only static sizes: same answer every time
    assert len({DA.choose_num_splits(2, 8, 1, 65536, 64, arch_sms, 2) for _ in range(5)}) == 1
    # the plan does not depend on the lengths
    q, k, v, _ = make_inputs(1, 1, 32, 8, 128, [1], Lmax=32768)
    plans = {plan(q, k, None, None, True)[1] for _ in range(3)}
    assert len(plans) == 1 and plans.pop() > 1


def test_split_heuristic_paged_fills_two_ctas_per_sm():
    """Caches paged in pages no larger than a KV tile get the count that fills 2 CTAs per SM (the
    second hides block-table latency), contiguous ones and larger pages 1 CTA per SM: b4 hq64 hkv8
    L65536 -> 8 (pages of 16) vs 4 splits (contiguous, pages of 256) on 132 SMs."""
    from cute_kernels.common.arch import current_arch

    sms = current_arch().sm_count
    q = torch.empty(4, 1, 64, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(4, 65536, 8, 128, dtype=torch.bfloat16, device="meta")
    kp = torch.empty(1, 16, 8, 128, dtype=torch.bfloat16, device="meta")
    bt = torch.empty(4, 65536 // 16, dtype=torch.int32, device="meta")
    contiguous, paged = plan(q, k, None, None, True)[1], plan(q, kp, bt, None, True)[1]
    assert contiguous == DA.choose_num_splits(4, 8, 1, 65536, 64, sms, 1)
    assert paged == DA.choose_num_splits(4, 8, 1, 65536, 64, sms, 2) > contiguous
    kp256 = torch.empty(1, 256, 8, 128, dtype=torch.bfloat16, device="meta")
    bt256 = torch.empty(4, 65536 // 256, dtype=torch.int32, device="meta")
    assert plan(q, kp256, bt256, None, True)[1] == contiguous
    if sms == 132:
        assert (contiguous, paged) == (4, 8)


def test_workspace_helper():
    q = torch.empty(2, 3, 8, 128, dtype=torch.bfloat16)
    ws = decode_attn_workspace(q, 16)
    assert ws.dtype == torch.float32 and ws.numel() == DA.workspace_numel(16, 2, 3, 8, 128)
    assert DA.workspace_numel(1, 2, 3, 8, 128) >= 1


# every kernel variant builds for sm_90a without local memory
_CFG_AXES = dict(
    dtype=[torch.bfloat16, torch.float16],
    D=[64, 128, 256],
    rows=[8, 32, 64],
    paged=[0, 16, 256],
    causal=[True, False],
    split=[True, False],
)
_ALL_CFGS = list(itertools.product(*_CFG_AXES.values()))
# a fast default subset covering every value of every axis
_FAST_CFGS = [
    (torch.bfloat16, 128, 8, 0, True, True),
    (torch.bfloat16, 128, 8, 16, True, False),
    (torch.float16, 128, 32, 0, False, True),
    (torch.bfloat16, 128, 64, 256, True, True),
    (torch.bfloat16, 64, 8, 16, True, True),
    (torch.float16, 64, 64, 0, True, False),
    (torch.bfloat16, 256, 8, 0, True, True),
    (torch.bfloat16, 256, 32, 16, False, True),
    (torch.float16, 256, 64, 256, True, False),
]


def _cid(c):
    return f"{str(c[0])[6:]}-d{c[1]}-r{c[2]}-p{c[3]}-{'causal' if c[4] else 'full'}-{'split' if c[5] else 'direct'}"


def _compile_check(case, kv_bytes=0):
    """The default kernel of a configuration (``kv_bytes`` <= TMA_EF_MAX_KV_BYTES of a contiguous
    cache: TMA + evict-first loads, else cp.async) builds without local memory; split configurations
    launch the merge as a programmatic dependent."""
    from cute_kernels.tools import inspect as ins

    dtype, D, rows, page, causal, split = case
    cfg = DA.make_config(dtype, D, rows, page > 0, page, causal, split, kv_bytes=kv_bytes)
    rep = ins.inspect_builder(DA.decode_builder(cfg))
    ks = [k for k in rep.kernels if "Decode" in k.name]
    assert len(ks) == 1, rep.summary()
    k = ks[0]
    assert k.spills == 0 and k.stack_frame == 0, f"{cfg}\n{rep.summary()}"  # SASS read (nvdisasm or raise)
    assert k.instructions["HMMA"] > 0 and k.instructions["LDGSTS"] > 0, rep.summary()
    if split:
        assert any("Merge" in k.name for k in rep.kernels)
    if rep.ptx is not None:
        assert "griddepcontrol.wait" in rep.ptx
        if split:
            assert "griddepcontrol.launch_dependents" in rep.ptx
    return cfg, rep, k


@pytest.mark.parametrize("case", _FAST_CFGS, ids=_cid)
def test_compiles_for_sm90a(case):
    _compile_check(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in _ALL_CFGS if c not in _FAST_CFGS], ids=_cid)
def test_compiles_for_sm90a_all(case):
    _compile_check(case)


# ------------------------------------------------------------------------------------------ GPU
def run_and_ref(q, k, v, s, bt=None, **kw):
    out, lse = decode_attn(q, k, v, cache_seqlens=s, block_table=bt, return_lse=True, **kw)
    ro, rl = decode_attn_reference(q, k, v, s, bt, kw.get("causal", True), kw.get("softmax_scale"))
    return out, lse, ro, rl


@gpu
@pytest.mark.parametrize("L", [0, 1, 7, 1000, 65537, 131072])
@pytest.mark.parametrize("Sq", [1, 4])
@pytest.mark.parametrize("G", [1, 4, 8])
def test_gpu_lengths_gqa(L, Sq, G):
    Hkv = 2
    lens = [L, L // 3]
    q, k, v, s = make_inputs(2, Sq, Hkv * G, Hkv, 128, lens, device="cuda", seed=L + 7 * Sq + G)
    out, lse, ro, rl = run_and_ref(q, k, v, s)
    check_close(out, lse, ro, rl, q.dtype, f"L={L} Sq={Sq} G={G}")


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 256])
@pytest.mark.parametrize("Sq,G", [(1, 8), (3, 4), (16, 4)])
def test_gpu_dtypes_head_dims(dtype, D, Sq, G):
    Hkv = 2
    q, k, v, s = make_inputs(3, Sq, Hkv * G, Hkv, D, [3000, 1, 777], dtype=dtype, device="cuda")
    out, lse, ro, rl = run_and_ref(q, k, v, s)
    check_close(out, lse, ro, rl, dtype, f"{dtype} D={D} Sq={Sq} G={G}")


@gpu
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Hq,Hkv,Sq", [(32, 1, 1), (64, 1, 2), (16, 16, 16)])
def test_gpu_mqa_many_rows_and_noncausal(causal, Hq, Hkv, Sq):
    """MQA with 32..128 rows per KV head (several row blocks), and full (non-causal) masks."""
    q, k, v, s = make_inputs(2, Sq, Hq, Hkv, 128, [2500, 70], device="cuda")
    out, lse, ro, rl = run_and_ref(q, k, v, s, causal=causal, softmax_scale=0.2)
    check_close(out, lse, ro, rl, q.dtype, f"Hq={Hq} Hkv={Hkv} Sq={Sq} causal={causal}")


@gpu
@pytest.mark.parametrize("page_size", [16, 64, 128, 256, 48])
@pytest.mark.parametrize("Sq", [1, 4])
def test_gpu_paged_equals_contiguous(page_size, Sq):
    lens = [5000, 1, 0, 2049]
    Lmax = 5120
    q, k, v, s = make_inputs(4, Sq, 16, 4, 128, lens, Lmax=Lmax, device="cuda", seed=page_size)
    kp, vp, bt = to_paged(k, v, page_size, seed=page_size)
    for splits in (1, 7, None):
        # same split count on both: identical tiles and merge order -> identical bits
        P = splits if splits is not None else plan(q, k, None, None, True)[1]
        oc, lc = decode_attn(q, k, v, cache_seqlens=s, num_splits=P, return_lse=True)
        op, lp = decode_attn(q, kp, vp, cache_seqlens=s, block_table=bt, num_splits=P, return_lse=True)
        assert torch.equal(oc, op) and torch.equal(lc, lp), f"page {page_size} splits {P}"
    out, lse, ro, rl = run_and_ref(q, kp, vp, s, bt)
    check_close(out, lse, ro, rl, q.dtype, f"paged {page_size}")


@gpu
@pytest.mark.parametrize("num_splits", [1, None, 3, 64, 300])
def test_gpu_split_counts(num_splits):
    """Split 1, auto, a few, more splits than chunks (L=100 -> 2 tiles; 300 splits for L<=9000)."""
    q, k, v, s = make_inputs(3, 2, 16, 2, 128, [100, 9000, 3], device="cuda", seed=11)
    out, lse, ro, rl = run_and_ref(q, k, v, s, num_splits=num_splits)
    check_close(out, lse, ro, rl, q.dtype, f"splits={num_splits}")
    out2 = decode_attn(q, k, v, cache_seqlens=s, num_splits=num_splits)
    assert torch.equal(out2, out)


@gpu
def test_gpu_paged_split_agrees_bitwise():
    """Paged (cp.async gather) and contiguous (TMA) caches with the same splits: identical bits."""
    q, k, v, s = make_inputs(4, 4, 32, 8, 128, [7000, 1, 0, 3333], device="cuda", seed=12)
    kp, vp, bt = to_paged(k, v, 32)
    base = decode_attn(q, k, v, cache_seqlens=s, num_splits=24, return_lse=True)
    for _ in range(3):
        o, l = decode_attn(q, kp, vp, cache_seqlens=s, block_table=bt, num_splits=24, return_lse=True)
        assert torch.equal(o, base[0]) and torch.equal(l, base[1])


@gpu
def test_gpu_deterministic_many_splits():
    q, k, v, s = make_inputs(2, 4, 32, 4, 128, [20000, 13001], device="cuda", seed=3)
    first = decode_attn(q, k, v, cache_seqlens=s, num_splits=48, return_lse=True)
    for _ in range(20):
        o, l = decode_attn(q, k, v, cache_seqlens=s, num_splits=48, return_lse=True)
        assert torch.equal(o, first[0]) and torch.equal(l, first[1])
    auto = plan(q, k, None, None, True)[1]
    for _ in range(5):
        assert torch.equal(decode_attn(q, k, v, cache_seqlens=s, num_splits=auto), decode_attn(q, k, v, cache_seqlens=s))


@gpu
def test_gpu_split_partials_reused_per_stream():
    """The fast path reuses its split partial states per stream: back-to-back calls with different
    inputs on one stream, and calls on two streams at once, each equal a lone call (bitwise)."""
    ins = [make_inputs(2, 2, 16, 4, 128, [3000 + 500 * i, 77 * i + 1], Lmax=5000, device="cuda", seed=40 + i)
           for i in range(4)]  # one shape: one launcher, so its partials are shared
    lone = [decode_attn(q, k, v, cache_seqlens=s, num_splits=6, return_lse=True) for q, k, v, s in ins]
    torch.cuda.synchronize()
    outs = [decode_attn(q, k, v, cache_seqlens=s, num_splits=6, return_lse=True) for q, k, v, s in ins]  # one stream
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    both = [None] * 4
    torch.cuda.synchronize()
    for i, (q, k, v, s) in enumerate(ins):
        with torch.cuda.stream(streams[i % 2]):
            for _ in range(3):
                both[i] = decode_attn(q, k, v, cache_seqlens=s, num_splits=6, return_lse=True)
    torch.cuda.synchronize()
    for i in range(4):
        for got in (outs[i], both[i]):
            assert torch.equal(got[0], lone[i][0]) and torch.equal(got[1], lone[i][1]), f"input {i}"


@gpu
def test_gpu_split_partials_pooled_across_batch_sizes():
    """A continuously batched server's steps: split decode calls whose batch size changes call by call
    share one pool of partial states per stream (fastpath.pooled_views), growing past the first size;
    every call, back to back without a sync, equals its lone result (bitwise) and the reference."""
    sizes = (3, 1, 5, 2, 8, 1, 3, 8)
    ins = [make_inputs(b, 1, 32, 8, 128, [(1500 + 997 * (i * 7 + j)) % 6000 + 1 for j in range(b)], Lmax=6000,
                       device="cuda", seed=70 + i) for i, b in enumerate(sizes)]
    lone = []
    for q, k, v, s in ins:
        lone.append(decode_attn(q, k, v, cache_seqlens=s, num_splits=5, return_lse=True))
        torch.cuda.synchronize()
    for _ in range(2):
        outs = [decode_attn(q, k, v, cache_seqlens=s, num_splits=5, return_lse=True) for q, k, v, s in ins]
        torch.cuda.synchronize()
        for i, ((q, k, v, s), got) in enumerate(zip(ins, outs)):
            assert torch.equal(got[0], lone[i][0]) and torch.equal(got[1], lone[i][1]), f"call {i}"
            ro, rl = decode_attn_reference(q, k, v, s)
            check_close(got[0], got[1], ro, rl, q.dtype, f"batch {sizes[i]}")


@gpu
def test_gpu_poisoned_buffers():
    """out and workspace full of NaN: every element is rewritten."""
    q, k, v, s = make_inputs(3, 4, 16, 2, 128, [4000, 0, 2], device="cuda", seed=5)
    P = 40
    ws = decode_attn_workspace(q, P)
    rows = 3 * 4 * 16
    assert ws.numel() == P * rows * 129
    ws.fill_(float("nan"))
    out = torch.full_like(q, float("nan"))
    o, lse = decode_attn(q, k, v, cache_seqlens=s, num_splits=P, out=out, workspace=ws, return_lse=True)
    assert o.data_ptr() == out.data_ptr()
    ro, rl = decode_attn_reference(q, k, v, s)
    check_close(o, lse, ro, rl, q.dtype, "poisoned")
    out1 = torch.full_like(q, float("nan"))
    decode_attn(q, k, v, cache_seqlens=s, num_splits=1, out=out1)
    check_close(out1, None, ro, rl, q.dtype, "poisoned direct")


@gpu
@pytest.mark.parametrize("paged", [False, True], ids=["tma", "paged-cpasync"])
def test_gpu_cuda_graph_capture_replay(paged):
    """Capture once, replay with new lengths and contents: the contiguous cache (32 MiB: TMA loads)
    and the same cache paged (cp.async gather)."""
    B, Sq, Hq, Hkv, D = 2, 2, 16, 4, 128
    Lmax = 8192
    q, k, v, s = make_inputs(B, Sq, Hq, Hkv, D, [6000, 300], Lmax=Lmax, device="cuda", seed=9)
    bt = None
    kc, vc = k, v
    if paged:
        kc, vc, bt = to_paged(k, v, 64, spare_pages=0)
    P = 16
    ws = decode_attn_workspace(q, P)
    out = torch.empty_like(q)
    decode_attn(q, kc, vc, cache_seqlens=s, block_table=bt, num_splits=P, out=out, workspace=ws)  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attn(q, kc, vc, cache_seqlens=s, block_table=bt, num_splits=P, out=out, workspace=ws)
    for lens, seed in (([6000, 300], 1), ([8192, 1], 2), ([17, 0], 3), ([4097, 8000], 4)):
        q2, k2, v2, s2 = make_inputs(B, Sq, Hq, Hkv, D, lens, Lmax=Lmax, device="cuda", seed=seed)
        q.copy_(q2), s.copy_(s2)
        if paged:  # the same page permutation (to_paged's seed), new contents
            kp2, vp2, _ = to_paged(k2, v2, 64, spare_pages=0)
            kc.copy_(kp2), vc.copy_(vp2)
        else:
            kc.copy_(k2), vc.copy_(v2)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ro, rl = decode_attn_reference(q2, k2, v2, s)
        check_close(out, None, ro, rl, q.dtype, f"graph replay {lens} paged={paged}")


@gpu
def test_gpu_bad_device_values_stay_in_bounds():
    """Default (unchecked) mode: lengths past the capacity are clamped, bad page ids clamped."""
    q, k, v, _ = make_inputs(3, 1, 8, 2, 128, [1], Lmax=1000, device="cuda")
    s = torch.tensor([5000, -3, 999], dtype=torch.int32, device="cuda")
    out, lse = decode_attn(q, k, v, cache_seqlens=s, return_lse=True, num_splits=4)
    torch.cuda.synchronize()
    ro, rl = decode_attn_reference(q, k, v, s.clamp(0, 1000))
    check_close(out, lse, ro, rl, q.dtype, "clamped lengths")
    kp, vp, bt = to_paged(k, v, 64)
    bt[0, 3] = 10**7
    bt[1, 0] = -(10**7)
    s2 = torch.tensor([900, 64, 10**6], dtype=torch.int32, device="cuda")
    out2 = decode_attn(q, kp, vp, cache_seqlens=s2, block_table=bt)
    torch.cuda.synchronize()
    assert torch.isfinite(out2).all()
    with pytest.raises(ValueError):
        decode_attn(q, kp, vp, cache_seqlens=s2, block_table=bt, checked=True)


@gpu
def test_gpu_planted_keys():
    """One key per query row dominates: the output must be exactly that key's value row."""
    B, Sq, Hq, Hkv, D, L = 2, 3, 8, 2, 128, 3000
    G = Hq // Hkv
    q = torch.zeros(B, Sq, Hq, D, device="cuda", dtype=torch.bfloat16)
    k = torch.zeros(B, L, Hkv, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, L, Hkv, D, device="cuda").to(torch.bfloat16)
    target = {}
    gen = torch.Generator().manual_seed(0)
    for b in range(B):
        for t in range(Sq):
            for h in range(Hq):
                hk = h // G
                j = (b * Sq + t) * Hq + h  # distinct direction per row
                pos = int(torch.randint(0, L - Sq + t + 1, (1,), generator=gen))
                q[b, t, h, j % D] = 1.0
                k[b, pos, hk, j % D] = 100.0
                target[(b, t, h)] = (pos, hk)
    s = torch.tensor([L, L], dtype=torch.int32, device="cuda")
    # scale makes the planted score 100*... dominate; other scores are 0 (or 100 when two rows
    # share a direction and a KV head: avoided because j % D is unique per (b, t, h) here)
    for splits in (1, 13):
        out = decode_attn(q, k, v, cache_seqlens=s, num_splits=splits, softmax_scale=1.0)
        for (b, t, h), (pos, hk) in target.items():
            torch.testing.assert_close(out[b, t, h].float(), v[b, pos, hk].float(), atol=1e-2, rtol=1e-2)


@gpu
def test_gpu_strided_inputs():
    """q sliced out of a packed qkv buffer, k/v caches as views of one (B, L, 2, Hkv, D) buffer."""
    B, Sq, Hq, Hkv, D, L = 2, 2, 8, 2, 128, 1500
    qkv = torch.randn(B, Sq, Hq + 2 * Hkv, D, device="cuda").to(torch.bfloat16)
    q = qkv[:, :, :Hq]
    kv = torch.randn(B, L, 2, Hkv, D, device="cuda").to(torch.bfloat16)
    k, v = kv[:, :, 0], kv[:, :, 1]
    s = torch.tensor([L, 999], dtype=torch.int32, device="cuda")
    out, lse, ro, rl = run_and_ref(q, k, v, s)
    check_close(out, lse, ro, rl, q.dtype, "strided")


@gpu
def test_gpu_torch_compile():
    q, k, v, s = make_inputs(2, 1, 8, 2, 128, [100, 2000], device="cuda")

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(q, k, v, s):
        return decode_attn(q, k, v, cache_seqlens=s, num_splits=4) * 2

    out = f(q, k, v, s)
    ro, rl = decode_attn_reference(q, k, v, s)
    check_close(out / 2, None, 2 * ro / 2, rl, q.dtype, "torch.compile")


def test_cpu_torch_compile_traces():
    """The public function traces into one graph (custom ops + fake implementations)."""
    q, k, v, s = make_inputs(2, 1, 8, 2, 64, [5, 9])

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(q, k, v, s):
        o, lse = decode_attn(q, k, v, cache_seqlens=s, num_splits=2, return_lse=True)
        return o.float() * 2, lse

    o, lse = f(q, k, v, s)
    ro, rl = decode_attn_reference(q, k, v, s)
    torch.testing.assert_close(o, 2 * ro.to(q.dtype).float())
    torch.testing.assert_close(lse, rl)


# --------------------------------------------------------------------- GPU: parallel precompile
def gpu_test_configs():
    """The DecodeConfigs the GPU tests above use (compiled up front, in parallel)."""
    bf, f16 = torch.bfloat16, torch.float16
    cases = set()

    def add(dtype, D, rows, page, causal):
        for split in (False, True):
            cases.add((dtype, D, rows, page, causal, split))

    for G in (1, 4, 8):
        for Sq in (1, 4):
            add(bf, 128, G * Sq, 0, True)
    for dt in (bf, f16):
        for D in (64, 256):
            for rows in (8, 12, 64):
                add(dt, D, rows, 0, True)
    for rows in (32, 128, 16):
        for c in (True, False):
            add(bf, 128, rows, 0, c)
    for ps in (16, 64, 128, 256, 48, 32):
        for rows in (4, 16):
            add(bf, 128, rows, ps, True)
    for rows in (16, 32, 8):
        add(bf, 128, rows, 0, True)
    cfgs = []
    for dtype, D, rows, page, causal, split in sorted(cases, key=str):
        # contiguous caches: both load paths (small caches TMA, the long-length tests cp.async)
        for kv_bytes in ((1 << 20, 0) if page == 0 else (0,)):
            cfgs.append(DA.make_config(dtype, D, rows, page > 0, page, causal, split, kv_bytes=kv_bytes))
    return list(dict.fromkeys(cfgs))


@pytest.fixture(scope="module", autouse=True)
def _precompile_for_gpu_tests(request):
    precompile_for_module_gpu_tests(request, lambda: DA.precompile(gpu_test_configs()))


def test_gpu_config_list_is_small():
    assert 10 <= len(gpu_test_configs()) <= 80


@gpu
def test_gpu_empty_batch_and_lengths_shorter_than_q():
    q, k, v, s = make_inputs(1, 1, 8, 2, 128, [3], device="cuda")
    assert decode_attn(q[:0], k[:0], v[:0], cache_seqlens=s[:0]).shape == (0, 1, 8, 128)
    # L < Sq: the first new tokens see nothing (zeros, -inf LSE), the last ones see the cache
    q, k, v, s = make_inputs(2, 8, 8, 2, 128, [3, 0], Lmax=64, device="cuda")
    for P in (1, 5):
        out, lse, ro, rl = run_and_ref(q, k, v, s, num_splits=P)
        check_close(out, lse, ro, rl, q.dtype, f"L<Sq P={P}")


# ------------------------------------------------------------------ the two contiguous load paths
_LOAD_CASES = [(torch.bfloat16, 128, 8, 0, True, True), (torch.float16, 256, 64, 0, False, False),
               (torch.bfloat16, 64, 32, 0, True, True)]


@pytest.mark.parametrize("case", _LOAD_CASES, ids=_cid)
def test_compiles_tma_path(case):
    """Contiguous caches within TMA_EF_MAX_KV_BYTES: TMA loads issued by a whole warp (the DSL wraps
    each TMA copy in elect.sync 0xffffffff; issued from one thread ptxas emits a divergent fallback,
    BRA.DIV -> WARPSYNC.COLLECTIVE, in which that lane waits for 31 lanes that never come: a hang),
    every expect_tx arming exactly the bytes of its boxes."""
    cfg, rep, k = _compile_check(case, kv_bytes=1 << 20)
    assert cfg.load == "tma"
    assert k.instructions["UTMALDG"] > 0 and k.instructions["HMMA"] > 0, rep.summary()
    assert "WARPSYNC.COLLECTIVE" not in rep.sass and "BRA.DIV" not in rep.sass
    if rep.ptx is not None:
        _check_expect_tx(rep.ptx, cfg)


def _check_expect_tx(ptx, cfg):
    """Every mbarrier.arrive.expect_tx arms exactly the bytes of the TMA boxes issued after it on
    the same barrier (K + V of one tile: 2 * D/64 boxes of n_tile x 64 elements, 128-byte swizzle;
    clipped boxes still count whole), and is preceded by an elect.sync (one arrival, count 1)."""
    import re

    lines = ptx.splitlines()
    movs = {}
    arms = []
    for i, ln in enumerate(lines):
        m = re.match(r"\s*mov\.b32\s+(%r\d+),\s*(\d+);", ln)
        if m:
            movs[m.group(1)] = int(m.group(2))
        m = re.search(r"mbarrier\.arrive\.expect_tx\.shared\.b64\s+\S+\s+\[[^\]]+\],\s*(%r\d+);", ln)
        if m:
            arms.append((i, movs[m.group(1)]))
    assert arms, "no expect_tx in the PTX"
    el = 2  # float16 / bfloat16 bytes
    box = cfg.n_tile * 64 * el
    for i, nbytes in arms:
        assert any("elect.sync" in x for x in lines[max(0, i - 6) : i]), lines[max(0, i - 6) : i + 1]
        n = 0
        for ln in lines[i + 1 :]:
            if "expect_tx" in ln or "try_wait" in ln or "bar.sync" in ln:
                break
            n += "cp.async.bulk.tensor" in ln
        assert n == 2 * cfg.head_dim // 64, (i, n)
        assert nbytes == n * box == 2 * cfg.n_tile * cfg.head_dim * el, (i, nbytes, n, box)


def test_tma_loads_evict_first():
    """TMA K/V loads carry the L2 evict-first policy (CUTLASS's EVICT_FIRST; without it the DSL
    passes policy 0): every bulk tensor load of the kernel."""
    import re

    from cute_kernels.common import tma

    cfg, rep, k = _compile_check((torch.bfloat16, 128, 4, 0, True, True), kv_bytes=1 << 20)
    assert cfg.load == "tma"
    if rep.ptx is None:
        pytest.skip("no PTX in the report")
    regs = re.findall(r"cp\.async\.bulk\.tensor\.\S+L2::cache_hint \[[^\]]*\], \[[^\]]*\], \[[^\]]*\], (%rd\d+);",
                      rep.ptx)
    assert len(regs) == 2 * cfg.head_dim // 64 * 3  # K + V boxes, prologue + loop copies of the issue
    vals = {int(re.findall(r"mov\.[bu]64\s+%s,\s*(\d+);" % re.escape(r), rep.ptx)[0]) for r in regs}
    assert vals == {tma.L2_EVICT_FIRST}


def test_load_path_by_size():
    """TMA + evict-first up to TMA_EF_MAX_KV_BYTES of contiguous K+V, cp.async above and for every
    paged cache; the plan passes the static capacity's bytes."""
    cap = DA.TMA_EF_MAX_KV_BYTES
    assert DA.load_for(False, 128 << 20) == "tma" and DA.load_for(False, cap) == "tma"
    assert DA.load_for(False, cap + 1) == "cpasync" and DA.load_for(False, 0) == "cpasync"
    assert DA.load_for(True, 1 << 20) == "cpasync"
    assert DA.make_config(torch.bfloat16, 128, 4, False, 0, True, True, kv_bytes=128 << 20).load == "tma"
    assert DA.make_config(torch.bfloat16, 128, 4, False, 0, True, True, kv_bytes=256 << 20).load == "cpasync"
    assert DA.make_config(torch.bfloat16, 128, 4, True, 16, True, True, kv_bytes=1 << 20).load == "cpasync"
    with pytest.raises(ValueError, match="contiguous caches only"):
        DA.DecodeConfig(tile=DA.make_config(torch.bfloat16, 128, 4, True, 16, True, True).tile, paged=True,
                        page_size=16, causal=True, split=True, load="tma")
    # the plan: b1 hq32 hkv8 L32768 D128 bf16 = 128 MiB of K+V; b8 L8192 = 256 MiB (meta tensors)
    for b, L, load in ((1, 32768, "tma"), (8, 8192, "cpasync")):
        q = torch.empty(b, 1, 32, 128, dtype=torch.bfloat16, device="meta")
        k = torch.empty(b, L, 8, 128, dtype=torch.bfloat16, device="meta")
        assert plan(q, k, None, None, True)[0].load == load


@gpu
@pytest.mark.parametrize("num_splits", [1, None, 48])
def test_gpu_load_paths_bitwise_equal(num_splits):
    """The two contiguous load paths give the same bits: one cache whose capacity is above
    TMA_EF_MAX_KV_BYTES (cp.async) and a view of its first rows within the bound (TMA + evict-first),
    ragged lengths (0/1/7/1000/5000), rows past each length NaN; both match the float32 reference."""
    lens = [0, 1, 7, 1000, 5000]
    Lmax = 65600  # 5 x 65600 x 4 heads x 128 x 2 B x 2 = 671 MB of K+V: cp.async
    q, k, v, s = make_inputs(len(lens), 1, 16, 4, 128, lens, Lmax=Lmax, device="cuda", seed=21)
    for b, L in enumerate(lens):
        k[b, L:] = float("nan")
        v[b, L:] = float("nan")
    small = 5120  # the first 5120 rows: 52 MB, TMA + evict-first
    assert plan(q, k, None, num_splits, True)[0].load == "cpasync"
    assert plan(q, k[:, :small], None, num_splits, True)[0].load == "tma"
    P = num_splits or plan(q, k[:, :small], None, None, True)[1]
    base, base_lse = decode_attn(q, k, v, cache_seqlens=s, num_splits=P, return_lse=True)
    for _ in range(2):
        o, l = decode_attn(q, k[:, :small], v[:, :small], cache_seqlens=s, num_splits=P, return_lse=True)
        assert torch.equal(o, base) and torch.equal(l, base_lse)
    ro, rl = decode_attn_reference(q, k, v, s)
    check_close(o, l, ro, rl, q.dtype, "load paths")
    # strided caches (views of one K/V buffer), Sq > 1, D = 256, and clamped lengths: TMA path
    B, Sq, Hq, Hkv, D, L = 2, 3, 8, 2, 256, 1500
    kv = torch.randn(B, L, 2, Hkv, D, device="cuda").to(torch.bfloat16)
    q2 = torch.randn(B, Sq, Hq, D, device="cuda").to(torch.bfloat16)
    s2 = torch.tensor([L, 999], dtype=torch.int32, device="cuda")
    out, lse, ro, rl = run_and_ref(q2, kv[:, :, 0], kv[:, :, 1], s2, num_splits=num_splits)
    check_close(out, lse, ro, rl, q2.dtype, "strided D=256")
    s3 = torch.tensor([10**6, -5], dtype=torch.int32, device="cuda")
    o3 = decode_attn(q2, kv[:, :, 0], kv[:, :, 1], cache_seqlens=s3, num_splits=num_splits)
    torch.cuda.synchronize()
    ro3, _ = decode_attn_reference(q2, kv[:, :, 0], kv[:, :, 1], s3.clamp(0, L))
    check_close(o3, None, ro3, None, q2.dtype, "clamped")


def test_public_surface_and_warmup():
    """What a user imports from cute_kernels.attention, and warm-up of the planned decode config
    (plus its merge) through cute_kernels.warmup (recorded, nothing compiled)."""
    import cute_kernels
    from cute_kernels import attention
    from cute_kernels.common import jit

    for name in attention.__all__:
        assert getattr(attention, name) is not None
    assert attention.decode_attn is cute_kernels.decode_attn and attention.decode is DA
    cfg = attention.explain(1, 32, 8, 32768)["config"]
    assert isinstance(cfg, attention.DecodeConfig) and cfg.split and cfg.load == "tma"
    merge = attention.MergeConfig("float32", "bfloat16", 128)
    with jit.dry_run() as dry:
        assert cute_kernels.warmup([("decode_attn", cfg), ("merge_states", merge)]) == 2
    assert dry.seen == [("decode_attn", cfg), ("merge_states", merge)]


@gpu
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_gpu_growing_cache_takes_grown_launchers(layout):
    """A DynamicCache's decode steps: a new, longer K / V tensor every step (Transformers holds them
    (B, H, L, D): ``bhsd``), no out=.  After the first step the calls take the launchers made once per
    number of KV tiles (``decode._GROWN``: no check, plan or launcher per length); every step against
    the float32 reference, across tile and split-count changes, each step's two layers alike."""
    B, Hq, Hkv, D = 2, 8, 2, 128
    g = torch.Generator().manual_seed(11)
    made = len(DA._launchers)
    for L in [1, 2, 63, 64, 65, 200, 511, 513, 1500, 1501, 4099]:
        q = torch.randn(B, 1, Hq, D, generator=g).to(torch.bfloat16).cuda()
        if layout == "bshd":
            k, v = (torch.randn(B, L, Hkv, D, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
        else:
            k, v = (torch.randn(B, Hkv, L, D, generator=g).to(torch.bfloat16).cuda().transpose(1, 2) for _ in range(2))
        s = torch.tensor([L, max(1, L // 3)], dtype=torch.int32, device="cuda")
        for layer in range(2):
            out, lse, ro, rl = run_and_ref(q, k, v, s)
            check_close(out, lse, ro, rl, q.dtype, f"{layout} L={L} layer {layer}")
    assert len(DA._launchers) <= made + 2  # the first length's launchers (return_lse) only, not one per length
