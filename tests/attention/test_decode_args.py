"""decode_attn / merge_state(s) argument checks on the CPU: non-tensors raise TypeError naming the
argument, ``num_splits`` must be an int >= 1, negative page ids are rejected in checked mode and
clamped (never read out of bounds) unchecked, warm-up specs are checked, and ``torch.compile(
dynamic=True)`` traces ``decode_attn`` with the default scale (CPU tensors: the custom op's fake
implementation traces, its CPU path runs)."""

from __future__ import annotations

import math

import pytest
import torch

import cute_kernels
from cute_kernels.attention import MergeConfig, explain, merge_state, merge_states
from cute_kernels.attention.decode import decode_attn, decode_attn_reference
from cute_kernels.attention.decode_plan import check_num_splits, resolve_scale
from cute_kernels.common import jit
from cute_kernels.testing import count_launches


def make_inputs(B=2, Sq=1, Hq=8, Hkv=2, D=64, lens=(5, 9), Lmax=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    Lmax = Lmax or max(lens)
    q = torch.randn(B, Sq, Hq, D, generator=g).bfloat16()
    k = torch.randn(B, Lmax, Hkv, D, generator=g).bfloat16()
    v = torch.randn(B, Lmax, Hkv, D, generator=g).bfloat16()
    return q, k, v, torch.tensor(lens, dtype=torch.int32)


def paged(k, v, page_size):
    """(B, Lmax, H, D) -> pages (B * pps, page_size, H, D) in order, and the block table."""
    B, Lmax, H, D = k.shape
    pps = -(-Lmax // page_size)
    pad = (0, 0, 0, 0, 0, pps * page_size - Lmax)
    kp = torch.nn.functional.pad(k, pad).reshape(B * pps, page_size, H, D)
    vp = torch.nn.functional.pad(v, pad).reshape(B * pps, page_size, H, D)
    return kp, vp, torch.arange(B * pps, dtype=torch.int32).reshape(B, pps)


# ------------------------------------------------------------------------------- non-tensor arguments
@pytest.mark.parametrize("name,value", [
    ("q", [[0.0]]), ("k_cache", 1.0), ("v_cache", None), ("cache_seqlens", [5, 9]),
    ("block_table", [[0]]), ("out", [0]), ("workspace", 3),
])
def test_decode_non_tensor_argument(name, value):
    q, k, v, s = make_inputs()
    kw = dict(q=q, k_cache=k, v_cache=v, cache_seqlens=s)
    kw[name] = value
    with pytest.raises(TypeError, match=rf"decode_attn: {name} must be a torch.Tensor"):
        decode_attn(kw.pop("q"), kw.pop("k_cache"), kw.pop("v_cache"), **kw)


def test_merge_non_tensor_arguments():
    o, lse = torch.randn(4, 64), torch.randn(4)
    for i, name in enumerate(("o_a", "lse_a", "o_b", "lse_b")):
        args = [o, lse, o, lse]
        args[i] = [1.0]
        with pytest.raises(TypeError, match=rf"merge_state: {name} must be a torch.Tensor"):
            merge_state(*args)
    with pytest.raises(TypeError, match="merge_states: o_parts must be a torch.Tensor"):
        merge_states([1.0], lse[None])
    with pytest.raises(TypeError, match="merge_states: lse_parts must be a torch.Tensor"):
        merge_states(o[None], 0.0)


# ------------------------------------------------------------------------------------------ num_splits
@pytest.mark.parametrize("value,exc", [
    ("four", TypeError), (2.5, TypeError), (2.0, TypeError), (True, TypeError), ([2], TypeError),
    (0, ValueError), (-1, ValueError), (-7, ValueError),
])
def test_num_splits_rejected(value, exc):
    q, k, v, s = make_inputs()
    with pytest.raises(exc, match="num_splits"):
        decode_attn(q, k, v, cache_seqlens=s, num_splits=value)
    with pytest.raises(exc, match="num_splits"):
        explain(2, 8, 2, 1024, num_splits=value)


def test_num_splits_accepted():
    import numpy as np

    assert check_num_splits(None) is None
    assert check_num_splits(3) == 3 and check_num_splits(np.int64(4)) == 4 and check_num_splits(torch.tensor(2)) == 2
    q, k, v, s = make_inputs()
    ref = decode_attn_reference(q, k, v, s)[0].to(q.dtype)
    assert torch.equal(decode_attn(q, k, v, cache_seqlens=s, num_splits=2), ref)


# --------------------------------------------------------------------------------- causal, checked
@pytest.mark.parametrize("name,value,match", [
    ("causal", "yes", "causal must be a bool, got str"), ("causal", torch.tensor(True), "causal must be a bool, got Tensor"),
    ("causal", 1, "causal must be a bool, got int"), ("causal", None, "causal must be a bool, got NoneType"),
    ("checked", "no", "checked must be a bool or None, got str"), ("checked", 0, "checked must be a bool or None"),
])
def test_flags_must_be_bools(name, value, match):
    """A string or a tensor would pass as its truth value (a tensor causal would also enter the compile
    key by its identity: a compile per call); nothing runs."""
    q, k, v, s = make_inputs()
    with count_launches() as n, pytest.raises(TypeError, match=f"decode_attn: {match}"):
        decode_attn(q, k, v, cache_seqlens=s, **{name: value})
    assert n.total() == 0


# ---------------------------------------------------------------------------------------- page ids
def test_negative_page_id_checked_mode_rejects(monkeypatch):
    q, k, v, s = make_inputs(lens=(30, 17), Lmax=32)
    kp, vp, bt = paged(k, v, 16)
    bad = bt.clone()
    bad[1, 0] = -1
    monkeypatch.setenv("CUTE_KERNELS_CHECKED", "1")
    with pytest.raises(ValueError, match=r"block_table\[1\] has page ids outside \[0, 4\)"):
        decode_attn(q, kp, vp, cache_seqlens=s, block_table=bad)
    bad[1, 0], bad[0, 1] = bt[1, 0], -5
    with pytest.raises(ValueError, match=r"block_table\[0\]"):
        decode_attn(q, kp, vp, cache_seqlens=s, block_table=bad)
    decode_attn(q, kp, vp, cache_seqlens=s, block_table=bt)  # valid ids pass


def test_bad_page_ids_unchecked_are_clamped():
    """Unchecked, a page id below 0 reads page 0 and one past the end the last page (as the kernel
    clamps them): wrong numbers, never an out-of-bounds read or an IndexError."""
    q, k, v, s = make_inputs(lens=(30, 17), Lmax=32)
    kp, vp, bt = paged(k, v, 16)
    bad, clamped = bt.clone(), bt.clone()
    bad[1, 0], clamped[1, 0] = -1, 0
    bad[0, 1], clamped[0, 1] = 10**6, kp.shape[0] - 1
    out = decode_attn(q, kp, vp, cache_seqlens=s, block_table=bad, checked=False)
    ref = decode_attn(q, kp, vp, cache_seqlens=s, block_table=clamped, checked=False)
    assert torch.equal(out, ref)


def test_lengths_past_capacity_unchecked_are_clamped():
    q, k, v, _ = make_inputs(lens=(5, 9))
    out = decode_attn(q, k, v, cache_seqlens=torch.tensor([50, -3], dtype=torch.int32), checked=False)
    ref = decode_attn(q, k, v, cache_seqlens=torch.tensor([9, 0], dtype=torch.int32), checked=False)
    assert torch.equal(out, ref)


# ------------------------------------------------------------------------------------------- scale
def test_scale_check():
    assert resolve_scale(None, 64) == 64 ** -0.5
    assert resolve_scale(0.25, 64) == 0.25 and resolve_scale(1, 128) == 1.0
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="softmax_scale"):
            resolve_scale(bad, 64)
    for bad in ("0.1", True, [0.1]):
        with pytest.raises(TypeError, match="softmax_scale"):
            resolve_scale(bad, 64)


def test_compile_dynamic_default_scale():
    """torch.compile(dynamic=True) traces decode_attn with the default scale (the host check used
    ``math.isfinite`` on the symbolic ``D ** -0.5``); eager backend on CPU tensors, no GPU needed."""
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v, s: decode_attn(q, k, v, cache_seqlens=s, return_lse=True),
                       fullgraph=True, dynamic=True, backend="eager")
    for seed, (B, Sq, L, lens) in enumerate([(2, 1, 9, (5, 9)), (3, 2, 17, (3, 17, 2))]):
        q, k, v, s = make_inputs(B=B, Sq=Sq, lens=lens, Lmax=L, seed=seed)
        out, lse = fn(q, k, v, s)
        ro, rl = decode_attn_reference(q, k, v, s)
        assert torch.equal(out, ro.to(q.dtype)) and torch.equal(lse, rl)
    fn = torch.compile(lambda q, k, v, s: decode_attn(q, k, v, cache_seqlens=s, softmax_scale=0.1),
                       fullgraph=True, dynamic=True, backend="eager")
    q, k, v, s = make_inputs()
    assert torch.equal(fn(q, k, v, s), decode_attn_reference(q, k, v, s, softmax_scale=0.1)[0].to(q.dtype))


# ------------------------------------------------------------------------------------------ warmup
@pytest.mark.parametrize("name,spec,exc,match", [
    ("decode_attn", dict(batch=1), TypeError, "DecodeConfig"),
    ("merge_states", dict(head_dim=64), TypeError, "MergeConfig"),
    ("merge_states", MergeConfig("float32", "bfloat16", -64), ValueError, "head_dim must be an int >= 1"),
    ("merge_states", MergeConfig("float32", "bfloat16", 64, num_warps=0), ValueError, "num_warps"),
    ("merge_states", MergeConfig("fp32", "bfloat16", 64), ValueError, "dtype_in"),
])
def test_warmup_attention_specs(name, spec, exc, match):
    before = dict(jit.stats)
    with pytest.raises(exc, match=match):
        cute_kernels.warmup([(name, spec)])
    assert jit.stats["compiles"] == before["compiles"]
