"""The host fast paths on the GPU, against the real compiled functions (issue 19: host time per call).

A launcher's key (``forward_host.*_key``, ``decode._key``, ``merge._key``) leaves out what the compiled function's TVM-FFI entry checks
itself before launching (``cute_kernels.common.jit.direct``): the other tensors' dtypes and devices,
sizes shared by several tensors, data-pointer alignment.  Each test makes a launcher, then makes calls
whose key *is* that launcher's (asserted, so the fast path is really taken) and that differ in one
such fact.  Each must raise the checked path's own error, naming the argument, with nothing launched --
or, where the call is valid (a misaligned decode q is copied, misaligned merge rows take the torch
path), give the right answer.  Afterwards the launcher still serves the first call, correctly and
without a compile.  The same rules on the CPU, with a stub that refuses like the entry:
tests/common/test_host_path.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from cute_kernels.attention import decode as DE
from cute_kernels.attention import forward as FW
from cute_kernels.attention import forward_host as FH
from cute_kernels.attention import merge as ME
from cute_kernels.testing import count_launches
from _check import RTOL, assert_close_elementwise, misaligned, no_compiles, refused
from test_forward import check_against_reference, make_qkv
from test_forward_varlen import check_window_result

pytestmark = pytest.mark.gpu
BF = torch.bfloat16


def misaligned_like(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` (same shape, dtype, device, contiguous strides) 2 bytes past a 16-byte boundary."""
    return misaligned(tuple(t.shape), t.dtype, t.device).copy_(t)


# ----------------------------------------------------------------------------------------- flash_attn
def test_flash_attn_dense_refusals():
    B, S, Hq, Hkv, D = 2, 80, 4, 2, 64
    q, k, v = make_qkv(B, S, S, Hq, Hkv, D, device="cuda", seed=1)
    out = torch.empty_like(q)
    for _ in range(2):
        FW.flash_attn(q, k, v, out=out)
        FW.flash_attn(q, k, v, causal=True)
    L = FW._launchers

    def key(q=q, k=k, v=v, out=out, causal=False):
        return FH.dense_key(q, k, v, out, causal, (-1, -1))

    v_b1 = torch.randn(B - 1, S, Hkv, D, dtype=BF, device="cuda")  # the strides of v, another batch
    cases = [
        (dict(v=v.half()), TypeError, "v dtype"),
        (dict(k=misaligned_like(k)), ValueError, "k data pointer must be 16-byte aligned"),
        (dict(v=misaligned_like(v)), ValueError, "v data pointer must be 16-byte aligned"),
        (dict(out=misaligned_like(out)), ValueError, "out data pointer must be 16-byte aligned"),
        (dict(v=v.cpu()), ValueError, "v is on cpu"),
        (dict(out=out.cpu()), ValueError, "out is on cpu"),
        (dict(v=v_b1), ValueError, "v shape"),
        (dict(out=out.half()), TypeError, "out dtype"),
        (dict(out=torch.empty(B - 1, S, Hq, D, dtype=BF, device="cuda")), ValueError, "out shape"),
    ]
    with no_compiles():
        for over, exc, match in cases:
            args = {"q": q, "k": k, "v": v, "out": out, **over}
            refused(L, key(**args), lambda a=args: FW.flash_attn(a["q"], a["k"], a["v"], out=a["out"]), exc, match)
        # the allocating launcher (out=None, causal) refuses the same way
        refused(L, key(v=v.half(), out=None, causal=True), lambda: FW.flash_attn(q, k, v.half(), causal=True),
                TypeError, "v dtype")
        with count_launches() as n:
            o, lse = FW.flash_attn(q, k, v, causal=True, return_lse=True)
            FW.flash_attn(q, k, v, out=out)
        assert n["flash_attn"] == 2
    check_against_reference(o, lse, q, k, v, True, what="causal after refusals")
    check_against_reference(out, FW.flash_attn(q, k, v, return_lse=True)[1], q, k, v, False, what="out= after refusals")


def test_flash_attn_packed_refusals():
    Hq, Hkv, D = 4, 2, 128
    lens = [37, 0, 130]
    total = sum(lens)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(total, Hq, D, generator=g).to(BF).cuda()
    k = torch.randn(total, Hkv, D, generator=g).to(BF).cuda()
    v = torch.randn(total, Hkv, D, generator=g).to(BF).cuda()
    cu = torch.tensor([0, 37, 37, total], dtype=torch.int32, device="cuda")
    kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=130, max_seqlen_k=130, causal=True)
    for _ in range(2):
        FW.flash_attn(q, k, v, **kw)
    L = FW._launchers

    def key(k=k, v=v, cu_k=cu):
        return FH.packed_key(q, k, v, cu, cu_k, 130, 130, None, True, (-1, -1))

    cu_short = torch.tensor([0, 37, total], dtype=torch.int32, device="cuda")
    with no_compiles():
        refused(L, key(v=v.half()), lambda: FW.flash_attn(q, k, v.half(), **kw), TypeError, "v dtype")
        refused(L, key(k=misaligned_like(k)), lambda: FW.flash_attn(q, misaligned_like(k), v, **kw), ValueError,
                "k data pointer must be 16-byte aligned")
        refused(L, key(cu_k=cu_short), lambda: FW.flash_attn(q, k, v, **{**kw, "cu_seqlens_k": cu_short}),
                ValueError, "cu_seqlens_k shape")
        refused(L, key(cu_k=cu.cpu()), lambda: FW.flash_attn(q, k, v, **{**kw, "cu_seqlens_k": cu.cpu()}),
                ValueError, "cu_seqlens_k is on cpu")
        o, lse = FW.flash_attn(q, k, v, return_lse=True, **kw)
    for b, (s0, n) in enumerate(zip((0, 37, 37), lens)):
        if n:
            qs, ks, vs = (t[s0:s0 + n][None] for t in (q, k, v))
            check_against_reference(o[s0:s0 + n][None], lse[:, s0:s0 + n][None], qs, ks, vs, True,
                                    what=f"packed sequence {b} after refusals")


def test_flash_attn_window_and_paged_refusals():
    B, Sq, Hq, Hkv, D, page = 2, 40, 4, 2, 128, 64
    q, k, v = make_qkv(B, Sq, 100, Hq, Hkv, D, device="cuda", seed=5)
    for _ in range(2):
        FW.flash_attn(q, k, v, causal=True, window_size=(16, 0))
    L = FW._launchers
    with no_compiles():
        refused(L, FH.dense_key(q, k, v.half(), None, True, (16, 0)),
                lambda: FW.flash_attn(q, k, v.half(), causal=True, window_size=(16, 0)), TypeError, "v dtype")
    g = torch.Generator().manual_seed(6)
    pool_k = torch.randn(6, page, Hkv, D, generator=g).to(BF).cuda()
    pool_v = torch.randn(6, page, Hkv, D, generator=g).to(BF).cuda()
    bt = torch.tensor([[4, 1], [2, 0]], dtype=torch.int32, device="cuda")
    used = torch.tensor([100, 41], dtype=torch.int32, device="cuda")
    kw = dict(block_table=bt, seqused_k=used, causal=True)
    for _ in range(2):
        FW.flash_attn(q, pool_k, pool_v, **kw)

    def key(v=pool_v, used=used):
        return FH.paged_key(q, pool_k, v, bt, used, None, None, None, None, True, (-1, -1))

    with no_compiles():
        refused(L, key(v=pool_v.half()), lambda: FW.flash_attn(q, pool_k, pool_v.half(), **kw), TypeError, "v dtype")
        refused(L, key(v=misaligned_like(pool_v)), lambda: FW.flash_attn(q, pool_k, misaligned_like(pool_v), **kw),
                ValueError, "v data pointer must be 16-byte aligned")
        refused(L, key(used=used[:1]), lambda: FW.flash_attn(q, pool_k, pool_v, **{**kw, "seqused_k": used[:1]}),
                ValueError, "seqused_k must be")
        o, lse = FW.flash_attn(q, pool_k, pool_v, return_lse=True, **kw)
        ow, lw = FW.flash_attn(q, k, v, causal=True, window_size=(16, 0), return_lse=True)
    for b in range(B):  # each sequence's keys gathered from its pages
        n = int(used[b])
        kb = pool_k[bt[b].long()].reshape(-1, Hkv, D)[:n][None]
        vb = pool_v[bt[b].long()].reshape(-1, Hkv, D)[:n][None]
        check_against_reference(o[b:b + 1], lse[b:b + 1], q[b:b + 1], kb, vb, True, what=f"paged sequence {b}")
    check_window_result(ow, lw, q, k, v, True, (16, 0), what="window after a refusal")


# ---------------------------------------------------------------------------------------- decode_attn
def _decode_check(o, q, k, v, s, what):
    """As tests/attention/test_decode.py: float32 reference, bf16 tolerance scaled by each row's largest |ref|."""
    ref, _ = DE.decode_attn_reference(q.float(), k.float(), v.float(), s, None, True, None)
    assert torch.isfinite(o).all(), what
    atol = 2e-2 * ref.abs().amax(-1, keepdim=True)
    assert_close_elementwise(o.float(), ref, atol=atol, rtol=RTOL[BF], regions=[], what=what)


def test_decode_refusals_and_a_copied_q():
    B, Hq, Hkv, D, Lmax = 3, 8, 2, 128, 300
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, 1, Hq, D, generator=g).to(BF).cuda()
    k = torch.randn(B, Lmax, Hkv, D, generator=g).to(BF).cuda()
    v = torch.randn(B, Lmax, Hkv, D, generator=g).to(BF).cuda()
    s = torch.tensor([1, 299, 150], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    for _ in range(2):
        DE.decode_attn(q, k, v, cache_seqlens=s, out=out)
        DE.decode_attn(q, k, v, cache_seqlens=s, num_splits=3)
    L = DE._launchers

    def key(q=q, k=k, v=v, s=s, out=out, num_splits=None):
        return DE._key(q, k, v, s, None, out, None, num_splits, True)

    call = DE.decode_attn
    s_short = s[:2].clone()
    cases = [
        (dict(v=v.half()), TypeError, "v_cache dtype"),
        (dict(k=misaligned_like(k)), ValueError, "k_cache must be 16-byte aligned"),
        (dict(out=misaligned_like(out)), ValueError, "out must be 16-byte aligned"),
        (dict(s=s_short), ValueError, "cache_seqlens must be"),
        (dict(s=s.cpu()), ValueError, "cache_seqlens is on cpu"),
        (dict(v=v.cpu()), ValueError, "v_cache is on cpu"),
        (dict(out=out.half()), ValueError, "out must be a contiguous"),
        (dict(out=torch.empty(B, 1, Hq, 2 * D, dtype=BF, device="cuda")[..., :D]), ValueError, "out must be contiguous"),
        (dict(num_splits=3, v=v.half()), TypeError, "v_cache dtype"),
    ]
    with no_compiles():
        for over, exc, match in cases:
            a = dict(q=q, k=k, v=v, s=s, out=out if "num_splits" not in over else None, num_splits=None)
            a.update(over)
            refused(L, key(**a), lambda a=a: call(a["q"], a["k"], a["v"], cache_seqlens=a["s"], out=a["out"],
                                                   num_splits=a["num_splits"]), exc, match)
        # a misaligned q is valid: the launcher's kernel refuses it, the checked path copies it
        q_mis = misaligned_like(q)
        assert key(q=q_mis) in L
        with count_launches() as n:
            o_mis = call(q_mis, k, v, cache_seqlens=s, out=torch.empty_like(q))
        assert n["decode_attn"] == 1
        with count_launches() as n:
            o_split = call(q, k, v, cache_seqlens=s, num_splits=3)
            call(q, k, v, cache_seqlens=s, out=out)
        assert n["decode_attn"] == 2
    for o, what in ((o_mis, "copied misaligned q"), (o_split, "3 splits"), (out, "out=")):
        _decode_check(o, q, k, v, s, what)


# --------------------------------------------------------------------------------------- merge_states
def test_merge_refusals_and_misaligned_rows():
    P, B, S, H, D = 3, 2, 1, 4, 128
    g = torch.Generator().manual_seed(4)
    o = torch.randn(P, B, S, H, D, generator=g).cuda()
    lse = torch.randn(P, B, S, H, generator=g).cuda()
    lse[1, 0] = -math.inf
    for _ in range(2):
        ME.merge_states(o, lse)
    L = ME._launchers
    with no_compiles():
        refused(L, ME._key(o, lse.half()), lambda: ME.merge_states(o, lse.half()), TypeError, "lse_parts must be float32")
        refused(L, ME._key(o, lse.cpu()), lambda: ME.merge_states(o, lse.cpu()), ValueError, "lse_parts is on cpu")
        o_mis = misaligned_like(o)
        assert ME._key(o_mis, lse) in L
        with count_launches() as n:
            mo_mis, ml_mis = ME.merge_states(o_mis, lse)
        assert n.as_dict() == {"merge_states:torch": 1}
        with count_launches() as n:
            mo, ml = ME.merge_states(o, lse)
        assert n.as_dict() == {"merge_states": 1}
    ref_o, ref_l = ME.merge_states_torch(o, lse)  # float32 torch ops
    for got_o, got_l, what in ((mo, ml, "kernel"), (mo_mis, ml_mis, "torch path")):
        assert_close_elementwise(got_o, ref_o, atol=1e-4, rtol=1e-4, regions=[], what=f"merged o ({what})")
        assert_close_elementwise(got_l, ref_l, atol=1e-4, rtol=1e-4, regions=[], what=f"merged lse ({what})")
