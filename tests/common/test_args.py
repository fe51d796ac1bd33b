"""Sparse and nested tensors are refused by every op with a TypeError naming the argument (before, a
sparse one crashed gemm's fast path on its missing data pointer and reached the attention checks as
"strides (0, 0, 0, 0)"); torch's SDPA drop-in hands them to torch (tests/integrations/test_sdpa.py)."""

from __future__ import annotations

import warnings

import pytest
import torch

import cute_kernels
from cute_kernels.common.args import tensor_fault

BF = torch.bfloat16


def _nested():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.randn(3, 64), torch.randn(5, 64)]).to(BF)


def test_tensor_fault():
    dense = torch.randn(4, 8, dtype=BF)
    assert tensor_fault(dense) is None and tensor_fault(dense.t()) is None
    assert tensor_fault(3.0) == "must be a torch.Tensor, got float"
    assert "dense (strided)" in tensor_fault(dense.to_sparse()) and "sparse_coo" in tensor_fault(dense.to_sparse())
    assert "nested" in tensor_fault(_nested())


def _cases():
    a = torch.randn(16, 64, dtype=BF)
    q = torch.randn(1, 16, 2, 64, dtype=BF)
    s = torch.full((1,), 16, dtype=torch.int32)
    yield "gemm: b", lambda: cute_kernels.gemm(a, a.t().contiguous().to_sparse())
    yield "gemm: a", lambda: cute_kernels.gemm(a.to_sparse(), a.t())
    yield "gemm: out", lambda: cute_kernels.gemm(a, a.t(), out=torch.zeros(16, 16, dtype=BF).to_sparse())
    yield "gemm: c", lambda: cute_kernels.gemm(a, a.t(), c=torch.zeros(16, 16, dtype=BF).to_sparse(), beta=1.0)
    yield "gemm: a", lambda: cute_kernels.gemm(_nested(), a.t())
    yield "flash_attn: q", lambda: cute_kernels.flash_attn(q.to_sparse(), q, q)
    yield "flash_attn: v", lambda: cute_kernels.flash_attn(q, q, q.to_sparse())
    yield "decode_attn: k_cache", lambda: cute_kernels.decode_attn(q[:, :1], q.to_sparse(), q, cache_seqlens=s)
    yield "decode_attn: cache_seqlens", lambda: cute_kernels.decode_attn(q[:, :1], q, q, cache_seqlens=s.to_sparse())
    yield "merge_states: o_parts", lambda: cute_kernels.merge_states(q.to_sparse(), torch.randn(1, 16, 2))


@pytest.mark.parametrize("name,call", list(_cases()), ids=[n for n, _ in _cases()])
def test_sparse_and_nested_tensors_are_refused(name, call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TypeError, match=f"^{name} must be a dense \\(strided\\) tensor"):
            call()
