"""Issue 35, "Hostile input": one-line reproducers on a CPU machine, each now a clear ValueError /
TypeError naming the argument before any launch (or, for merge_states and sdpa, torch's answer).

CPU and meta tensors stand in for CUDA ones; the host fast paths are exercised with the kernels
stubbed (test_host_path's ``stubbed`` fixture): a launcher cached by a good call must refuse an
overlapping ``out`` given with the same metadata.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels
from cute_kernels import decode_attn, flash_attn, merge_state, merge_states
from cute_kernels.attention import decode as DE
from cute_kernels.attention import forward as FW
from cute_kernels.attention import forward_host as FH
from cute_kernels.attention.forward_validate import MAX_SOFTMAX_SCALE
from cute_kernels.common.overlap import internal_overlap, out_guard
from cute_kernels.gemm import host as GH
from cute_kernels.integrations import sdpa as S
from cute_kernels.testing import count_launches
from _check import refused

BF = torch.bfloat16


def named(exc, arg: str, call):
    """``call()`` raises ``exc`` whose message names ``arg``, counting nothing."""
    with count_launches() as n, pytest.raises(exc) as info:
        call()
    assert arg in str(info.value), str(info.value)
    assert n.total() == 0, n
    return str(info.value)


def z(*shape, device="cpu", dtype=BF):
    return torch.zeros(*shape, dtype=dtype, device=device)


def decode_args(device="cpu"):
    q, kc = z(1, 1, 2, 64, device=device), z(1, 16, 2, 64, device=device)
    return q, kc, kc, torch.full((1,), 4, dtype=torch.int32, device=device)


# ------------------------------------------------------------------------------ 1. softmax_scale
BAD_SCALES = [(10 ** 400, ValueError), (np.complex128(0.5 + 1j), TypeError), (1e300, ValueError),
              (MAX_SOFTMAX_SCALE * 1.01, ValueError), (-(10 ** 400), ValueError), (complex(1, 0), TypeError)]


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("scale,exc", BAD_SCALES, ids=lambda v: type(v).__name__)
def test_softmax_scale_out_of_range_or_complex(device, scale, exc):
    """10**400 raised OverflowError in float(); a complex numpy scale lost its imaginary part; a scale
    whose scale * log2(e) overflows float32 reached the kernels as inf."""
    q = z(1, 4, 2, 64, device=device)
    named(exc, "softmax_scale", lambda: flash_attn(q, q, q, softmax_scale=scale))
    q, k, v, s = decode_args(device)
    named(exc, "softmax_scale", lambda: decode_attn(q, k, v, cache_seqlens=s, softmax_scale=scale))


def test_fast_scale_sends_huge_scales_to_the_checks():
    """``0.0 < 10**400 < math.inf`` is True for a Python int: the fast path took it (then float()
    overflowed in the launch)."""
    class Hit:
        default_scale = 0.125

    for bad in (10 ** 400, math.inf, float("nan"), MAX_SOFTMAX_SCALE * 2, 0, -1.0):
        assert FH.fast_scale(Hit, bad) is None, bad
    assert FH.fast_scale(Hit, 0.5) == 0.5 and FH.fast_scale(Hit, 2) == 2 and FH.fast_scale(Hit, None) == 0.125
    assert FH.fast_scale(Hit, MAX_SOFTMAX_SCALE) == MAX_SOFTMAX_SCALE


def test_accepted_scales_still_pass():
    q = z(1, 4, 2, 64, device="meta")
    for ok in (0.5, 2, np.float32(0.25), np.int64(1), MAX_SOFTMAX_SCALE):
        with pytest.raises(ValueError, match="on meta"):  # past every argument check: the device's turn
            flash_attn(q, q, q, softmax_scale=ok)


# ----------------------------------------------------------------------- 2. outputs that overlap
def test_internal_overlap_rule():
    buf = torch.empty(64 * 8 + 64)
    assert internal_overlap(buf.as_strided((64, 64), (8, 1)))
    assert internal_overlap(torch.empty(1, 8).expand(4, 8))
    assert not internal_overlap(torch.empty(4, 8)) and not internal_overlap(torch.empty(8, 4).mT)
    assert not internal_overlap(torch.empty(2, 16, 8)[:, :, :4]) and not internal_overlap(torch.empty(0, 3))


def test_out_guard_three_and_many_inputs():
    """The launchers' per-call guard: the byte ranges meet or not, None inputs and empty extents skipped,
    the written-out three-input closure and the general one give the same answers."""
    buf = torch.empty(1024, dtype=torch.uint8)
    a, b, c, d = buf[0:100], buf[100:200], buf[200:300], buf[300:400]
    for names in (("a", "b", "c"), ("a", "b", "c", "d")):
        exts = tuple(100 for _ in names)
        g = out_guard("op", "out", 100, names, exts)
        ins = (a, b, c, d)[:len(names)]
        g(buf[400:500], *ins)  # after the last input: no overlap
        g(buf[50:150], None, None, *ins[2:])  # the inputs it meets are None
        named(ValueError, "out overlaps a", lambda: g(buf[99:199], *ins))
        named(ValueError, "out overlaps b", lambda: g(buf[199:299], None, *ins[1:]))
        named(ValueError, f"out overlaps {names[-1]}", lambda: g(buf[len(names) * 100 - 1:], *ins))
        empty = out_guard("op", "out", 100, names, (0,) * len(names))
        empty(buf[0:100], *ins)  # empty inputs meet nothing
    out_guard("op", "out", 0, ("a", "b", "c"), (100, 100, 100))(buf[0:0], a, b, c)  # an empty out neither


def test_gemm_out_overlapping_an_input_or_itself():
    a, b = torch.randn(64, 64, dtype=BF), torch.randn(64, 64, dtype=BF)
    named(ValueError, "out overlaps a", lambda: cute_kernels.gemm(a, a, out=a))
    named(ValueError, "out overlaps b", lambda: cute_kernels.gemm(a, b, out=b))
    rows = torch.empty(64 * 8 + 64, dtype=BF).as_strided((64, 64), (8, 1))  # rows 8 elements apart
    named(ValueError, "out of shape", lambda: cute_kernels.gemm(a, b, out=rows))
    big = torch.empty(128, 64, dtype=BF)
    named(ValueError, "out overlaps c", lambda: cute_kernels.gemm(a, b, out=big[:64], c=big[32:96], beta=1.0))


def test_gemm_out_may_be_c_exactly(stubbed):
    """out=c (read, then written, element by element) stays accepted."""
    a, b, c = torch.randn(64, 32, dtype=BF), torch.randn(32, 48, dtype=BF), torch.randn(64, 48, dtype=BF)
    with count_launches() as n:
        assert cute_kernels.gemm(a, b, out=c, c=c, beta=0.5) is c
        assert cute_kernels.gemm(a, b, out=c, c=c, beta=0.5) is c  # the fast path
    assert n["gemm"] == 2


def test_gemm_fast_path_refuses_an_overlapping_out(stubbed):
    """A launcher cached by gemm(a, b, out=fresh) is keyed on strides, not pointers: gemm(a, b,
    out=a) with a of out's shape and strides hit it and launched over its own input."""
    a, b, fresh = torch.randn(64, 64, dtype=BF), torch.randn(64, 64, dtype=BF), torch.empty(64, 64, dtype=BF)
    cute_kernels.gemm(a, b, out=fresh)
    key = GH._key(a, b, a, None, 0.0, None)
    refused(GH._launchers, key, lambda: cute_kernels.gemm(a, b, out=a), ValueError, "out overlaps a")
    refused(GH._launchers, key, lambda: cute_kernels.gemm(a, b, out=b), ValueError, "out overlaps b")


def test_flash_attn_out_overlapping_an_input():
    q, k, v = z(1, 4, 2, 64), z(1, 4, 2, 64), z(1, 4, 2, 64)
    named(ValueError, "out overlaps k", lambda: flash_attn(q, k, v, out=k))
    qkv = z(1, 4, 3, 2, 64)
    named(ValueError, "out overlaps q", lambda: flash_attn(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2],
                                                            out=qkv[:, :, 0]))
    rows = torch.empty(4 * 64 + 128, dtype=BF).as_strided((1, 4, 2, 64), (256, 64, 8, 1))
    named(ValueError, "out of shape", lambda: flash_attn(q, k, v, out=rows))


def test_flash_attn_fast_path_refuses_an_overlapping_out(stubbed):
    q, k, v, fresh = (torch.randn(1, 4, 2, 64, dtype=BF) for _ in range(4))
    flash_attn(q, k, v, out=fresh)
    key = FH.dense_key(q, k, v, k, False, (-1, -1))
    refused(FW._launchers, key, lambda: flash_attn(q, k, v, out=k), ValueError, "out overlaps k")
    refused(FW._launchers, key, lambda: flash_attn(q, k, v, out=q), ValueError, "out overlaps q")


def test_decode_attn_out_or_workspace_overlapping():
    q, k, v, s = decode_args()
    named(ValueError, "out overlaps q", lambda: decode_attn(q, k, v, cache_seqlens=s, out=q))
    kq = k.view(-1)[: q.numel()].view(q.shape)  # the first rows of the cache
    named(ValueError, "out overlaps k_cache", lambda: decode_attn(q, k, v, cache_seqlens=s, out=kq))
    ws = torch.empty(4096, dtype=torch.float32)
    named(ValueError, "out overlaps workspace", lambda: decode_attn(q, k, v, cache_seqlens=s, num_splits=2,
                                                                     out=ws.view(BF)[: q.numel()].view(q.shape),
                                                                     workspace=ws))


def test_decode_attn_fast_path_refuses_an_overlapping_out(stubbed):
    q, k, v, s = decode_args()
    q = torch.randn_like(q)
    decode_attn(q, k, v, cache_seqlens=s, num_splits=1, out=torch.empty_like(q))
    key = DE._key(q, k, v, s, None, q, None, 1, True)
    refused(DE._launchers, key, lambda: decode_attn(q, k, v, cache_seqlens=s, num_splits=1, out=q), ValueError,
            "out overlaps q")


# ------------------------------------------------------------------------- 3. ints past int64
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_ints_past_the_kernels_range(device):
    """They passed validation and failed in the custom op's schema ("Expected a value of type 'int'")."""
    q = z(1, 4, 2, 64, device=device)
    for w, side in (((2 ** 63, 0), "window_size left"), ((-1, 2 ** 40), "window_size right"),
                    (((1 << 30) + 1, 0), "window_size left")):
        named(ValueError, side, lambda: flash_attn(q, q, q, window_size=w))
    p = z(6, 2, 64, device=device)
    cu = torch.tensor([0, 6], dtype=torch.int32, device=device)
    for kw, arg in ((dict(max_seqlen_q=2 ** 63, max_seqlen_k=6), "max_seqlen_q"),
                    (dict(max_seqlen_q=6, max_seqlen_k=2 ** 31), "max_seqlen_k")):
        named(ValueError, arg, lambda: flash_attn(p, p, p, cu_seqlens_q=cu, cu_seqlens_k=cu, **kw))
    q, k, v, s = decode_args(device)
    for n in (2 ** 63, 2 ** 31):
        named(ValueError, "num_splits", lambda: decode_attn(q, k, v, cache_seqlens=s, num_splits=n))


# ------------------------------------------------------------------------- 4. +inf LSE parts
def test_merge_posinf_lse_is_logsumexp():
    o = torch.tensor([[[1.0, 2.0]], [[3.0, 4.0]], [[5.0, 6.0]]])
    lse = torch.tensor([[math.inf], [0.0], [math.inf]])
    mo, ml = merge_states(o, lse)
    assert torch.equal(ml, torch.logsumexp(lse, 0)) and torch.equal(mo, torch.tensor([[3.0, 4.0]]))
    mo, ml = merge_state(o[0], lse[0], o[1], lse[1])
    assert torch.isposinf(ml).all() and torch.equal(mo, o[0])


# --------------------------------------------------------------------------- 5. hf integration
def test_hf_arguments_of_the_wrong_type():
    pytest.importorskip("transformers")
    from cute_kernels.integrations import hf

    named(TypeError, "model", lambda: hf.patch_linear(None))
    named(TypeError, "model", lambda: hf.unpatch_linear("x"))
    named(TypeError, "require_cuda", lambda: hf.patch_linear(torch.nn.Linear(2, 2), require_cuda="no"))
    named(TypeError, "attention_mask", lambda: hf.mask_function(1, 4, 4, attention_mask="x"))


# ---------------------------------------------------------------------------------- 6. sdpa
def test_sdpa_on_meta_tensors_is_torchs():
    q = z(1, 2, 4, 64, device="meta")
    for kw in (dict(), dict(is_causal=True)):
        assert S.route(q, q, q, **kw)[0] == "flash_attn"
        out, ref = S.sdpa(q, q, q, **kw), F.scaled_dot_product_attention(q, q, q, **kw)
        assert (out.shape, out.dtype, out.device) == (ref.shape, ref.dtype, ref.device)


def test_sdpa_routes_scales_the_kernels_refuse_to_torch():
    """route() raised OverflowError for 10**400 (math.isfinite); 1e300 reached flash_attn, which refuses
    it, where torch's function computes."""
    q = z(1, 2, 4, 64, device="meta")
    for bad in (10 ** 400, 1e300, float("nan"), -1, 0):
        assert S.route(q, q, q, scale=bad) == ("torch", S.R_SCALE), bad
    assert S.route(q, q, q, scale=MAX_SOFTMAX_SCALE)[0] == "flash_attn"


@pytest.mark.parametrize("kw", [dict(is_causal=1), dict(enable_gqa="yes"), dict(is_causal=np.bool_(True))],
                         ids=str)
def test_sdpa_flags_are_bools_as_in_torch(kw):
    q = z(1, 2, 4, 64)
    with pytest.raises(TypeError):
        F.scaled_dot_product_attention(q, q, q, **kw)
    for device in ("cpu", "meta"):
        q = z(1, 2, 4, 64, device=device)
        named(TypeError, next(iter(kw)), lambda: S.sdpa(q, q, q, **kw))


# --------------------------------------------------------------------------- 7. check order
def test_decode_scalars_named_before_the_device():
    """With meta tensors a bad scalar was reported as "q is on meta"."""
    q, k, v, s = decode_args("meta")
    named(ValueError, "softmax_scale", lambda: decode_attn(q, k, v, cache_seqlens=s, softmax_scale=-1.0))
    named(TypeError, "causal", lambda: decode_attn(q, k, v, cache_seqlens=s, causal="yes"))
    named(TypeError, "num_splits", lambda: decode_attn(q, k, v, cache_seqlens=s, num_splits=2.5))
    named(ValueError, "on meta", lambda: decode_attn(q, k, v, cache_seqlens=s))
    q = z(1, 4, 2, 64)
    named(ValueError, "softmax_scale", lambda: flash_attn(q, q, q, softmax_scale=0.0))
    named(TypeError, "causal", lambda: flash_attn(q, q, q, causal="yes"))


def test_gemm_under_fake_tensor_mode_reads_no_data_pointer():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Accessing the data pointer of FakeTensor is deprecated"
        with FakeTensorMode():
            a, b = torch.empty(8, 16, dtype=BF, device="cuda"), torch.empty(16, 8, dtype=BF, device="cuda")
            assert cute_kernels.gemm(a, b).shape == (8, 8)
            out = torch.empty(8, 8, dtype=torch.float32, device="cuda")
            assert cute_kernels.gemm(a, b, out=out, c=out, beta=0.5) is out
