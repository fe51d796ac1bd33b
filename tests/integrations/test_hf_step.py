"""The call-site decision cache of the Transformers attention function
(:mod:`cute_kernels.integrations.hf_step`): a call whose key (keywords, scalars, tensor metadata)
matches an earlier call that reached the kernels skips the checks, and every call takes the decision
it takes with the cache empty: the same kernel with the same arguments, or the same fallback with the
same reason, or the same error.

CPU (``cpu_as_gpu``: ``decode_attn``'s CPU path, a torch stand-in of ``flash_attn``, both recorded):

- per variant of a decode call (positions, new tensors, strides, a misaligned view, dtypes, masks,
  windows, sinks, softcaps, grad, dropout, keywords set, scaling, causality, the route's devices,
  inference mode, a static buffer without positions, prefill shapes), the outcome after a call that
  filled the cache equals the outcome with the cache empty; the variants that only change values hit
  the cache (no route call), and a plain repeat always does;
- whole tiny models (full and sliding layers, softcap, sinks; DynamicCache and StaticCache; unpadded
  and left-padded): the same tokens, kernel calls and counts with the cache as without, and fewer
  route calls.
"""

import contextlib
import warnings

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", minversion="5",
    reason="the Hugging Face integration needs transformers>=5 (pip install -e '.[hf]')")

from cute_kernels.attention import decode as D  # noqa: E402
from cute_kernels.integrations import hf, hf_step  # noqa: E402
from cute_kernels.integrations import sdpa as S  # noqa: E402

from _hf_models import (FLASH_CALLS, cpu_as_gpu, fresh, generate, left_padded, ours,  # noqa: E402,F401
                        window_model)

W = 8


def plain(x):
    """A kernel argument as comparable data (tensors by dtype, shape, strides and values)."""
    if isinstance(x, torch.Tensor):
        return ("tensor", x.dtype, tuple(x.shape), x.stride(), x.detach().float().tolist())
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(plain(v) for v in x)
    return x


@pytest.fixture
def spies(monkeypatch, cpu_as_gpu):  # noqa: F811  (the fixture, imported)
    """(decode_attn calls, route calls, lookups that hit): recorded (flash_attn's calls in FLASH_CALLS)."""
    decodes, routes, hits = [], [], []
    orig_decode, orig_route, orig_lookup = D.decode_attn, hf.route, hf_step.lookup

    def decode(q, k, v, **kw):
        decodes.append(plain(dict(kw, q=q, k=k, v=v, pointers=(q.data_ptr(), k.data_ptr(), v.data_ptr()))))
        return orig_decode(q, k, v, **kw)

    def lookup(*a):
        hit = orig_lookup(*a)
        hits.append(hit is not None)
        return hit

    monkeypatch.setattr(D, "decode_attn", decode)
    monkeypatch.setattr(hf, "route", lambda *a: routes.append(a) or orig_route(*a))
    monkeypatch.setattr(hf_step, "lookup", lookup)
    return decodes, routes, hits


def outcome(run, spies):
    """What ``run()`` did: its result (or error), the counts, our warnings, the kernels' arguments."""
    decodes, routes, hits = spies
    decodes.clear()
    routes.clear()
    hits.clear()
    FLASH_CALLS.clear()
    for k in hf.hf_stats:
        hf.hf_stats[k] = 0
    hf._WARNED.clear()
    torch.manual_seed(0)  # (a dropout fallback)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        try:
            o, w = run()
            result = ("ok", plain(o), plain(w))
        except Exception as e:  # noqa: BLE001
            result = ("raised", type(e), str(e))
    return dict(result=result, stats=dict(hf.hf_stats), warned=ours(rec), decode=list(decodes),
                flash=[plain(c) for c in FLASH_CALLS])


def tensors(B=2, q_len=1, kv_len=24, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 4, q_len, 64, generator=g).to(dtype)
    k, v = (torch.randn(B, 2, kv_len, 64, generator=g).to(dtype) for _ in range(2))
    return q, k, v


def misaligned(t):
    """``t``'s values, shape and strides, its data pointer 2 bytes past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 8, dtype=t.dtype)
    out = buf[1:1 + t.numel()].view(t.shape)
    out.copy_(t)
    assert out.stride() == t.stride() and out.data_ptr() % 16 == 2
    return out


_LAYERS: dict = {}


def layer(family):
    if family not in _LAYERS:
        _LAYERS[family] = window_model(family, W).model.layers[1].self_attn
    return _LAYERS[family]


def positions(last, B=2):
    cp = torch.tensor([last])
    return dict(cache_position=cp, position_ids=cp[None].expand(B, 1))


def call(attn, q, k, v, mask=None, ctx=contextlib.nullcontext, **kw):
    def run():
        with ctx():
            return hf.attention_forward(layer(attn), q, k, v, mask, **{"scaling": 0.125, **kw})
    return run


def grad_q(q):
    return q.detach().clone().requires_grad_()


# name -> (base call, variant call, the variant hits the cache); each a function of the base tensors
# (q, k, v) and the monkeypatch fixture, returning the two calls
def _variants():
    P = positions(20)
    V = {}

    def add(name, hit="miss", family="llama", base_kw=None):
        def deco(fn):
            V[name] = (family, base_kw or P, fn, hit)
            return fn
        return deco

    add("positions", hit="hit")(lambda q, k, v, mp: call("llama", q, k, v, **positions(9)))
    add("new tensors", hit="hit")(lambda q, k, v, mp: call("llama", *tensors(seed=1), **P))
    add("position_ids only")(lambda q, k, v, mp: call("llama", q, k, v, position_ids=P["position_ids"]))
    add("no positions")(lambda q, k, v, mp: call("llama", q, k, v))
    add("positions None", hit="hit")(lambda q, k, v, mp: call("llama", q, k, v, cache_position=None,
                                                             position_ids=None))
    add("other strides", hit="hit")(lambda q, k, v, mp: call(  # (the length's strides: Decision.grow)
        "llama", q, *(torch.cat([t, t[:, :, :8]], 2)[:, :, :24] for t in (k, v)), **P))
    add("head dim strided")(lambda q, k, v, mp: call(
        "llama", q, k.transpose(-1, -2).contiguous().transpose(-1, -2), v, **P))
    add("misaligned key")(lambda q, k, v, mp: call("llama", q, misaligned(k), v, **P))
    add("misaligned query")(lambda q, k, v, mp: call("llama", misaligned(q), k, v, **P))
    add("float16")(lambda q, k, v, mp: call("llama", q.half(), k.half(), v.half(), **P))
    add("float32")(lambda q, k, v, mp: call("llama", q.float(), k.float(), v.float(), **P))
    add("mixed dtypes")(lambda q, k, v, mp: call("llama", q, k.half(), v, **P))
    add("padding mask")(lambda q, k, v, mp: call(
        "llama", q, k, v, torch.arange(24)[None].expand(2, -1) >= torch.tensor([[0], [5]]), **P))
    add("mask of ones")(lambda q, k, v, mp: call("llama", q, k, v, torch.ones(2, 24, dtype=torch.bool), **P))
    add("dense mask")(lambda q, k, v, mp: call("llama", q, k, v, torch.ones(2, 1, 1, 24, dtype=torch.bool), **P))
    add("window wider")(lambda q, k, v, mp: call("mistral", q, k, v, sliding_window=64, **P))
    add("window narrower")(lambda q, k, v, mp: call("mistral", q, k, v, sliding_window=W, **P))
    add("window as float")(lambda q, k, v, mp: call("mistral", q, k, v, sliding_window=64.0, **P))
    add("window narrower, other value", family="mistral", base_kw=dict(P, sliding_window=W))(
        lambda q, k, v, mp: call("mistral", q, k, v, **dict(P, sliding_window=W + 1)))
    add("window None", family="mistral", base_kw=dict(P, sliding_window=64))(
        lambda q, k, v, mp: call("mistral", q, k, v, **dict(P, sliding_window=None)))
    add("non-causal window", family="mistral", base_kw=dict(P, sliding_window=W))(
        lambda q, k, v, mp: call("mistral", q, k, v, is_causal=False, **dict(P, sliding_window=W)))
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(3)) * 2
    add("sinks", hit="hit", family="gpt_oss", base_kw=dict(P, s_aux=sinks))(
        lambda q, k, v, mp: call("gpt_oss", q, k, v, **dict(P, s_aux=sinks + 1)))
    add("sinks added", hit="hit", family="gpt_oss", base_kw=dict(P, s_aux=None))(
        lambda q, k, v, mp: call("gpt_oss", q, k, v, **dict(P, s_aux=sinks)))
    add("sinks of the wrong length", hit="hit, checked", family="gpt_oss", base_kw=dict(P, s_aux=sinks))(
        lambda q, k, v, mp: call("gpt_oss", q, k, v, **dict(P, s_aux=sinks[:3])))
    add("sinks not a tensor", hit="hit, checked", family="gpt_oss", base_kw=dict(P, s_aux=sinks))(
        lambda q, k, v, mp: call("gpt_oss", q, k, v, **dict(P, s_aux=sinks.tolist())))
    add("sinks 2-d", hit="hit, checked", family="gpt_oss", base_kw=dict(P, sinks=sinks))(
        lambda q, k, v, mp: call("gpt_oss", q, k, v, **dict(P, sinks=sinks[None])))
    add("softcap", hit="hit", family="gemma2", base_kw=dict(P, softcap=0.5))(
        lambda q, k, v, mp: call("gemma2", *tensors(seed=2), **dict(P, softcap=0.5)))
    add("softcap other value", family="gemma2", base_kw=dict(P, softcap=0.5))(
        lambda q, k, v, mp: call("gemma2", q, k, v, **dict(P, softcap=2.0)))
    add("softcap negative", family="gemma2", base_kw=dict(P, softcap=0.5))(
        lambda q, k, v, mp: call("gemma2", q, k, v, **dict(P, softcap=-1.0)))
    add("softcap bool", family="gemma2", base_kw=dict(P, softcap=1))(
        lambda q, k, v, mp: call("gemma2", q, k, v, **dict(P, softcap=True)))
    add("softcap a tensor", family="gemma2", base_kw=dict(P, softcap=0.5))(
        lambda q, k, v, mp: call("gemma2", q, k, v, **dict(P, softcap=torch.tensor(0.5))))
    add("softcap a list", family="gemma2", base_kw=dict(P, softcap=0.5))(
        lambda q, k, v, mp: call("gemma2", q, k, v, **dict(P, softcap=[0.5])))
    add("grad")(lambda q, k, v, mp: call("llama", grad_q(q), k, v, **P))
    add("grad disabled")(lambda q, k, v, mp: call("llama", grad_q(q), k, v, ctx=torch.no_grad, **P))
    add("inference mode")(lambda q, k, v, mp: call("llama", q, k, v, ctx=torch.inference_mode, **P))
    add("dropout")(lambda q, k, v, mp: call("llama", q, k, v, dropout=0.1, **P))
    add("scaling")(lambda q, k, v, mp: call("llama", q, k, v, scaling=0.25, **P))
    add("scaling None")(lambda q, k, v, mp: call("llama", q, k, v, scaling=None, **P))
    add("scaling negative")(lambda q, k, v, mp: call("llama", q, k, v, scaling=-0.125, **P))
    add("scaling int")(lambda q, k, v, mp: call("llama", q, k, v, scaling=1, **P))
    add("not causal")(lambda q, k, v, mp: call("llama", q, k, v, is_causal=False, **P))
    add("output_attentions", family="llama", base_kw=dict(P, output_attentions=False))(
        lambda q, k, v, mp: call("llama", q, k, v, **dict(P, output_attentions=True)))
    add("unknown keyword set", family="llama", base_kw=dict(P, indices=None))(
        lambda q, k, v, mp: call("llama", q, k, v, **dict(P, indices=torch.arange(3))))
    add("position bias", family="llama", base_kw=dict(P, position_bias=None))(
        lambda q, k, v, mp: call("llama", q, k, v, **dict(P, position_bias=torch.zeros(2, 4, 1, 24))))
    add("packed keywords", family="llama", base_kw=dict(P, cu_seq_lens_q=None))(
        lambda q, k, v, mp: call("llama", q, k, v, **dict(P, cu_seq_lens_q=torch.tensor([0, 1], dtype=torch.int32))))
    add("the route's devices")(lambda q, k, v, mp: call(
        "llama", q, k, v, ctx=lambda: _patched(mp, S, "_KERNEL_DEVICES", ("cuda", "meta")), **P))
    add("not Hopper")(lambda q, k, v, mp: call(
        "llama", q, k, v, ctx=lambda: _patched(mp, S, "_is_hopper", lambda dev: False), **P))
    add("the route's Hopper cache replaced")(lambda q, k, v, mp: call(
        "llama", q, k, v, ctx=lambda: _patched(mp, S, "_HOPPER", {}), **P))
    add("value is key")(lambda q, k, v, mp: call("llama", q, k, k, **P))
    # a growing cache (DynamicCache): the next step's keys a new, longer tensor (Decision.grow)
    add("longer keys", hit="hit")(lambda q, k, v, mp: call("llama", *tensors(kv_len=31, seed=4), **positions(30)))
    add("shorter keys", hit="hit")(lambda q, k, v, mp: call("llama", *tensors(kv_len=9, seed=4), **positions(8)))
    add("keys as many as queries")(lambda q, k, v, mp: call("llama", *tensors(kv_len=1, seed=4), **positions(0)))
    add("longer keys, a view of a longer buffer", hit="hit")(lambda q, k, v, mp: call(
        "llama", q, *(torch.cat([t, t, t], 2)[:, :, :40] for t in (k, v)), **positions(39)))
    add("longer keys, rows not in 16-byte units")(lambda q, k, v, mp: call(
        "llama", q, *(torch.randn(2 * 2 * (30 * 64 + 4)).to(t.dtype).as_strided(
            (2, 2, 30, 64), (2 * (30 * 64 + 4), 30 * 64 + 4, 64, 1)) for t in (k, v)), **positions(29)))
    add("longer keys, head dim strided")(lambda q, k, v, mp: call(
        "llama", q, *(t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in tensors(kv_len=31)[1:]),
        **positions(30)))
    add("longer keys of a sliding layer", hit="hit", family="mistral", base_kw=dict(P, sliding_window=W))(
        lambda q, k, v, mp: call("mistral", *tensors(kv_len=31, seed=4), **dict(positions(30), sliding_window=W)))
    add("more queries than keys")(lambda q, k, v, mp: call("llama", *tensors(q_len=4, kv_len=2), **P))
    add("prefill")(lambda q, k, v, mp: call("llama", *tensors(q_len=20), **P))
    add("prefill past the positions")(lambda q, k, v, mp: call("llama", *tensors(q_len=20), **positions(5)))
    return V


@contextlib.contextmanager
def _patched(mp, obj, name, value):
    with mp.context() as m:
        m.setattr(obj, name, value)
        yield


VARIANTS = _variants()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_call_after_a_cached_one_decides_as_with_no_cache(name, spies, monkeypatch):
    family, base_kw, variant, hit = VARIANTS[name]
    q, k, v = tensors()
    base = call(family, q, k, v, **base_kw)
    run = variant(q, k, v, monkeypatch)
    _, routes, hits = spies
    hf_step.clear()
    alone = outcome(run, spies)
    hf_step.clear()
    first = outcome(base, spies)
    assert not first["warned"] and first["stats"]["fallback"] == 0 and len(hf_step._DECISIONS) == 1, first
    assert outcome(base, spies) == first and hits == [True] and routes == []  # a repeat: no checks
    after = outcome(run, spies)
    assert after == alone
    # a call with a mask looks nothing up; a hit whose sinks the kernels do not take runs the full checks
    assert hits == ([] if "mask" in name else [hit in ("hit", "hit, checked")]), (hits, alone)
    assert routes == [] or hit != "hit"


def test_a_misaligned_buffer_falls_back_with_the_strides_reason(spies):
    q, k, v = tensors()
    P = positions(20)
    outcome(call("llama", q, k, v, **P), spies)
    got = outcome(call("llama", q, k, misaligned(v), **P), spies)
    assert got["stats"]["fallback"] == 1 and got["decode"] == [], got
    assert len(got["warned"]) == 1 and "data pointers not 16-byte aligned" in got["warned"][0]


def test_layers_alternating_keep_one_decision_each(spies):
    """A full layer and a sliding one in turn (another key length, another window): both decisions
    kept, each call after the first two a hit."""
    P = positions(30)
    full = call("gemma3", *tensors(kv_len=31), **dict(P, sliding_window=None))
    sliding = call("gemma3", *tensors(kv_len=W, seed=1), **dict(P, sliding_window=W))
    _, routes, hits = spies
    want = [outcome(f, spies) for f in (full, sliding)]
    for _ in range(3):
        for f, w in zip((full, sliding), want):
            assert outcome(f, spies) == w and hits == [True] and routes == []
    assert len(hf_step._DECISIONS) == 2


def test_a_growing_cache_step_moves_the_exact_guard(spies):
    """A DynamicCache step: the first layer's call passes the grow guard only (longer keys); the decision's
    exact guard then follows the step's metadata, so the step's next layers pass it without the grow
    path's stride checks; the previous step's metadata still hits (through the grow guard)."""
    P, base = positions(23), tensors()
    first = outcome(call("llama", *base, **P), spies)
    (decision,) = hf_step._DECISIONS.values()
    q, k, v = tensors(kv_len=25, seed=3)
    assert not decision.guard.check(q, k, v)
    _, routes, hits = spies
    step = outcome(call("llama", q, k, v, **positions(24)), spies)
    assert hits == [True] and routes == [] and step["stats"]["fallback"] == 0
    assert decision.guard.check(q, k, v) and decision.guard.check(*tensors(kv_len=25, seed=5))
    assert outcome(call("llama", *base, **P), spies) == first and hits == [True] and routes == []


def test_keys_kept_are_bounded(spies):
    q, k, v = tensors()
    for i in range(hf_step.KEEP + 5):
        hf.attention_forward(layer("llama"), q, k, v, None, scaling=0.01 * (i + 1), **positions(20))
    assert len(hf_step._DECISIONS) == hf_step.KEEP


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3", "gpt_oss"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("padded", [False, True])
def test_generation_is_the_same_with_the_cache(family, cache, padded, spies, monkeypatch):
    """Whole tiny models: the same tokens, kernel calls (and their arguments) and counts with the
    decision cache as with every call checked; the cache answers most decode calls."""
    decodes, routes, _ = spies
    model = window_model(family, W)
    lengths = [12, 9] if padded else [12, 12]
    ids, mask = left_padded(lengths, model.config.vocab_size)

    def run():
        hf.reset_stats()
        decodes.clear()
        FLASH_CALLS.clear()
        routes.clear()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            out = generate(model, ids, mask, "cute_kernels", cache, 6)
        decode = [{k: v for k, v in d.items() if k != "pointers"} for d in decodes]  # (new buffers each run)
        return dict(tokens=out.sequences.tolist(), stats=dict(hf.hf_stats), warned=ours(rec), decode=decode,
                    flash=[plain(c) for c in FLASH_CALLS]), len(routes)

    with_cache, cached_routes = run()
    with monkeypatch.context() as m:
        m.setattr(hf_step, "lookup", lambda *a: None)
        m.setattr(hf_step, "remember", lambda *a: None)
        without, all_routes = run()
    assert with_cache == without
    assert with_cache["stats"]["fallback"] == 0 and with_cache["warned"] == []
    # a padded batch keeps its mask every step: no call takes the cache; a DynamicCache's full layers
    # meet a longer key tensor each step (two layers: the first misses, the next one hits)
    if not padded:
        assert cached_routes <= (all_routes * 3 // 4 if cache == "dynamic" else all_routes // 2), (
            cached_routes, all_routes)


def test_counts_under_torch_compile_never_recompile(spies):
    """hf_stats counts eager calls only: a count traced by dynamo would guard on the value it read, so a
    compiled caller would recompile on every call (its own count changed it)."""
    q, k, v = tensors()
    P = positions(20)
    torch._dynamo.reset()

    @torch.compile(backend="eager", fullgraph=True)
    def f(x):
        hf.count_eager(hf.hf_stats, "decode_attn")
        return x * 2

    before = dict(hf.hf_stats)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            f(q)
            hf.attention_forward(layer("llama"), q, k, v, None, scaling=0.125, **P)  # an eager call counts
    assert hf.hf_stats["decode_attn"] == before["decode_attn"] + 3
    torch._dynamo.reset()
