"""Hugging Face Transformers 5.x on the kernels (:mod:`cute_kernels.integrations.hf`).

CPU: ``register()`` makes ``"cute_kernels"`` resolvable; a tiny Llama (random weights, no download)
with ``attn_implementation="cute_kernels"`` on CPU tensors falls back to HF's sdpa and equals
``attn_implementation="sdpa"`` bit for bit (no cache, DynamicCache and StaticCache generation); the
mask function builds no mask for plain causal batches, the 2-D padding slice for padded ones and
HF's dense mask otherwise; a left-padded batch runs on the kernels (packed) with no warning; the kernel routes (CPU tensors routed as a GPU's:
``decode_attn``'s CPU path and a ``flash_attn`` stand-in) generate what sdpa generates, with the
cache lengths of a StaticCache taken from the positions; ``patch_linear`` / ``unpatch_linear``.

GPU (``-m gpu``): a small Llama-architecture model (bf16, GQA 8/2, random seeded weights), prefill
of a 100-token prompt + 64 greedy decode steps with StaticCache and DynamicCache, once on sdpa and once
on cute_kernels (also with ``patch_linear``): the kernels ran (``hf_stats``: one ``flash_attn`` per
layer for the prefill, one ``decode_attn`` per layer per decode step, no fallback) and the generations
agree under :func:`assert_same_generation`'s rule.
"""

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

transformers = pytest.importorskip(
    "transformers", minversion="5",
    reason="the Hugging Face integration needs transformers>=5 (pip install -e '.[hf]')")

from transformers.masking_utils import (  # noqa: E402
    ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask, sliding_window_causal_mask_function)

from cute_kernels.attention import decode as D  # noqa: E402
from cute_kernels.integrations import hf  # noqa: E402
from cute_kernels.testing import count_launches  # noqa: E402
from cute_kernels.integrations import sdpa as S  # noqa: E402

from _hf_models import (PREFIX, assert_same_generation, cpu_as_gpu, fresh, generate,  # noqa: E402,F401
                        ours, tiny_llama, tiny_model)

gpu = pytest.mark.gpu


# -------------------------------------------------------------------------------------------- CPU
def test_register_makes_the_name_resolvable():
    assert hf.NAME in transformers.AttentionInterface()
    assert transformers.AttentionInterface()[hf.NAME] is hf.attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS[hf.NAME] is hf.mask_function
    hf.register()  # idempotent
    model = tiny_llama(attn="cute_kernels")
    assert model.config._attn_implementation == "cute_kernels"


@pytest.mark.parametrize("cache", [None, "static"])
def test_cpu_model_falls_back_and_equals_sdpa(cache):
    """CPU tensors: every call runs HF's sdpa (one warning); the logits equal sdpa's bit for bit, also
    in generation (a StaticCache's decode gets the same dense mask sdpa's mask function builds)."""
    model = tiny_llama()
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
        model.set_attn_implementation("cute_kernels")
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            out = model(ids).logits
            gen = generate(model, ids, torch.ones_like(ids), "cute_kernels", cache, 6)
        gref = generate(model, ids, torch.ones_like(ids), "sdpa", cache, 6)
    assert torch.equal(out, ref)
    assert torch.equal(gen.sequences, gref.sequences)
    for a, b in zip(gen.logits, gref.logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert ours(rec) == [f"{PREFIX} running transformers' sdpa attention: {S.R_DEVICE}"]
    assert hf.hf_stats["flash_attn"] == hf.hf_stats["decode_attn"] == 0 and hf.hf_stats["fallback"] > 0


def test_mask_function_builds_no_mask_for_plain_causal():
    ones = torch.ones(2, 12, dtype=torch.bool)
    assert hf.mask_function(2, 12, 12) is None
    assert hf.mask_function(2, 12, 12, attention_mask=ones) is None
    assert hf.mask_function(2, 1, 40, q_offset=39, attention_mask=torch.ones(2, 40, dtype=torch.bool)) is None
    assert hf.mask_function(2, 1, 64, q_offset=torch.tensor(39), attention_mask=torch.ones(2, 40, dtype=torch.bool),
                            allow_is_causal_skip=False) is None  # a StaticCache decode step
    left = ones.clone()
    left[0, :3] = False
    m = hf.mask_function(2, 12, 12, attention_mask=left)  # padding: the 2-D mask over the keys
    assert torch.equal(m, left)
    sw = sliding_window_causal_mask_function(4)  # the attention function applies the window itself
    assert hf.mask_function(2, 12, 12, mask_function=sw, attention_mask=ones, local_size=4) is None
    m = hf.mask_function(2, 12, 12, mask_function=sw, attention_mask=ones, local_size=5)  # not HF's window
    assert m is not None and m.shape == (2, 1, 12, 12) and not m[0, 0, 11, 0]
    assert torch.equal(m, sdpa_mask(batch_size=2, q_length=12, kv_length=12, attention_mask=ones, mask_function=sw,
                                    allow_is_causal_skip=False))
    # through the model's own entry point
    cfg = tiny_llama(attn="cute_kernels").config
    from transformers.masking_utils import create_causal_mask

    emb = torch.zeros(2, 12, 8)
    assert create_causal_mask(cfg, emb, ones, None) is None
    assert torch.equal(create_causal_mask(cfg, emb, left, None), left)


@pytest.mark.usefixtures("cpu_as_gpu")
def test_left_padded_batch_runs_on_the_kernels():
    """Prefill packed on flash_attn, each decode step on decode_attn reading the cache in place with
    cache_leftpad (one layer call per layer and step)."""
    model = tiny_llama(torch.bfloat16)
    ids = torch.randint(1, 512, (2, 20), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    ids[1, :5] = 0
    with torch.no_grad(), warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = generate(model, ids, mask, "cute_kernels", None, 5)
        ref = generate(model, ids, mask, "sdpa", None, 5)
    assert ours(rec) == []
    assert hf.hf_stats == {"flash_attn": 2, "decode_attn": 4 * 2, "fallback": 0}
    assert_same_generation(ref, out)


@pytest.mark.usefixtures("cpu_as_gpu")
@pytest.mark.parametrize("cache", [None, "static"])
def test_kernel_routes_generate_what_sdpa_generates(monkeypatch, cache):
    """The routing and the lengths on CPU tensors: prefill on flash_attn (a StaticCache's buffer sliced
    to the valid keys), each decode step on decode_attn reading the cache in place with lengths from
    the positions (a StaticCache's buffer is longer than the valid keys)."""
    model = tiny_llama(torch.bfloat16)
    ids = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(3))
    seen = []
    orig = D.decode_attn

    def spy(q, k, v, **kw):
        seen.append((k.shape[1], kw["cache_seqlens"].tolist(), k.data_ptr()))
        return orig(q, k, v, **kw)

    monkeypatch.setattr(D, "decode_attn", spy)
    with torch.no_grad():
        ref = generate(model, ids, torch.ones_like(ids), "sdpa", cache, 12)
        out = generate(model, ids, torch.ones_like(ids), "cute_kernels", cache, 12)
    assert hf.hf_stats == {"flash_attn": 2, "decode_attn": 11 * 2, "fallback": 0}
    for i, (cap, lens, _) in enumerate(seen):
        assert lens == [40 + 1 + i // 2] * 2  # every cached token including the new one
        assert cap == (40 + 12 - 1 if cache == "static" else lens[0])
    if cache == "static":  # the same static buffer, read in place, every step
        assert len({p for *_, p in seen[0::2]}) == 1
    assert_same_generation(ref, out)


@pytest.mark.usefixtures("cpu_as_gpu")
def test_unsupported_layer_arguments_fall_back():
    """output_attentions goes to the model's eager attention, dropout to HF's sdpa, plain calls and
    softcapping to the kernels (every keyword, path by path: test_hf_fallback.py)."""
    attn = tiny_model("gemma2", torch.bfloat16).model.layers[0].self_attn
    q, k = torch.randn(1, 4, 8, 64, dtype=torch.bfloat16), torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    with pytest.warns(UserWarning, match="eager attention: output_attentions=True"):
        o, w = hf.attention_forward(attn, q, k, k, None, scaling=0.125, softcap=30.0, output_attentions=True)
    assert o.shape == (1, 8, 4, 64) and w is not None and hf.hf_stats["fallback"] == 1
    with pytest.warns(UserWarning, match="sdpa attention: dropout"):
        hf.attention_forward(attn, q, k, k, None, dropout=0.1, scaling=0.125)
    o, _ = hf.attention_forward(attn, q, k, k, None, scaling=0.125)  # runs the flash_attn stand-in
    hf.attention_forward(attn, q, k, k, None, scaling=0.125, softcap=30.0)
    assert hf.hf_stats["flash_attn"] == 2 and o.shape == (1, 8, 4, 64)


@pytest.mark.usefixtures("cpu_as_gpu")
def test_static_buffer_without_positions_raises():
    model = tiny_llama(torch.bfloat16)
    attn = model.model.layers[0].self_attn
    q, k = torch.randn(1, 4, 1, 64, dtype=torch.bfloat16), torch.zeros(1, 2, 32, 64, dtype=torch.bfloat16)
    o, _ = hf.attention_forward(attn, q, k, k, None, scaling=0.125)  # not a static buffer: all 32 keys
    assert o.shape == (1, 1, 4, 64) and hf.hf_stats["decode_attn"] == 1
    torch._dynamo.mark_static_address(k)
    with pytest.raises(ValueError, match="static cache buffer"):
        hf.attention_forward(attn, q, k, k, None, scaling=0.125)


def test_patch_linear_counts_and_unpatches():
    model = tiny_llama(torch.bfloat16)
    extra = nn.Linear(8, 8, bias=True).to(torch.bfloat16)
    fp32 = nn.Linear(8, 8, bias=False)
    model.extra, model.fp32 = extra, fp32
    ids = torch.randint(0, 512, (1, 10))
    with torch.no_grad():
        ref = model(ids).logits
    assert hf.patch_linear(model) == 0  # on the CPU: nothing (the default wants CUDA weights)
    n = hf.patch_linear(model, require_cuda=False)
    assert n == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer + lm_head
    assert hf.patch_linear(model, require_cuda=False) == 0  # already patched
    assert "forward" in model.lm_head.__dict__ and "forward" not in extra.__dict__ and "forward" not in fp32.__dict__
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)  # CPU inputs: the patched forward runs F.linear
    assert hf.unpatch_linear(model) == n
    assert "forward" not in model.lm_head.__dict__ and hf.unpatch_linear(model) == 0


def test_patched_linear_keeps_nothing_of_its_weight():
    """The patched forward keeps no view of the weight on the module (it would keep the weight's memory
    alive after ``weight.data = ...`` or Accelerate moving it): after a call, replacing the weight
    frees the old one's memory."""
    import gc
    import weakref

    lin = nn.Linear(64, 96, bias=False).to(torch.bfloat16)
    assert hf.patch_linear(lin, require_cuda=False) == 1
    with torch.no_grad():
        lin(torch.randn(3, 64, dtype=torch.bfloat16))  # (CPU: F.linear; the module's state is what counts)
    old = weakref.ref(lin.weight)
    lin.weight = nn.Parameter(torch.randn(96, 64, dtype=torch.bfloat16))
    gc.collect()
    assert old() is None and set(lin.__dict__) - set(nn.Linear(1, 1).__dict__) == {"_cute_kernels_orig_forward", "forward"}
    assert hf.unpatch_linear(lin) == 1


def test_import_cute_kernels_does_not_import_transformers():
    import subprocess
    import sys

    code = "import cute_kernels, cute_kernels.integrations.hf, sys; print('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


# -------------------------------------------------------------------------------------------- GPU
GPU_CASES = [  # (cache, head_dim, patch linears)
    ("static", 64, False),
    ("dynamic", 64, False),
    ("static", 128, True),
    ("dynamic", 128, True),
]


@gpu
def test_patched_linear_follows_its_weight():
    """A weight replaced by a new Parameter, rebound with ``.data =`` (new memory, or the same memory
    viewed with fewer rows), or written in place is the one the patched forward uses (against F.linear
    in float32): nothing derived from an earlier weight may outlive it."""
    g = torch.Generator().manual_seed(7)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16).cuda()

    lin = nn.Linear(256, 384, bias=False).to(torch.bfloat16).cuda().requires_grad_(False)
    assert hf.patch_linear(lin) == 1
    xs = rand(3, 1, 256), rand(1, 1, 256)  # (one token: M = 1, a canonical-stride view in gemm's launcher)

    def check(what):
        for x in xs:
            with count_launches() as n:
                y = lin(x)
            assert n["gemm"] == 1, what
            ref = F.linear(x.float(), lin.weight.float())
            assert y.shape == (*x.shape[:2], lin.weight.shape[0]), what
            assert torch.allclose(y.float(), ref, atol=3e-2, rtol=2e-2), what

    check("first call")
    check("second call")
    lin.weight = nn.Parameter(rand(384, 256), requires_grad=False)
    check("a new Parameter")
    lin.weight.data = rand(384, 256)
    check("weight.data rebound")
    with torch.no_grad():
        lin.weight.copy_(rand(384, 256))
    check("written in place")
    lin.weight.data = lin.weight.data[:320]  # the same memory, fewer rows
    check("the same memory, fewer rows")
    assert hf.unpatch_linear(lin) == 1


@gpu
def test_patched_linear_weight_requiring_grad_takes_the_guard():
    """A model's weights require grad (Transformers' default) and decode runs under no_grad: the patched
    forward's ``w.t()`` requires grad too, and gemm still arms each weight's entry (a guard recording it,
    taken with grad mode off), so the calls take the guard path (against F.linear in float32 on every
    call, alternating weights, M = 1 and 3)."""
    from cute_kernels.gemm import host as GH

    g = torch.Generator().manual_seed(8)
    lins = [nn.Linear(256, n, bias=False).to(torch.bfloat16).cuda() for n in (384, 128, 384)]
    assert all(lin.weight.requires_grad for lin in lins) and sum(hf.patch_linear(lin) for lin in lins) == 3
    xs = [torch.randn(m, 1, 256, generator=g).to(torch.bfloat16).cuda() for m in (1, 3)]
    with torch.no_grad():
        for x in xs:
            for step in range(4):
                for lin in lins:
                    y = lin(x)
                    ref = F.linear(x.float(), lin.weight.float())
                    assert y.shape == ref.shape and torch.allclose(y.float(), ref, atol=3e-2, rtol=2e-2)
            for lin in lins:  # (armed by now: the guard of a, the kept b and no out)
                entry = GH._launchers.armed.get(lin.weight.data_ptr())
                assert entry is not None and entry[2] is not None
    for lin in lins:
        hf.unpatch_linear(lin)


@gpu
@pytest.mark.parametrize("cache,head_dim,patch", GPU_CASES)
def test_llama_generate_on_the_kernels(cache, head_dim, patch):
    """Prefill of a 100-token prompt + 64 greedy decode steps (max_new_tokens=65), sdpa vs cute_kernels."""
    L, new = 4, 65
    model = tiny_llama(torch.bfloat16, hidden_size=512, intermediate_size=1024, num_hidden_layers=L,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=head_dim, vocab_size=1000).cuda()
    ids = torch.randint(0, 1000, (2, 100), generator=torch.Generator().manual_seed(4)).cuda()
    mask = torch.ones_like(ids)
    cache_impl = "static" if cache == "static" else None
    with torch.no_grad():
        ref = generate(model, ids, mask, "sdpa", cache_impl, new)
        if patch:
            assert hf.patch_linear(model) == L * 7 + 1
        hf.reset_stats()
        out = generate(model, ids, mask, "cute_kernels", cache_impl, new)
        if patch:
            assert hf.unpatch_linear(model) == L * 7 + 1
    assert hf.hf_stats == {"flash_attn": L, "decode_attn": (new - 1) * L, "fallback": 0}, hf.hf_stats
    assert_same_generation(ref, out)
    same = (ref.sequences == out.sequences).float().mean().item()
    print(f"{cache} D={head_dim} patch={patch}: {same:.1%} identical tokens")


@gpu
def test_left_padded_batch_on_the_gpu_runs_on_the_kernels():
    """The prefill packed on flash_attn, the 7 decode steps on decode_attn reading the StaticCache in place
    (cache_leftpad)."""
    model = tiny_llama(torch.bfloat16, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=64, vocab_size=1000).cuda()
    ids = torch.randint(1, 1000, (2, 40), generator=torch.Generator().manual_seed(5)).cuda()
    mask = torch.ones_like(ids)
    mask[0, :7], ids[0, :7] = 0, 0
    with torch.no_grad(), warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        ref = generate(model, ids, mask, "sdpa", "static", 8)
        out = generate(model, ids, mask, "cute_kernels", "static", 8)
    assert ours(rec) == []
    assert_same_generation(ref, out)
    assert hf.hf_stats == {"flash_attn": 2, "decode_attn": 7 * 2, "fallback": 0}


def _train(make, ids, runs, steps, mask=None):
    """``{run: [loss per step]}``: ``steps`` AdamW steps (lr 1e-3) on the one batch ``ids`` (with the
    padding ``mask``, if any: padded positions get no label) for each run
    (``"sdpa"``, ``"cute_kernels"``, ``"cute_kernels+linear"``: with ``patch_linear``) of ``make(attn)``
    (the same init each time); on the kernels, every layer's attention ran forward and backward at every
    step (``hf_stats``, launch counts) and, with ``+linear``, the GEMMs forward and backward."""
    losses = {}
    labels = ids if mask is None else ids.masked_fill(~mask.bool(), -100)
    for run in runs:
        attn = run.split("+")[0]
        model = make(attn).cuda().train()
        L = model.config.num_hidden_layers
        if run.endswith("+linear"):
            assert hf.patch_linear(model) == L * 7 + 1
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        hf.reset_stats()
        with count_launches() as n:
            for _ in range(steps):
                loss = model(ids, attention_mask=mask, labels=labels).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.setdefault(run, []).append(loss.item())
        if attn == "cute_kernels":
            assert hf.hf_stats == {"flash_attn": steps * L, "decode_attn": 0, "fallback": 0}, hf.hf_stats
            assert n["flash_attn"] == steps * L and n["flash_attn_backward"] == steps * L, n.as_dict()
        if run.endswith("+linear"):  # forward (7 per layer + lm_head) and backward (two per weight) GEMMs
            assert n["gemm"] >= steps * (L * 7 + 1) * 2, n.as_dict()
    return losses


def _assert_same_losses(losses, tol=0.02):
    ref = losses["sdpa"]
    for run, got in losses.items():
        rel = [abs(a - b) / abs(a) for a, b in zip(ref, got)]
        print(f"losses sdpa {[round(x, 4) for x in ref]} {run} {[round(x, 4) for x in got]} "
              f"max relative difference {max(rel):.4f}")
        assert ref[-1] < ref[0] and got[-1] < got[0]  # it learns
        assert max(rel) < tol, (run, rel)


@gpu
def test_llama_trains_on_the_kernels():
    """20 AdamW steps of a tiny Llama (bf16, random init, one batch of 4 x 128 tokens, memorized) with
    cute_kernels (with and without ``patch_linear``) and with sdpa from the same init and data: every layer's attention ran forward and backward on the kernels
    at every step, and the losses agree step by step within 2% (bf16 attention gradients differ in
    rounding between the two; 20 steps of AdamW at lr 1e-3 keep the trajectories close)."""
    ids = torch.randint(0, 1000, (4, 128), generator=torch.Generator().manual_seed(9)).cuda()  # one batch: learnable
    _assert_same_losses(_train(lambda attn: tiny_llama(
        torch.bfloat16, attn=attn, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, vocab_size=1000), ids, ("sdpa", "cute_kernels", "cute_kernels+linear"), 20))


@gpu
def test_sliding_window_model_trains_on_the_kernels():
    """The same for a tiny Mistral whose 64-key sliding window is shorter than the 200-token batch: the
    windowed forward and backward (``window_size=(63, 0)``) on every layer and step, losses within 2%
    of sdpa's (HF's sliding-window mask)."""
    ids = torch.randint(0, 1000, (2, 200), generator=torch.Generator().manual_seed(10)).cuda()
    _assert_same_losses(_train(lambda attn: tiny_model(
        "mistral", torch.bfloat16, attn=attn, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1000, sliding_window=64),
        ids, ("sdpa", "cute_kernels"), 15))


@gpu
def test_padded_batch_trains_on_the_kernels():
    """A left-padded batch (4 sequences of 128, 100, 77 and 31 tokens in 128 columns) trains on the packed
    forward and backward (no fallback: every layer, every step), losses within 2% of sdpa's (its
    padding mask)."""
    ids = torch.randint(0, 1000, (4, 128), generator=torch.Generator().manual_seed(11)).cuda()
    mask = torch.zeros(4, 128, dtype=torch.long, device="cuda")
    for b, n in enumerate((128, 100, 77, 31)):
        mask[b, 128 - n:] = 1
    _assert_same_losses(_train(lambda attn: tiny_llama(
        torch.bfloat16, attn=attn, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, vocab_size=1000), ids, ("sdpa", "cute_kernels"), 15, mask=mask))


@gpu
def test_packed_keywords_batch_matches_sequences_one_by_one():
    """A padding-free batch (one row of 3 packed sequences, ``position_ids`` restarting per sequence,
    ``cu_seq_lens_q/k`` and ``max_length_q/k`` as a flattening collator passes them) runs every layer on one
    packed flash_attn call, forward and backward; each sequence's logits equal those of the sequence run
    alone on sdpa (bf16 rounding), and the loss's gradients reach the weights."""
    lens = [50, 1, 77]
    torch.manual_seed(12)
    seqs = [torch.randint(0, 1000, (n,), device="cuda") for n in lens]
    make = lambda attn: tiny_llama(torch.bfloat16, attn=attn, hidden_size=256, intermediate_size=512,  # noqa: E731
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   vocab_size=1000).cuda()
    ref = make("sdpa")
    with torch.no_grad():
        want = [ref(s[None]).logits[0].float() for s in seqs]
    model = make("cute_kernels").train()
    ids = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(n, device="cuda") for n in lens])[None]
    cu = torch.tensor([0, 50, 51, 128], dtype=torch.int32, device="cuda")
    hf.reset_stats()
    with count_launches() as n:
        out = model(ids, position_ids=pos, labels=ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=77,
                    max_length_k=77)
        out.loss.backward()
    L = model.config.num_hidden_layers
    assert hf.hf_stats == {"flash_attn": L, "decode_attn": 0, "fallback": 0}, hf.hf_stats
    assert n["flash_attn"] == L and n["flash_attn_backward"] == L, n.as_dict()
    got = out.logits[0].float().detach().split(lens)
    for g, w in zip(got, want):
        assert (g - w).abs().max().item() < 0.05 * w.abs().max().item()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


def test_valid_lengths_computed_once_per_step():
    """The lengths from ``cache_position`` / ``position_ids``: computed by the first layer of a step and
    shared by the next ones (the same unchanged source tensor); recomputed for another source, batch,
    dtype, or a source changed in place (a static ``cache_position`` buffer advanced by ``add_``)."""
    cp = torch.tensor([10, 11, 12])
    a = hf._valid_lengths(dict(cache_position=cp), 2, 20, cp.device, torch.int32)
    assert a.tolist() == [13, 13] and a.dtype == torch.int32
    assert hf._valid_lengths(dict(cache_position=cp), 2, 20, cp.device, torch.int32) is a  # the next layer
    assert hf._valid_lengths(dict(cache_position=cp), 3, 20, cp.device, torch.int32).tolist() == [13] * 3
    assert hf._valid_lengths(dict(cache_position=cp), 2, 20, cp.device).dtype == torch.int64
    cp.add_(1)
    assert hf._valid_lengths(dict(cache_position=cp), 2, 20, cp.device, torch.int32).tolist() == [14, 14]
    pos = torch.tensor([[4, 5], [7, 8]])
    assert hf._valid_lengths(dict(position_ids=pos), 2, 20, cp.device).tolist() == [6, 9]
    assert hf._valid_lengths(dict(position_ids=torch.tensor([[4, 5], [7, 9]])), 2, 20, cp.device).tolist() == [6, 10]
    assert hf._valid_lengths({}, 2, 20, cp.device) is None


def test_deterministic_follows_the_layer_hf_and_torch(monkeypatch):
    """The backward's deterministic mode for a layer: its ``deterministic`` keyword, else HF's
    ``FLASH_ATTENTION_DETERMINISTIC=1`` or ``torch.use_deterministic_algorithms(True)``; the keyword is
    honoured by the kernels (no fallback)."""
    monkeypatch.delenv("FLASH_ATTENTION_DETERMINISTIC", raising=False)
    assert hf._deterministic({}) is False
    assert hf._deterministic({"deterministic": True}) is True
    monkeypatch.setenv("FLASH_ATTENTION_DETERMINISTIC", "1")
    assert hf._deterministic({}) is True and hf._deterministic({"deterministic": False}) is False
    monkeypatch.delenv("FLASH_ATTENTION_DETERMINISTIC")
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert hf._deterministic({}) is True
    finally:
        torch.use_deterministic_algorithms(before)
    assert hf.fallback_path({"deterministic": True}) is None
