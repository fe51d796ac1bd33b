"""Helpers shared by the Hugging Face integration tests: tiny random models of each family, the
``cpu_as_gpu`` routing fixture (CPU tensors take a GPU's routes), generation and its comparison rule."""

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", minversion="5",
    reason="the Hugging Face integration needs transformers>=5 (pip install -e '.[hf]')")

from transformers import AutoModelForCausalLM  # noqa: E402

from cute_kernels.attention import forward as FW  # noqa: E402
from cute_kernels.integrations import hf  # noqa: E402
from cute_kernels.integrations import sdpa as S  # noqa: E402

PREFIX = "cute_kernels attention:"


@pytest.fixture(autouse=True)
def fresh():
    """(autouse where imported) The integration registered, its counters and warned reasons zeroed."""
    hf.register()
    hf.reset_stats()
    yield
    hf.reset_stats()


def attention_reference(q, k, v, *, causal=False, softmax_scale, window_size=(-1, -1), softcap=0.0,
                        learnable_sink=None):
    """One sequence, float32: q (Sq, Hq, D), k / v (Sk, Hkv, D) -> (Sq, Hq, D) float32.  flash_attn's
    definition: GQA, bottom-right causal and window (a side None or -1 unbounded), softcap, a sink per
    query head in the denominator; a row that sees no key gives 0."""
    Sq, Hq, _ = q.shape
    Sk, Hkv, _ = k.shape
    G = Hq // Hkv
    kf, vf = k.float().repeat_interleave(G, 1), v.float().repeat_interleave(G, 1)
    s = torch.einsum("qhd,khd->hqk", q.float(), kf) * softmax_scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    kpos, last = torch.arange(Sk)[None, :], (Sk - Sq + torch.arange(Sq))[:, None]
    vis = torch.ones(Sq, Sk, dtype=torch.bool)
    left, right = window_size if window_size is not None else (None, None)
    if causal:
        vis &= kpos <= last
    if right is not None and right != -1:
        vis &= kpos <= last + right
    if left is not None and left != -1:
        vis &= kpos >= last - left
    s = s.masked_fill(~vis, float("-inf"))
    if learnable_sink is not None:
        s = torch.cat([s, learnable_sink.float().view(Hq, 1, 1).expand(Hq, Sq, 1)], -1)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
    if learnable_sink is not None:
        p = p[..., :-1]
    return torch.einsum("hqk,khd->qhd", p, vf)


#: Every call of :func:`flash_standin`: its keyword arguments (tests read what the kernel was asked).
FLASH_CALLS: list = []


def flash_standin(q, k, v, *, causal=False, softmax_scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                  max_seqlen_q=None, max_seqlen_k=None, window_size=(-1, -1), softcap=0.0, learnable_sink=None,
                  deterministic=False):
    """flash_attn's contract in torch (float32): dense (B, S, H, D) or packed (total, H, D) with
    cu_seqlens; GQA, bottom-right causal, windows, softcap, sinks; the arguments pass flash_attn's own
    checks but the device one (the views of HF's tensors need no copy)."""
    FLASH_CALLS.append(dict(causal=causal, softmax_scale=softmax_scale, cu_seqlens_q=cu_seqlens_q,
                            cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                            window_size=window_size, softcap=softcap, learnable_sink=learnable_sink,
                            deterministic=deterministic, shapes=(tuple(q.shape), tuple(k.shape))))
    packed = cu_seqlens_q is not None
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        if packed:
            FW.validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, None, softmax_scale,
                               softcap=softcap, learnable_sink=learnable_sink)
        else:
            FW.validate(q, k, v, None, softmax_scale, softcap=softcap, learnable_sink=learnable_sink)
    FW.check_window(window_size, causal, negative=True)
    assert q.dtype in (torch.bfloat16, torch.float16) and softmax_scale is not None
    kw = dict(causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
              learnable_sink=learnable_sink)
    if not packed:
        o = torch.stack([attention_reference(q[b], k[b], v[b], **kw) for b in range(q.shape[0])])
        return o.to(q.dtype)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    o = torch.zeros(q.shape, dtype=torch.float32)
    for b in range(len(cq) - 1):
        assert cq[b + 1] - cq[b] <= max_seqlen_q and ck[b + 1] - ck[b] <= max_seqlen_k
        if cq[b + 1] > cq[b]:
            o[cq[b]:cq[b + 1]] = attention_reference(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]], **kw)
    return o.to(q.dtype)


@pytest.fixture
def cpu_as_gpu(monkeypatch):
    """CPU tensors take a GPU's routes: decode_attn runs its CPU path, flash_attn a torch stand-in."""
    monkeypatch.setattr(S, "_KERNEL_DEVICES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(FW, "flash_attn", flash_standin)
    FLASH_CALLS.clear()


#: family -> (config class name, the family's own settings): tiny random models, no download.  The
#: softcap and the sinks are strong enough to change every row (a random init leaves sinks at 0).
FAMILIES = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", dict(sliding_window=64)),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {}),
    "gemma2": ("Gemma2Config", dict(sliding_window=64, attn_logit_softcapping=0.05)),
    "gemma3": ("Gemma3TextConfig", dict(sliding_window=64)),
    # every expert on every token: a top-k router is a discontinuity (a near-tie between the k-th and the
    # next expert flips on bf16 noise and moves the logits by ~1), which compares routers, not attention
    # (profiles/NOTES-decode.md, session 22: margin 0.004, flipped by a 0.006 router-logit difference)
    "gpt_oss": ("GptOssConfig", dict(sliding_window=64, num_local_experts=4, num_experts_per_tok=4)),
}
SINK_MEAN, SINK_STD = 2.0, 2.0


def tiny_model(family="llama", dtype=torch.float32, attn="eager", seed=0, **over):
    """A tiny random model of ``family`` (GQA 4/2, head dim 64 unless ``over`` says otherwise); gpt-oss's
    sinks drawn from N(2, 2)."""
    cls_name, own = FAMILIES[family]
    kw = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, vocab_size=512)
    kw.update(own)
    kw.update(over)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(getattr(transformers, cls_name)(**kw), attn_implementation=attn,
                                             dtype=dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("self_attn.sinks"):
                p.normal_(SINK_MEAN, SINK_STD)
    return model


def tiny_llama(dtype=torch.float32, attn="sdpa", seed=0, **over):
    return tiny_model("llama", dtype, attn, seed, **over)


def ours(rec):
    return [str(w.message) for w in rec if str(w.message).startswith(PREFIX)]


def generate(model, ids, mask, attn, cache, new):
    model.set_attn_implementation(attn)
    # min_new_tokens: no early stop at an EOS (the step counts are asserted); disable_compile: generate would
    # compile StaticCache decoding on CUDA, and compiled mask code cannot inspect the padding (see hf's doc)
    return model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                          cache_implementation=cache, disable_compile=True, return_dict_in_generate=True,
                          output_logits=True, pad_token_id=0)


def assert_same_generation(ref, out, rel_tol=0.03):
    """The rule: the tokens are identical up to the first step where they differ (if any); at every
    step up to and including that one, the logits (same inputs there) agree within ``rel_tol`` of the
    reference's largest logit magnitude (bf16 tolerance: 2^-8 relative rounding compounded over the
    layers); and a divergence is allowed only at a near-tie: the two chosen tokens' reference logits
    within that same tolerance of each other.  After a divergence the inputs differ: nothing more is
    compared."""
    seq_r, seq_o = ref.sequences, out.sequences
    assert seq_r.shape == seq_o.shape
    n_new = len(ref.logits)
    for b in range(seq_r.shape[0]):
        for step in range(n_new):
            lr, lo = ref.logits[step][b].float(), out.logits[step][b].float()
            tol = rel_tol * lr.abs().max().item()
            err = (lr - lo).abs().max().item()
            assert err <= tol, f"batch {b} step {step}: logits differ by {err} > {tol}"
            tr, to = seq_r[b, -n_new + step].item(), seq_o[b, -n_new + step].item()
            if tr != to:
                gap = (lr[tr] - lr[to]).abs().item()
                assert gap <= tol, f"batch {b} step {step}: tokens {tr} != {to} and not a near-tie ({gap} > {tol})"
                break


# ----------------------------------------------------------------------- padded / sliding-window batches
#: family -> settings that give it sliding-window layers of width ``window`` (Qwen2: layer 0 full, layer 1
#: sliding; Gemma-3: one of each; Gemma-2 and gpt-oss alternate by default; Mistral: every layer).
def sliding_settings(family, window):
    return {"llama": {}, "qwen3": {},
            "mistral": dict(sliding_window=window),
            "qwen2": dict(use_sliding_window=True, sliding_window=window, max_window_layers=1),
            "gemma2": dict(sliding_window=window),
            "gemma3": dict(sliding_window=window, layer_types=["sliding_attention", "full_attention"]),
            "gpt_oss": dict(sliding_window=window)}[family]


def window_model(family, window, dtype=torch.bfloat16, **over):
    """:func:`tiny_model` of ``family`` with its sliding layers ``window`` wide (if it has any)."""
    return tiny_model(family, dtype, **{**sliding_settings(family, window), **over})


def reference_attn(family):
    """The implementation to compare with: eager where the layers pass softcap or sinks (HF's sdpa
    refuses them), sdpa otherwise."""
    return "eager" if family in ("gemma2", "gpt_oss") else "sdpa"


def left_padded(lengths, vocab, seed=0):
    """ids and attention mask (B, max(lengths)) of prompts of ``lengths`` tokens, left-padded with 0."""
    T = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), T), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        mask[b, T - n:] = 1
        ids[b, :T - n] = 0
    return ids, mask
