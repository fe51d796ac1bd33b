"""flash_attn (FlashAttention forward) tests.

CPU: every host validation error names its argument and comes before any launch (nothing planned or
compiled); empty problems; the custom ops' fake implementations under FakeTensorMode and
torch.compile; the float32 reference against torch SDPA; planning and warm-up under ``jit.dry_run``
(the compile of every configuration for sm_90a is in ``test_forward_compile.py``).
GPU (``-m gpu``): fresh random data, outputs poisoned with NaN before the launch, per (batch, head)
``max|O - ref| <= 2 * max|O_torch - ref| + 1e-4`` where ``O_torch`` is torch's own 16-bit attention
(SDPA math backend, 16-bit reductions allowed) on the same inputs, the last query tile on its own,
``|dLSE| <= 1e-3``; lengths 1/17/128/1000/4097 with Sq != Sk, causal and not, GQA 1/4/8, D 64/128,
fp16/bf16; fully masked rows; bitwise repeatability; strided views without a copy; views of larger
NaN-filled buffers; ``out=``; the split-at-Sk/2 merge; CUDA-graph capture; torch.compile.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

import cute_kernels
from cute_kernels.attention import forward as FW
from cute_kernels.attention.forward import flash_attn
from cute_kernels.common import jit
from conftest import precompile_for_module_gpu_tests

gpu = pytest.mark.gpu
NAN = float("nan")
DTYPES = (torch.float16, torch.bfloat16)
CONFIGS = list(itertools.product(DTYPES, FW.HEAD_DIMS, (False, True)))  # every kernel configuration


# ------------------------------------------------------------------------------------------ reference
def attention_reference(q, k, v, causal=False, softmax_scale=None):
    """float32 matmul + softmax: (o (B, Sq, Hq, D) float32, lse (B, Hq, Sq) float32, natural log).

    Bottom-right causal (query i sees keys j <= i + Sk - Sq), GQA by repeat_interleave of the K/V
    heads; rows that see no key give o = 0 and lse = -inf.  One (batch, head group) at a time so that
    4097 x 4097 scores stay small."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    scale = D ** -0.5 if softmax_scale is None else float(softmax_scale)
    out = torch.zeros(B, Sq, Hq, D, dtype=torch.float32, device=q.device)
    lse = torch.full((B, Hq, Sq), float("-inf"), dtype=torch.float32, device=q.device)
    if Sk == 0 or Sq == 0:
        return out, lse
    mask = None
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        mask = j > i + (Sk - Sq)  # True = masked
    hstep = max(1, min(Hq, (1 << 26) // max(1, Sq * Sk)))
    for b in range(B):
        kf = k[b].float().transpose(0, 1).repeat_interleave(G, 0)  # (Hq, Sk, D)
        vf = v[b].float().transpose(0, 1).repeat_interleave(G, 0)
        for h0 in range(0, Hq, hstep):
            h1 = min(Hq, h0 + hstep)
            qf = q[b, :, h0:h1].float().transpose(0, 1)  # (h, Sq, D)
            s = torch.matmul(qf, kf[h0:h1].transpose(-1, -2)) * scale  # (h, Sq, Sk)
            if mask is not None:
                s = s.masked_fill(mask, float("-inf"))
            l = torch.logsumexp(s, dim=-1)  # -inf where the row sees nothing
            empty = torch.isneginf(l)
            p = torch.exp(s - torch.where(empty, torch.zeros_like(l), l)[..., None])
            p = torch.where(empty[..., None], torch.zeros_like(p), p)
            out[b, :, h0:h1] = torch.matmul(p, vf[h0:h1]).transpose(0, 1)
            lse[b, h0:h1] = l
    return out, lse


def sdpa_16bit(q, k, v, causal=False, softmax_scale=None):
    """torch's own attention in the input dtype (SDPA math backend with 16-bit reductions allowed,
    i.e. no fp32 upcast), bottom-right causal through an explicit mask, GQA by repeat_interleave.
    Returns (B, Sq, Hq, D) in q's dtype."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, Sq, Hq, D = q.shape
    Sk, G = k.shape[1], Hq // k.shape[2]
    qt = q.transpose(1, 2)
    kt = k.transpose(1, 2).repeat_interleave(G, 1)
    vt = v.transpose(1, 2).repeat_interleave(G, 1)
    mask = None
    if causal:
        mask = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device).tril(diagonal=Sk - Sq)  # True = attend
    prev = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=softmax_scale)
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(prev)
    return o.transpose(1, 2)


# ------------------------------------------------------------------------------------------ helpers
def make_qkv(B, Sq, Sk, Hq, Hkv, D, dtype=torch.bfloat16, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, Sq, Hq, D, generator=g, device=device).to(dtype)
    k = torch.randn(B, Sk, Hkv, D, generator=g, device=device).to(dtype)
    v = torch.randn(B, Sk, Hkv, D, generator=g, device=device).to(dtype)
    return q, k, v


def q_tile_rows() -> int:
    """Query rows per CTA tile of the kernel (the last, possibly partial, tile is checked alone)."""
    return FW.plan(torch.bfloat16, 128, False).tile.tile_m


def run_poisoned(q, k, v, causal=False, softmax_scale=None):
    """The kernel through the out-variant op with NaN-poisoned out and LSE buffers."""
    B, Sq, Hq, D = q.shape
    out = torch.full((B, Sq, Hq, D), NAN, dtype=q.dtype, device=q.device)
    lse = torch.full((B, Hq, Sq), NAN, dtype=torch.float32, device=q.device)
    scale = D ** -0.5 if softmax_scale is None else softmax_scale
    torch.ops.cute_kernels.flash_attn_(q, k, v, out, lse, causal, scale)
    return out, lse


def max_err_per_head(o, ref, rows=None):
    """max |o - ref| per (batch, head) over the query rows ``rows`` (a slice) and the head dim."""
    d = (o.float() - ref).abs()
    if rows is not None:
        d = d[:, rows]
    return d.amax(dim=(1, 3)) if d.shape[1] else torch.zeros(d.shape[0], d.shape[2], device=d.device)


def check_against_reference(o, lse, q, k, v, causal, softmax_scale=None, what="", tile_m=None):
    """Issue 16's criteria (:func:`check_result`) against the float32 reference and torch's own
    16-bit attention."""
    ref, ref_lse = attention_reference(q, k, v, causal, softmax_scale)
    check_result(o, lse, ref, ref_lse, sdpa_16bit(q, k, v, causal, softmax_scale), what, tile_m)


def check_result(o, lse, ref, ref_lse, o_torch, what="", tile_m=None):
    """A (B, S, H, D) result against the float32 reference (ref, ref_lse) and torch's 16-bit attention
    o_torch: per (batch, head) error within 2x torch's + 1e-4 or one unit of O's dtype at the head's
    largest |ref| (a few-element head can leave torch's error near zero by luck; a rounding step is
    not a fault), the last query tile alone too; LSE
    within 1e-3 where finite, -inf exactly where the row sees no key (and O = 0 there); no NaN
    anywhere (the buffers were poisoned)."""
    assert torch.isfinite(o).all(), f"{what}: NaN/inf in O (unwritten, 0/0 or overflow)"
    assert not torch.isnan(lse).any(), f"{what}: NaN in LSE"
    Sq, tm = o.shape[1], tile_m or q_tile_rows()  # (tile_m: the query rows of a tile the test chose)
    last = slice(((Sq - 1) // tm) * tm, Sq)
    for rows, name in ((None, "all rows"), (last, f"last q tile {last.start}:{last.stop}")):
        ours, theirs = max_err_per_head(o, ref, rows), max_err_per_head(o_torch, ref, rows)
        one_unit = torch.finfo(o.dtype).eps * max_err_per_head(torch.zeros_like(o), ref, rows)
        bad = ours > torch.maximum(2 * theirs + 1e-4, one_unit)
        assert not bad.any(), (f"{what} ({name}): max|O - ref| {ours[bad].tolist()[:4]} > 2 x torch's "
                               f"{theirs[bad].tolist()[:4]} + 1e-4 at (batch, head) {bad.nonzero().tolist()[:4]}")
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), f"{what}: -inf LSE pattern differs from the reference"
    if (~empty).any():
        d = (lse[~empty] - ref_lse[~empty]).abs().max().item()
        assert d <= 1e-3, f"{what}: max |dLSE| {d:.3g} > 1e-3"
    if empty.any():
        assert (o.float()[empty.permute(0, 2, 1)] == 0).all(), f"{what}: rows that see no key must be 0"


# ------------------------------------------------------------------------------------------ CPU: validation
def _base(**over):
    q, k, v = make_qkv(2, 5, 7, 8, 2, 64)
    kw = dict(q=q, k=k, v=v)
    kw.update(over)
    return kw


def _bf(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


def _misaligned(*shape):
    n = math.prod(shape)
    return torch.randn(n + 8).to(torch.bfloat16)[1 : n + 1].view(*shape)  # 2 bytes past 16-byte alignment


def _call(kw):
    kw = dict(kw)
    return flash_attn(kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)


BAD_INPUTS = [  # (make kwargs, exception, message pattern naming the argument)
    ("q-not-tensor", lambda: _base(q=[1.0]), TypeError, "q must be a torch.Tensor"),
    ("v-not-tensor", lambda: _base(v=None), TypeError, "v must be a torch.Tensor"),
    ("q-rank", lambda: _base(q=_bf(2, 5, 512)), ValueError, "q must be 4-d"),
    ("k-rank", lambda: _base(k=_bf(2, 7, 2, 64, 1)), ValueError, "k must be 4-d"),
    ("out-rank", lambda: _base(out=_bf(2, 5, 512)), ValueError, "out must be 4-d"),
    ("head-dim-100", lambda: _base(q=_bf(2, 5, 8, 100)), ValueError, r"q head_dim must be one of \(64, 96, 128, 256\), got 100"),
    ("head-dim-80", lambda: _base(q=_bf(2, 5, 8, 80)), ValueError, r"q head_dim must be one of"),
    ("head-dim-256", lambda: _base(q=_bf(2, 5, 8, 256)), ValueError, "q head_dim"),
    ("k-head-dim", lambda: _base(k=_bf(2, 7, 2, 128), v=_bf(2, 7, 2, 128)), ValueError, "k head_dim"),
    ("gqa-ratio", lambda: _base(k=_bf(2, 7, 3, 64), v=_bf(2, 7, 3, 64)), ValueError, r"q heads \(8\).*k/v heads \(3\)"),
    ("kv-heads-0", lambda: _base(k=_bf(2, 7, 0, 64), v=_bf(2, 7, 0, 64)), ValueError, "k/v heads"),
    ("batch", lambda: _base(k=_bf(3, 7, 2, 64), v=_bf(3, 7, 2, 64)), ValueError, r"k batch \(3\) must equal q batch \(2\)"),
    ("kv-shape", lambda: _base(v=_bf(2, 6, 2, 64)), ValueError, "v shape"),
    ("kv-heads-differ", lambda: _base(v=_bf(2, 7, 1, 64)), ValueError, "v shape"),
    ("fp32", lambda: _base(q=torch.randn(2, 5, 8, 64)), TypeError, "q must be float16 or bfloat16"),
    ("fp8", lambda: _base(q=torch.randn(2, 5, 8, 64).to(torch.float8_e4m3fn)), TypeError, "q must be float16 or bfloat16"),
    ("mixed-k", lambda: _base(k=torch.randn(2, 7, 2, 64, dtype=torch.float16)), TypeError, "k dtype"),
    ("mixed-v", lambda: _base(v=torch.randn(2, 7, 2, 64, dtype=torch.float16)), TypeError, "v dtype"),
    ("q-stride-1", lambda: _base(q=_bf(2, 5, 8, 128)[..., ::2]), ValueError, r"q must be contiguous in the head dim"),
    ("k-stride-1", lambda: _base(k=_bf(2, 7, 2, 128)[..., ::2], v=_bf(2, 7, 2, 128)[..., ::2]), ValueError,
     r"k must be contiguous in the head dim"),
    ("v-transposed", lambda: _base(v=_bf(2, 7, 64, 2).transpose(2, 3)), ValueError, "v must be contiguous in the head dim"),
    ("q-row-stride", lambda: _base(q=_bf(2, 5, 8, 65)[..., :64]), ValueError, "q strides must be multiples of 8"),
    ("k-row-stride", lambda: _base(k=_bf(2, 7, 2, 68)[..., :64]), ValueError, "k strides must be multiples of 8"),
    ("v-head-stride", lambda: _base(v=_bf(2, 7, 3, 64)[:, :, :2].as_strided((2, 7, 2, 64), (7 * 132, 132, 68, 1))),
     ValueError, "v strides must be multiples of 8"),
    ("q-pointer", lambda: _base(q=_misaligned(2, 5, 8, 64)), ValueError, "q data pointer must be 16-byte aligned"),
    ("k-pointer", lambda: _base(k=_misaligned(2, 7, 2, 64)), ValueError, "k data pointer"),
    ("v-pointer", lambda: _base(v=_misaligned(2, 7, 2, 64)), ValueError, "v data pointer"),
    ("out-shape", lambda: _base(out=_bf(2, 5, 8, 128)), ValueError, "out shape"),
    ("out-shape-seq", lambda: _base(out=_bf(2, 7, 8, 64)), ValueError, "out shape"),
    ("out-dtype", lambda: _base(out=torch.empty(2, 5, 8, 64, dtype=torch.float16)), TypeError, "out dtype"),
    ("out-fp32", lambda: _base(out=torch.empty(2, 5, 8, 64)), TypeError, "out dtype"),
    ("out-stride-1", lambda: _base(out=_bf(2, 5, 8, 128)[..., ::2]), ValueError, "out must be contiguous in the head dim"),
    ("out-row-stride", lambda: _base(out=_bf(2, 5, 8, 72)[..., :64].as_strided((2, 5, 8, 64), (5 * 8 * 72, 8 * 72, 65, 1))),
     ValueError, "out strides"),
    ("out-pointer", lambda: _base(out=_misaligned(2, 5, 8, 64)), ValueError, "out data pointer"),
    ("out-not-tensor", lambda: _base(out=3), TypeError, "out must be a torch.Tensor"),
    ("scale-negative", lambda: _base(softmax_scale=-0.5), ValueError, "softmax_scale"),
    ("scale-nan", lambda: _base(softmax_scale=NAN), ValueError, "softmax_scale"),
    ("scale-string", lambda: _base(softmax_scale="big"), TypeError, "softmax_scale"),
    ("scale-tensor", lambda: _base(softmax_scale=torch.tensor(0.1)), TypeError, "softmax_scale must be a Python number"),
    ("dropout", lambda: _base(dropout_p=0.1), ValueError, r"dropout_p=0.1: dropout is not supported"),
    ("dropout-string", lambda: _base(dropout_p="0.1"), TypeError, "dropout_p must be a float"),
    ("dropout-tensor", lambda: _base(dropout_p=torch.tensor(0.0)), TypeError, "dropout_p must be a float"),
    ("softcap-valid", lambda: _base(softcap=30.0), ValueError, "q is on cpu"),  # (supported: test_variants.py)
    ("softcap-negative", lambda: _base(softcap=-1.0), ValueError, "softcap must be a finite number >= 0"),
    ("softcap-string", lambda: _base(softcap="30"), TypeError, "softcap must be a real number"),
    ("sink-dtype", lambda: _base(learnable_sink=torch.zeros(8, dtype=torch.bfloat16)), TypeError,
     "learnable_sink must be float32"),
    ("alibi", lambda: _base(alibi_slopes=torch.ones(8)), ValueError, "alibi_slopes: ALiBi is not supported"),
    ("alibi-packed", lambda: _base(alibi_slopes=torch.ones(8), cu_seqlens_q=torch.zeros(3, dtype=torch.int32)),
     ValueError, "alibi_slopes"),
    ("causal-string", lambda: _base(causal="yes"), TypeError, "causal must be a bool, got str"),
    ("causal-tensor", lambda: _base(causal=torch.tensor(True)), TypeError, "causal must be a bool, got Tensor"),
    ("causal-int", lambda: _base(causal=1), TypeError, "causal must be a bool, got int"),
    ("checked-string", lambda: _base(checked="no"), TypeError, "checked must be a bool or None"),
    ("neutral-extras", lambda: _base(dropout_p=0, softcap=0.0, alibi_slopes=None), ValueError, "q is on cpu"),
    ("cpu-tensors", lambda: _base(), ValueError, r"q is on cpu; flash_attn runs on CUDA tensors"),
]


@pytest.mark.parametrize("make,exc,match", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_inputs_raise_before_any_launch(make, exc, match):
    """Each bad argument raises the right error naming it; nothing is planned, compiled or launched
    (the CPU tensors would reach the device check last: shape, dtype and stride errors come first)."""
    kw = make()
    stats = dict(jit.stats)
    with jit.dry_run() as dry:
        with pytest.raises(exc, match=match):
            _call(kw)
    assert dry.seen == [] and jit.stats == stats


def test_bad_input_messages_name_the_function():
    with pytest.raises(ValueError, match=r"^flash_attn: q head_dim"):
        _call(_base(q=_bf(2, 5, 8, 100)))


def test_shape_errors_before_device_errors():
    """CPU tensors with a bad shape report the shape, the same with good shapes report the device."""
    q, k, v = make_qkv(1, 3, 4, 6, 4, 64)
    with pytest.raises(ValueError, match="multiple of k/v heads"):
        flash_attn(q, k, v)
    with pytest.raises(ValueError, match="q is on cpu"):
        flash_attn(q, k[:, :, :2], v[:, :, :2])


@pytest.mark.parametrize("shape", [(0, 5, 4, 64), (2, 0, 4, 64), (2, 5, 0, 64)], ids=["B0", "Sq0", "Hq0"])
def test_empty_problems_fail_only_on_the_device_check(shape):
    """Empty problems pass every shape check (CPU tensors still stop at the device check)."""
    B, Sq, Hq, D = shape
    q = torch.empty(shape, dtype=torch.bfloat16)
    k = torch.empty(B, 3, max(1, Hq // 2) if Hq else 2, D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="on cpu"):
        flash_attn(q, k, k.clone())


# ------------------------------------------------------------------------------------------ CPU: host paths
@pytest.mark.parametrize("Sq,Sk,B", [(5, 0, 2), (0, 7, 2), (5, 7, 0)], ids=["Sk0", "Sq0", "B0"])
def test_empty_problems_launch_nothing(Sq, Sk, B):
    """The host handles them: Sk == 0 gives O = 0 and LSE = -inf, the others empty results; nothing
    is planned or compiled (the launch path run directly on CPU tensors)."""
    q, k, v = make_qkv(B, Sq, Sk, 4, 2, 64)
    out = torch.full_like(q, NAN)
    lse = torch.full((B, 4, Sq), NAN)
    stats = dict(jit.stats)
    with jit.dry_run() as dry:
        FW._run(FW.Call(FW.DENSE, True, 0.125), q, k, v, out, lse)
    assert dry.seen == [] and jit.stats == stats
    if Sk == 0 and B and Sq:
        assert (out == 0).all() and torch.isneginf(lse).all()


def test_default_scale():
    assert FW._scale(None, 64) == 0.125 and FW._scale(None, 128) == pytest.approx(128 ** -0.5)
    assert FW._scale(0.3, 128) == 0.3


def test_opcheck_custom_ops():
    """Schema, fake implementation and functionalization of both ops (Sk == 0 and B == 0: the host
    path, no kernel, so this runs on the CPU)."""
    q, k, v = make_qkv(2, 3, 0, 4, 2, 64)
    torch.library.opcheck(torch.ops.cute_kernels.flash_attn, (q, k, v, True, 0.125))
    out, lse = torch.empty_like(q), torch.empty(2, 4, 3)
    torch.library.opcheck(torch.ops.cute_kernels.flash_attn_, (q, k, v, out, lse, False, 0.125))
    q0, k0, v0 = make_qkv(0, 3, 5, 4, 2, 64)
    torch.library.opcheck(torch.ops.cute_kernels.flash_attn, (q0, k0, v0, False, 0.125))


def _fake_cuda(*shapes, dtype=torch.bfloat16):
    return [torch.empty(s, dtype=dtype, device="cuda") for s in shapes]


def test_fake_impl_shapes_under_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = _fake_cuda((2, 33, 8, 128), (2, 70, 2, 128), (2, 70, 2, 128))
        o, lse = torch.ops.cute_kernels.flash_attn(q, k, v, True, 0.1)
        assert o.shape == q.shape and o.dtype == q.dtype and o.is_contiguous() and o.device == q.device
        assert lse.shape == (2, 8, 33) and lse.dtype == torch.float32
        # the public function on fake tensors goes through the ops
        o2, lse2 = flash_attn(q, k, v, causal=True, return_lse=True)
        assert o2.shape == q.shape and lse2.shape == (2, 8, 33)
        # (B, H, S, D) storage viewed as (B, S, H, D): the output is contiguous (B, S, H, D)
        qt = torch.empty(2, 8, 33, 128, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        o3 = flash_attn(qt, k, v)
        assert o3.shape == (2, 33, 8, 128) and o3.is_contiguous()
        out = torch.empty(2, 33, 8, 128, dtype=torch.bfloat16, device="cuda")
        r, lse4 = flash_attn(q, k, v, out=out, return_lse=True)
        assert r is out and lse4.shape == (2, 8, 33)
        with pytest.raises(ValueError, match="multiple of k/v heads"):
            kv3 = torch.empty(2, 70, 3, 128, dtype=torch.bfloat16, device="cuda")
            flash_attn(q, kv3, kv3)


@pytest.mark.parametrize("with_out", [False, True], ids=["functional", "out"])
def test_torch_compile_traces_one_graph(with_out):
    """torch.compile(fullgraph=True) of a function calling flash_attn traces (fake CUDA tensors, no
    GPU) into one graph holding the custom op, with the right output shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm  # runs on the fake tensors: the fake implementations

    def f(q, k, v, out):
        if with_out:
            o, lse = flash_attn(q, k, v, causal=True, out=out, return_lse=True)
        else:
            o, lse = flash_attn(q, k, v, causal=True, return_lse=True)
        return o.float() * 2, lse

    torch._dynamo.reset()
    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v, out = _fake_cuda((2, 17, 8, 64), (2, 1000, 1, 64), (2, 1000, 1, 64), (2, 17, 8, 64))
        o, lse = torch.compile(f, fullgraph=True, backend=backend)(q, k, v, out)
        assert o.shape == (2, 17, 8, 64) and o.dtype == torch.float32 and lse.shape == (2, 8, 17)
    assert len(graphs) == 1
    op = "cute_kernels.flash_attn_" if with_out else "cute_kernels.flash_attn."
    assert op in graphs[0].code, graphs[0].code
    torch._dynamo.reset()


def test_torch_compile_eager_backend_dynamic_lengths():
    """backend="eager" with dynamic shapes: new lengths reuse the traced graph (the ops take any
    length), fp16, a non-default scale."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch._dynamo.reset()
    with FakeTensorMode(allow_non_fake_inputs=True):
        f = torch.compile(lambda q, k, v: flash_attn(q, k, v, softmax_scale=0.2) + 1, fullgraph=True, backend="eager",
                          dynamic=True)
        for Sq, Sk in ((128, 17), (1000, 4097)):
            q, k, v = _fake_cuda((1, Sq, 4, 128), (1, Sk, 4, 128), (1, Sk, 4, 128), dtype=torch.float16)
            o = f(q, k, v)
            assert o.shape == q.shape and o.dtype == torch.float16
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------ CPU: reference
@pytest.mark.parametrize("Sq,Sk,G", [(5, 5, 1), (7, 19, 4), (19, 7, 2), (1, 33, 8)])
def test_reference_matches_sdpa_non_causal(Sq, Sk, G):
    q, k, v = make_qkv(2, Sq, Sk, 2 * G, 2, 64, dtype=torch.float32, seed=1)
    o, lse = attention_reference(q, k, v, softmax_scale=0.3)
    sd = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=0.3, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(o, sd, atol=1e-5, rtol=1e-5)
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double().repeat_interleave(G, 2)) * 0.3
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("Sq,Sk", [(6, 6), (4, 9), (9, 4), (1, 5), (5, 1)])
def test_reference_bottom_right_causal_matches_sdpa_with_mask(Sq, Sk):
    """Bottom-right alignment: query i sees keys j <= i + Sk - Sq (an explicit mask for SDPA, whose
    is_causal is top-left); with Sq > Sk the first Sq - Sk rows see nothing: O = 0, LSE = -inf."""
    q, k, v = make_qkv(2, Sq, Sk, 4, 2, 64, dtype=torch.float32, seed=2)
    o, lse = attention_reference(q, k, v, causal=True)
    mask = torch.tensor([[j <= i + Sk - Sq for j in range(Sk)] for i in range(Sq)])
    sd = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(o, sd, atol=1e-5, rtol=1e-5)
    empty = max(0, Sq - Sk)
    assert torch.isneginf(lse[:, :, :empty]).all() and torch.isfinite(lse[:, :, empty:]).all()
    assert (o[:, :empty] == 0).all()
    if Sq == Sk:  # square: the usual top-left mask
        sd2 = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)
        torch.testing.assert_close(o, sd2.transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_reference_no_keys():
    q, k, v = make_qkv(1, 3, 0, 2, 1, 64, dtype=torch.float32)
    o, lse = attention_reference(q, k, v)
    assert (o == 0).all() and torch.isneginf(lse).all()


def test_sdpa_16bit_is_torchs_own_precision():
    """O_torch keeps 16-bit reductions (no fp32 upcast): its error vs the float32 reference is well
    above the output's own rounding, which is what the kernel's tolerance is measured against."""
    q, k, v = make_qkv(1, 64, 300, 2, 2, 64, dtype=torch.bfloat16, seed=3)
    ref, _ = attention_reference(q, k, v)
    e16 = (sdpa_16bit(q, k, v).float() - ref).abs().max()
    e_round = (ref.to(torch.bfloat16).float() - ref).abs().max()
    assert e16 > e_round and not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()


# ------------------------------------------------------------------------------------------ CPU: plan, warm-up
def test_public_surface():
    from cute_kernels import attention

    assert cute_kernels.flash_attn is flash_attn is attention.flash_attn
    assert "flash_attn" in cute_kernels.__all__ and "flash_attn" in attention.__all__
    assert FW.HEAD_DIMS == (64, 96, 128, 256)


@pytest.mark.parametrize("spec,match", [
    (dict(dtype=torch.float32, head_dim=128, causal=True), "dtype"),
    (dict(dtype="bfloat16", head_dim=80, causal=True), "head_dim"),
    (dict(dtype="bfloat16", head_dim=128, softcapping=True), "unknown keys"),
])
def test_warmup_bad_spec(spec, match):
    with jit.dry_run() as dry, pytest.raises(ValueError, match=match):
        cute_kernels.warmup([("flash_attn", spec)])
    assert dry.seen == []


def test_warmup_plans_the_config_a_call_runs():
    """cute_kernels.warmup([("flash_attn", dict(...))]) asks the compile cache for exactly the config
    a call runs (recorded under jit.dry_run, nothing compiled); names and torch dtypes agree."""
    from cute_kernels.attention.forward_kernel import FlashFwdConfig, fwd_config

    specs = [dict(dtype=torch.bfloat16, head_dim=128, causal=True), dict(dtype="float16", head_dim=64, causal=False)]
    with jit.dry_run() as dry:
        assert cute_kernels.warmup([("flash_attn", s) for s in specs]) == 2
    want = [fwd_config("bfloat16", 128, True), fwd_config("float16", 64, False)]
    assert dry.seen == [("flash_attn_fwd", c) for c in want]
    assert all(isinstance(c, FlashFwdConfig) and hash(c) == hash(fwd_config(c.dtype, c.head_dim, c.causal)) for c in want)
    with jit.dry_run() as dry:
        cute_kernels.warmup([("flash_attn", want[0])])
    assert dry.seen == [("flash_attn_fwd", want[0])]


def test_plan_depends_on_static_facts_only():
    """Every length, batch and head count of one (dtype, D, causal) plans the same config (no
    recompile for new lengths); the config is what fwd_config returns for those facts."""
    from cute_kernels.attention.forward_kernel import fwd_config

    seen = set()
    for B, Sq, Sk, Hq, Hkv in [(1, 1, 1, 1, 1), (2, 17, 4097, 8, 1), (3, 1000, 128, 32, 8), (1, 4097, 17, 4, 4)]:
        q, k, v = make_qkv(B, Sq, Sk, Hq, Hkv, 128, dtype=torch.float16)
        out, lse = torch.empty_like(q), torch.empty(B, Hq, Sq)
        with jit.dry_run() as dry:
            FW._run(FW.Call(FW.DENSE, True, 0.1), q, k, v, out, lse)
        assert len(dry.seen) == 1
        seen.add(dry.seen[0])
    assert seen == {("flash_attn_fwd", fwd_config("float16", 128, True))}
    assert FW.plan(torch.float16, 128, True) is FW.plan(torch.float16, 128, True)
    assert len({FW.plan(*c) for c in CONFIGS}) == len(CONFIGS) == 16


# ------------------------------------------------------------------------------------------ GPU
@pytest.fixture(scope="module", autouse=True)
def _precompile_for_gpu_tests(request):
    """Compile the eight configurations up front, in parallel processes (disk cache)."""
    precompile_for_module_gpu_tests(request, lambda: FW.precompile([FW.plan(*c) for c in CONFIGS], processes=4))


LENGTHS = (1, 17, 128, 1000, 4097)
_AXES = list(itertools.product((1, 4, 8), FW.HEAD_DIMS, DTYPES))  # (G, D, dtype): 24 combinations


def _numerics_cases():
    """Every (Sq, Sk) pair of LENGTHS, causal and not (50 cases); the 24 (GQA, D, dtype) combinations
    cycle over them, so each axis value meets most lengths and both masks; plus 4097^2 at every D."""
    cases = []
    for i, (Sq, Sk, causal) in enumerate(itertools.product(LENGTHS, LENGTHS, (False, True))):
        G, D, dtype = _AXES[(i + i // len(_AXES)) % len(_AXES)]
        cases.append((Sq, Sk, causal, G, D, dtype))
    # the largest square problem at D = 128 too (the cycle gives it D = 64)
    cases += [(4097, 4097, True, 8, 128, torch.bfloat16), (4097, 4097, False, 1, 128, torch.float16),
              (4097, 4097, True, 4, 256, torch.bfloat16), (4097, 4097, False, 2, 96, torch.float16),
              (4097, 4097, True, 1, 64, torch.float16), (4097, 1000, False, 8, 256, torch.float16)]
    return cases


def _case_id(c):
    Sq, Sk, causal, G, D, dtype = c
    return f"q{Sq}-k{Sk}-{'causal' if causal else 'full'}-g{G}-d{D}-{str(dtype)[6:]}"


@gpu
@pytest.mark.parametrize("case", _numerics_cases(), ids=_case_id)
def test_gpu_numerics(case):
    Sq, Sk, causal, G, D, dtype = case
    Hkv = 1 if G == 8 else 2
    B = 2 if Sq * Sk <= 1000 * 4097 else 1
    q, k, v = make_qkv(B, Sq, Sk, G * Hkv, Hkv, D, dtype, device="cuda", seed=7 * Sq + 13 * Sk + G + D + causal)
    o, lse = run_poisoned(q, k, v, causal)
    check_against_reference(o, lse, q, k, v, causal, what=_case_id(case))


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_scale_and_peaky_scores(dtype):
    """A non-default scale on large-magnitude scores (the running max moves by tens per tile: the
    rescale path), GQA 4, ragged lengths."""
    q, k, v = make_qkv(2, 300, 777, 8, 2, 128, dtype, device="cuda", seed=11)
    q = (q.float() * 4).to(dtype)
    for causal in (False, True):
        o, lse = run_poisoned(q, k, v, causal, softmax_scale=0.37)
        check_against_reference(o, lse, q, k, v, causal, 0.37, what=f"peaky causal={causal}")


@gpu
@pytest.mark.parametrize("Sq,Sk,D", [(1000, 17, 128), (4097, 128, 64), (130, 1, 128), (1000, 83, 256), (300, 5, 96)])
def test_gpu_fully_masked_rows(Sq, Sk, D):
    """Causal with Sq > Sk: the first Sq - Sk query rows see no key: exactly 0 and -inf (never NaN),
    through the public function with a poisoned out= and through the op with a poisoned LSE."""
    q, k, v = make_qkv(2, Sq, Sk, 8, 2, D, device="cuda", seed=5)
    o, lse = run_poisoned(q, k, v, causal=True)
    n = Sq - Sk
    assert (o[:, :n] == 0).all() and torch.isneginf(lse[:, :, :n]).all()
    assert torch.isfinite(lse[:, :, n:]).all() and torch.isfinite(o).all()
    out = torch.full_like(q, NAN)
    r, lse2 = flash_attn(q, k, v, causal=True, out=out, return_lse=True)
    assert r is out and torch.equal(out, o) and torch.equal(lse2, lse)
    check_against_reference(o, lse, q, k, v, True, what="masked rows")


@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_many_heads_full_and_partial_l2_sections(causal):
    """72 (batch, head) pairs at Sk = 8192: one full section of 64 heads and a partial one of 8 in the
    CTA order (:func:`forward_softmax.tile_coords`); every tile of every head written once."""
    q, k, v = make_qkv(3, 300, 8192, 24, 3, 128, device="cuda", seed=23)
    o, lse = run_poisoned(q, k, v, causal)
    check_against_reference(o, lse, q, k, v, causal, what=f"72 heads causal={causal}")


@gpu
def test_gpu_bitwise_repeatable():
    q, k, v = make_qkv(2, 1000, 4097, 8, 2, 128, device="cuda", seed=7)
    for causal in (False, True):
        first = flash_attn(q, k, v, causal=causal, return_lse=True)
        for _ in range(3):
            o, lse = flash_attn(q, k, v, causal=causal, return_lse=True)
            assert torch.equal(o, first[0]) and torch.equal(lse, first[1])
        o2, lse2 = run_poisoned(q, k, v, causal)
        assert torch.equal(o2, first[0]) and torch.equal(lse2, first[1])


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_strided_views_run_without_a_copy(dtype):
    """(B, H, S, D) tensors viewed as (B, S, H, D), and q/k/v sliced out of one packed qkv buffer: no
    copy (the call allocates only out and LSE) and the same bits as contiguous inputs."""
    B, Sq, Sk, Hq, Hkv, D = 2, 333, 1000, 8, 2, 128
    qh = torch.randn(B, Hq, Sq, D, device="cuda").to(dtype)
    kh = torch.randn(B, Hkv, Sk, D, device="cuda").to(dtype)
    vh = torch.randn(B, Hkv, Sk, D, device="cuda").to(dtype)
    q, k, v = qh.transpose(1, 2), kh.transpose(1, 2), vh.transpose(1, 2)
    assert not q.is_contiguous()
    ref_o, ref_lse = flash_attn(q.contiguous(), k.contiguous(), v.contiguous(), causal=True, return_lse=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    o, lse = flash_attn(q, k, v, causal=True, return_lse=True)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra <= o.numel() * o.element_size() + lse.numel() * 4 + 4096, f"copied inputs? {extra} extra bytes"
    assert o.is_contiguous() and torch.equal(o, ref_o) and torch.equal(lse, ref_lse)
    check_against_reference(o, lse, q, k, v, True, what="transposed views")
    qkv = torch.randn(B, Sk, Hq + 2 * Hkv, D, device="cuda").to(dtype)  # packed projections, Sq == Sk
    q2, k2, v2 = qkv[:, :, :Hq], qkv[:, :, Hq:Hq + Hkv], qkv[:, :, Hq + Hkv:]
    o2, lse2 = run_poisoned(q2, k2, v2, False)
    check_against_reference(o2, lse2, q2, k2, v2, False, what="packed qkv")


@gpu
def test_gpu_out_in_place():
    """out= is written in place (poisoned first), contiguous or a (B, H, S, D) view."""
    q, k, v = make_qkv(2, 200, 500, 8, 8, 64, torch.float16, device="cuda", seed=8)
    ref = flash_attn(q, k, v, causal=True)
    out = torch.full_like(q, NAN)
    r = flash_attn(q, k, v, causal=True, out=out)
    assert r is out and torch.equal(out, ref)
    out_h = torch.full((2, 8, 200, 64), NAN, dtype=q.dtype, device="cuda")
    r2, lse = flash_attn(q, k, v, causal=True, out=out_h.transpose(1, 2), return_lse=True)
    assert r2.data_ptr() == out_h.data_ptr() and torch.equal(out_h.transpose(1, 2), ref)
    check_against_reference(r2, lse, q, k, v, True, what="out= view")


@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_views_of_larger_buffers(causal):
    """q/k/v/out as views of larger NaN-filled buffers (extra rows past Sq / Sk, extra heads on both
    sides): nothing past a view's own rows or heads is read into the result or written."""
    B, Sq, Sk, Hq, Hkv, D = 2, 333, 1000, 8, 2, 128
    q0, k0, v0 = make_qkv(B, Sq, Sk, Hq, Hkv, D, device="cuda", seed=14)

    def padded(t, extra_rows):
        big = torch.full((t.shape[0], t.shape[1] + extra_rows, t.shape[2] + 2, D), NAN, dtype=t.dtype, device="cuda")
        view = big[:, : t.shape[1], 1 : 1 + t.shape[2]]
        view.copy_(t)
        return big, view

    _, q = padded(q0, 77)
    _, k = padded(k0, 128)
    _, v = padded(v0, 128)
    big_out, out = padded(torch.zeros_like(q0), 50)
    big_out.fill_(NAN)
    o, lse = flash_attn(q, k, v, causal=causal, out=out, return_lse=True)
    assert o is out
    check_against_reference(o, lse, q0, k0, v0, causal, what="views of larger buffers")
    assert torch.isnan(big_out[:, Sq:]).all() and torch.isnan(big_out[:, :, 0]).all() and torch.isnan(big_out[:, :, -1]).all()


@gpu
@pytest.mark.parametrize("Sq,Sk,G,D,dtype", [(1000, 4097, 4, 128, torch.bfloat16), (17, 128, 1, 64, torch.float16),
                                             (128, 1001, 8, 128, torch.float16)])
def test_gpu_split_keys_merge(Sq, Sk, G, D, dtype):
    """Split Sk at Sk/2, run both halves with return_lse, merge with merge_states(o, lse^T): the
    unsplit result (within the rounding of the halves' 16-bit outputs) and its LSE (non-causal: a
    bottom-right mask on a half is not the full problem's mask restricted to it)."""
    q, k, v = make_qkv(2, Sq, Sk, 2 * G, 2, D, dtype, device="cuda", seed=9)
    h = Sk // 2
    o, lse = flash_attn(q, k, v, return_lse=True)
    o1, lse1 = flash_attn(q, k[:, :h], v[:, :h], return_lse=True)
    o2, lse2 = flash_attn(q, k[:, h:], v[:, h:], return_lse=True)
    om, lsem = cute_kernels.merge_states(torch.stack([o1, o2]), torch.stack([lse1, lse2]).transpose(-1, -2))
    assert om.shape == o.shape and lsem.shape == (2, Sq, 2 * G)
    ref, ref_lse = attention_reference(q, k, v)
    torch_err = max_err_per_head(sdpa_16bit(q, k, v), ref)
    # the merged state meets the unsplit criterion against the reference, and the two agree at the
    # scale of 16-bit rounding (each half's output is rounded once more before the merge: an FA-style
    # emulation measured |merged - unsplit| up to 1.4x torch's error)
    assert (max_err_per_head(om, ref) <= 2 * torch_err + 1e-4).all()
    assert (max_err_per_head(om, o.float()) <= 4 * torch_err + 1e-4).all()
    assert (lsem - lse.transpose(-1, -2)).abs().max().item() <= 1e-3
    assert (lsem - ref_lse.transpose(-1, -2)).abs().max().item() <= 1e-3


@gpu
def test_gpu_zero_lengths():
    """Sk == 0: O = 0, LSE = -inf (no launch); Sq == 0 and B == 0: empty results."""
    q, k, v = make_qkv(2, 9, 0, 4, 2, 128, device="cuda")
    out = torch.full_like(q, NAN)
    o, lse = flash_attn(q, k, v, out=out, return_lse=True)
    assert (o == 0).all() and torch.isneginf(lse).all() and lse.shape == (2, 4, 9)
    q, k, v = make_qkv(2, 0, 5, 4, 2, 128, device="cuda")
    o, lse = flash_attn(q, k, v, causal=True, return_lse=True)
    assert o.shape == (2, 0, 4, 128) and lse.shape == (2, 4, 0)
    q, k, v = make_qkv(0, 3, 5, 4, 2, 64, device="cuda")
    assert flash_attn(q, k, v).shape == (0, 3, 4, 64)


@gpu
def test_gpu_device_errors():
    q, k, v = make_qkv(1, 4, 5, 4, 2, 64, device="cuda")
    with pytest.raises(ValueError, match="k is on cpu"):
        flash_attn(q, k.cpu(), v)
    with pytest.raises(ValueError, match="out is on cpu"):
        flash_attn(q, k, v, out=torch.empty(1, 4, 4, 64, dtype=q.dtype))


@gpu
def test_gpu_cuda_graph_capture_replay():
    """Capture once (public function, out= and the returned LSE), replay with new contents: the
    eager results, bitwise."""
    from conftest import capture_graph

    q, k, v = make_qkv(2, 1000, 1000, 8, 2, 128, device="cuda", seed=12)
    out = torch.empty_like(q)
    res = {}

    def step():
        res["o"], res["lse"] = flash_attn(q, k, v, causal=True, out=out, return_lse=True)

    g = capture_graph(step)
    for seed in (1, 2):
        q2, k2, v2 = make_qkv(2, 1000, 1000, 8, 2, 128, device="cuda", seed=seed)
        q.copy_(q2), k.copy_(k2), v.copy_(v2)
        out.fill_(NAN)
        g.replay()
        torch.cuda.synchronize()
        eo, else_ = flash_attn(q2, k2, v2, causal=True, return_lse=True)
        assert torch.equal(out, eo) and torch.equal(res["lse"], else_)


@gpu
def test_gpu_dynamic_schedule_counter_reuse():
    """Causal at D = 128 runs the dynamic schedule (persistent CTAs take tiles from a global counter
    that the last CTA resets): with 1024 tiles (~8 per CTA), back-to-back calls, calls on two streams
    at once, and replays of a captured graph all give the first call's bits, which match the reference."""
    from conftest import capture_graph

    assert FW.plan(torch.bfloat16, 128, True).tile.dynamic
    q, k, v = make_qkv(4, 2048, 2048, 16, 4, 128, device="cuda", seed=31)
    ref_o, ref_lse = run_poisoned(q, k, v, True)
    check_against_reference(ref_o, ref_lse, q, k, v, True, what="dynamic schedule")
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    outs = []
    for _ in range(3):
        for s in streams:
            with torch.cuda.stream(s):
                outs.append(flash_attn(q, k, v, causal=True, return_lse=True))
    torch.cuda.synchronize()
    for o, lse in outs:
        assert torch.equal(o, ref_o) and torch.equal(lse, ref_lse)
    out = torch.empty_like(q)
    g = capture_graph(lambda: flash_attn(q, k, v, causal=True, out=out))
    for _ in range(3):
        out.fill_(NAN)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ref_o)
    assert torch.equal(flash_attn(q, k, v, causal=True), ref_o)  # eager after the graph: counter still clean


@gpu
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_gpu_torch_compile(backend):
    """torch.compile(fullgraph=True) of a function calling flash_attn runs and matches eager."""
    q, k, v = make_qkv(2, 300, 1000, 8, 1, 64, device="cuda", seed=13)

    def f(q, k, v):
        o, lse = flash_attn(q, k, v, causal=True, return_lse=True)
        return o.float() * 2, lse + 1

    torch._dynamo.reset()
    o, lse = torch.compile(f, fullgraph=True, backend=backend)(q, k, v)
    eo, else_ = flash_attn(q, k, v, causal=True, return_lse=True)
    assert torch.equal(o, eo.float() * 2) and torch.equal(lse, else_ + 1)
    out = torch.full_like(q, NAN)
    g = torch.compile(lambda q, k, v, out: flash_attn(q, k, v, causal=True, out=out), fullgraph=True, backend=backend)
    g(q, k, v, out)
    assert torch.equal(out, eo)
    torch._dynamo.reset()


P_SMEM_CASES = [  # (D, causal, B, Sq, Sk, Hq, Hkv, dtype, FwdTile overrides besides p_smem)
    (96, False, 2, 1000, 4097, 8, 2, torch.bfloat16, dict(tile_m=192)),  # issue 36's D 96 candidate
    (96, True, 1, 4097, 4097, 8, 1, torch.float16, dict(tile_m=192)),  # the dynamic schedule, causal
    (96, True, 2, 17, 1000, 4, 4, torch.bfloat16, dict(tile_m=192)),  # one query tile, many masked keys
    (96, False, 1, 333, 5, 8, 8, torch.bfloat16, dict(tile_m=192, tile_n=144, persistent=False, dynamic=False)),
    (64, True, 2, 1000, 777, 8, 1, torch.bfloat16, {}),  # D 64's 192 x 128 tile with P in shared memory
    (128, False, 2, 4097, 300, 4, 2, torch.float16, {}),  # two warpgroups
]


@gpu
@pytest.mark.parametrize("case", P_SMEM_CASES,
                         ids=lambda c: f"d{c[0]}-{'causal' if c[1] else 'full'}-{c[3]}x{c[4]}-m{c[8].get('tile_m', 'def')}"
                                       f"-n{c[8].get('tile_n', 'def')}")
def test_gpu_p_smem_matches_reference(monkeypatch, case):
    """``FwdTile.p_smem`` (P through shared memory; not a default yet): the planner patched to choose it
    (with the case's tile), NaN-poisoned outputs against the float64 reference, every row."""
    from cute_kernels.attention import forward_config
    from cute_kernels.common.fastpath import LauncherCache

    D, causal, B, Sq, Sk, Hq, Hkv, dtype, kw = case
    config = forward_config.fwd_config

    def with_p_smem(*args, **kwargs):
        cfg = config(*args, **kwargs)
        return dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, p_smem=True, **kw))

    monkeypatch.setattr(forward_config, "fwd_config", with_p_smem)  # (the planner's: forward.plan reads it there)
    monkeypatch.setattr(FW, "_PLANS", {})
    monkeypatch.setattr(FW, "_launchers", LauncherCache())
    tile = FW.plan(dtype, D, causal).tile
    assert tile.p_smem
    q, k, v = make_qkv(B, Sq, Sk, Hq, Hkv, D, dtype, device="cuda", seed=D + Sq + Sk + causal)
    o, lse = run_poisoned(q, k, v, causal)
    check_against_reference(o, lse, q, k, v, causal, what=f"p_smem {case}", tile_m=tile.tile_m)


@gpu
@pytest.mark.parametrize("D,B,Sq,Sk,Hq,Hkv,dtype", [
    (128, 32, 512, 512, 32, 8, torch.bfloat16),  # issue 36's short causal shape: many 1-4 step tiles per CTA
    (128, 3, 1000, 4097, 8, 1, torch.float16),  # Sq < Sk, ragged
    (64, 2, 4097, 777, 4, 4, torch.bfloat16),  # rows without keys
    (96, 1, 17, 1000, 8, 2, torch.bfloat16),  # fewer tiles than CTAs
], ids=["d128-b32-s512", "d128-sq-lt-sk", "d64-sq-gt-sk", "d96-one-tile"])
def test_gpu_prefetch_tile_matches_reference(monkeypatch, D, B, Sq, Sk, Hq, Hkv, dtype):
    """``FwdTile.prefetch_tile`` (the dynamic schedule's next tile claimed before the current one's loads; not a
    default yet): the planner patched to choose it for causal calls, NaN-poisoned outputs against the float64
    reference, every row; twice, so the second launch finds the counter reset by the first."""
    from cute_kernels.attention import forward_config
    from cute_kernels.common.fastpath import LauncherCache

    config = forward_config.fwd_config

    def with_prefetch(*args, **kwargs):
        cfg = config(*args, **kwargs)
        if not cfg.tile.dynamic:
            return cfg
        return dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, prefetch_tile=True))

    monkeypatch.setattr(forward_config, "fwd_config", with_prefetch)
    monkeypatch.setattr(FW, "_PLANS", {})
    monkeypatch.setattr(FW, "_launchers", LauncherCache())
    assert FW.plan(dtype, D, True).tile.prefetch_tile
    q, k, v = make_qkv(B, Sq, Sk, Hq, Hkv, D, dtype, device="cuda", seed=D + Sq + Sk)
    for _ in range(2):
        o, lse = run_poisoned(q, k, v, True)
        check_against_reference(o, lse, q, k, v, True, what=f"prefetch_tile D={D} {B}x{Sq}x{Sk}")
