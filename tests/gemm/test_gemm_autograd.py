"""``gemm`` under autograd (:mod:`cute_kernels.gemm.autograd`): da = alpha dout b^T, db = alpha a^T dout,
dc = beta dout, on the same kernels.

CPU (meta tensors: the op's fake implementation): gradients reach a, b and c with their shapes, 2-d
and batched, only for the inputs that require grad; out= with grad raises before any launch.
GPU: gradients against float32 autograd of the same expression (elementwise, per row), 2-d, batched,
odd sizes, alpha / beta / c, an fp32 output, column-major operands.
"""

import pytest
import torch

from cute_kernels.gemm import host as GH
from cute_kernels.testing import count_launches

BF = torch.bfloat16
gpu = pytest.mark.gpu


def meta(*shape, grad=True, dtype=BF):
    return torch.empty(*shape, dtype=dtype, device="meta", requires_grad=grad)


@pytest.mark.parametrize("batch", [None, 3])
def test_gradients_reach_the_inputs_on_meta_tensors(batch):
    lead = () if batch is None else (batch,)
    a, b, c = meta(*lead, 40, 64), meta(*lead, 64, 24), meta(*lead, 40, 24)
    out = GH.gemm(a, b, c=c, alpha=0.5, beta=2.0)
    assert out.grad_fn is not None and out.shape == (*lead, 40, 24)
    da, db, dc = torch.autograd.grad(out.float().sum(), (a, b, c))
    assert da.shape == a.shape and db.shape == b.shape and dc.shape == c.shape and dc.dtype == c.dtype
    a2, b2 = meta(*lead, 40, 64), meta(*lead, 64, 24, grad=False)
    out2 = GH.gemm(a2, b2, out_dtype=torch.float32)
    assert out2.dtype == torch.float32
    (da2,) = torch.autograd.grad(out2.sum(), (a2,))
    assert da2.shape == a2.shape and da2.dtype == BF


def test_out_is_refused_with_grad():
    a, b = meta(40, 64), meta(64, 24)
    with count_launches() as n, pytest.raises(ValueError, match="out= cannot be used when an input requires grad"):
        GH.gemm(a, b, out=torch.empty(40, 24, dtype=BF, device="meta"))
    assert n.total() == 0


def _rand(*shape, major="row", g=None):
    if major == "col":
        return torch.randn(*shape[:-2], shape[-1], shape[-2], device="cuda", generator=g).to(BF).transpose(-1, -2)
    return torch.randn(*shape, device="cuda", generator=g).to(BF)


@gpu
@pytest.mark.parametrize("M,N,K,batch,with_c,out_dtype,b_major", [
    (256, 384, 512, None, False, None, "row"), (97, 131, 200, None, True, None, "col"),
    (128, 256, 64, 3, True, None, "row"), (64, 4096, 1024, None, False, torch.float32, "col"),
])
def test_gradients_match_float32(M, N, K, batch, with_c, out_dtype, b_major):
    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    lead = () if batch is None else (batch,)
    a = _rand(*lead, M, K, g=g).requires_grad_(True)
    b = _rand(*lead, K, N, major=b_major, g=g).requires_grad_(True)
    c = _rand(*lead, M, N, g=g).requires_grad_(True) if with_c else None
    alpha, beta = (0.5, 1.5) if with_c else (1.0, 0.0)
    dout = torch.randn(*lead, M, N, device="cuda", generator=g)
    out = GH.gemm(a, b, c=c, alpha=alpha, beta=beta, out_dtype=out_dtype)
    ins = (a, b) + ((c,) if with_c else ())
    got = torch.autograd.grad((out.float() * dout).sum(), ins)
    ref_in = [t.detach().float().requires_grad_(True) for t in ins]
    ref_out = alpha * ref_in[0] @ ref_in[1] + (beta * ref_in[2] if with_c else 0)
    ref = torch.autograd.grad((ref_out * dout.to(out.dtype).float()).sum(), ref_in)
    for name, x, r in zip("abc", got, ref):
        x, r = x.float(), r.float()
        assert torch.isfinite(x).all()
        tol = 2e-2 * r.abs().amax(dim=-1, keepdim=True).clamp_min(1e-3) + 1e-2  # bf16 operands: rounding of dout
        assert ((x - r).abs() <= tol).all(), f"d{name}: {(x - r).abs().max().item()}"


@pytest.mark.parametrize("batch", [None, 2])
def test_gradients_come_in_the_inputs_layout(batch):
    """A column-major operand's gradient is column-major too (computed as the transposed GEMM), so a
    linear layer's weight (b = weight.t()) gets a contiguous gradient: no copy into its layout."""
    lead = () if batch is None else (batch,)
    w = meta(*lead, 24, 64)  # (out, in) row-major: b = w^T is column-major
    at = meta(*lead, 64, 40)  # a = at^T: column-major too
    a, b = at.transpose(-1, -2), w.transpose(-1, -2)
    out = GH.gemm(a, b)
    gat, gw = torch.autograd.grad(out.float().sum(), (at, w))
    assert gw.shape == w.shape and gw.is_contiguous(), gw.stride()
    assert gat.shape == at.shape and gat.is_contiguous(), gat.stride()
    a2, b2 = meta(*lead, 40, 64), meta(*lead, 64, 24)  # row-major: row-major gradients
    ga, gb = torch.autograd.grad(GH.gemm(a2, b2).float().sum(), (a2, b2))
    assert ga.is_contiguous() and gb.is_contiguous()
