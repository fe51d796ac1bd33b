"""Padding, sliding windows, softcapping and sinks on the kernels (:mod:`cute_kernels.integrations.hf`).

CPU:

- ``unpad_metadata`` (the packed form of a padded batch) against a brute force, for left / right
  padding, gaps, empty rows and every query length; packing and scattering back with it round-trips.
- The dense mask a fallback builds from a padding mask equals HF's own sdpa mask of the same call
  (sliding and full layers, the cache offsets of every cache kind).
- The mask function: None without padding over the layer's keys, the 2-D slice with, HF's dense mask
  for every other pattern (overlays, chunked, packed sequences, another window).
- The decision table: each kind of call (prefill and decode, dynamic / static / rolled sliding
  buffers, padded left / right / with gaps, softcap, sinks, grad, dense masks, tracing) takes the
  documented path with the documented kernel arguments, and its result equals a float64 reference of
  HF's semantics (key j visible to query i when i - W < j <= i, padding keys invisible).
- Whole tiny bf16 models of every family (``cpu_as_gpu``: a torch stand-in of ``flash_attn``,
  ``decode_attn``'s CPU path), a left-padded batch of 4 prompts past the window, DynamicCache and
  StaticCache (and a config-less DynamicCache, whose layers keep every key): the same greedy tokens as
  the reference implementation (eager for softcap / sinks, else sdpa) under
  :func:`assert_same_generation`'s rule, no fallback; the unpadding runs once per mask per forward.

GPU (``-m gpu``, H200): the same generations on the kernels, 32 greedy tokens, both cache kinds past
the window, ``hf_stats["fallback"] == 0``.
"""

import warnings

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", minversion="5",
    reason="the Hugging Face integration needs transformers>=5 (pip install -e '.[hf]')")

from transformers import DynamicCache  # noqa: E402
from transformers import masking_utils as mu  # noqa: E402

from cute_kernels.attention import decode as D  # noqa: E402
from cute_kernels.integrations import hf  # noqa: E402

from _hf_models import (FAMILIES, FLASH_CALLS, PREFIX, assert_same_generation, cpu_as_gpu, fresh,  # noqa: E402,F401
                        generate, left_padded, ours, reference_attn, tiny_model, window_model)

gpu = pytest.mark.gpu
TOL = 2e-2  # bf16 inputs and output against a float64 reference
W = 8  # the CPU tests' window


# ---------------------------------------------------------------------------------------- unpad math
def brute_unpad(mask, q_len):
    """The packed form by lists: ``mask`` a list of rows of bools."""
    B, n = len(mask), len(mask[0])
    keys = [[j for j in range(n) if mask[b][j]] for b in range(B)]
    queries = [[i for i in range(q_len) if mask[b][n - q_len + i]] for b in range(B)]
    cu_k, cu_q = [0], [0]
    for b in range(B):
        cu_k.append(cu_k[-1] + len(keys[b]))
        cu_q.append(cu_q[-1] + len(queries[b]))
    k_index = [(b, j) for b in range(B) for j in keys[b]]
    q_index = [(b, i) for b in range(B) for i in queries[b]]
    one_run = all(r == list(range(r[0], r[0] + len(r))) for r in keys if r)
    return dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(map(len, queries)),
                max_seqlen_k=max(map(len, keys)), q_index=q_index, k_index=k_index, total_q=len(q_index),
                all_queries=all(len(r) == q_len for r in queries), one_run=one_run)


def masks():
    """(name, (B, n) bool mask): the patterns a model passes and some it should survive."""
    n = 13
    left = torch.ones(4, n, dtype=torch.bool)
    for b, p in enumerate([0, 3, 9, 12]):
        left[b, :p] = False
    right = left.flip(1)
    gaps = torch.ones(3, n, dtype=torch.bool)
    gaps[0, 4:6] = False
    gaps[1, ::2] = False
    gaps[2, :] = False  # an empty row
    rand = torch.rand(5, n, generator=torch.Generator().manual_seed(4)) > 0.4
    return [("left", left), ("right", right), ("gaps", gaps), ("random", rand),
            ("ones", torch.ones(2, n, dtype=torch.bool))]


@pytest.mark.parametrize("name,mask", masks(), ids=[m[0] for m in masks()])
@pytest.mark.parametrize("q_len", [1, 3, 13])
def test_unpad_metadata_matches_brute_force(name, mask, q_len):
    meta = hf.unpad_metadata(mask, q_len)
    want = brute_unpad(mask.tolist(), q_len)
    assert meta.cu_seqlens_q.dtype == meta.cu_seqlens_k.dtype == torch.int32
    assert meta.cu_seqlens_q.tolist() == want["cu_seqlens_q"] and meta.cu_seqlens_k.tolist() == want["cu_seqlens_k"]
    for field in ("max_seqlen_q", "max_seqlen_k", "total_q", "all_queries", "one_run"):
        assert getattr(meta, field) == want[field], field
    assert list(zip(*(t.tolist() for t in meta.q_index))) == want["q_index"]
    assert list(zip(*(t.tolist() for t in meta.k_index))) == want["k_index"]
    if name in ("left", "right", "ones"):
        assert meta.one_run
    # packing (B, n, H, D) rows and scattering them back: the valid rows, zeros elsewhere
    x = torch.randn(mask.shape[0], mask.shape[1], 2, 4)
    packed = x[meta.k_index]
    assert packed.shape[0] == want["cu_seqlens_k"][-1]
    back = torch.zeros_like(x)
    back[meta.k_index] = packed
    assert torch.equal(back, x * mask[:, :, None, None])
    with pytest.raises(ValueError, match="queries"):
        hf.unpad_metadata(mask, mask.shape[1] + 1)


# (kv_length, kv_offset) of each cache kind for a mask of T columns and q new tokens
def cache_layouts(T, q, window):
    full = T - q  # tokens cached before this step
    return {
        "no cache / dynamic full": (T, 0),
        "static full (buffer longer)": (T + 9, 0),
        "dynamic sliding": ((window - 1 + q, full - window + 1) if full >= window else (T, 0)),
        "static sliding, rolled": ((window + q - 1, full - window + 1) if full >= window else
                                   (T, 0) if T > window else (window, 0)),
    }


@pytest.mark.parametrize("T,q", [(20, 20), (21, 1), (30, 1), (30, 4), (6, 1), (6, 6)])
@pytest.mark.parametrize("sliding", [False, True])
def test_fallback_mask_from_padding_equals_hfs_mask(T, q, sliding):
    """For every cache kind's (kv_length, kv_offset), the padding slice the mask function returns,
    expanded by the fallback with causality and the window, is HF's own sdpa mask of the same call over
    the keys the mask covers (nothing beyond them)."""
    B = 3
    full2d = torch.ones(B, T, dtype=torch.bool)
    full2d[1, :min(5, T - 1)] = False
    full2d[2, :T - 2] = False
    window = W if sliding else None
    fn = mu.sliding_window_causal_mask_function(W) if sliding else mu.causal_mask_function
    for kind, (kv_length, kv_offset) in cache_layouts(T, q, W).items():
        if not sliding and "sliding" in kind:
            continue
        hf_mask = mu.sdpa_mask(batch_size=B, q_length=q, kv_length=kv_length, q_offset=T - q, kv_offset=kv_offset,
                               mask_function=fn, attention_mask=full2d, local_size=window, allow_is_causal_skip=False)
        ours_2d = hf.mask_function(B, q, kv_length, q_offset=T - q, kv_offset=kv_offset, mask_function=fn,
                                   attention_mask=full2d, local_size=window)
        seen = full2d[:, -kv_length:]
        assert torch.equal(ours_2d, seen), kind  # the padding slice (the mask has padding in its columns)
        n = seen.shape[1]
        dense = hf._padding_dense(seen, q, True, window)
        assert torch.equal(dense, hf_mask[..., :n]), kind
        assert not hf_mask[..., n:].any(), kind


def test_mask_function_returns_per_pattern():
    ones = torch.ones(2, 30, dtype=torch.bool)
    left = ones.clone()
    left[0, :25] = False
    sw = mu.sliding_window_causal_mask_function(W)
    # no padding: None (plain causal, or sliding whose keys miss the padding)
    assert hf.mask_function(2, 30, 30, attention_mask=ones) is None
    assert hf.mask_function(2, 1, W, q_offset=29, kv_offset=30 - W, mask_function=sw, attention_mask=left[:, :30],
                            local_size=W) is not None  # its last 8 keys include padding
    late = ones.clone()
    late[0, :10] = False
    assert hf.mask_function(2, 1, W, q_offset=29, kv_offset=30 - W, mask_function=sw, attention_mask=late,
                            local_size=W) is None  # the padding is behind the window
    # padding: the 2-D boolean slice over the layer's keys (an integer mask too)
    m = hf.mask_function(2, 30, 30, attention_mask=left.long())
    assert m.dtype == torch.bool and torch.equal(m, left)
    m = hf.mask_function(2, 1, W, mask_function=sw, attention_mask=left, local_size=W)
    assert torch.equal(m, left[:, -W:])
    # other patterns: HF's dense mask
    for fn, local in [(mu.or_masks(mu.causal_mask_function, lambda b, h, q, k: k == 0), None),
                      (mu.and_masks(mu.causal_mask_function, lambda b, h, q, k: k >= 0), None),
                      (mu.sliding_window_causal_mask_function(4), W),  # another width than local_size
                      (mu.and_masks(mu.sliding_window_overlay(W), mu.causal_mask_function,
                                    lambda b, h, q, k: k >= 0), W),
                      (mu.causal_mask_function, W)]:
        d = hf.mask_function(2, 30, 30, mask_function=fn, attention_mask=ones, local_size=local)
        assert d is not None and d.shape == (2, 1, 30, 30)
    # through a model's own entry points: a sliding layer's mask, and packed sequences (dense)
    cfg = window_model("mistral", W, attn="cute_kernels").config
    emb = torch.zeros(2, 30, 8)
    assert torch.equal(mu.create_sliding_window_causal_mask(cfg, emb, left, None), left)
    assert mu.create_sliding_window_causal_mask(cfg, emb, ones, None) is None
    packed_pos = torch.cat([torch.arange(12), torch.arange(18)])[None].expand(2, 30)
    d = mu.create_causal_mask(cfg, emb, None, None, position_ids=packed_pos)
    assert d is not None and d.dim() == 4


# ---------------------------------------------------------------------------------- decision table
def ref(q, k, v, scale, vis, softcap=None, sinks=None):
    """float64 (B, Hq, Sq, D) x (B, Hkv, Sk, D), visibility (B, Sq, Sk) -> (B, Sq, Hq, D); a row that
    sees no key gives 0."""
    G = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    s = q.double() @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~vis[:, None], float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double().view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)], -1)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isneginf(m), 0.0, m))
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-300)
    if sinks is not None:
        p = p[..., :-1]
    return (p @ v).transpose(1, 2)


def band(B, q_len, n, window=None, lens=None, pad=None):
    """(B, q_len, n) visibility: queries the last q_len of each sequence's ``lens`` (default n) keys,
    causal, within ``window``, keys of ``pad`` (B, n) only."""
    lens = torch.full((B,), n) if lens is None else torch.as_tensor(lens)
    j = torch.arange(n)[None, None, :]
    last = (lens[:, None] - q_len + torch.arange(q_len)[None, :])[:, :, None]
    vis = j <= last
    if window is not None:
        vis &= j > last - window
    if pad is not None:
        vis &= pad[:, None, :]
    return vis


def tensors(B, q_len, kv_len, seed=0, static=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 4, q_len, 64, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B, 2, kv_len, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    if static:
        torch._dynamo.mark_static_address(k)
        torch._dynamo.mark_static_address(v)
    return q, k, v


def layer(family):
    return window_model(family, W).model.layers[1].self_attn


def pos(B, last, q_len=1):
    return torch.arange(last - q_len + 1, last + 1)[None].expand(B, q_len)


@pytest.fixture
def decode_spy(monkeypatch):
    seen = []
    orig = D.decode_attn

    def spy(q, k, v, **kw):
        seen.append(dict(kw, capacity=k.shape[1]))
        return orig(q, k, v, **kw)

    monkeypatch.setattr(D, "decode_attn", spy)
    return seen


def call(attn, q, k, v, mask=None, **kw):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        o, _ = hf.attention_forward(attn, q, k, v, mask, scaling=0.125, **kw)
    return o, ours(rec)


def pad_rows(mask, q_len):
    """(B, q_len) valid query rows of a padding mask (its last columns)."""
    return mask[:, -q_len:]


def close(o, want, rows=None):
    o = o.double()
    if rows is not None:  # padded query rows: zero on the kernels, anything on a fallback
        o, want = o[rows], want[rows]
    err = (o - want).abs().max().item()
    assert err < TOL, err


@pytest.mark.usefixtures("cpu_as_gpu")
class TestDecisions:
    """Each kind of call: the path, the kernel's arguments, the result against HF's semantics."""

    def test_prefill_windows(self):
        attn = layer("mistral")
        q, k, v = tensors(2, 20, 20)
        o, warned = call(attn, q, k, v, sliding_window=W)
        assert warned == [] and FLASH_CALLS[-1]["window_size"] == (W - 1, 0) and FLASH_CALLS[-1]["causal"]
        close(o, ref(q, k, v, 0.125, band(2, 20, 20, W)))
        q, k, v = tensors(2, 6, 6)
        call(attn, q, k, v, sliding_window=W)
        assert FLASH_CALLS[-1]["window_size"] == (-1, -1)  # no query sees more than W keys
        assert hf.hf_stats == {"flash_attn": 2, "decode_attn": 0, "fallback": 0}

    def test_decode_dynamic_sliding(self, decode_spy):
        """A DynamicSlidingWindowLayer past the window: W - 1 kept keys + the new one, positions far
        beyond: decode_attn over all W keys (the lengths clamped to the key length)."""
        attn = layer("mistral")
        q, k, v = tensors(2, 1, W)
        o, warned = call(attn, q, k, v, sliding_window=W, position_ids=pos(2, 30))
        assert warned == [] and decode_spy[-1]["cache_seqlens"].tolist() == [W, W]
        assert decode_spy[-1]["cache_seqlens"].dtype == torch.int32
        close(o, ref(q, k, v, 0.125, band(2, 1, W)))
        assert hf.hf_stats == {"flash_attn": 0, "decode_attn": 1, "fallback": 0}

    @pytest.mark.parametrize("last,valid", [(5, 6), (30, W)])
    def test_decode_static_sliding(self, decode_spy, last, valid):
        """A StaticSlidingWindowLayer's buffer (W slots): filling (first position + 1 valid), then
        rolled (the last W positions, all valid)."""
        attn = layer("gemma2")
        q, k, v = tensors(2, 1, W, static=True)
        o, warned = call(attn, q, k, v, sliding_window=W, softcap=0.5, position_ids=pos(2, last))
        assert warned == [] and decode_spy[-1]["cache_seqlens"].tolist() == [valid, valid]
        assert decode_spy[-1]["softcap"] == 0.5 and decode_spy[-1]["capacity"] == W
        close(o, ref(q, k, v, 0.125, band(2, 1, W, lens=[valid, valid]), softcap=0.5))

    def test_decode_chunk_past_the_window_takes_flash_attn(self):
        """Several new tokens after W - 1 kept keys, and one token against a cache that keeps every
        key: more than W keys, so the window matters: flash_attn with (W - 1, 0)."""
        attn = layer("mistral")
        q, k, v = tensors(2, 3, W - 1 + 3)
        o, _ = call(attn, q, k, v, sliding_window=W, position_ids=pos(2, 40, 3))
        assert FLASH_CALLS[-1]["window_size"] == (W - 1, 0) and FLASH_CALLS[-1]["shapes"][1][1] == W + 2
        close(o, ref(q, k, v, 0.125, band(2, 3, W + 2, W)))
        q, k, v = tensors(2, 1, 40)
        o, _ = call(attn, q, k, v, sliding_window=W, position_ids=pos(2, 39))
        assert FLASH_CALLS[-1]["window_size"] == (W - 1, 0)
        close(o, ref(q, k, v, 0.125, band(2, 1, 40, W)))
        assert hf.hf_stats == {"flash_attn": 2, "decode_attn": 0, "fallback": 0}

    def test_static_full_buffer_with_a_window(self):
        """A full-length static buffer on a sliding layer (a cache without sliding layers): the keys
        sliced to the valid length, the window applied."""
        attn = layer("mistral")
        q, k, v = tensors(2, 1, 48, static=True)
        o, _ = call(attn, q, k, v, sliding_window=W, position_ids=pos(2, 29))
        assert FLASH_CALLS[-1]["shapes"][1][1] == 30 and FLASH_CALLS[-1]["window_size"] == (W - 1, 0)
        close(o, ref(q, k, v, 0.125, band(2, 1, 48, W, lens=[30, 30])))

    @pytest.mark.parametrize("family", ["llama", "mistral", "gemma2", "gpt_oss"])
    @pytest.mark.parametrize("q_len", [17, 1])
    @pytest.mark.parametrize("side", ["left", "right"])
    def test_padded_batches_run_packed(self, family, q_len, side):
        """A 2-D padding mask: packed flash_attn (cu_seqlens from the mask, the window, softcap and sinks
        per sequence), zeros at padded query rows; a static buffer longer than the mask is cut to it."""
        if side == "right" and q_len == 1:
            pytest.skip("decoding after right padding: the new token follows the padding (gaps)")
        attn = layer(family)
        n = 17 if q_len == 17 else 25
        mask = torch.ones(3, n, dtype=torch.bool)
        for b, p in enumerate([0, 4, 13]):
            if side == "left":
                mask[b, :p] = False
            else:
                mask[b, n - p:] = False
        q, k, v = tensors(3, q_len, n + 7, static=True)  # a static buffer: 7 slots past the mask
        kw = dict(sliding_window=W if family != "llama" else None)
        softcap = sinks = None
        if family == "gemma2":
            kw["softcap"] = softcap = 0.5
        if family == "gpt_oss":
            kw["s_aux"] = sinks = attn.sinks.detach()
        o, warned = call(attn, q, k, v, mask, **kw)
        if side == "left" and q_len == 1:  # a left-padded decode step: in place, cache_leftpad (sinks too)
            assert warned == [] and hf.hf_stats == {"flash_attn": 0, "decode_attn": 1, "fallback": 0}
            want = ref(q, k[:, :, :n], v[:, :, :n], 0.125, band(3, q_len, n, kw["sliding_window"], pad=mask),
                       softcap=softcap, sinks=sinks)
            close(o, want, pad_rows(mask, q_len))
            return
        assert warned == [] and hf.hf_stats == {"flash_attn": 1, "decode_attn": 0, "fallback": 0}
        c = FLASH_CALLS[-1]
        lens_k = mask.sum(1).tolist()
        assert c["cu_seqlens_k"].tolist() == [0] + torch.tensor(lens_k).cumsum(0).tolist()
        assert c["max_seqlen_k"] == max(lens_k) and c["causal"]
        assert c["window_size"] == ((W - 1, 0) if kw["sliding_window"] and max(lens_k) > W else (-1, -1))
        assert c["softcap"] == (softcap or 0.0)
        assert (c["learnable_sink"] is None) == (sinks is None)
        if sinks is not None:
            assert c["learnable_sink"].dtype == torch.float32
        want = ref(q, k[:, :, :n], v[:, :, :n], 0.125, band(3, q_len, n, kw["sliding_window"], pad=mask),
                   softcap=softcap, sinks=sinks)
        rows = pad_rows(mask, q_len)
        close(o, want, rows)
        assert not o[~rows].any()  # padded query rows: zeros

    def test_keys_beyond_the_mask(self):
        """Keys the mask does not cover: a static buffer's slots past it are unfilled (its first keys
        count), another key tensor's extra keys are older ones (its last keys count: a sliding layer
        that records its past returns more than the window, transformers 5.17)."""
        mask = torch.ones(2, 12, dtype=torch.bool)
        mask[1, :4] = False
        for static in (True, False):
            q, k, v = tensors(2, 1, 17, static=static)
            kk, vv = (t[:, :, :12] if static else t[:, :, 5:] for t in (k, v))
            o, warned = call(layer("mistral"), q, k, v, mask, sliding_window=W)
            assert warned == [] and hf.hf_stats["decode_attn"] == 1 + (not static)  # left padding: in place
            close(o, ref(q, kk, vv, 0.125, band(2, 1, 12, W, pad=mask)))

    def test_gaps(self):
        """A mask with a gap inside a sequence: exact packed without a window; with one, HF's window
        counts the gap's columns, packing would not: the fallback (HF's mask), one warning."""
        mask = torch.ones(2, 20, dtype=torch.bool)
        mask[0, 5:9] = False
        q, k, v = tensors(2, 20, 20)
        o, warned = call(layer("llama"), q, k, v, mask)
        assert warned == [] and FLASH_CALLS[-1]["cu_seqlens_k"].tolist() == [0, 16, 36]
        close(o, ref(q, k, v, 0.125, band(2, 20, 20, pad=mask)), mask)
        o, warned = call(layer("mistral"), q, k, v, mask, sliding_window=W)
        assert warned == [f"{PREFIX} running transformers' sdpa attention: {hf.R_GAPS}"]
        close(o, ref(q, k, v, 0.125, band(2, 20, 20, W, pad=mask)), mask)
        o, warned = call(layer("gemma2"), q, k, v, mask, sliding_window=W, softcap=0.5)
        assert warned == [f"{PREFIX} running the model's eager attention: {hf.R_GAPS}"]
        close(o, ref(q, k, v, 0.125, band(2, 20, 20, W, pad=mask), softcap=0.5), mask)
        assert hf.hf_stats == {"flash_attn": 1, "decode_attn": 0, "fallback": 2}
        sparse = torch.zeros(2, 20, dtype=torch.bool)  # fewer than W keys, spread wider than W columns
        sparse[:, ::4] = True
        q1, k1, v1 = tensors(2, 1, 20)
        sparse[:, -1] = True
        hf.reset_stats()
        o, warned = call(layer("mistral"), q1, k1, v1, sparse, sliding_window=W)
        assert warned == [f"{PREFIX} running transformers' sdpa attention: {hf.R_GAPS}"]
        assert hf.hf_stats == {"flash_attn": 0, "decode_attn": 0, "fallback": 1}
        close(o, ref(q1, k1, v1, 0.125, band(2, 1, 20, W, pad=sparse)))
        assert (ref(q1, k1, v1, 0.125, band(2, 1, 20, pad=sparse)) - ref(q1, k1, v1, 0.125, band(
            2, 1, 20, W, pad=sparse))).abs().max() > 10 * TOL  # the window matters there

    @pytest.mark.parametrize("q_len", [20, 1])
    @pytest.mark.parametrize("family", ["mistral", "gpt_oss"])
    def test_padded_batch_with_grad_runs_packed(self, family, q_len):
        """A padded batch whose inputs require grad runs the packed ``flash_attn`` (differentiable; a
        decode-shaped one too: ``decode_attn`` has no backward), the layer's ``deterministic`` passed on;
        output and gradients against the float64 reference on the valid query rows."""
        attn = layer(family)
        mask = torch.ones(2, 20, dtype=torch.bool)
        mask[1, :6] = False
        q, k, v = tensors(2, q_len, 20)
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        kw = dict(sliding_window=W, deterministic=True)
        sinks = None
        if family == "gpt_oss":
            kw["s_aux"] = sinks = attn.sinks.detach()
        o, warned = call(attn, q, k, v, mask, **kw)
        assert warned == [] and hf.hf_stats == {"flash_attn": 1, "decode_attn": 0, "fallback": 0}
        assert FLASH_CALLS[-1]["cu_seqlens_q"] is not None and FLASH_CALLS[-1]["deterministic"] is True
        vis = band(2, q_len, 20, W, pad=mask)
        rows = pad_rows(mask, q_len)
        want = ref(q, k, v, 0.125, vis, sinks=sinks)
        close(o.detach(), want.detach(), rows)
        dout = torch.randn(o.shape, dtype=torch.float64) * rows[:, :, None, None]
        got = torch.autograd.grad((o.double() * dout).sum(), (q, k, v))
        exp = torch.autograd.grad((want * dout).sum(), (q, k, v))
        for g, e in zip(got, exp):
            assert (g.double() - e).abs().max().item() < 2 * TOL

    @pytest.mark.parametrize("why", ["dense mask", "tracing"])
    @pytest.mark.parametrize("family", ["mistral", "gpt_oss"])
    def test_remaining_fallbacks_honour_everything(self, monkeypatch, why, family):
        """A dense 4-D mask, a padded batch under tracing: the fallback (the model's eager attention for
        a layer with sinks), with the window, the padding and the sinks applied."""
        attn = layer(family)
        mask = torch.ones(2, 20, dtype=torch.bool)
        mask[1, :6] = False
        q, k, v = tensors(2, 20, 20)
        kw = dict(sliding_window=W)
        sinks = None
        if family == "gpt_oss":
            kw["s_aux"] = sinks = attn.sinks.detach()
        vis = band(2, 20, 20, W, pad=mask)
        given, reason = mask, None
        if why == "dense mask":
            given, reason = vis[:, None], hf.R_MASK
        else:
            import transformers.utils.import_utils as iu

            monkeypatch.setattr(iu, "is_tracing", lambda *a, **k: True)
            reason = hf.R_TRACED_PADDING
        o, warned = call(attn, q, k, v, given, **kw)
        where = "the model's eager attention" if sinks is not None else "transformers' sdpa attention"
        assert warned == [f"{PREFIX} running {where}: {reason}"]
        assert hf.hf_stats == {"flash_attn": 0, "decode_attn": 0, "fallback": 1}
        close(o.detach(), ref(q.detach(), k, v, 0.125, vis, sinks=sinks), mask)


# ------------------------------------------------------------------------------------- whole models
CPU_LENGTHS = [20, 15, 11, 5]  # past the window W = 8 (one prompt shorter than it)
CPU_NEW = 10


def padded_generations(model, ids, mask, family, cache, new: int):
    """Greedy generations of ``new`` tokens by the family's reference attention, then by the kernels (stats
    reset before, warnings recorded): ``(reference, ours, warnings)``."""
    with torch.no_grad():
        ref_out = generate(model, ids, mask, reference_attn(family), cache, new)
        hf.reset_stats()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            return ref_out, generate(model, ids, mask, "cute_kernels", cache, new), rec


@pytest.mark.usefixtures("cpu_as_gpu")
@pytest.mark.parametrize("cache", [None, "static"], ids=["dynamic", "static"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_cpu_padded_generation_on_the_kernel_paths(family, cache):
    ref_out, out, rec = padded_generations(window_model(family, W), *left_padded(CPU_LENGTHS, 512, seed=3), family,
                                           cache, CPU_NEW)
    assert ours(rec) == []
    stats = dict(hf.hf_stats)
    assert stats["fallback"] == 0 and stats["flash_attn"] + stats["decode_attn"] == 2 * CPU_NEW, stats
    if family in ("mistral", "gemma2", "gemma3", "gpt_oss", "qwen2"):  # sliding layers: decode_attn once
        assert stats["decode_attn"] > 0, stats  # the window leaves the padding behind
    assert_same_generation(ref_out, out)


def configless_generations(model, ids, mask, new: int):
    """Greedy generations of ``new`` tokens with ``DynamicCache()`` (no config: every layer keeps every
    key), by sdpa then by the kernels (stats reset before): ``(reference, ours)``."""
    kw = dict(attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, disable_compile=True,
              return_dict_in_generate=True, output_logits=True, pad_token_id=0)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        ref_out = model.generate(ids, past_key_values=DynamicCache(), **kw)
        model.set_attn_implementation("cute_kernels")
        hf.reset_stats()
        return ref_out, model.generate(ids, past_key_values=DynamicCache(), **kw)


def configless_routes(padded: bool, new: int) -> dict:
    """The two layers' calls: unpadded, every step on flash_attn with the window (more keys than it); left
    padded, the prefill packed and the decode steps in place (decode_attn with the window, cache_leftpad)."""
    if padded:
        return {"flash_attn": 2, "decode_attn": 2 * (new - 1), "fallback": 0}
    return {"flash_attn": 2 * new, "decode_attn": 0, "fallback": 0}


@pytest.mark.usefixtures("cpu_as_gpu")
@pytest.mark.parametrize("padded", [False, True])
def test_cpu_configless_dynamic_cache_keeps_every_key(padded):
    """``DynamicCache()`` without a config: full layers on a sliding model, every key kept; decode steps
    take flash_attn with the window, or, left-padded, decode_attn with the window and cache_leftpad."""
    ref_out, out = configless_generations(window_model("mistral", W), *left_padded(
        CPU_LENGTHS if padded else [20] * 4, 512, seed=5), CPU_NEW)
    assert hf.hf_stats == configless_routes(padded, CPU_NEW), hf.hf_stats
    assert (FLASH_CALLS[-1]["cu_seqlens_q"] is not None) == padded
    assert all(c["window_size"] == (W - 1, 0) for c in FLASH_CALLS)
    assert_same_generation(ref_out, out)


@pytest.mark.usefixtures("cpu_as_gpu")
def test_cpu_unpadding_runs_once_per_mask_per_forward(monkeypatch):
    model = window_model("gemma2", W, num_hidden_layers=4)  # 2 sliding + 2 full layers
    ids, mask = left_padded([20, 3], 512, seed=6)  # the 3-token prompt keeps padding in every window
    calls = []
    from cute_kernels.integrations import hf_masks

    orig = hf_masks.unpad_metadata
    monkeypatch.setattr(hf_masks, "unpad_metadata", lambda m, q: calls.append(q) or orig(m, q))
    with torch.no_grad():
        generate(model, ids, mask, "cute_kernels", None, 4)
    assert hf.hf_stats == {"flash_attn": 4, "decode_attn": 4 * 3, "fallback": 0}, hf.hf_stats
    assert calls == [20, 20] + [1, 1] * 3  # per forward: the full layers' mask and the sliding layers'


# -------------------------------------------------------------------------------------------- GPU
GPU_FAMILIES = [f for f, (cls, _) in FAMILIES.items() if hasattr(transformers, cls)]
GPU_W = 32
GPU_LENGTHS = [64, 50, 37, 13]  # three longer than the window, one shorter (padding inside the window)
GPU_NEW = 32


def gpu_model(family, **over):
    return window_model(family, GPU_W, num_attention_heads=8, num_key_value_heads=2, hidden_size=512,
                        intermediate_size=1024, vocab_size=1000, **over).cuda()


@gpu
@pytest.mark.parametrize("cache", [None, "static"], ids=["dynamic", "static"])
@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_padded_generation_on_the_kernels(family, cache):
    """A left-padded batch of 4 prompts, 32 greedy tokens past the window: the tokens of the reference
    (eager for softcap / sinks, else sdpa) up to a near-tie, every call on the kernels."""
    ids, mask = left_padded(GPU_LENGTHS, 1000, seed=8)
    ref_out, out, rec = padded_generations(gpu_model(family), ids.cuda(), mask.cuda(), family, cache, GPU_NEW)
    stats = dict(hf.hf_stats)
    same = (ref_out.sequences == out.sequences).float().mean().item()
    print(f"{family} {cache or 'dynamic'}: {stats}, {same:.1%} identical tokens")
    assert ours(rec) == [], ours(rec)
    assert stats["fallback"] == 0 and stats["flash_attn"] + stats["decode_attn"] == 2 * GPU_NEW, stats
    assert_same_generation(ref_out, out)


@gpu
@pytest.mark.parametrize("padded", [False, True])
def test_configless_dynamic_cache_on_the_kernels(padded):
    ids, mask = left_padded(GPU_LENGTHS if padded else [64] * 4, 1000, seed=9)
    ref_out, out = configless_generations(gpu_model("mistral"), ids.cuda(), mask.cuda(), GPU_NEW)
    assert hf.hf_stats == configless_routes(padded, GPU_NEW), hf.hf_stats
    assert_same_generation(ref_out, out)
