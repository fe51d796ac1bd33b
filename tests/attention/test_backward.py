"""flash_attn_backward (FlashAttention backward, part 1) GPU tests.

Every gradient against a float32 autograd reference of masked attention (explicit math), per tensor
and per row (the D values of one (batch, position, head)): ``max|g - ref| <= 2 * max|g_torch - ref| +
eps`` with ``g_torch`` the same math computed by torch in the input dtype (autograd in fp16 / bf16) and
``eps`` one machine epsilon of the row's largest reference value (plus 1e-5, plus the effect of
``out``'s rounding on FlashAttention's ``Delta = rowsum(dO * out)``: :func:`out_rounding_effect`);
fresh random inputs; outputs poisoned with NaN before the launch; lengths 1/17/128/1000/4097 with
Sq != Sk, GQA 1/4/8, D 64/96/128/256, fp16/bf16, causal (bottom-right) and not; rows that see no key
(causal, Sq > Sk: zero dq rows, no NaN); sliding windows; the deterministic mode (the same bits over
repeated calls); strided
views of NaN-filled buffers; the LSE gradient; the real forward's out / lse; validation errors
naming their argument.  Softcapping and attention sinks: the same rule against the reference with
``softcap * tanh(s / softcap)`` scores and the sink logit in the denominator (the sink's gradient too,
per head).  CPU tests (tile walk, emulation, compiles) are in ``test_backward_compile.py``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from cute_kernels.attention import backward as BW
from layouts import attention_backward as LB

gpu = pytest.mark.gpu
DTYPES = (torch.bfloat16, torch.float16)
NAN = float("nan")
MASKED = -30000.0  # a masked score (finite, so that no NaN enters autograd; exp underflows to 0)
#: (Sq, Sk) pairs: every length of 1/17/128/1000/4097, Sq != Sk, both Sq < Sk and Sq > Sk
LENGTHS = [(1, 17), (17, 128), (128, 1000), (1000, 17), (1000, 4097), (4097, 1000)]
GROUPS = (1, 4, 8)
HQ = 8
MAX_ERRORS: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _precompile():
    """Every configuration compiled in parallel processes first (later calls load them)."""
    if not torch.cuda.is_available():
        yield
        return
    plans = [BW.bwd_plan(dt, d, c, dl) for dt in DTYPES for d in LB.BWD_HEAD_DIMS for c in (False, True)
             for dl in (False, True)]
    plans += [BW.bwd_plan(torch.bfloat16, d, False, False, True) for d in LB.BWD_HEAD_DIMS]
    plans += [BW.bwd_plan(dt, d, c, dl, False, g, True) for dt in DTYPES for d in LB.BWD_HEAD_DIMS
              for c in (False, True) for dl in (False, True) for g in (False, True)
              if dt == torch.bfloat16 or not dl]  # softcapping (fp16: no LSE-gradient case)
    errors = BW.precompile(plans)
    assert not errors, errors
    yield
    for key, (err, base) in sorted(MAX_ERRORS.items()):
        print(f"max error {key}: {err:.3e} (torch in dtype: {base:.3e})")


def reference(q, k, v, dout, causal, scale, dtype, dlse=None, return_p=False, window=None, softcap=0.0, sink=None):
    """``(out, lse, dq, dk, dv)`` of masked attention computed by torch in ``dtype`` with autograd:
    bottom-right causal, GQA by repeat_interleave (its backward sums the groups), rows that see no key
    give out = 0, lse = -inf and zero gradients (``return_p``: the probabilities (B, Hq, Sq, Sk) too,
    times ``1 - tanh^2`` of the capped scores with ``softcap``: the factor of ``dP - Delta`` in the
    scores' gradient; ``window``: (left, right) sides, -1 unbounded, instead of causal).  ``softcap``:
    scores ``softcap * tanh(s / softcap)`` before the mask; ``sink`` ((Hq,) fp32): one more logit in
    every row's denominator (a row without keys: out = 0, lse = sink), its gradient ((Hq,)) last."""
    G = q.shape[2] // k.shape[2]
    qd, kd, vd = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    sd = None if sink is None else sink.detach().to(dtype).requires_grad_()
    kk, vv = kd.repeat_interleave(G, 2), vd.repeat_interleave(G, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kk) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
        t = s.detach() / softcap
    Sq, Sk = q.shape[1], k.shape[1]
    has_key = torch.ones(Sq, dtype=torch.bool, device=q.device)
    if causal or window is not None:
        left, right = window if window is not None else (-1, 0)
        key = torch.arange(Sk, device=q.device)[None, :]
        pos = torch.arange(Sq, device=q.device)[:, None] + Sk - Sq
        vis = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
        if left >= 0:
            vis = vis & (key >= pos - left)
        if right >= 0:
            vis = vis & (key <= pos + right)
        s = s.masked_fill(~vis, MASKED)
        has_key = vis.any(-1)
    if sd is None:
        lse = torch.logsumexp(s, -1)
    else:  # a row without keys: its masked scores underflow, lse = sink
        lse = torch.logsumexp(torch.cat([s, sd[None, :, None, None].expand(*s.shape[:-1], 1)], -1), -1)
    p = torch.exp(s - lse[..., None]) * has_key[:, None].to(dtype)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    outs, grads = [o], [dout.to(dtype)]
    if dlse is not None:
        outs.append(lse)
        grads.append((dlse if sd is not None else dlse * has_key).to(dtype))
    leaves = (qd, kd, vd) if sd is None else (qd, kd, vd, sd)
    dq, dk, dv, *dsink = torch.autograd.grad(outs, leaves, grads)
    lse_out = lse.float() if sd is not None else torch.where(has_key, lse.float(), torch.full_like(lse.float(), -math.inf))
    res = (o.detach(), lse_out.detach(), dq, dk, dv)
    if return_p:
        res += ((p * (1 - t * t)).detach() if softcap else p.detach(),)
    return res + tuple(dsink)


def out_rounding_effect(p, q, k, dout, out, o32, scale):
    """Per-row ``(|effect on dq|, |effect on dk|)`` of the kernel's ``out`` not being the exact output:
    ``Delta = rowsum(dO * out)`` (FlashAttention's pre-pass) differs from the exact one by ``dDelta``,
    which moves ``dS = P (dP - Delta)`` by ``-P dDelta``: dq by ``-scale dDelta P K``, dk by
    ``-scale (P dDelta)^T Q`` (summed over the query heads of a KV head).  Largest where a row sees
    few keys (the differences dP - Delta cancel); autograd in any dtype never sees it."""
    G = q.shape[2] // k.shape[2]
    d_delta = torch.einsum("bqhd,bqhd->bhq", dout.float(), out.float() - o32.float())
    pw = p.float() * d_delta[..., None]
    dq_eff = scale * torch.einsum("bhqk,bkhd->bqhd", pw, k.float().repeat_interleave(G, 2))
    dk_eff = scale * torch.einsum("bhqk,bqhd->bkhd", pw, q.float())
    dk_eff = dk_eff.unflatten(2, (k.shape[2], G)).sum(3)
    return dq_eff.abs().amax(-1), dk_eff.abs().amax(-1)


def grad_problem(name, got, ref, ref_torch, key=None, slack=None):
    """Per row and per tensor: error <= 2 x torch's in-dtype error + one epsilon of the row's max
    (+ ``slack`` per row: :func:`out_rounding_effect`).  Returns what is wrong (None when nothing is)."""
    if torch.isnan(got).any():
        return f"{name}: {int(torch.isnan(got).any(-1).sum())} rows with NaN"
    err = (got.float() - ref.float()).abs().amax(-1)
    base = (ref_torch.float() - ref.float()).abs().amax(-1)
    eps = torch.finfo(got.dtype).eps * ref.float().abs().amax(-1) + 1e-5
    if slack is not None:
        eps = eps + slack
    bad = err > 2 * base + eps
    if key is not None:
        prev = MAX_ERRORS.get(key, (0.0, 0.0))
        MAX_ERRORS[key] = (max(prev[0], float(err.max())), max(prev[1], float(base.max())))
    if bad.any():
        first = [int(x) for x in bad.nonzero()[0]]
        return (f"{name}: {int(bad.sum())} of {bad.numel()} rows out of bound (first {first}); worst "
                f"{float((err - 2 * base - eps).max()):.3e} over; max err {float(err.max()):.3e}, "
                f"torch {float(base.max()):.3e}")
    return None


def check_grads(triples, key=None, slack=(None, None, None)):
    """Every gradient checked, all problems reported together."""
    problems = [grad_problem(name, got, ref, ref16, key, sl) for (name, got, ref, ref16), sl in zip(triples, slack)]
    problems = [p for p in problems if p]
    assert not problems, "; ".join(problems)


def run_case(dtype, D, causal, B, Sq, Sk, Hq, Hkv, dlse_on=False, seed=0, window=None, softcap=0.0, sink=False,
             deterministic=False, repeats=0):
    """One backward call against :func:`reference` (``softcap``: its value, 0 off; ``sink``: random sink
    logits around log(Sk), so that the sink takes a real share of the rows, whose gradient is checked
    per head as well).  ``deterministic``: that mode, and ``repeats`` more calls on the same inputs must
    give the same bits (dq, dk, dv, dsink)."""
    torch.manual_seed(seed)
    dev = "cuda"
    q = torch.randn(B, Sq, Hq, D, device=dev, dtype=dtype)
    k = torch.randn(B, Sk, Hkv, D, device=dev, dtype=dtype)
    v = torch.randn(B, Sk, Hkv, D, device=dev, dtype=dtype)
    dout = torch.randn(B, Sq, Hq, D, device=dev, dtype=dtype)
    dlse = torch.randn(B, Hq, Sq, device=dev, dtype=torch.float32) if dlse_on else None
    sk = math.log(max(Sk, 1)) + 2 * torch.randn(Hq, device=dev, dtype=torch.float32) if sink else None
    scale = D ** -0.5
    variant = dict(softcap=softcap, sink=sk)
    o32, lse32, dq32, dk32, dv32, p32, *ds32 = reference(q, k, v, dout, causal, scale, torch.float32, dlse, True,
                                                         window, **variant)
    _, _, dq16, dk16, dv16, *ds16 = reference(q, k, v, dout, causal, scale, dtype, dlse, window=window, **variant)
    out = o32.to(dtype)
    dq = torch.full_like(q, NAN)
    dk = torch.full_like(k, NAN)
    dv = torch.full_like(v, NAN)
    res = BW.flash_attn_backward(dout, q, k, v, out, lse32, causal=causal, dq=dq, dk=dk, dv=dv, dlse=dlse,
                                 window_size=window, softcap=softcap, learnable_sink=sk, deterministic=deterministic)
    assert len(res) == (4 if sink else 3)
    assert res[0] is dq and res[1] is dk and res[2] is dv
    torch.cuda.synchronize()
    key = (f"{str(dtype)[6:]} D={D} {'causal' if causal else 'full'}{'' if window is None else ' window'}"
           f"{' softcap' if softcap else ''}{' sink' if sink else ''}")
    slack_q, slack_k = out_rounding_effect(p32, q, k, dout, out, o32, scale)
    triples, slack = [("dq", dq, dq32, dq16), ("dk", dk, dk32, dk16), ("dv", dv, dv32, dv16)], [slack_q, slack_k, None]
    if sink:  # per head (a row each); out's rounding moves Delta, d sink by -sum exp(sink - lse) dDelta
        dsink = res[3]
        assert dsink.shape == (Hq,) and dsink.dtype == torch.float32
        d_delta = torch.einsum("bqhd,bqhd->bhq", dout.float(), out.float() - o32.float())
        slack_s = (torch.exp(sk[None, :, None] - lse32) * d_delta).sum((0, 2)).abs()
        triples.append(("dsink", dsink[:, None], ds32[0][:, None], ds16[0][:, None]))
        slack.append(slack_s)
    check_grads(triples, key, slack)
    if causal and Sq > Sk:  # rows that see no key: exactly zero
        assert (dq[:, : Sq - Sk] == 0).all()
    empty = ~torch.isfinite(lse32).any(0).any(0)
    assert (dq[:, empty] == 0).all()
    for r in range(repeats):
        again = BW.flash_attn_backward(dout, q, k, v, out, lse32, causal=causal, dlse=dlse, window_size=window,
                                       softcap=softcap, learnable_sink=sk, deterministic=deterministic)
        for name, a, b in zip(("dq", "dk", "dv", "dsink"), again, res):
            assert torch.equal(a, b), f"{key}: {name} of call {r + 2} differs from the first's bits"
    return res


@gpu
@pytest.mark.parametrize("dtype,D,causal,B,Sq,Sk,Hq,Hkv,kw", [
    (torch.bfloat16, 128, True, 2, 1000, 1000, 8, 2, {}),  # GQA (fp32 dK / dV adds), ragged tiles
    (torch.float16, 64, False, 1, 4097, 1000, 8, 8, {}),  # dK / dV stored, Sq > Sk
    (torch.bfloat16, 96, True, 1, 17, 1000, 4, 4, {}),  # a single query tile: the carried stage at the end
    (torch.bfloat16, 128, False, 1, 1000, 1000, 4, 4, dict(window=(100, 50))),  # the window's three loops
    (torch.bfloat16, 64, True, 1, 777, 777, 4, 2, dict(softcap=30.0, sink=True)),
    (torch.bfloat16, 128, False, 1, 1000, 1000, 8, 2, dict(deterministic=True, repeats=2)),
], ids=["gqa-d128-causal", "d64-sq-gt-sk", "d96-one-tile", "window-d128", "softcap-sink-d64", "deterministic-d128"])
def test_dk_carry_matches_reference(monkeypatch, dtype, D, causal, B, Sq, Sk, Hq, Hkv, kw):
    """``BwdTile.dk_carry`` (dK from shared memory, running on into the next query tile; not the default
    yet): the planner patched to choose it, the same checks as the default tile's."""
    from cute_kernels.attention import backward_config as bk  # (the planner reads bwd_config there)

    config = bk.bwd_config

    def carried(*args, **kwargs):
        cfg = config(*args, **kwargs)
        return dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, dk_carry=True))

    monkeypatch.setattr(bk, "bwd_config", carried)
    monkeypatch.setattr(BW, "_PLANS", {})
    assert BW.bwd_plan(dtype, D, causal)[0].tile.dk_carry
    run_case(dtype, D, causal, B, Sq, Sk, Hq, Hkv, **kw)


#: the step's candidate orders (``BwdTile`` fields, not the default yet), each GPU-tested like the default
STEP_VARIANTS = {"dv_early": dict(dv_early=True), "qdo_rings": dict(qdo_rings=True),
                 "both": dict(dv_early=True, qdo_rings=True),
                 "tm64_dv_early": dict(tile_m=64, dq_split_m=False, dv_early=True)}  # (D 64's 64-row tile)


@gpu
@pytest.mark.parametrize("variant", list(STEP_VARIANTS))
@pytest.mark.parametrize("dtype,D,causal,B,Sq,Sk,Hq,Hkv,kw", [
    (torch.bfloat16, 128, True, 2, 1000, 1000, 8, 2, {}),  # GQA (fp32 dK / dV adds), ragged tiles
    (torch.float16, 96, False, 1, 4097, 1000, 4, 4, {}),  # dK / dV stored, Sq > Sk
    (torch.bfloat16, 64, True, 1, 17, 1000, 4, 4, {}),  # D 64's 128-row tile, a single query tile
    (torch.bfloat16, 128, False, 1, 1000, 1000, 4, 4, dict(window=(100, 50))),  # the window's three loops
    (torch.bfloat16, 96, True, 1, 777, 777, 4, 2, dict(softcap=30.0, sink=True)),
    (torch.bfloat16, 128, False, 1, 1000, 1000, 8, 2, dict(deterministic=True, repeats=2)),
], ids=["gqa-d128-causal", "d96-sq-gt-sk", "d64-one-tile", "window-d128", "softcap-sink-d96", "deterministic-d128"])
def test_step_variants_match_reference(monkeypatch, variant, dtype, D, causal, B, Sq, Sk, Hq, Hkv, kw):
    """``BwdTile.dv_early`` (dV += P^T dO issued before the dP^T wait) and ``BwdTile.qdo_rings`` (Q and dO in
    rings of their own, waited for and handed back apart), alone and together: the planner patched to
    choose them, the same checks as the default tile's.  (``dv_early`` with ``dk_carry``: below.)"""
    from cute_kernels.attention import backward_config as bk  # (the planner reads bwd_config there)

    config, fields = bk.bwd_config, STEP_VARIANTS[variant]

    def patched(*args, **kwargs):
        cfg = config(*args, **kwargs)
        return dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, **fields))

    monkeypatch.setattr(bk, "bwd_config", patched)
    monkeypatch.setattr(BW, "_PLANS", {})
    tile = BW.bwd_plan(dtype, D, causal)[0].tile
    assert all(getattr(tile, f) == v for f, v in fields.items())
    run_case(dtype, D, causal, B, Sq, Sk, Hq, Hkv, **kw)


@gpu
def test_dv_early_with_dk_carry_matches_reference(monkeypatch):
    """``dv_early`` with ``dk_carry`` (dK running on into the next query tile): a single query tile, where
    the carried stage is handed back at the end."""
    from cute_kernels.attention import backward_config as bk

    config = bk.bwd_config

    def patched(*args, **kwargs):
        cfg = config(*args, **kwargs)
        return dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, dv_early=True, dk_carry=True))

    monkeypatch.setattr(bk, "bwd_config", patched)
    monkeypatch.setattr(BW, "_PLANS", {})
    run_case(torch.bfloat16, 128, True, 1, 17, 1000, 4, 4)
    run_case(torch.bfloat16, 128, False, 1, 1000, 1000, 8, 2)


def kv_reduce_planner(monkeypatch):
    """The planner patched to take ``FlashBwdConfig.kv_reduce`` (not the default yet) where it applies."""
    from cute_kernels.attention import backward_config as bk

    config = bk.bwd_config

    def patched(*args, **kwargs):
        cfg = config(*args, **kwargs)
        return dataclasses.replace(cfg, kv_reduce=True) if cfg.kv_reduce_applies else cfg

    monkeypatch.setattr(bk, "bwd_config", patched)
    monkeypatch.setattr(BW, "_PLANS", {})


@gpu
@pytest.mark.parametrize("dtype,D,causal,B,Sq,Sk,Hq,Hkv,kw", [
    (torch.bfloat16, 128, True, 2, 1000, 1000, 8, 2, {}),  # ragged last KV tile (rows past Sk clipped)
    (torch.float16, 96, False, 1, 333, 1000, 6, 2, {}),  # Sq < Sk
    (torch.bfloat16, 64, True, 3, 17, 129, 8, 1, {}),  # MQA, D 64's 128-row tile, one key past a tile
    (torch.bfloat16, 128, False, 1, 1000, 1000, 4, 2, dict(window=(100, 50), softcap=30.0, sink=True)),
], ids=["d128-causal", "d96-sq-lt-sk", "d64-mqa", "window-softcap-sink-d128"])
def test_kv_reduce_matches_reference(monkeypatch, dtype, D, causal, B, Sq, Sk, Hq, Hkv, kw):
    """``FlashBwdConfig.kv_reduce`` (GQA's dK / dV staged in the K / V buffers and added by TMA reduce-adds):
    the same checks as the atomic adds'."""
    kv_reduce_planner(monkeypatch)
    assert BW.bwd_plan(dtype, D, causal, gqa=True)[0].kv_reduce
    run_case(dtype, D, causal, B, Sq, Sk, Hq, Hkv, **kw)


@gpu
@pytest.mark.parametrize("dtype,D,B,Sq,Sk,Hq,Hkv,kw", [
    (torch.bfloat16, 128, 3, 300, 300, 24, 6, {}),  # GQA, 72 (batch, head) pairs: a partial last section
    (torch.float16, 64, 2, 1000, 777, 8, 8, {}),  # D 64's 128-row tile, dK / dV stored, Sq > Sk
    (torch.bfloat16, 96, 1, 333, 1000, 4, 2, dict(softcap=30.0, sink=True)),  # Sq < Sk
    (torch.bfloat16, 256, 2, 200, 200, 4, 4, {}),
], ids=["gqa-d128-sections", "d64-sq-gt-sk", "softcap-sink-d96", "d256"])
def test_lpt_order_matches_reference(monkeypatch, dtype, D, B, Sq, Sk, Hq, Hkv, kw):
    """``FlashBwdConfig.lpt`` (causal CTAs longest first in L2-sized sections of heads; not the default yet):
    the planner patched to choose it, the same checks as the default order's."""
    from cute_kernels.attention import backward_config as bk

    config = bk.bwd_config

    def patched(*args, **kwargs):
        cfg = config(*args, **kwargs)
        return dataclasses.replace(cfg, lpt=True) if cfg.causal and not cfg.deterministic and not cfg.varlen else cfg

    monkeypatch.setattr(bk, "bwd_config", patched)
    monkeypatch.setattr(BW, "_PLANS", {})
    assert BW.bwd_plan(dtype, D, True)[0].lpt
    run_case(dtype, D, True, B, Sq, Sk, Hq, Hkv, **kw)


CASES = [(dt, D, c, i) for dt in DTYPES for D in LB.BWD_HEAD_DIMS for c in (False, True) for i in range(len(LENGTHS))]


@gpu
@pytest.mark.parametrize("dtype,D,causal,i", CASES,
                         ids=[f"{str(dt)[6:]}-D{D}-{'causal' if c else 'full'}-{LENGTHS[i][0]}x{LENGTHS[i][1]}"
                              for dt, D, c, i in CASES])
def test_backward_matches_reference(dtype, D, causal, i):
    """Each length pair with a GQA group size (1/4/8 in turn), B = 2 for the short ones."""
    Sq, Sk = LENGTHS[i]
    G = GROUPS[(i + LB.BWD_HEAD_DIMS.index(D)) % len(GROUPS)]
    B = 1 if max(Sq, Sk) > 1000 else 2
    run_case(dtype, D, causal, B, Sq, Sk, HQ, HQ // G, seed=i)


@gpu
@pytest.mark.parametrize("G", GROUPS)
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_groups(G, causal):
    """Every group size on one shape (dk / dv sum their query heads)."""
    run_case(torch.bfloat16, 128, causal, 2, 300, 200, HQ, HQ // G, seed=G)


WINDOW_CASES = [((0, 0), 300, 200), ((5, 0), 1000, 1000), ((0, 7), 200, 300), ((40, 3), 333, 257),
                ((130, 130), 1000, 4097), ((300, -1), 4097, 1000), ((-1, 200), 17, 128)]


@gpu
@pytest.mark.parametrize("D", LB.BWD_HEAD_DIMS)
@pytest.mark.parametrize("window,Sq,Sk", WINDOW_CASES, ids=[f"w{w[0]}_{w[1]}-{a}x{b}" for w, a, b in WINDOW_CASES])
def test_window(window, Sq, Sk, D):
    """Sliding windows (bf16, GQA 4): near-edge masked, unmasked and far-edge masked query tiles."""
    run_case(torch.bfloat16, D, False, 1, Sq, Sk, HQ, 2, seed=Sq + Sk, window=window)


@gpu
@pytest.mark.parametrize("D", LB.BWD_HEAD_DIMS)
@pytest.mark.parametrize("window,Sq,Sk", [((5, 0), 200, 1000), ((40, 3), 333, 257)])
def test_window_one_head_per_kv_head(window, Sq, Sk, D):
    """Windows with Hq == Hkv (dK / dV stored by the main kernel): the KV tiles no query sees (keys 0..767
    of 1000 for a 200-row query with a 5-key window) store zeros over the NaN-poisoned dk, dv."""
    _, dk, dv = run_case(torch.bfloat16, D, False, 1, Sq, Sk, 3, 3, seed=Sq + Sk, window=window)
    if Sq < Sk:
        assert (dk[:, : Sk - Sq - window[0] - 1] == 0).all() and (dv[:, : Sk - Sq - window[0] - 1] == 0).all()


@gpu
@pytest.mark.parametrize("D", LB.BWD_HEAD_DIMS)
def test_lse_gradient(D):
    """An incoming LSE gradient (Delta - dLSE)."""
    run_case(torch.bfloat16, D, True, 2, 200, 333, HQ, 2, dlse_on=True, seed=3)


#: softcapping / sinks: (dtype, D, causal, length pair, GQA group, softcap, sink) -- every head dim,
#: both masks, ragged lengths (the key-length tail, Sq > Sk causal: rows without keys), GQA 1/4/8, a
#: strong cap (2: tanh far from linear at scores ~ N(0, 1)) and a realistic one (30)
VARIANT_CASES = [(dt, D, c, i, GROUPS[(i + j) % 3], cap, sk)
                 for j, (dt, cap, sk) in enumerate([(torch.bfloat16, 2.0, False), (torch.bfloat16, 0.0, True),
                                                    (torch.bfloat16, 30.0, True), (torch.float16, 2.0, True)])
                 for D in LB.BWD_HEAD_DIMS for c in (False, True) for i in ((j + D // 32) % len(LENGTHS),)]


@gpu
@pytest.mark.parametrize("dtype,D,causal,i,G,softcap,sink", VARIANT_CASES,
                         ids=[f"{str(dt)[6:]}-D{D}-{'causal' if c else 'full'}-{LENGTHS[i][0]}x{LENGTHS[i][1]}-g{G}"
                              f"-cap{cap:g}{'-sink' if sk else ''}" for dt, D, c, i, G, cap, sk in VARIANT_CASES])
def test_softcap_and_sinks_match_reference(dtype, D, causal, i, G, softcap, sink):
    """Softcapping (dS times 1 - tanh^2 of the capped scores) and sinks (the sink-inclusive LSE; the
    sink's gradient from the pre-pass's Delta), alone and together."""
    Sq, Sk = LENGTHS[i]
    B = 1 if max(Sq, Sk) > 1000 else 2
    run_case(dtype, D, causal, B, Sq, Sk, HQ, HQ // G, seed=100 + i, softcap=softcap, sink=sink)


@gpu
@pytest.mark.parametrize("D", LB.BWD_HEAD_DIMS)
@pytest.mark.parametrize("softcap,sink", [(0.0, True), (5.0, True), (5.0, False)])
def test_softcap_and_sinks_lse_gradient(D, softcap, sink):
    """An incoming LSE gradient: Delta - dLSE in dS, and the sink's gradient exp(sink - lse) (dLSE -
    rowsum(dO O)); causal with Sq > Sk (rows without keys: lse = sink, d sink gets their dLSE)."""
    run_case(torch.bfloat16, D, True, 2, 333, 200, HQ, 2, dlse_on=True, seed=13, softcap=softcap, sink=sink)


@gpu
def test_softcap_window():
    """Softcapping under a sliding window (its three query-tile loops), GQA 4."""
    run_case(torch.bfloat16, 128, False, 1, 333, 257, HQ, 2, seed=17, window=(40, 3), softcap=3.0, sink=True)


@gpu
def test_sink_without_keys():
    """Sk = 0: nothing launched, zero gradients for q; the sink's gradient is the rows' dLSE (lse = sink)."""
    dt = torch.bfloat16
    q = torch.randn(2, 5, 4, 64, device="cuda", dtype=dt)
    k = torch.randn(2, 0, 2, 64, device="cuda", dtype=dt)
    sink = torch.randn(4, device="cuda")
    lse = sink[None, :, None].expand(2, 4, 5).contiguous()
    dlse = torch.randn(2, 4, 5, device="cuda")
    dq, dk, dv, dsink = BW.flash_attn_backward(torch.randn_like(q), q, k, k.clone(), torch.zeros_like(q), lse,
                                               dlse=dlse, learnable_sink=sink, softcap=10.0)
    assert (dq == 0).all() and dk.shape == k.shape
    torch.testing.assert_close(dsink, dlse.sum((0, 2)))
    *_, dsink = BW.flash_attn_backward(torch.randn_like(q), q, k, k.clone(), torch.zeros_like(q), lse,
                                       learnable_sink=sink)
    assert (dsink == 0).all()


@gpu
def test_rows_without_keys():
    """Causal with Sq > Sk: the first Sq - Sk rows see no key (forward LSE -inf): dq rows 0, no NaN."""
    dq, dk, dv = run_case(torch.float16, 64, True, 1, 300, 100, 4, 4, seed=5)
    assert (dq[:, :200] == 0).all() and dq[:, 200:].abs().sum() > 0


@gpu
def test_strided_views():
    """Inputs and outputs as head-padded views of larger NaN-filled buffers (strides multiples of 8
    but not compact); the padding stays NaN."""
    torch.manual_seed(7)
    dt, D, B, Sq, Sk, Hq, Hkv = torch.bfloat16, 64, 2, 130, 257, 4, 2

    def view(shape):
        buf = torch.randn(*shape[:-1], shape[-1] + 16, device="cuda", dtype=dt)
        return buf[..., :D]

    q, dout = view((B, Sq, Hq, D)), view((B, Sq, Hq, D))
    k, v = view((B, Sk, Hkv, D)), view((B, Sk, Hkv, D))
    scale = 0.3
    o32, lse32, dq32, dk32, dv32, p32 = reference(q, k, v, dout, False, scale, torch.float32, None, True)
    _, _, dq16, dk16, dv16 = reference(q, k, v, dout, False, scale, dt)
    out = torch.full((B, Sq, Hq, D + 8), NAN, device="cuda", dtype=dt)[..., :D]
    out.copy_(o32)
    bufs = [torch.full((*t.shape[:-1], D + 24), NAN, device="cuda", dtype=dt) for t in (q, k, v)]
    dq, dk, dv = (b[..., 8:8 + D] for b in bufs)
    BW.flash_attn_backward(dout, q, k, v, out, lse32.transpose(1, 2).contiguous().transpose(1, 2), causal=False,
                           softmax_scale=scale, dq=dq, dk=dk, dv=dv)
    torch.cuda.synchronize()
    check_grads((("dq", dq, dq32, dq16), ("dk", dk, dk32, dk16), ("dv", dv, dv32, dv16)), None,
                (*out_rounding_effect(p32, q, k, dout, out, o32, scale), None))
    for b in bufs:
        assert torch.isnan(b[..., :8]).all() and torch.isnan(b[..., 8 + D:]).all()


@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_with_flash_attn_forward(causal):
    """out and lse from the real forward (flash_attn(..., return_lse=True)), allocated gradients."""
    from cute_kernels.attention.forward import flash_attn

    torch.manual_seed(11)
    dt, D, B, Sq, Sk, Hq, Hkv = torch.bfloat16, 128, 2, 1000, 777, 8, 2
    q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=dt)
    k = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt)
    v = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt)
    dout = torch.randn_like(q)
    out, lse = flash_attn(q, k, v, causal=causal, return_lse=True)
    assert lse.shape == (B, Hq, Sq) and lse.dtype == torch.float32
    dq, dk, dv = BW.flash_attn_backward(dout, q, k, v, out, lse, causal=causal)
    o32, _, dq32, dk32, dv32, p32 = reference(q, k, v, dout, causal, D ** -0.5, torch.float32, None, True)
    _, _, dq16, dk16, dv16 = reference(q, k, v, dout, causal, D ** -0.5, dt)
    check_grads((("dq", dq, dq32, dq16), ("dk", dk, dk32, dk16), ("dv", dv, dv32, dv16)), None,
                (*out_rounding_effect(p32, q, k, dout, out, o32, D ** -0.5), None))


@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_variants_with_flash_attn_forward(causal):
    """out and lse from the real forward with softcapping and a sink (its tanh.approx scores, its
    sink-inclusive LSE), allocated gradients, the sink's gradient per head."""
    from cute_kernels.attention.forward import flash_attn

    torch.manual_seed(12)
    dt, D, B, Sq, Sk, Hq, Hkv, cap = torch.bfloat16, 128, 2, 1000, 777, 8, 2, 4.0
    q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=dt)
    k = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt)
    v = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt)
    sink = math.log(Sk) + 2 * torch.randn(Hq, device="cuda")
    dout = torch.randn_like(q)
    out, lse = flash_attn(q, k, v, causal=causal, return_lse=True, softcap=cap, learnable_sink=sink)
    dq, dk, dv, dsink = BW.flash_attn_backward(dout, q, k, v, out, lse, causal=causal, softcap=cap,
                                               learnable_sink=sink)
    variant = dict(softcap=cap, sink=sink)
    o32, _, dq32, dk32, dv32, p32, ds32 = reference(q, k, v, dout, causal, D ** -0.5, torch.float32, None, True,
                                                    **variant)
    _, _, dq16, dk16, dv16, ds16 = reference(q, k, v, dout, causal, D ** -0.5, dt, **variant)
    d_delta = torch.einsum("bqhd,bqhd->bhq", dout.float(), out.float() - o32.float())
    slack_s = (torch.exp(sink[None, :, None] - lse) * d_delta).sum((0, 2)).abs()
    check_grads((("dq", dq, dq32, dq16), ("dk", dk, dk32, dk16), ("dv", dv, dv32, dv16),
                 ("dsink", dsink[:, None], ds32[:, None], ds16[:, None])), None,
                (*out_rounding_effect(p32, q, k, dout, out, o32, D ** -0.5), None, slack_s))


DET_CASES = [
    (128, True, 2, 1000, 1000, 8, 2, None, False),  # GQA 4: the dQ turns and the dK / dV turns
    (64, False, 1, 777, 1500, 8, 8, None, True),  # one query head per KV head (dK / dV stored), a sink
    (96, False, 1, 1000, 1000, 8, 1, (100, 50), False),  # a window: turns from n_block_last
    (128, True, 1, 4097, 1000, 4, 2, None, False),  # rows without keys, query tiles no KV tile meets
    (128, False, 1, 2000, 500, 8, 8, None, False),  # dense, N <= M: rotated starts, turns in arrival order
    (64, False, 2, 1000, 1000, 8, 2, None, False),  # the same with GQA (128-row tiles: M = N = 8)
    (256, True, 1, 1000, 1000, 4, 2, None, False),  # D 256's head-dim split tile, GQA 2
    (128, False, 1, 64, 1000, 4, 4, None, False),  # one query tile: the second dQ warp has none
]


@gpu
@pytest.mark.parametrize("D,causal,B,Sq,Sk,Hq,Hkv,window,sink", DET_CASES)
def test_deterministic_is_bitwise_repeatable(D, causal, B, Sq, Sk, Hq, Hkv, window, sink):
    """``deterministic=True``: the gradients match the reference as in the default mode, and four more
    calls on the same inputs give the same bits."""
    run_case(torch.bfloat16, D, causal, B, Sq, Sk, Hq, Hkv, dlse_on=True, seed=D + Sq, window=window, sink=sink,
             deterministic=True, repeats=4)


@gpu
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("D,causal,B,Sq,Sk,Hq,Hkv,window,sink", DET_CASES)
def test_dq_warps_2_is_bitwise_repeatable(monkeypatch, D, causal, B, Sq, Sk, Hq, Hkv, window, sink, groups):
    """``BwdTile.dq_warps = 2`` (two dQ warps taking the query tiles by parity), alone and with
    ``dq_groups = 2`` (two dQ accumulators summed by the post-pass; not the default yet): the planner
    patched to choose them, the deterministic mode's checks."""
    from cute_kernels.attention import backward_config as bk  # (the planner reads bwd_config there)

    config = bk.bwd_config

    def two_warps(*args, **kwargs):
        cfg = config(*args, **kwargs)
        return dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, dq_warps=2, dq_groups=groups))

    monkeypatch.setattr(bk, "bwd_config", two_warps)
    monkeypatch.setattr(BW, "_PLANS", {})
    plan = BW.bwd_plan(torch.bfloat16, D, causal, deterministic=True, gqa=Hq != Hkv)
    assert plan[0].tile.dq_warps == 2 and plan[2].groups == groups
    run_case(torch.bfloat16, D, causal, B, Sq, Sk, Hq, Hkv, dlse_on=True, seed=D + Sq, window=window, sink=sink,
             deterministic=True, repeats=4)


@gpu
def test_empty_problems():
    dt = torch.bfloat16
    q = torch.randn(1, 5, 2, 64, device="cuda", dtype=dt)
    k = torch.randn(1, 0, 2, 64, device="cuda", dtype=dt)
    lse = torch.full((1, 2, 5), -math.inf, device="cuda")
    dq, dk, dv = BW.flash_attn_backward(torch.randn_like(q), q, k, k.clone(), torch.zeros_like(q), lse)
    assert (dq == 0).all() and dk.shape == k.shape


@gpu
def test_validation_names_the_argument():
    dt = torch.bfloat16
    q = torch.randn(1, 5, 2, 64, device="cuda", dtype=dt)
    k = torch.randn(1, 7, 1, 64, device="cuda", dtype=dt)
    lse = torch.zeros(1, 2, 5, device="cuda")
    args = dict(dout=torch.randn_like(q), q=q, k=k, v=k.clone(), out=torch.randn_like(q), lse=lse)

    def call(**over):
        a = {**args, **over}
        kw = {n: a.pop(n) for n in list(a) if n not in ("dout", "q", "k", "v", "out", "lse")}
        return BW.flash_attn_backward(a["dout"], a["q"], a["k"], a["v"], a["out"], a["lse"], **kw)

    with pytest.raises(ValueError, match="dout"):
        call(dout=torch.randn(1, 6, 2, 64, device="cuda", dtype=dt))
    with pytest.raises(TypeError, match="dout"):
        call(dout=torch.randn(1, 5, 2, 64, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="lse"):
        call(lse=torch.zeros(1, 5, 2, device="cuda"))
    with pytest.raises(TypeError, match="lse"):
        call(lse=torch.zeros(1, 2, 5, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="dk"):
        call(dk=torch.empty(1, 7, 2, 64, device="cuda", dtype=dt))
    with pytest.raises(ValueError, match="dq"):
        call(dq=torch.empty(1, 5, 2, 32, device="cuda", dtype=dt))
    with pytest.raises(TypeError, match="causal"):
        call(causal="yes")
    with pytest.raises(TypeError, match="deterministic"):
        call(deterministic="yes")
    with pytest.raises(ValueError, match="head_dim"):
        q2 = torch.randn(1, 5, 2, 192, device="cuda", dtype=dt)
        k2 = torch.randn(1, 7, 1, 192, device="cuda", dtype=dt)
        BW.flash_attn_backward(torch.randn_like(q2), q2, k2, k2.clone(), torch.randn_like(q2), lse)
    with pytest.raises(ValueError, match="out"):
        call(out=torch.randn(1, 4, 2, 64, device="cuda", dtype=dt))
    with pytest.raises(ValueError, match="learnable_sink"):
        call(learnable_sink=torch.zeros(3, device="cuda"))
    with pytest.raises(TypeError, match="learnable_sink"):
        call(learnable_sink=torch.zeros(2, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="softcap"):
        call(softcap=-1.0)
    with pytest.raises(TypeError, match="softcap"):
        call(softcap=torch.tensor(1.0))


@gpu
@pytest.mark.parametrize("causal,window", [(True, None), (False, None), (False, (-1, 0))])
def test_deterministic_turns_that_could_not_finish_are_refused(causal, window):
    """Deterministic turns over more KV tiles of one sequence and head than the GPU runs at once would
    hang (``backward_mask.det_wait_span``): refused with a ValueError before anything is launched; a
    bounded window over the same keys is not (its turns span the window's tiles)."""
    from _check import assert_raises_before_any_launch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    S = (sms + 8) * 128  # more KV tiles than SMs at any tile_n <= 128; dense: Sq = Sk, so N <= M
    q, k, v, out, dout = (torch.randn(1, S, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(5))
    lse = torch.randn(1, 1, S, device="cuda")
    assert_raises_before_any_launch(ValueError, "deterministic=True", BW.flash_attn_backward, dout, q, k, v, out, lse,
                                    causal=causal, window_size=window, deterministic=True)
    dq, dk, dv = BW.flash_attn_backward(dout, q, k, v, out, lse, causal=False, window_size=(256, 0), deterministic=True)
    torch.cuda.synchronize()
    assert all(torch.isfinite(t).all() for t in (dq, dk, dv))
