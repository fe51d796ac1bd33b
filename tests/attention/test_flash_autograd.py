"""``flash_attn`` under autograd: inputs that require grad go through the functional custom op, whose
registered formula runs the backward kernels (``cute_kernels::flash_attn_backward``).

CPU (meta tensors: the ops' fake implementations, nothing launched): gradients reach q, k, v with
their shapes, through the output and through a returned LSE, also after a no-grad call cached a
launcher for the same metadata; softcapping and sinks reach the backward op (the sink only when it
requires grad, then it gets its gradient); calls the backward cannot take (``out=``, paged, packed,
windows with a side below -1) raise a ValueError naming the argument before any launch;
sliding windows reach the backward op with the forward's sides; so does
``decode_attn`` (no backward) with an input that requires grad.

GPU: gradients against a float32 autograd reference (per tensor and per row: at most 2x the error of
the same math in the input dtype plus an epsilon), with and without an LSE gradient, after a no-grad
call cached a launcher for the same metadata, with softcapping and a learnable sink (its gradient
too), with sliding windows (rows without keys among them); ``torch.compile(fullgraph=True)`` and CUDA-graph capture of a forward + backward step.
"""

import math

import pytest
import torch
from cute_kernels.attention import forward as FW
from cute_kernels.attention import forward_validate as FV
from cute_kernels.testing import count_launches

BF = torch.bfloat16
gpu = pytest.mark.gpu


@pytest.fixture
def meta_ok(monkeypatch):
    """Meta tensors pass the device check: the ops' fake implementations run (a CPU-only torch cannot run
    autograd on fake CUDA tensors)."""
    monkeypatch.setattr(FV, "_check_devices", lambda named: None)


@pytest.fixture
def backward_variants(monkeypatch):
    """The keyword arguments of every ``cute_kernels::flash_attn_backward`` call autograd makes (a list
    filled as they run; the real op still runs)."""
    from cute_kernels.attention import forward_autograd as FA

    seen, orig = [], FA._flash_attn_backward_op

    def spy(*args, **variant):
        seen.append(variant)
        return orig(*args, **variant)

    monkeypatch.setattr(FA, "_flash_attn_backward_op", spy)
    return seen


def meta_qkv(B=2, Sq=40, Sk=70, Hq=8, Hkv=2, D=128, grad=True):
    q = torch.empty(B, Sq, Hq, D, dtype=BF, device="meta", requires_grad=grad)
    k = torch.empty(B, Sk, Hkv, D, dtype=BF, device="meta", requires_grad=grad)
    v = torch.empty(B, Sk, Hkv, D, dtype=BF, device="meta", requires_grad=grad)
    return q, k, v


def test_gradients_reach_every_input(meta_ok):
    q, k, v = meta_qkv()
    with torch.no_grad():
        FW.flash_attn(q, k, v, causal=True)  # a launcher for this metadata would not serve a grad call
    out = FW.flash_attn(q, k, v, causal=True)
    assert out.grad_fn is not None
    out.float().sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    q2, k2, v2 = meta_qkv()
    o, lse = FW.flash_attn(q2, k2, v2, return_lse=True)
    assert lse.shape == (2, 8, 40) and o.shape == q2.shape
    dq, dk = torch.autograd.grad(lse.sum(), (q2, k2))  # through the LSE alone
    assert dq.shape == q2.shape and dk.shape == k2.shape
    q3, k3, v3 = meta_qkv()
    o3 = FW.flash_attn(q3.detach(), k3, v3.detach())  # one input requiring grad is enough
    (dk3,) = torch.autograd.grad(o3.float().sum(), (k3,))
    assert dk3.shape == k3.shape


def test_an_unused_lse_sends_no_gradient(meta_ok, monkeypatch):
    """The backward gets dlse=None unless the LSE was used (no zeros tensor read through the dLSE path)."""
    from cute_kernels.attention import forward_autograd as FA

    seen, orig = [], FA._flash_attn_backward_op

    def spy(dout, q, k, v, out, lse, dlse, causal, scale, **variant):
        seen.append(dlse is None)
        assert not variant  # no softcap, no sink: the plain op call
        return orig(dout, q, k, v, out, lse, dlse, causal, scale)

    monkeypatch.setattr(FA, "_flash_attn_backward_op", spy)
    q, k, v = meta_qkv()
    torch.autograd.grad(FW.flash_attn(q, k, v).float().sum(), (q,))
    o, lse = FW.flash_attn(q, k, v, return_lse=True)
    torch.autograd.grad(o.float().sum() + lse.sum(), (q,))
    assert seen == [True, False]


def meta_sink(Hq=8, grad=True):
    return torch.empty(Hq, dtype=torch.float32, device="meta", requires_grad=grad)


@pytest.mark.parametrize("softcap", [0.0, 20.0])
@pytest.mark.parametrize("sink_grad", [True, False, None], ids=["sink-grad", "sink", "no-sink"])
def test_softcap_and_sinks_reach_the_backward(meta_ok, backward_variants, softcap, sink_grad):
    """Softcapping and sinks are differentiable: the backward op gets the softcap, and the sink only
    when it requires grad (q, k, v's gradients do not read it), which then gets its (Hq,) gradient."""
    seen = backward_variants
    if not softcap and sink_grad is None:
        pytest.skip("the plain call: test_gradients_reach_every_input")
    q, k, v = meta_qkv()
    sink = None if sink_grad is None else meta_sink(grad=sink_grad)
    with count_launches() as n:
        o, lse = FW.flash_attn(q, k, v, causal=True, softcap=softcap, learnable_sink=sink, return_lse=True)
    assert n.total() == 0 and o.grad_fn is not None
    leaves = (q, k, v) + ((sink,) if sink_grad else ())
    grads = torch.autograd.grad(o.float().sum() + lse.sum(), leaves)
    assert [g.shape for g in grads] == [t.shape for t in leaves]
    want = ({"softcap": softcap} if softcap else {}) | ({"learnable_sink": sink} if sink_grad else {})
    assert len(seen) == 1 and seen[0].keys() == want.keys()
    assert all(seen[0][key] is want[key] or seen[0][key] == want[key] for key in want)
    if sink_grad:  # the sink alone requiring grad is enough
        q2, k2, v2 = meta_qkv(grad=False)
        o2 = FW.flash_attn(q2, k2, v2, softcap=softcap, learnable_sink=sink)
        (ds,) = torch.autograd.grad(o2.float().sum(), (sink,))
        assert ds.shape == (8,) and ds.dtype == torch.float32


@pytest.mark.parametrize("causal,window,sent", [
    (True, (16, 0), (16, 0)), (False, (7, 3), (7, 3)), (False, (None, 5), (-1, 5)), (True, (-1, -1), None),
])
def test_windows_reach_the_backward(meta_ok, backward_variants, causal, window, sent):
    """A sliding window is differentiable: the backward op gets the forward's sides (None as -1); a
    call without one sends none (the plain op call)."""
    seen = backward_variants
    q, k, v = meta_qkv()
    dq, dk, dv = torch.autograd.grad(FW.flash_attn(q, k, v, causal=causal, window_size=window).float().sum(), (q, k, v))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    want = {} if sent is None else dict(window_left=sent[0], window_right=sent[1])
    assert seen == [want]


def test_deterministic_reaches_the_backward(meta_ok, backward_variants):
    """``deterministic=True`` reaches the backward op (False sends nothing: the plain call); a value that
    is not a bool raises before any launch, with or without grad."""
    seen = backward_variants
    q, k, v = meta_qkv()
    for det in (True, False):
        torch.autograd.grad(FW.flash_attn(q, k, v, causal=True, deterministic=det).float().sum(), (q,))
    assert seen == [{"deterministic": True}, {}]
    for grad in (True, False):
        with count_launches() as n, pytest.raises(TypeError, match="deterministic"):
            FW.flash_attn(*meta_qkv(grad=grad), deterministic=1)
        assert n.total() == 0


def test_no_grad_and_detached_inputs_record_nothing(meta_ok):
    q, k, v = meta_qkv(grad=False)
    assert FW.flash_attn(q, k, v).grad_fn is None
    q, k, v = meta_qkv()
    with torch.no_grad():
        assert FW.flash_attn(q, k, v).grad_fn is None


@pytest.mark.parametrize("what,kw,match", [
    ("out", "out", "out= cannot be used when an input requires grad"),
    ("window", dict(window_size=(16, -4)), r"window_size \(16, -4\) has a side below -1"),
    ("paged", "paged", r"block_table \(paged K/V\) has no backward"),
])
def test_calls_without_a_backward_are_refused(meta_ok, what, kw, match):
    q, k, v = meta_qkv(D=128)
    args, extra = (q, k, v), {}
    if kw == "out":
        extra = dict(out=torch.empty(q.shape, dtype=BF, device="meta"))
    elif kw == "paged":
        pool = torch.empty(10, 16, 2, 128, dtype=BF, device="meta", requires_grad=True)
        args = (q, pool, pool)
        extra = dict(block_table=torch.empty(2, 5, dtype=torch.int32, device="meta"),
                     seqused_k=torch.empty(2, dtype=torch.int32, device="meta"))
    elif isinstance(kw, dict):
        extra = kw
    with count_launches() as n, pytest.raises(ValueError, match=match):
        FW.flash_attn(*args, **extra)
    assert n.total() == 0


def test_decode_attn_refuses_inputs_that_need_gradients():
    """decode_attn has no backward: a result without gradients would be silently wrong."""
    from cute_kernels.attention.decode import decode_attn

    q = torch.randn(1, 1, 4, 64).to(BF).requires_grad_(True)
    k = torch.randn(1, 32, 2, 64).to(BF)
    lens = torch.tensor([32], dtype=torch.int32)
    with count_launches() as n, pytest.raises(ValueError, match="decode_attn has no backward"):
        decode_attn(q, k, k, cache_seqlens=lens)
    assert n.total() == 0
    with torch.no_grad():
        assert decode_attn(q, k, k, cache_seqlens=lens).shape == q.shape  # (the CPU reference path)
    assert decode_attn(q.detach(), k, k, cache_seqlens=lens).shape == q.shape


def test_warmup_knows_the_backward():
    """``warmup`` compiles the backward's three kernels (main, pre-pass, post-pass) of a config, and the
    CLI's / users' spec types are checked like the forward's."""
    import cute_kernels
    from cute_kernels.attention import backward as BW
    from cute_kernels.common import jit

    with jit.dry_run() as dry:
        assert cute_kernels.warmup([("flash_attn_backward", dict(dtype="bfloat16", head_dim=64, causal=True))]) == 1
    assert [c for _, c in dry.seen] == list(BW.bwd_plan(torch.bfloat16, 64, True))
    with pytest.raises(TypeError, match="causal must be a bool"):
        cute_kernels.warmup([("flash_attn_backward", dict(causal="no"))])
    with pytest.raises(ValueError, match="head_dim must be one of"):
        cute_kernels.warmup([("flash_attn_backward", dict(head_dim=192))])
    assert cute_kernels.flash_attn_backward is BW.flash_attn_backward


# -------------------------------------------------------------------------------------------- GPU
def _reference_grads(q, k, v, dout, causal, dlse=None, softcap=0.0, sink=None, return_out=False, window=None):
    """float32 autograd of explicit attention (bottom-right causal, GQA by repeat; ``softcap``: scores
    ``softcap * tanh(s / softcap)`` before the mask; ``sink``: one more logit per head in the
    denominator, its gradient after v's; ``window``: (left, right), -1 unbounded, query q at position
    p = q + Sk - Sq sees keys p - left .. p + right), and the same math in the input dtype: (grads32,
    grads_dtype) (``return_out``: and the float32 output)."""
    def attn(q, k, v, sk, dt):
        G = q.shape[2] // k.shape[2]
        qt, kt, vt = (t.to(dt).transpose(1, 2) for t in (q, k, v))
        kt, vt = kt.repeat_interleave(G, 1), vt.repeat_interleave(G, 1)
        s = (qt @ kt.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        Sq, Sk = s.shape[-2:]
        if causal:
            s = s.masked_fill(~torch.ones(Sq, Sk, dtype=torch.bool, device=s.device).tril(Sk - Sq), float("-inf"))
        if window is not None:
            pos = torch.arange(Sq, device=s.device)[:, None] + Sk - Sq
            key = torch.arange(Sk, device=s.device)[None, :]
            seen = torch.ones(Sq, Sk, dtype=torch.bool, device=s.device)
            if window[0] >= 0:
                seen &= key >= pos - window[0]
            if window[1] >= 0:
                seen &= key <= pos + window[1]
            s = s.masked_fill(~seen, float("-inf"))
        full = s if sk is None else torch.cat([s, sk[None, :, None, None].expand(*s.shape[:-1], 1)], -1)
        lse = torch.logsumexp(full, -1)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0).to(dt)
        return (p @ vt).transpose(1, 2), lse

    res = []
    for dt in (torch.float32, q.dtype):
        qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        sk = None if sink is None else sink.detach().clone().requires_grad_(True)
        o, lse = attn(qq, kk, vv, sk, dt)
        loss = (o.float() * dout.float()).sum() + (0 if dlse is None else (lse.nan_to_num(0.0) * dlse).sum())
        res.append(torch.autograd.grad(loss, (qq, kk, vv) + (() if sk is None else (sk,))))
        if dt == torch.float32:
            o32 = o.detach()
    return res + [o32] if return_out else res


def _assert_grads(got, ref32, refdt, what):
    # the epsilon scales with the problem's gradients, not each tensor's own: a gradient that is exactly 0
    # (window (0, 0): one key per row, dS = P (dP - Delta) cancels) comes out as fp32 rounding of dP - Delta
    scale = max(r.float().abs().amax() for r in ref32[:3]).clamp_min(1e-3)
    for name, g, r, d in zip("qkv", got, ref32, refdt):
        g, r, d = g.float(), r.float(), d.float()
        assert torch.isfinite(g).all(), f"{what} d{name}: non-finite"
        tol = 2 * (d - r).abs().amax(dim=(-1, -2), keepdim=True) + 1e-3 * scale
        err = (g - r).abs().amax(dim=(-1, -2), keepdim=True)
        assert (err <= tol).all(), f"{what} d{name}: worst row error {err.max().item():.3g} > {tol.flatten()[err.flatten().argmax()].item():.3g}"


@gpu
@pytest.mark.parametrize("B,Sq,Sk,Hq,Hkv,D,causal", [
    (2, 128, 128, 8, 2, 128, True), (1, 17, 300, 4, 4, 64, False), (2, 1000, 777, 8, 1, 96, True),
    (1, 257, 129, 4, 2, 128, True),  # rows with no key (causal, Sq > Sk)
])
def test_autograd_matches_float32(B, Sq, Sk, Hq, Hkv, D, causal):
    g = torch.Generator(device="cuda").manual_seed(B * Sq + Sk)
    q = torch.randn(B, Sq, Hq, D, device="cuda", generator=g).to(BF).requires_grad_(True)
    k = torch.randn(B, Sk, Hkv, D, device="cuda", generator=g).to(BF).requires_grad_(True)
    v = torch.randn(B, Sk, Hkv, D, device="cuda", generator=g).to(BF).requires_grad_(True)
    dout = torch.randn(B, Sq, Hq, D, device="cuda", generator=g).to(BF)
    dlse = torch.randn(B, Hq, Sq, device="cuda", generator=g)
    with torch.no_grad():
        FW.flash_attn(q, k, v, causal=causal)  # a launcher for this metadata: the grad call must not use it
    with count_launches() as n:
        o, lse = FW.flash_attn(q, k, v, causal=causal, return_lse=True)
    assert n["flash_attn"] == 1 and o.grad_fn is not None
    got = torch.autograd.grad((o.float() * dout.float()).sum(), (q, k, v), retain_graph=True)
    _assert_grads(got, *_reference_grads(q, k, v, dout, causal), f"{(B, Sq, Sk, Hq, Hkv, D, causal)}")
    got = torch.autograd.grad((o.float() * dout.float()).sum() + (lse.nan_to_num(0.0) * dlse).sum(), (q, k, v))
    _assert_grads(got, *_reference_grads(q, k, v, dout, causal, dlse), "with dlse")


@gpu
@pytest.mark.parametrize("B,Sq,Sk,Hq,Hkv,D,causal,softcap,with_sink", [
    (2, 128, 128, 8, 2, 128, True, 30.0, True), (1, 17, 300, 4, 4, 64, False, 2.0, False),
    (2, 1000, 777, 8, 1, 96, True, 0.0, True),
    (1, 257, 129, 4, 2, 128, True, 5.0, True),  # rows with no key (causal, Sq > Sk): lse = sink there
])
def test_autograd_softcap_and_sinks_match_float32(B, Sq, Sk, Hq, Hkv, D, causal, softcap, with_sink):
    """torch.autograd through ``flash_attn(..., softcap=, learnable_sink=)``: q, k, v and the sink's
    gradients, with and without an LSE gradient; the sink's per head within 2x the input dtype's error
    (+ 1e-3 of its largest)."""
    g = torch.Generator(device="cuda").manual_seed(B * Sq + Sk + 1)
    q = torch.randn(B, Sq, Hq, D, device="cuda", generator=g).to(BF).requires_grad_(True)
    k = torch.randn(B, Sk, Hkv, D, device="cuda", generator=g).to(BF).requires_grad_(True)
    v = torch.randn(B, Sk, Hkv, D, device="cuda", generator=g).to(BF).requires_grad_(True)
    sink = None
    if with_sink:
        sink = (math.log(Sk) + 2 * torch.randn(Hq, device="cuda", generator=g)).requires_grad_(True)
    dout = torch.randn(B, Sq, Hq, D, device="cuda", generator=g).to(BF)
    dlse = torch.randn(B, Hq, Sq, device="cuda", generator=g)
    o, lse = FW.flash_attn(q, k, v, causal=causal, return_lse=True, softcap=softcap, learnable_sink=sink)
    leaves = (q, k, v) + ((sink,) if with_sink else ())
    what = f"{(B, Sq, Sk, Hq, Hkv, D, causal, softcap, with_sink)}"
    for dl in (None, dlse):
        loss = (o.float() * dout.float()).sum() + (0 if dl is None else (lse.nan_to_num(0.0) * dl).sum())
        got = torch.autograd.grad(loss, leaves, retain_graph=True)
        ref32, refdt, o32 = _reference_grads(q, k, v, dout, causal, dl, softcap, sink, return_out=True)
        _assert_grads(got[:3], ref32[:3], refdt[:3], what + (" with dlse" if dl is not None else ""))
        if with_sink:
            gs, rs, ds = got[3], ref32[3], refdt[3].float()
            assert gs.shape == (Hq,) and torch.isfinite(gs).all()
            # the kernel's Delta reads its rounded out: d sink moves by -sum exp(sink - lse) dDelta
            d_delta = torch.einsum("bqhd,bqhd->bhq", dout.float(), o.detach().float() - o32.float())
            slack = (torch.exp(sink.detach()[None, :, None] - lse.detach()) * d_delta).sum((0, 2)).abs()
            tol = 2 * (ds - rs).abs() + slack + 1e-3 * rs.abs().max().clamp_min(1e-3)
            assert ((gs - rs).abs() <= tol).all(), f"{what} dsink: {gs} vs {rs}"


@gpu
@pytest.mark.parametrize("B,Sq,Sk,Hq,Hkv,D,causal,window", [
    (2, 300, 300, 8, 2, 128, True, (64, 0)), (1, 200, 333, 4, 4, 64, False, (50, 20)),
    (1, 129, 129, 4, 1, 96, True, (0, 0)), (1, 1000, 1000, 4, 4, 128, False, (-1, 100)),
    (1, 300, 100, 4, 2, 64, True, (20, 0)),  # Sq > Sk: rows with no key
])
def test_autograd_windows_match_float32(B, Sq, Sk, Hq, Hkv, D, causal, window):
    """torch.autograd through ``flash_attn(..., window_size=)`` (the sliding-window layers' training
    step): q, k, v's gradients against the float32 reference with the same window, with and without an
    LSE gradient."""
    g = torch.Generator(device="cuda").manual_seed(B * Sq + Sk + 2)
    q = torch.randn(B, Sq, Hq, D, device="cuda", generator=g).to(BF).requires_grad_(True)
    k = torch.randn(B, Sk, Hkv, D, device="cuda", generator=g).to(BF).requires_grad_(True)
    v = torch.randn(B, Sk, Hkv, D, device="cuda", generator=g).to(BF).requires_grad_(True)
    dout = torch.randn(B, Sq, Hq, D, device="cuda", generator=g).to(BF)
    dlse = torch.randn(B, Hq, Sq, device="cuda", generator=g)
    with count_launches() as n:
        o, lse = FW.flash_attn(q, k, v, causal=causal, window_size=window, return_lse=True)
    assert n["flash_attn"] == 1 and o.grad_fn is not None
    what = f"{(B, Sq, Sk, Hq, Hkv, D, causal, window)}"
    for dl in (None, dlse):
        loss = (o.float() * dout.float()).sum() + (0 if dl is None else (lse.nan_to_num(0.0) * dl).sum())
        got = torch.autograd.grad(loss, (q, k, v), retain_graph=True)
        _assert_grads(got, *_reference_grads(q, k, v, dout, causal, dl, window=window),
                      what + (" with dlse" if dl is not None else ""))


@gpu
def test_sink_without_grad_gets_none():
    """A sink that does not require grad: q, k, v get theirs, the sink none (and no sink gradient is
    computed)."""
    q, k, v = (torch.randn(1, 64, 4, 64, device="cuda").to(BF).requires_grad_(True) for _ in range(3))
    sink = torch.zeros(4, device="cuda")
    FW.flash_attn(q, k, v, learnable_sink=sink, softcap=10.0).float().sum().backward()
    assert sink.grad is None and torch.isfinite(q.grad.float()).all() and q.grad.abs().sum() > 0


@gpu
def test_compile_and_cuda_graph_of_a_training_step():
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(2, 256, 8 if i == 0 else 2, 128, device="cuda", generator=g).to(BF).requires_grad_(True)
               for i in range(3))

    def step(q, k, v):
        o = FW.flash_attn(q, k, v, causal=True)
        return torch.autograd.grad(o.float().square().sum(), (q, k, v))

    def loss(q, k, v):  # compiled whole (AOTAutograd traces the backward); autograd.grad stays outside
        return FW.flash_attn(q, k, v, causal=True).float().square().sum()

    ref = step(q, k, v)
    torch._dynamo.reset()
    try:
        got = torch.autograd.grad(torch.compile(loss, fullgraph=True)(q, k, v), (q, k, v))
    finally:
        torch._dynamo.reset()
    for a, b in zip(got, ref):
        same_up_to_reduction_order(a, b)
    graph_replay_matches_eager(step, (q, k, v))


def graph_replay_matches_eager(step, leaves):
    """``step(*leaves)`` (a forward + backward returning gradients) captured in a CUDA graph after a
    warm-up on a side stream, replayed on new inputs (``leaves * 0.5`` copied into the captured ones):
    its gradients as the eager step's on those inputs, up to the reduction order."""
    static = [t.detach().clone().requires_grad_(True) for t in leaves]
    step(*static)  # warm-up outside the capture (compiles, allocator)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(*static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(*static)
    with torch.no_grad():
        for s, t in zip(static, leaves):
            s.copy_(t * 0.5)
    graph.replay()
    torch.cuda.synchronize()
    want = step(*(t.detach().mul(0.5).requires_grad_(True) for t in leaves))
    for a, b in zip(out, want):
        same_up_to_reduction_order(a, b)


def same_up_to_reduction_order(a, b):
    """The same kernels on the same inputs: equal but for the order of the fp32 reduce-adds (dQ over KV
    tiles, dK / dV over a KV head's query heads), which the default mode does not fix: at most 2 bf16
    ulps apart, elementwise."""
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    tol = 2 * 2.0 ** -7 * torch.maximum(a.float().abs(), b.float().abs()) + 1e-6
    assert ((a.float() - b.float()).abs() <= tol).all(), (a.float() - b.float()).abs().max()
