"""The Transformers attention function never drops an argument: each keyword a layer passes runs on a
path that honours it (:mod:`cute_kernels.integrations.hf`'s module doc lists them).

CPU: softcap, s_aux, sinks and sliding_window run on the kernels (``cpu_as_gpu``: a torch stand-in
of ``flash_attn``, ``decode_attn``'s CPU path), given to them as the kernels take them (a float, a
float32 (Hq,) sink, ``window_size=(W - 1, 0)``); per keyword that forces a fallback (position_bias,
packed sequences, output_attentions, one unknown) a direct call takes the documented fallback, warns
once naming it; a fallback taken for a layer with softcap / sinks is the model's eager attention,
which applies them.  Every result equals a float64 reference that applies the argument, which
differs from the same reference without it by far more than the tolerance (so dropping it fails the
test).  Whole tiny float32 CPU models of the families that pass softcap / sinks (CPU tensors: the
eager fallback) equal ``attn_implementation="eager"``, unpadded and left-padded, prefill and decode.

GPU: every family the installed Transformers has (Llama, Mistral, Qwen2, Qwen3, Gemma-2 with a strong
softcap, Gemma-3, gpt-oss with sinks ~ N(2, 2)), bf16, 200-token prompts unpadded and left-padded,
``cute_kernels`` against ``eager``: last-position logits within bf16 noise and a few greedy decode
steps under :func:`assert_same_generation`'s rule, every call on the kernels (no fallback).
"""

import warnings

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", minversion="5",
    reason="the Hugging Face integration needs transformers>=5 (pip install -e '.[hf]')")

from cute_kernels.integrations import hf  # noqa: E402

from _hf_models import (FAMILIES, FLASH_CALLS, PREFIX, assert_same_generation, cpu_as_gpu,  # noqa: E402,F401
                        fresh, generate, ours, tiny_model)

gpu = pytest.mark.gpu
TOL = 2e-2  # bf16 inputs and output against a float64 reference


def reference(q, k, v, scale, *, causal=True, softcap=None, sinks=None, bias=None, mask=None):
    """float64 attention, (B, Hq, Sq, D) x (B, Hkv, Sk, D) -> (B, Sq, Hq, D): scores scaled, soft-capped,
    biased, masked (bottom-right causal and/or a boolean mask), softmax with an optional per-head sink
    logit in the denominator."""
    G = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    s = q.double() @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.double()
    Sq, Sk = s.shape[-2:]
    if causal:
        s = s.masked_fill(~torch.ones(Sq, Sk, dtype=torch.bool).tril(Sk - Sq), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink = sinks.double().view(1, -1, 1, 1).expand(s.shape[0], -1, Sq, 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1)
    return (p @ v).transpose(1, 2)


def packed_mask(cu, n):
    seg = torch.bucketize(torch.arange(n), torch.tensor(cu[1:]), right=True)
    return (seg[:, None] == seg[None, :]) & torch.ones(n, n, dtype=torch.bool).tril()


CU = [0, 5, 5, 17, 24]  # one empty sequence


def variant(name):
    """(module, kwargs, reference kwargs) of a keyword the kernels apply."""
    if name == "softcap":
        attn = tiny_model("gemma2", torch.bfloat16).model.layers[1].self_attn
        return attn, dict(softcap=0.5), dict(softcap=0.5)
    attn = tiny_model("gpt_oss", torch.bfloat16).model.layers[1].self_attn
    sinks = attn.sinks.detach()
    assert sinks.abs().max() > 1  # set, not a random init's zeros
    return attn, {name: sinks}, dict(sinks=sinks.float())


def case(name):
    """(module, kwargs, reference kwargs, expected path, warning text, batch)."""
    attn = tiny_model("llama", torch.bfloat16).model.layers[0].self_attn
    if name == "position_bias":
        bias = 2 * torch.randn(1, 4, 24, 24, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
        return attn, dict(position_bias=bias), dict(bias=bias), hf.SDPA, "position bias", 2
    if name == "packed":
        cu = torch.tensor(CU, dtype=torch.int32)
        kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=12, max_length_k=12)
        return attn, kw, dict(mask=packed_mask(CU, 24)), hf.SDPA, "packed sequences", 1
    if name == "output_attentions":
        return attn, dict(output_attentions=True), {}, hf.EAGER, "output_attentions=True", 2
    if name == "softcap+output_attentions":  # a fallback forced by one keyword keeps the others
        attn, kw, ref_kw = variant("softcap")
        return attn, dict(kw, output_attentions=True), ref_kw, hf.EAGER, "output_attentions=True", 2
    assert name == "unknown"
    return attn, dict(indices=torch.arange(3)), {}, hf.EAGER, "'indices'", 2


@pytest.mark.parametrize("name", ["position_bias", "output_attentions", "softcap+output_attentions", "unknown"])
@pytest.mark.usefixtures("cpu_as_gpu")
def test_each_keyword_runs_a_path_that_honours_it(name):
    attn, kw, ref_kw, path, text, B = case(name)
    g = torch.Generator().manual_seed(11)
    q = torch.randn(B, 4, 24, 64, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B, 2, 24, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    assert hf.fallback_path(kw)[0] == path
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        o, w = hf.attention_forward(attn, q, k, v, None, scaling=0.125, **kw)
        hf.attention_forward(attn, q, k, v, None, scaling=0.125, **kw)
    where = {hf.EAGER: "the model's eager attention", hf.SDPA: "transformers' sdpa attention"}[path]
    msgs = ours(rec)
    assert len(msgs) == 1 and msgs[0].startswith(f"{PREFIX} running {where}: ") and text in msgs[0], msgs
    assert hf.hf_stats == {"flash_attn": 0, "decode_attn": 0, "fallback": 2}
    ref = reference(q, k, v, 0.125, **ref_kw)
    err = (o.double() - ref).abs().max().item()
    assert o.shape == (B, 24, 4, 64) and err < TOL, err
    if ref_kw:  # the argument matters: the reference without it is far off
        plain = reference(q, k, v, 0.125)
        assert (plain - ref).abs().max().item() > 10 * TOL
    if "output_attentions" in name:
        assert w is not None and w.shape == (B, 4, 24, 24)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.usefixtures("cpu_as_gpu")
def test_packed_keywords_run_on_the_kernels(grad):
    """A padding-free collator's batch (``cu_seq_lens_q/k``, ``max_length_q/k``, batch 1, an empty sequence):
    one packed flash_attn call with those lengths, no warning, equal to the block-diagonal reference, and
    differentiable; with a mask or a batch of 2 the keywords still take the fallback."""
    attn, kw, ref_kw, path, text, B = case("packed")
    g = torch.Generator().manual_seed(13)
    q = torch.randn(1, 4, 24, 64, generator=g).to(torch.bfloat16).requires_grad_(grad)
    k, v = (torch.randn(1, 2, 24, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        o, _ = hf.attention_forward(attn, q, k, v, None, scaling=0.125, **kw)
    assert ours(rec) == [] and hf.hf_stats == {"flash_attn": 1, "decode_attn": 0, "fallback": 0}
    call = FLASH_CALLS[-1]
    assert call["cu_seqlens_q"].tolist() == CU and call["cu_seqlens_q"].dtype == torch.int32
    assert (call["max_seqlen_q"], call["max_seqlen_k"], call["causal"]) == (12, 12, True)
    ref = reference(q.detach(), k, v, 0.125, **ref_kw)
    assert o.shape == (1, 24, 4, 64) and (o.detach().double() - ref).abs().max().item() < TOL
    if grad:
        (gq,) = torch.autograd.grad(o.float().sum(), (q,))
        assert gq.shape == q.shape and torch.isfinite(gq).all() and gq.abs().max() > 0
    hf.reset_stats()
    q2, k2, v2 = (torch.cat([t.detach()] * 2) for t in (q, k, v))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        hf.attention_forward(attn, q2, k2, v2, None, scaling=0.125, **kw)
    assert hf.hf_stats["fallback"] == 1 and text in ours(rec)[0]


@pytest.mark.parametrize("name", ["softcap", "s_aux", "sinks"])
@pytest.mark.parametrize("q_len", [24, 1])
@pytest.mark.usefixtures("cpu_as_gpu")
def test_softcap_and_sinks_run_on_the_kernels(name, q_len):
    """A prefill on flash_attn and a decode step on decode_attn, given the softcap as a float and the
    sinks as float32 (the layer's are bf16 parameters); no warning, equal to the reference."""
    attn, kw, ref_kw = variant(name)
    assert hf.fallback_path(kw) is None
    g = torch.Generator().manual_seed(12)
    q = torch.randn(2, 4, q_len, 64, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(2, 2, 24, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        o, w = hf.attention_forward(attn, q, k, v, None, scaling=0.125, **kw)
    assert ours(rec) == [] and w is None
    kernel = "flash_attn" if q_len > 16 else "decode_attn"
    assert hf.hf_stats == {"flash_attn": 0, "decode_attn": 0, "fallback": 0, kernel: 1}
    if kernel == "flash_attn":
        call = FLASH_CALLS[-1]
        if name == "softcap":
            assert call["softcap"] == 0.5 and type(call["softcap"]) is float and call["learnable_sink"] is None
        else:
            assert call["learnable_sink"].dtype == torch.float32 and call["learnable_sink"].shape == (4,)
    ref = reference(q, k, v, 0.125, **ref_kw)
    assert (o.double() - ref).abs().max().item() < TOL
    assert (reference(q, k, v, 0.125) - ref).abs().max().item() > 10 * TOL


@pytest.mark.usefixtures("cpu_as_gpu")
def test_a_layer_with_sinks_and_grad_runs_on_the_kernels():
    """Inputs requiring grad: softcapping and sinks have a backward on the kernels, so the layer stays on
    flash_attn (no fallback, no warning)."""
    attn, kw, ref_kw = variant("s_aux")
    g = torch.Generator().manual_seed(13)
    q = torch.randn(2, 4, 24, 64, generator=g).to(torch.bfloat16).requires_grad_()
    k, v = (torch.randn(2, 2, 24, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o, _ = hf.attention_forward(attn, q, k, v, None, scaling=0.125, **kw)
    assert hf.hf_stats == {"flash_attn": 1, "decode_attn": 0, "fallback": 0}
    assert (o.detach().double() - reference(q.detach(), k, v, 0.125, **ref_kw)).abs().max().item() < TOL


@pytest.mark.usefixtures("cpu_as_gpu")
def test_keywords_without_effect_run_on_the_kernels():
    attn = tiny_model("llama", torch.bfloat16).model.layers[0].self_attn
    q, k = torch.randn(2, 4, 24, 64).to(torch.bfloat16), torch.randn(2, 2, 24, 64).to(torch.bfloat16)
    kw = dict(position_ids=torch.arange(24)[None].expand(2, 24), use_cache=True, output_attentions=False,
              output_hidden_states=False, sliding_window=None, softcap=None, s_aux=None, cu_seq_lens_q=None)
    for name in kw:
        assert hf.fallback_path({name: kw[name]}) is None, name
    o, _ = hf.attention_forward(attn, q, k, k, None, scaling=0.125, **kw)
    assert hf.hf_stats == {"flash_attn": 1, "decode_attn": 0, "fallback": 0}
    assert (o.double() - reference(q, k, k, 0.125)).abs().max().item() < TOL


@pytest.mark.usefixtures("cpu_as_gpu")
def test_a_window_without_a_mask_runs_on_the_kernels():
    """HF's sliding_window W: key j visible to query i when i - W < j <= i, flash_attn's (W - 1, 0); a
    window covering every key is no window; a non-causal layer's window needs a dense mask."""
    attn = tiny_model("mistral", torch.bfloat16).model.layers[0].self_attn
    q, k = torch.randn(1, 4, 24, 64).to(torch.bfloat16), torch.randn(1, 2, 24, 64).to(torch.bfloat16)
    o, _ = hf.attention_forward(attn, q, k, k, None, scaling=0.125, sliding_window=16)
    assert FLASH_CALLS[-1]["window_size"] == (15, 0) and hf.hf_stats["flash_attn"] == 1
    i, j = torch.arange(24)[:, None], torch.arange(24)[None, :]
    ref = reference(q, k, k, 0.125, mask=j > i - 16)
    assert (o.double() - ref).abs().max().item() < TOL
    assert (reference(q, k, k, 0.125) - ref).abs().max().item() > 10 * TOL
    hf.attention_forward(attn, q, k, k, None, scaling=0.125, sliding_window=24)  # the window covers all
    assert FLASH_CALLS[-1]["window_size"] == (-1, -1) and hf.hf_stats["flash_attn"] == 2
    with pytest.raises(ValueError, match="sliding_window=16"):
        hf.attention_forward(attn, q, k, k, None, scaling=0.125, is_causal=False, sliding_window=16)


@pytest.mark.usefixtures("cpu_as_gpu")
def test_no_eager_function_is_a_clear_error():
    class Bare(torch.nn.Module):  # a module whose modeling module has no eager_attention_forward
        num_key_value_groups = 2

    q, k = torch.randn(1, 4, 8, 64).to(torch.bfloat16), torch.randn(1, 2, 8, 64).to(torch.bfloat16)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="no eager_attention_forward"):
        hf.attention_forward(Bare(), q, k, k, None, scaling=0.125, output_attentions=True)


def _left_pad(ids, n):
    mask = torch.ones_like(ids)
    mask[0, :n], ids[0, :n] = 0, 0
    return ids, mask


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
@pytest.mark.parametrize("padded", [False, True])
def test_cpu_model_with_softcap_or_sinks_equals_eager(family, padded):
    """The whole model on CPU tensors (float32): the layers pass softcap / sinks, run the model's eager
    attention, and equal attn_implementation="eager" (prefill and DynamicCache decode steps)."""
    model = tiny_model(family)
    ids = torch.randint(1, 512, (2, 40), generator=torch.Generator().manual_seed(6))
    ids, mask = _left_pad(ids, 9 if padded else 0)
    with torch.no_grad():
        ref = generate(model, ids, mask, "eager", None, 4)
        with pytest.warns(UserWarning, match="running the model's eager attention"):
            out = generate(model, ids, mask, "cute_kernels", None, 4)
    assert torch.equal(out.sequences, ref.sequences)
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert hf.hf_stats["flash_attn"] == hf.hf_stats["decode_attn"] == 0


# -------------------------------------------------------------------------------------------- GPU
GPU_FAMILIES = [f for f, (cls, _) in FAMILIES.items() if hasattr(transformers, cls)]


@gpu
@pytest.mark.parametrize("family", GPU_FAMILIES)
@pytest.mark.parametrize("padded", [False, True])
def test_family_on_the_gpu_equals_eager(family, padded):
    model = tiny_model(family, torch.bfloat16, num_attention_heads=8, num_key_value_heads=2,
                       hidden_size=512, intermediate_size=1024, vocab_size=1000).cuda()
    ids = torch.randint(1, 1000, (2, 200), generator=torch.Generator().manual_seed(8)).cuda()
    ids, mask = _left_pad(ids, 37 if padded else 0)
    with torch.no_grad():
        model.set_attn_implementation("eager")
        ref_logits = model(ids, attention_mask=mask).logits[:, -1].float()
        model.set_attn_implementation("cute_kernels")
        hf.reset_stats()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logits = model(ids, attention_mask=mask).logits[:, -1].float()
        stats = dict(hf.hf_stats)
        ref = generate(model, ids, mask, "eager", None, 6)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = generate(model, ids, mask, "cute_kernels", None, 6)
    rel = ((logits - ref_logits).abs().max() / ref_logits.abs().max()).item()
    print(f"{family} padded={padded}: max relative logit difference {rel:.4f}, {stats}")
    assert rel < 0.03, (family, padded, rel)
    assert_same_generation(ref, out)
    assert stats == {"flash_attn": 2, "decode_attn": 0, "fallback": 0}, stats  # every layer on the kernels
