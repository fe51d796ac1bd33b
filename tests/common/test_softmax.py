"""cute_kernels.common.softmax: the online-softmax / LSE math in torch against a direct softmax (CPU),
a tiny kernel built from the device helpers compiles for sm_90a without local memory (CPU), and that
kernel's numbers against the torch math (GPU)."""

import math

import pytest
import torch

from cute_kernels.common import softmax as sm

gpu = pytest.mark.gpu

ROWS, L, D, SCALE = 8, 64, 4, 0.37


def online_softmax_reference(scores, values, scale: float, chunk: int):
    """``softmax(scale * scores) @ values`` computed the kernels' way, ``chunk`` keys at a time:
    exp2 with the scale folded, running max / sum, rescale on max change, deferred normalization.

    scores (..., L) with ``-inf`` for masked keys, values (L, D), float tensors.  Returns (o (..., D),
    lse (...) natural log); rows with no visible key give o = 0, lse = -inf.
    """
    scale_log2 = scale * sm.LOG2_E
    shape = scores.shape[:-1]
    m = torch.full(shape, float("-inf"), dtype=torch.float64)
    l = torch.zeros(shape, dtype=torch.float64)
    o = torch.zeros(*shape, values.shape[-1], dtype=torch.float64)
    s_all, v_all = scores.double(), values.double()
    for j in range(0, scores.shape[-1], chunk):
        s, v = s_all[..., j : j + chunk], v_all[j : j + chunk]
        m_new = torch.maximum(m, s.amax(-1))
        m_s = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new * scale_log2)
        p = torch.exp2(s * scale_log2 - m_s.unsqueeze(-1))
        corr = torch.exp2(m * scale_log2 - m_s)
        l = l * corr + p.sum(-1)
        o = o * corr.unsqueeze(-1) + p @ v
        m = m_new
    m_s = torch.where(torch.isneginf(m), torch.zeros_like(m), m * scale_log2)
    inv = torch.where(l > 0, 1.0 / l, torch.zeros_like(l))
    lse = torch.where(l > 0, (m_s + torch.log2(l)) * sm.LN_2, torch.full_like(l, float("-inf")))
    return o * inv.unsqueeze(-1), lse


def _direct(scores, values, scale):
    """softmax(scale * s) @ v and the natural-log LSE in float64; rows with no key: 0 and -inf."""
    s = scores.double() * scale
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse).unsqueeze(-1))
    return torch.nan_to_num(p) @ values.double(), lse


def _scores(seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(ROWS, L, generator=g, dtype=torch.float64) * 4
    s[1, 20:] = float("-inf")  # a row whose max is reached early, later keys masked
    s[2, :40] = float("-inf")  # a row whose first chunks are fully masked
    s[3] = float("-inf")  # a row that sees no key
    s[4, :] = torch.linspace(-30, 30, L, dtype=torch.float64)  # max grows every chunk
    v = torch.randn(L, D, generator=g, dtype=torch.float64)
    return s, v


def test_constants():
    assert sm.LOG2_E == pytest.approx(1 / math.log(2)) and sm.LN_2 == pytest.approx(math.log(2))


@pytest.mark.parametrize("chunk", [1, 16, 64])
def test_online_softmax_reference_matches_direct(chunk):
    s, v = _scores()
    o, lse = online_softmax_reference(s, v, SCALE, chunk)
    ro, rl = _direct(s, v, SCALE)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(o, ro, atol=1e-12, rtol=1e-10)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(rl)) and torch.isneginf(lse[3])
    torch.testing.assert_close(lse[~torch.isneginf(rl)], rl[~torch.isneginf(rl)], atol=1e-12, rtol=1e-10)
    assert (o[3] == 0).all()


def test_merge_reference_is_exact():
    """Two disjoint halves' states merge into the whole's state; an empty part (LSE -inf, o NaN) is
    ignored; all parts empty give o = 0, LSE -inf."""
    s, v = _scores(1)
    oa, la = online_softmax_reference(s[:, :24], v[:24], SCALE, 8)
    ob, lb = online_softmax_reference(s[:, 24:], v[24:], SCALE, 8)
    oa[torch.isneginf(la)] = float("nan")
    ob[torch.isneginf(lb)] = float("nan")
    from cute_kernels.attention.merge import merge_states_torch

    o, lse = merge_states_torch(torch.stack([oa, ob]), torch.stack([la, lb]))
    o, lse = o.double(), lse.double()
    ro, rl = _direct(s, v, SCALE)
    torch.testing.assert_close(o, ro, atol=1e-5, rtol=1e-5)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(rl))
    torch.testing.assert_close(lse[~torch.isneginf(rl)], rl[~torch.isneginf(rl)], atol=1e-5, rtol=1e-5)
    assert (o[3] == 0).all() and not torch.isnan(o).any()


# ---------------------------------------------------------------------------- a kernel using it
def _builder():
    """A one-warp kernel: row r of S (8 x 64) is held by the quad of lanes 4r..4r+3, 4 keys each per
    16-key tile; two OnlineSoftmax states over the two halves of the keys (as two token warps of the
    decode kernel), merged with the raw-state weights; O = normalized output, LSE natural log."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    class Kernel:
        @cute.jit
        def __call__(self, mS: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                     scale_log2: Float32, stream):
            self.kernel(mS, mV, mO, mLSE, scale_log2).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, mS: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                   scale_log2: Float32):
            lane, _, _ = cute.arch.thread_idx()
            row = lane // 4
            q = lane % 4
            halves = (sm.OnlineSoftmax.create(scale_log2, 1), sm.OnlineSoftmax.create(scale_log2, 1))
            o = cute.make_rmem_tensor((2, D), Float32)
            o.fill(0.0)
            s = cute.make_rmem_tensor((1, 4), Float32)
            for t in cutlass.range_constexpr(L // 16):
                h = t // (L // 32)
                for c in cutlass.range_constexpr(4):
                    s[0, c] = mS[row, t * 16 + q * 4 + c]
                halves[h].update_row(0, s[0, None], o[h, None])
                for d in cutlass.range_constexpr(D):
                    acc = o[h, d]
                    for c in cutlass.range_constexpr(4):
                        acc += s[0, c] * mV[t * 16 + q * 4 + c, d]
                    o[h, d] = acc
            m_all = cute.arch.fmax(halves[0].row_max[0], halves[1].row_max[0])
            m_all_s = sm.scaled_max(m_all, scale_log2)
            l_all = Float32(0.0)
            w = cute.make_rmem_tensor((2,), Float32)
            for h in cutlass.range_constexpr(2):
                w[h] = sm.raw_state_weight(halves[h].row_max[0], m_all_s, scale_log2)
                l_all += w[h] * sm.quad_sum(halves[h].row_sum[0])
            inv = sm.inv_or_zero(l_all)
            for d in cutlass.range_constexpr(D):
                mO[row, d] = sm.quad_sum(w[0] * o[0, d] + w[1] * o[1, d]) * inv
            if q == 0:
                mLSE[row] = sm.lse_from_scaled(m_all_s, l_all)

    f32 = cutlass.Float32
    args = (make_fake_compact_tensor(f32, (ROWS, L), stride_order=(1, 0), assumed_align=16),
            make_fake_compact_tensor(f32, (L, D), stride_order=(1, 0), assumed_align=16),
            make_fake_compact_tensor(f32, (ROWS, D), stride_order=(1, 0), assumed_align=16),
            make_fake_compact_tensor(f32, (ROWS,), assumed_align=16),
            Float32(1.0), make_fake_stream(use_tvm_ffi_env_stream=True))
    return Kernel(), args


def test_softmax_kernel_compiles_for_sm90a():
    from cute_kernels.tools import inspect as ins

    rep = ins.inspect_builder(_builder)
    assert len(rep.kernels) == 1
    k = rep.kernels[0]
    assert k.spills == 0 and k.stack_frame == 0, rep.summary()
    assert k.instructions["MUFU"] > 0 and k.instructions["SHFL"] > 0, rep.summary()


@gpu
def test_gpu_softmax_kernel_matches_reference():
    from cute_kernels.common import jit

    fn = jit.compile_now(_builder)
    s, v = _scores(2)
    o = torch.full((ROWS, D), float("nan"), device="cuda")
    lse = torch.full((ROWS,), float("nan"), device="cuda")
    fn(s.float().cuda(), v.float().cuda(), o, lse, SCALE * sm.LOG2_E)
    torch.cuda.synchronize()
    ro, rl = online_softmax_reference(s.float().double(), v.float().double(), SCALE, 16)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(o.double().cpu(), ro, atol=2e-5, rtol=2e-4)
    assert torch.equal(torch.isneginf(lse.cpu()), torch.isneginf(rl))
    fin = ~torch.isneginf(rl)
    torch.testing.assert_close(lse.double().cpu()[fin], rl[fin], atol=2e-5, rtol=2e-5)
    assert (o[3] == 0).all()
