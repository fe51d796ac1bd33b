"""Helpers shared by the Hugging Face integration tests: tiny random models of each family, the
``cpu_as_gpu`` routing fixture (CPU tensors take a GPU's routes), generation and its comparison rule."""

import pytest
import torch
import torch.nn.functional as F

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


def flash_standin(q, k, v, *, causal=False, softmax_scale=None):
    """flash_attn's contract in torch (float32): (B, S, H, D), GQA, bottom-right causal; the arguments
    pass flash_attn's own checks but the device one (the views of HF's tensors need no copy)."""
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        FW.validate(q, k, v, None, softmax_scale)
    Sq, Hq, Sk = q.shape[1], q.shape[2], k.shape[1]
    G = Hq // k.shape[2]
    assert q.dtype in (torch.bfloat16, torch.float16) and softmax_scale is not None
    mask = torch.ones(Sq, Sk, dtype=torch.bool).tril(diagonal=Sk - Sq) if causal else None
    o = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float().repeat_interleave(G, 1),
                                       v.transpose(1, 2).float().repeat_interleave(G, 1), attn_mask=mask,
                                       scale=softmax_scale)
    return o.transpose(1, 2).contiguous().to(q.dtype)


@pytest.fixture
def cpu_as_gpu(monkeypatch):
    """CPU tensors take a GPU's routes: decode_attn runs its CPU path, flash_attn a torch stand-in."""
    monkeypatch.setattr(S, "_KERNEL_DEVICES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(FW, "flash_attn", flash_standin)


#: family -> (config class name, the family's own settings): tiny random models, no download.  The
#: softcap and the sinks are strong enough to change every row (a random init leaves sinks at 0).
FAMILIES = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", dict(sliding_window=64)),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {}),
    "gemma2": ("Gemma2Config", dict(sliding_window=64, attn_logit_softcapping=0.05)),
    "gemma3": ("Gemma3TextConfig", dict(sliding_window=64)),
    "gpt_oss": ("GptOssConfig", dict(sliding_window=64, num_local_experts=4, num_experts_per_tok=2)),
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
