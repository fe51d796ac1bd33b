"""``cute_kernels.sdpa``: torch's ``scaled_dot_product_attention`` on the kernels.

CPU: the routing table (:func:`route` on meta tensors, which count as tensors on a Hopper GPU); every
fallback reason runs torch's own function (the same result, bit for bit, or torch's own error) with
exactly one warning per reason however often it recurs; the mapping of torch's semantics onto the
kernels (layout transposes, GQA, top-left causal with Sq < Sk as bottom-right over the first Sq keys,
decode lengths) checked on CPU tensors against torch, with ``decode_attn``'s own CPU path and a
bottom-right torch stand-in for ``flash_attn``; shapes and counters on fake CUDA tensors.

GPU (``-m gpu``): sdpa against torch's SDPA in float32 (math backend) on prefill and decode shapes,
within 2x torch's own 16-bit error + 1e-4 per (batch, head), with the kernel counters showing which
kernel ran; fallbacks equal torch; torch.compile and CUDA-graph capture of decode steps.
"""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels
from cute_kernels.integrations import sdpa as S

BF16, F16 = torch.bfloat16, torch.float16
gpu = pytest.mark.gpu


def t(B, H, S_, D, dtype=BF16, device="meta"):
    """A (B, H, S, D) tensor; on meta nothing is allocated."""
    if device == "meta":
        return torch.empty(B, H, S_, D, dtype=dtype, device="meta")
    g = torch.Generator().manual_seed(B * 1000003 + H * 1009 + S_ * 31 + D)
    return torch.randn(B, H, S_, D, generator=g).to(dtype).to(device)


def bshd(B, H, S_, D, dtype=BF16):
    """(B, H, S, D) as a transposed view of a (B, S, H, D) buffer (the kernels' native layout)."""
    return torch.empty(B, S_, H, D, dtype=dtype, device="meta").transpose(1, 2)


# ------------------------------------------------------------------------------------------- routing
ROUTES = [
    # (what, q, k, kwargs, backend)
    ("prefill Sq == Sk causal", t(2, 8, 512, 128), t(2, 8, 512, 128), dict(is_causal=True), "flash_attn"),
    ("prefill Sq == Sk", t(2, 8, 512, 64), t(2, 8, 512, 64), {}, "flash_attn"),
    ("prefill Sq < Sk", t(2, 8, 100, 128), t(2, 8, 1000, 128), {}, "flash_attn"),
    ("prefill Sq > Sk", t(2, 8, 1000, 128), t(2, 8, 100, 128), {}, "flash_attn"),
    ("causal Sq < Sk: first Sq keys", t(2, 8, 100, 128), t(2, 8, 1000, 128), dict(is_causal=True), "flash_attn"),
    ("causal Sq 1 < Sk: first key", t(2, 8, 1, 128), t(2, 8, 1000, 128), dict(is_causal=True), "flash_attn"),
    ("causal Sq == Sk == 1", t(2, 8, 1, 128), t(2, 8, 1, 128), dict(is_causal=True), "flash_attn"),
    ("causal Sq > Sk", t(2, 8, 1000, 128), t(2, 8, 100, 128), dict(is_causal=True), "torch"),
    ("decode Sq 1", t(2, 8, 1, 128), t(2, 8, 1000, 128), {}, "decode_attn"),
    ("decode Sq 16", t(2, 8, 16, 64), t(2, 8, 17, 64), {}, "decode_attn"),
    ("Sq 17 is prefill", t(2, 8, 17, 128), t(2, 8, 1000, 128), {}, "flash_attn"),
    ("Sq 4 == Sk 4 is prefill", t(2, 8, 4, 128), t(2, 8, 4, 128), {}, "flash_attn"),
    ("Sq 4 > Sk 2 is prefill", t(2, 8, 4, 128), t(2, 8, 2, 128), {}, "flash_attn"),
    ("decode D 256", t(1, 4, 1, 256), t(1, 4, 1000, 256), {}, "decode_attn"),
    ("prefill D 256", t(1, 4, 100, 256), t(1, 4, 100, 256), {}, "flash_attn"),
    ("causal Sq 1 D 256 (flash)", t(1, 4, 1, 256), t(1, 4, 1000, 256), dict(is_causal=True), "flash_attn"),
    ("D 96", t(1, 4, 100, 96), t(1, 4, 100, 96), {}, "flash_attn"),
    ("D 80", t(1, 4, 100, 80), t(1, 4, 100, 80), {}, "torch"),
    ("GQA with enable_gqa", t(2, 32, 300, 128), t(2, 8, 300, 128), dict(enable_gqa=True, is_causal=True), "flash_attn"),
    ("MQA decode", t(2, 32, 1, 128), t(2, 1, 3000, 128), dict(enable_gqa=True), "decode_attn"),
    ("enable_gqa with Hq == Hkv", t(2, 8, 300, 128), t(2, 8, 300, 128), dict(enable_gqa=True), "flash_attn"),
    ("GQA without enable_gqa", t(2, 32, 300, 128), t(2, 8, 300, 128), {}, "torch"),
    ("Hq not a multiple of Hkv", t(2, 6, 300, 128), t(2, 4, 300, 128), dict(enable_gqa=True), "torch"),
    ("float32", t(2, 8, 64, 64, torch.float32), t(2, 8, 64, 64, torch.float32), {}, "torch"),
    ("float16", t(2, 8, 64, 64, F16), t(2, 8, 64, 64, F16), {}, "flash_attn"),
    ("scale 0.1", t(2, 8, 64, 64), t(2, 8, 64, 64), dict(scale=0.1), "flash_attn"),
    ("(B, S, H, D) views", bshd(2, 8, 64, 128), bshd(2, 8, 64, 128), {}, "flash_attn"),
    ("(B, S, H, D) views decode", bshd(2, 8, 3, 128), bshd(2, 8, 64, 128), {}, "decode_attn"),
]


@pytest.mark.parametrize("what,q,k,kw,backend", ROUTES, ids=[r[0] for r in ROUTES])
def test_route(what, q, k, kw, backend):
    kw = dict(kw)
    scale = kw.pop("scale", None)
    where, reason = S.route(q, k, k, None, 0.0, kw.get("is_causal", False), kw.get("enable_gqa", False), scale)
    assert where == backend, (what, where, reason)
    assert reason


def _strided(kind):
    q = t(2, 8, 64, 128)
    if kind == "head dim not contiguous":
        return torch.empty(2, 8, 128, 64, dtype=BF16, device="meta").transpose(-1, -2)
    if kind == "row stride not a multiple of 8":
        return torch.empty(2, 8, 64, 136, dtype=BF16, device="meta")[..., 3:131]  # meta: offset unseen
    if kind == "odd padding":
        return torch.empty(2, 8, 64, 129, dtype=BF16, device="meta")[..., :128]
    if kind == "broadcast batch":
        return torch.empty(1, 8, 64, 128, dtype=BF16, device="meta").expand(2, 8, 64, 128)
    return q


@pytest.mark.parametrize("kind", ["head dim not contiguous", "odd padding", "broadcast batch"])
def test_route_strides(kind):
    q = _strided(kind)
    assert S.route(q, t(2, 8, 64, 128), t(2, 8, 64, 128)) == ("torch", S.R_STRIDES)
    assert S.route(t(2, 8, 64, 128), q, q)[0] == "torch"


def test_route_strides_of_size_one_dims():
    """The kernels' checks read every stride, size-1 dims included: odd or zero ones fall back."""
    for strides in ((5, 128, 3, 1), (0, 128, 0, 1)):
        q = torch.empty(1, 1, 8, 128, dtype=BF16, device="meta").as_strided((1, 8, 1, 128), strides)
        assert S.route(q, t(1, 8, 100, 128), t(1, 8, 100, 128)) == ("torch", S.R_STRIDES)
    q = torch.empty(1, 1, 8, 128, dtype=BF16, device="meta").as_strided((1, 8, 1, 128), (8, 128, 16, 1))
    assert S.route(q, t(1, 8, 100, 128), t(1, 8, 100, 128))[0] == "decode_attn"


FALLBACKS = [  # (reason, q, k, v, kwargs) on meta tensors
    (S.R_MASK, t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64), dict(attn_mask=torch.empty(8, 8, dtype=torch.bool, device="meta"))),
    (S.R_DROPOUT, t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64), dict(dropout_p=0.1)),
    (S.R_RANK, torch.empty(2, 8, 64, device="meta"), torch.empty(2, 8, 64, device="meta"),
     torch.empty(2, 8, 64, device="meta"), {}),
    (S.R_DEVICE, t(1, 2, 8, 64, device="cpu"), t(1, 2, 8, 64, device="cpu"), t(1, 2, 8, 64, device="cpu"), {}),
    (S.R_DEVICE, t(1, 2, 8, 64), t(1, 2, 8, 64, device="cpu"), t(1, 2, 8, 64), {}),
    (S.R_DTYPE, t(1, 2, 8, 64), t(1, 2, 8, 64, F16), t(1, 2, 8, 64), {}),
    (S.R_SHAPE, t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 128), {}),
    (S.R_SHAPE, t(2, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64), {}),
    (S.R_GQA_FLAG, t(1, 4, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64), {}),
    (S.R_GQA_DIV, t(1, 6, 8, 64), t(1, 4, 8, 64), t(1, 4, 8, 64), dict(enable_gqa=True)),
    (S.R_EMPTY, t(1, 2, 8, 64), t(1, 2, 0, 64), t(1, 2, 0, 64), {}),
    (S.R_EMPTY, t(0, 2, 8, 64), t(0, 2, 8, 64), t(0, 2, 8, 64), {}),
    (S.R_CAUSAL, t(1, 2, 8, 64), t(1, 2, 4, 64), t(1, 2, 4, 64), dict(is_causal=True)),
    (S.R_SCALE, t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64), dict(scale=0.0)),
    (S.R_SCALE, t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64), dict(scale=-1.0)),
    (S.R_SCALE, t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64), dict(scale=math.inf)),
    (S.R_SCALE, t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64), dict(scale=math.nan)),
    (S.R_HEAD_DIM, t(1, 2, 8, 80), t(1, 2, 8, 80), t(1, 2, 8, 80), {}),
    (S.R_HEAD_DIM, t(1, 2, 1, 32), t(1, 2, 80, 32), t(1, 2, 80, 32), {}),
]


@pytest.mark.parametrize("reason,q,k,v,kw", FALLBACKS, ids=[f"{i}-{r[0][:30]}" for i, r in enumerate(FALLBACKS)])
def test_route_fallback_reasons(reason, q, k, v, kw):
    kw = dict(kw)
    args = (kw.pop("attn_mask", None), kw.pop("dropout_p", 0.0), kw.pop("is_causal", False),
            kw.pop("enable_gqa", False), kw.pop("scale", None))
    assert S.route(q, k, v, *args) == ("torch", reason)


def test_route_grad():
    """An input that requires grad runs on flash_attn (differentiable), also for decode-sized queries."""
    q = t(1, 2, 8, 64).requires_grad_()
    assert S.route(q, t(1, 2, 8, 64), t(1, 2, 8, 64))[0] == "flash_attn"
    q1 = t(1, 2, 1, 64).requires_grad_()
    assert S.route(q1, t(1, 2, 100, 64), t(1, 2, 100, 64))[0] == "flash_attn"
    with torch.no_grad():
        assert S.route(q1, t(1, 2, 100, 64), t(1, 2, 100, 64))[0] == "decode_attn"
    with torch.inference_mode():
        assert S.route(t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64))[0] == "flash_attn"


def test_route_reads_no_values():
    """attn_mask is never inspected: a meta mask (no values at all) routes without error."""
    m = torch.empty(8, 8, device="meta")
    assert S.route(t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64), m) == ("torch", S.R_MASK)


def test_is_hopper(monkeypatch):
    monkeypatch.setattr(S, "_HOPPER", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (8, 0))
    assert not S._is_hopper(torch.device("cuda", 0)) and not S._is_hopper(torch.device("cuda"))
    monkeypatch.setattr(S, "_HOPPER", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (9, 0))
    assert S._is_hopper(torch.device("cuda", 0))
    assert S._is_hopper(torch.device("meta"))


# ------------------------------------------------------------------- fallbacks through sdpa (CPU)
@pytest.fixture
def cpu_as_gpu(monkeypatch):
    """CPU tensors take the routing a GPU's would (fresh warning set and counters): the fallbacks then
    run torch on the CPU, and the kernel routes reach decode_attn's CPU path / a flash_attn stand-in."""
    monkeypatch.setattr(S, "_KERNEL_DEVICES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(S, "_WARNED", set())
    monkeypatch.setattr(S, "sdpa_stats", {"flash_attn": 0, "decode_attn": 0, "torch": 0})


def c(B, H, S_, D, dtype=BF16):
    return t(B, H, S_, D, dtype, device="cpu")


def misaligned(B, H, S_, D):
    """Rows of 16-byte multiples, data pointer 2 bytes past a 16-byte boundary."""
    return torch.randn(B * H * S_ * D + 1).to(BF16)[1:].view(B, H, S_, D)


def cpu_fallback_cases():
    yield S.R_MASK, (c(1, 2, 8, 64), c(1, 2, 8, 64), c(1, 2, 8, 64)), dict(attn_mask=torch.rand(8, 8) > 0.3)
    yield S.R_DROPOUT, (c(1, 2, 8, 64), c(1, 2, 8, 64), c(1, 2, 8, 64)), dict(dropout_p=0.25)
    yield S.R_RANK, (torch.randn(2, 8, 64), torch.randn(2, 8, 64), torch.randn(2, 8, 64)), {}
    yield S.R_DTYPE, (c(1, 2, 8, 64, torch.float32),) * 3, {}
    yield S.R_SHAPE, (c(1, 2, 8, 64), c(1, 2, 8, 64), c(1, 2, 8, 128)), {}
    yield S.R_GQA_FLAG, (c(1, 4, 8, 64), c(1, 2, 8, 64), c(1, 2, 8, 64)), {}
    yield S.R_GQA_DIV, (c(1, 6, 8, 64), c(1, 4, 8, 64), c(1, 4, 8, 64)), dict(enable_gqa=True)
    yield S.R_EMPTY, (c(1, 2, 8, 64), c(1, 2, 0, 64), c(1, 2, 0, 64)), {}
    yield S.R_CAUSAL, (c(1, 2, 8, 64), c(1, 2, 5, 64), c(1, 2, 5, 64)), dict(is_causal=True)
    yield S.R_SCALE, (c(1, 2, 8, 64),) * 3, dict(scale=-0.5)
    yield S.R_HEAD_DIM, (c(1, 2, 8, 80),) * 3, {}
    yield S.R_STRIDES, (misaligned(1, 2, 8, 64), c(1, 2, 8, 64), c(1, 2, 8, 64)), {}
    yield S.R_STRIDES, (c(1, 2, 64, 8).transpose(-1, -2), c(1, 2, 8, 64), c(1, 2, 8, 64)), {}  # head dim strided
    yield S.R_STRIDES, (c(1, 2, 8, 64).to_sparse(), c(1, 2, 8, 64), c(1, 2, 8, 64)), {}  # (a sparse one: strides 0)
    nested = torch.nested.nested_tensor([torch.randn(n, 2, 64) for n in (5, 8)], layout=torch.jagged).to(BF16)
    yield S.R_NESTED, (nested.transpose(1, 2),) * 3, {}  # (B, H, j, D): torch's own nested SDPA decides


def _run_both(args, kw):
    """sdpa and torch's function on the same arguments: (ours, theirs), or the exceptions raised."""
    res = []
    for fn in (S.sdpa, F.scaled_dot_product_attention):
        torch.manual_seed(7)  # dropout draws the same mask
        try:
            res.append(fn(*args, **kw))
        except Exception as e:  # torch's own error, raised by the fallback too
            res.append(e)
    return res


def test_every_fallback_is_torch_with_one_warning_per_reason(cpu_as_gpu):
    cases = list(cpu_fallback_cases())
    expected_reasons = set()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(3):
            for reason, args, kw in cases:
                where, why = S.route(*args, kw.get("attn_mask"), kw.get("dropout_p", 0.0), kw.get("is_causal", False),
                                     kw.get("enable_gqa", False), kw.get("scale"))
                assert (where, why) == ("torch", reason)
                expected_reasons.add(reason)
                ours, theirs = _run_both(args, kw)
                if isinstance(theirs, Exception):
                    assert type(ours) is type(theirs) and str(ours) == str(theirs), (reason, ours, theirs)
                elif ours.is_nested:  # (torch.equal takes no nested tensors: per sequence)
                    assert all(torch.equal(x, y) for x, y in zip(ours.unbind(), theirs.unbind(), strict=True)), reason
                else:
                    assert torch.equal(ours, theirs), reason
    msgs = [str(w.message) for w in rec if str(w.message).startswith("cute_kernels.sdpa:")]
    assert len(msgs) == len(expected_reasons) == len(set(msgs)), msgs
    assert {m.split(": ", 2)[2] for m in msgs} == expected_reasons
    assert S.sdpa_stats["flash_attn"] == S.sdpa_stats["decode_attn"] == 0


def test_cpu_tensors_run_torch(monkeypatch):
    monkeypatch.setattr(S, "_WARNED", set())
    q, k = c(2, 8, 16, 64), c(2, 2, 40, 64)
    with pytest.warns(UserWarning, match="not all on one CUDA device"):
        o = cute_kernels.sdpa(q, k, k, enable_gqa=True)
    assert torch.equal(o, F.scaled_dot_product_attention(q, k, k, enable_gqa=True))


def test_fallback_warning_names_the_reason_and_the_caller(cpu_as_gpu):
    q = c(1, 2, 8, 64)
    with pytest.warns(UserWarning, match="attn_mask is given") as rec:
        S.sdpa(q, q, q, torch.ones(8, 8, dtype=torch.bool))
    assert rec[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        S.sdpa(q, q, q, torch.ones(8, 8, dtype=torch.bool))  # the second time: silent


# ------------------------------------------------- the kernel routes' semantics, on the CPU
def flash_standin(q, k, v, *, causal=False, softmax_scale=None, deterministic=False):
    """flash_attn's contract in torch (float32): (B, S, H, D), GQA, bottom-right causal."""
    Sq, Hq, Sk = q.shape[1], q.shape[2], k.shape[1]
    G = Hq // k.shape[2]
    assert q.dtype in (BF16, F16) and softmax_scale is not None
    mask = torch.ones(Sq, Sk, dtype=torch.bool).tril(diagonal=Sk - Sq) if causal else None
    o = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float().repeat_interleave(G, 1),
                                       v.transpose(1, 2).float().repeat_interleave(G, 1), attn_mask=mask,
                                       scale=softmax_scale)
    return o.transpose(1, 2).contiguous().to(q.dtype)


SEMANTICS = [  # (B, Hq, Hkv, Sq, Sk, D, causal, backend)
    (2, 4, 4, 64, 64, 64, True, "flash_attn"),
    (2, 8, 2, 40, 40, 128, False, "flash_attn"),
    (1, 4, 2, 24, 100, 64, True, "flash_attn"),  # top-left causal, Sq < Sk
    (1, 4, 4, 1, 50, 64, True, "flash_attn"),
    (2, 8, 2, 1, 70, 128, False, "decode_attn"),
    (2, 4, 1, 4, 33, 256, False, "decode_attn"),
    (1, 4, 4, 30, 20, 64, False, "flash_attn"),
]


@pytest.mark.parametrize("B,Hq,Hkv,Sq,Sk,D,causal,backend", SEMANTICS)
def test_kernel_routes_compute_torch_semantics(cpu_as_gpu, monkeypatch, B, Hq, Hkv, Sq, Sk, D, causal, backend):
    """On CPU tensors: decode_attn runs its own CPU path (the kernel's contract in torch), flash_attn a
    stand-in with its contract; the result equals torch's SDPA (top-left causal) within fp32 rounding."""
    monkeypatch.setattr(S, "flash_attn", flash_standin)
    q, k, v = c(B, Hq, Sq, D), c(B, Hkv, Sk, D), c(B, Hkv, Sk, D) * 0.5
    o = S.sdpa(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv)
    assert S.sdpa_stats[backend] == 1 and S.sdpa_stats["torch"] == 0
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, enable_gqa=Hq != Hkv)
    assert o.shape == ref.shape and o.dtype == BF16
    torch.testing.assert_close(o.float(), ref, atol=2e-2, rtol=2e-2)


def test_causal_sq_lt_sk_reads_only_the_first_sq_keys(cpu_as_gpu, monkeypatch):
    seen = {}

    def spy(q, k, v, **kw):
        seen.update(k=k, v=v, **kw)
        return flash_standin(q, k, v, **kw)

    monkeypatch.setattr(S, "flash_attn", spy)
    q, k = c(1, 2, 5, 64), c(1, 2, 40, 64)
    S.sdpa(q, k, k, is_causal=True, scale=0.3)
    assert seen["k"].shape == (1, 5, 2, 64) and seen["causal"] is True and seen["softmax_scale"] == 0.3
    assert seen["k"].data_ptr() == k.data_ptr(), "a view, not a copy"
    assert seen["deterministic"] is False
    before = torch.are_deterministic_algorithms_enabled()
    try:  # torch's deterministic flag reaches flash_attn (its backward's mode)
        torch.use_deterministic_algorithms(True)
        S.sdpa(q, k, k, is_causal=True, scale=0.3)
        assert seen["deterministic"] is True
    finally:
        torch.use_deterministic_algorithms(before)


def test_decode_route_arguments(cpu_as_gpu, monkeypatch):
    seen = {}

    def spy(q, k, v, **kw):
        seen.update(q=q, k=k, **kw)
        return torch.zeros(q.shape, dtype=q.dtype)

    monkeypatch.setattr(S, "decode_attn", spy)
    q, k = c(3, 8, 2, 128), c(3, 2, 77, 128)
    o = S.sdpa(q, k, k, enable_gqa=True)
    assert seen["cache_seqlens"].tolist() == [77, 77, 77] and seen["cache_seqlens"].dtype == torch.int32
    assert seen["causal"] is False and seen["softmax_scale"] == 1 / math.sqrt(128)
    assert seen["q"].shape == (3, 2, 8, 128) and seen["q"].data_ptr() == q.data_ptr()  # (B, S, H, D) view
    assert o.shape == (3, 8, 2, 128)


def test_compiled_caller_compiles_once(cpu_as_gpu, monkeypatch):
    """sdpa_stats counts eager calls only: a count traced by dynamo would guard on the value it read, so
    a compiled caller of sdpa would recompile on every call (its own count, and any eager call's, changed
    it).  On CPU tensors: flash_attn's stand-in, decode_attn's CPU path and a fallback (attn_mask)."""
    monkeypatch.setattr(S, "flash_attn", flash_standin)
    q, k, kd = c(1, 4, 8, 64), c(1, 2, 8, 64), c(1, 2, 40, 64)
    mask = torch.ones(8, 8, dtype=torch.bool)
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    def f(q, k, kd, mask):
        return (cute_kernels.sdpa(q, k, k, is_causal=True, enable_gqa=True),
                cute_kernels.sdpa(q.narrow(2, 0, 1), kd, kd, enable_gqa=True),
                cute_kernels.sdpa(q, k, k, mask, enable_gqa=True))

    torch._dynamo.reset()
    try:
        cf = torch.compile(f, backend=backend, fullgraph=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the eager fallback's warning
            for _ in range(4):
                got, want = cf(q, k, kd, mask), f(q, k, kd, mask)  # an eager call between compiled ones
                assert all(torch.equal(a, b) for a, b in zip(got, want))
    finally:
        torch._dynamo.reset()
    assert len(compiles) == 1, f"compiled {len(compiles)} times"
    assert S.sdpa_stats == {"flash_attn": 4, "decode_attn": 4, "torch": 4}, "the eager calls, counted"


# ---------------------------------------------------------- fake CUDA tensors (shapes, counters)
def test_sdpa_on_fake_cuda_tensors(monkeypatch):
    monkeypatch.setattr(S, "sdpa_stats", {"flash_attn": 0, "decode_attn": 0, "torch": 0})
    with FakeTensorMode(allow_non_fake_inputs=False):
        q = torch.empty(2, 8, 300, 128, dtype=BF16, device="cuda")
        kv = torch.empty(2, 2, 300, 128, dtype=BF16, device="cuda")
        o = cute_kernels.sdpa(q, kv, kv, is_causal=True, enable_gqa=True)
        assert o.shape == q.shape and o.dtype == BF16 and o.device.type == "cuda"
        assert o.transpose(1, 2).is_contiguous(), "a (B, H, S, D) view of a contiguous (B, S, H, D) output"
        od = cute_kernels.sdpa(q.narrow(2, 0, 3), kv, kv, enable_gqa=True)
        assert od.shape == (2, 8, 3, 128)
    assert S.sdpa_stats == {"flash_attn": 1, "decode_attn": 1, "torch": 0}


def test_public_name():
    assert cute_kernels.sdpa is S.sdpa and "sdpa" in cute_kernels.__all__
    import inspect

    assert list(inspect.signature(S.sdpa).parameters) == [
        "query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]


# ------------------------------------------------------------------------------------------- GPU
def _torch16(q, k, v, causal, gqa):
    """torch's own 16-bit attention (math backend, 16-bit reductions allowed), as the forward tests."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    prev = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(prev)


def _ref32(q, k, v, causal, gqa):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, enable_gqa=gqa)


def _max_err(o, ref):  # per (batch, head)
    return (o.float() - ref).abs().amax(dim=(2, 3))


GPU_CASES = [  # (B, Hq, Hkv, Sq, Sk, D, causal, dtype, backend)
    (2, 8, 8, 1000, 1000, 128, True, BF16, "flash_attn"),
    (2, 8, 8, 1000, 1000, 128, False, BF16, "flash_attn"),
    (2, 16, 4, 513, 513, 64, True, BF16, "flash_attn"),
    (1, 32, 8, 777, 777, 128, False, F16, "flash_attn"),
    (2, 8, 2, 300, 1000, 64, False, BF16, "flash_attn"),
    (2, 8, 2, 100, 1000, 128, True, BF16, "flash_attn"),  # top-left causal, Sq < Sk
    (2, 32, 8, 1, 1000, 128, False, BF16, "decode_attn"),
    (2, 32, 8, 4, 1000, 128, False, BF16, "decode_attn"),
    (3, 8, 1, 4, 1000, 64, False, F16, "decode_attn"),
]


@gpu
@pytest.mark.parametrize("B,Hq,Hkv,Sq,Sk,D,causal,dtype,backend", GPU_CASES)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_gpu_sdpa_matches_torch(B, Hq, Hkv, Sq, Sk, D, causal, dtype, backend, layout):
    g = torch.Generator(device="cuda").manual_seed(B * 7 + Sq * 13 + Sk + D)

    def make(H, S_):
        if layout == "bhsd":
            return torch.randn(B, H, S_, D, generator=g, device="cuda").to(dtype)
        return torch.randn(B, S_, H, D, generator=g, device="cuda").to(dtype).transpose(1, 2)

    q, k, v = make(Hq, Sq), make(Hkv, Sk), make(Hkv, Sk)
    gqa = Hq != Hkv
    before = dict(S.sdpa_stats)
    o = cute_kernels.sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)
    torch.cuda.synchronize()
    assert S.sdpa_stats[backend] == before[backend] + 1, "the kernel did not run"
    assert S.sdpa_stats["torch"] == before["torch"]
    assert o.shape == (B, Hq, Sq, D) and o.dtype == dtype and torch.isfinite(o).all()
    ref = _ref32(q, k, v, causal, gqa)
    ours, theirs = _max_err(o, ref), _max_err(_torch16(q, k, v, causal, gqa), ref)
    bad = ours > 2 * theirs + 1e-4
    assert not bad.any(), f"max|O - ref| {ours[bad].tolist()[:4]} > 2 x torch's {theirs[bad].tolist()[:4]} + 1e-4"


@gpu
def test_gpu_fallbacks_equal_torch():
    q = torch.randn(2, 8, 64, 128, device="cuda", dtype=BF16)
    mask = torch.rand(64, 64, device="cuda") > 0.5
    before = S.sdpa_stats["torch"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(cute_kernels.sdpa(q, q, q, mask), F.scaled_dot_product_attention(q, q, q, mask))
        k = torch.randn(2, 8, 32, 128, device="cuda", dtype=BF16)
        assert torch.equal(cute_kernels.sdpa(q, k, k, is_causal=True),
                           F.scaled_dot_product_attention(q, k, k, is_causal=True))
    assert S.sdpa_stats["torch"] == before + 2


@gpu
def test_gpu_torch_compile():
    q = torch.randn(2, 8, 256, 128, device="cuda", dtype=BF16)
    k = torch.randn(2, 2, 256, 128, device="cuda", dtype=BF16)

    def f(q, k):
        return cute_kernels.sdpa(q, k, k, is_causal=True, enable_gqa=True), cute_kernels.sdpa(
            q.narrow(2, 255, 1), k, k, enable_gqa=True)

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k)
    torch._dynamo.reset()
    want = f(q, k)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@gpu
def test_gpu_cuda_graph_decode_step():
    """A decode step through sdpa (lengths filled on the device, no sync) captures and replays."""
    from conftest import capture_graph

    q = torch.randn(2, 32, 1, 128, device="cuda", dtype=BF16)
    k = torch.randn(2, 8, 2048, 128, device="cuda", dtype=BF16)
    out = torch.empty(2, 32, 1, 128, device="cuda", dtype=BF16)
    graph = capture_graph(lambda: out.copy_(cute_kernels.sdpa(q, k, k, enable_gqa=True)))
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, cute_kernels.sdpa(q, k, k, enable_gqa=True))
