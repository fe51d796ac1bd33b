"""merge_states / merge_state: CPU math against a direct softmax, CuTe kernel compiles, GPU numerics."""

import math

import pytest
import torch

from cute_kernels.attention.merge import (
    MergeConfig,
    merge_builder,
    merge_state,
    merge_states,
    merge_states_torch,
)

HAS_CUDA = torch.cuda.is_available()


def make_parts(n_parts, rows, D, empty=(), seed=0, device="cpu", span=10):
    """Scores/values over n_parts*span keys; returns (o_parts, lse_parts, full o, full lse).

    Parts listed in `empty` have no keys: lse=-inf and o full of NaN (must be ignored)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(rows, n_parts * span, generator=g, dtype=torch.float64) * 3
    v = torch.randn(n_parts * span, D, generator=g, dtype=torch.float64)
    keep = torch.ones(n_parts * span, dtype=torch.bool)
    o_parts, lse_parts = [], []
    for p in range(n_parts):
        sl = slice(p * span, (p + 1) * span)
        if p in empty:
            keep[sl] = False
            o_parts.append(torch.full((rows, D), float("nan"), dtype=torch.float64))
            lse_parts.append(torch.full((rows,), float("-inf"), dtype=torch.float64))
            continue
        ss = s[:, sl]
        lse_parts.append(torch.logsumexp(ss, -1))
        o_parts.append(torch.softmax(ss, -1) @ v[sl])
    if keep.any():
        o_full = torch.softmax(s[:, keep], -1) @ v[keep]
        lse_full = torch.logsumexp(s[:, keep], -1)
    else:
        o_full = torch.zeros(rows, D, dtype=torch.float64)
        lse_full = torch.full((rows,), float("-inf"), dtype=torch.float64)
    op = torch.stack(o_parts).float().to(device)
    lp = torch.stack(lse_parts).float().to(device)
    return op, lp, o_full, lse_full


# ------------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("n_parts", [1, 2, 5, 40])
@pytest.mark.parametrize("empty", [(), (0,), (1, 3)])
def test_cpu_merge_matches_softmax(n_parts, empty):
    empty = tuple(e for e in empty if e < n_parts)
    if len(empty) == n_parts:
        pytest.skip("covered by test_cpu_all_empty")
    op, lp, o_full, lse_full = make_parts(n_parts, 7, 16, empty)
    o, lse = merge_states(op, lp)
    assert o.shape == (7, 16) and lse.shape == (7,)
    assert o.dtype == torch.float32 and lse.dtype == torch.float32
    torch.testing.assert_close(o.double(), o_full, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(lse.double(), lse_full, atol=2e-6, rtol=2e-6)


def test_cpu_all_empty():
    op, lp, _, _ = make_parts(3, 4, 8, empty=(0, 1, 2))
    o, lse = merge_states(op, lp)
    assert torch.equal(o, torch.zeros_like(o))
    assert torch.isneginf(lse).all()


def test_cpu_extra_dims_and_low_precision():
    op, lp, o_full, lse_full = make_parts(4, 6, 32)
    o, lse = merge_states(op.view(4, 2, 3, 32).bfloat16(), lp.view(4, 2, 3))
    assert o.shape == (2, 3, 32) and o.dtype == torch.bfloat16 and lse.shape == (2, 3)
    torch.testing.assert_close(o.double().view(6, 32), o_full, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double().view(6), lse_full, atol=1e-5, rtol=1e-5)


def test_cpu_merge_state_pair_is_associative():
    op, lp, o_full, lse_full = make_parts(3, 5, 8)
    o01, l01 = merge_state(op[0], lp[0], op[1], lp[1])
    o, l = merge_state(o01, l01, op[2], lp[2])
    torch.testing.assert_close(o.double(), o_full, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(l.double(), lse_full, atol=2e-6, rtol=2e-6)
    # with an empty side the other state passes through unchanged
    o2, l2 = merge_state(op[0], lp[0], torch.full_like(op[1], float("nan")), torch.full_like(lp[1], -math.inf))
    torch.testing.assert_close(o2, op[0])
    torch.testing.assert_close(l2, lp[0])


def test_cpu_nan_lse_propagates():
    op, lp, _, _ = make_parts(2, 3, 4)
    lp[1, 0] = float("nan")
    o, lse = merge_states(op, lp)
    assert torch.isnan(lse[0]) and torch.isnan(o[0]).all()
    assert torch.isfinite(lse[1:]).all()


def _posinf_parts(D, device="cpu"):
    """Five rows of three parts: row 0 one part at +inf, row 1 two at +inf (the others finite / empty),
    row 2 all at +inf, row 3 one at +inf among empty ones, row 4 finite (the ordinary merge)."""
    inf = math.inf
    lp = torch.tensor([[inf, 1.0, inf, -inf, 0.5], [0.0, inf, inf, inf, 2.0], [-inf, inf, inf, -inf, -1.0]])
    op = torch.randn(3, 5, D, generator=torch.Generator().manual_seed(3))
    return op.to(device), lp.to(device)


def _posinf_expected(op, lp):
    """torch.logsumexp's LSE and, where it is +inf, the mean of the outputs of the parts at +inf."""
    lse = torch.logsumexp(lp, 0)
    at_inf = torch.isposinf(lp).float()
    o_inf = (at_inf.unsqueeze(-1) * op).sum(0) / at_inf.sum(0).clamp(min=1).unsqueeze(-1)
    return torch.where(torch.isposinf(lse).unsqueeze(-1), o_inf, merge_states_torch(op, lp)[0]), lse


def test_cpu_posinf_lse_dominates():
    """Issue 35: a part with LSE +inf gave o = 0 and LSE NaN, where logsumexp gives +inf: it dominates
    (o = its output, the mean of them if several; LSE +inf), in merge_states and merge_state."""
    op, lp = _posinf_parts(8)
    o, lse = merge_states(op, lp)
    ref_o, ref_l = _posinf_expected(op, lp)
    assert torch.equal(lse, ref_l) and torch.isposinf(lse[:4]).all()
    torch.testing.assert_close(o, ref_o)
    torch.testing.assert_close(o[0], op[0, 0])
    torch.testing.assert_close(o[1], (op[1, 1] + op[2, 1]) / 2)
    o2, l2 = merge_state(op[0], lp[0], op[1], lp[1])
    assert torch.isposinf(l2[:4]).all()
    torch.testing.assert_close(o2[0], op[0, 0])


@pytest.mark.parametrize(
    "o,l,exc,match",
    [
        (torch.zeros(2, 3, 4), torch.zeros(2, 4), ValueError, "shape"),
        (torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.float64), TypeError, "float32"),
        (torch.zeros(2, 3, 4, dtype=torch.int32), torch.zeros(2, 3), TypeError, "float32/float16/bfloat16"),
        (torch.zeros(4), torch.zeros(()), ValueError, r"\(P, ..., D\)"),
    ],
)
def test_cpu_bad_inputs(o, l, exc, match):
    with pytest.raises(exc, match=match):
        merge_states(o, l)


def test_cpu_merge_state_shape_mismatch():
    with pytest.raises(ValueError, match="shapes differ"):
        merge_state(torch.zeros(3, 4), torch.zeros(3), torch.zeros(2, 4), torch.zeros(2))


def test_cpu_opcheck():
    op, lp, _, _ = make_parts(3, 4, 8)
    torch.library.opcheck(torch.ops.cute_kernels.merge_states, (op, lp))


@pytest.mark.parametrize(
    "cfg",
    [
        MergeConfig("float32", "float32", 128),
        MergeConfig("float32", "bfloat16", 128),
        MergeConfig("float32", "float16", 64),
        MergeConfig("float32", "bfloat16", 256),
        MergeConfig("bfloat16", "bfloat16", 128),
        MergeConfig("float32", "float32", 40),
    ],
    ids=lambda c: f"{c.dtype_in}-{c.dtype_out}-{c.head_dim}",
)
def test_merge_kernel_compiles_for_sm90a(cfg):
    from cute_kernels.tools import inspect as ins

    rep = ins.inspect_builder(merge_builder(cfg))
    ks = [k for k in rep.kernels if "Merge" in k.name]
    assert len(ks) == 1
    k = ks[0]
    assert k.spills == 0, rep.summary()  # the SASS was read: inspect_builder raises without nvdisasm
    assert k.registers <= 255
    # 16-byte vector loads of the partial outputs, several in flight
    assert k.instructions["LDG"] >= 8, rep.summary()


def test_inspect_without_nvdisasm_raises(monkeypatch):
    """No nvdisasm: the SASS-reading path (spills, instruction counts) raises a RuntimeError naming
    nvdisasm and how to get it, instead of a report whose spill count is a vacuous 0; the cubin facts
    (registers, shared memory) still come without it, and asking such a report for spills raises."""
    from cute_kernels.tools import inspect as ins

    cfg = MergeConfig("float32", "bfloat16", 64)
    with_sass = ins.inspect_builder(merge_builder(cfg))
    monkeypatch.setattr(ins, "nvdisasm_path", lambda: None)
    for call in (lambda: ins.inspect_builder(merge_builder(cfg)), lambda: ins.disassemble(with_sass.cubin)):
        with pytest.raises(RuntimeError, match="nvdisasm") as e:
            call()
        assert isinstance(e.value, ins.NvdisasmNotFound)
        assert "nvidia-cuda-nvdisasm" in str(e.value) and "PATH" in str(e.value)
    rep = ins.inspect_builder(merge_builder(cfg), sass=False)
    assert rep.sass is None
    (k,) = [k for k in rep.kernels if "Merge" in k.name]
    (k_sass,) = [k for k in with_sass.kernels if "Merge" in k.name]
    assert (k.registers, k.static_smem, k.stack_frame) == (k_sass.registers, k_sass.static_smem, k_sass.stack_frame)
    assert k.registers > 0
    with pytest.raises(RuntimeError, match="SASS was not read"):
        k.spills
    assert "SASS not read" in rep.summary()


# ------------------------------------------------------------------------------------------- GPU
gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("n_parts", [1, 3, 33, 100])
@pytest.mark.parametrize("D", [64, 128, 256, 40])
def test_gpu_merge_matches_torch(n_parts, D):
    empty = (0, 2) if n_parts > 2 else ()
    op, lp, o_full, lse_full = make_parts(n_parts, 37, D, empty, device="cuda")
    o, lse = merge_states(op, lp)
    ref_o, ref_l = merge_states_torch(op, lp)
    torch.testing.assert_close(o, ref_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_l, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(o.double().cpu(), o_full, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse.double().cpu(), lse_full, atol=1e-4, rtol=1e-4)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_merge_low_precision_and_shapes(dtype):
    op, lp, o_full, lse_full = make_parts(5, 24, 128, (1,), device="cuda")
    o, lse = merge_states(op.view(5, 2, 3, 4, 128).to(dtype), lp.view(5, 2, 3, 4))
    assert o.shape == (2, 3, 4, 128) and o.dtype == dtype and lse.shape == (2, 3, 4)
    torch.testing.assert_close(o.double().cpu().view(24, 128), o_full, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double().cpu().view(24), lse_full, atol=1e-4, rtol=1e-4)


@gpu
def test_gpu_merge_all_empty_and_pair():
    op, lp, _, _ = make_parts(4, 9, 64, (0, 1, 2, 3), device="cuda")
    o, lse = merge_states(op, lp)
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()
    op, lp, o_full, lse_full = make_parts(2, 9, 64, device="cuda")
    o, lse = merge_state(op[0], lp[0], op[1], lp[1])
    torch.testing.assert_close(o.double().cpu(), o_full, atol=1e-4, rtol=1e-4)


@gpu
def test_gpu_merge_deterministic_noncontiguous():
    op, lp, _, _ = make_parts(48, 64, 128, (5,), device="cuda")
    op_nc = op.transpose(0, 1).contiguous().transpose(0, 1)  # strided parts
    first = merge_states(op_nc, lp)
    for _ in range(10):
        o, lse = merge_states(op_nc, lp)
        assert torch.equal(o, first[0]) and torch.equal(lse, first[1])


@gpu
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_posinf_lse_dominates(D):
    """The kernel's merge step gives the CPU math's result for LSEs at +inf (issue 35)."""
    op, lp = _posinf_parts(D, device="cuda")
    o, lse = merge_states(op, lp)
    ref_o, ref_l = _posinf_expected(op.cpu(), lp.cpu())
    assert torch.equal(lse.cpu(), ref_l)
    torch.testing.assert_close(o.cpu(), ref_o, atol=1e-5, rtol=1e-5)
