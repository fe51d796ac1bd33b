"""The model families of ``cute-kernels bench model`` (:mod:`cute_kernels.tools.bench_model_families`).

CPU: the family configs (shapes, ``sliding_window``), the sliding layers' cache sizes and read bytes,
``--family`` parsing; on a tiny Mistral (window 16): the benchmark's pre-filled StaticCache holds its
sliding buffers in the layout HF's own prefill of ctx tokens leaves (the last W positions in order),
and a decode step on it gives the logits of a real ``model(prefill_ids)`` prefill + step (every side),
reading exactly the last W keys; ``run_point`` end to end; the record's name and ``records.load``.
"""

import json

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", minversion="5",
    reason="the Hugging Face integration needs transformers>=5 (pip install -e '.[hf]')")

from cute_kernels.integrations import hf
from cute_kernels.integrations import sdpa as S
from cute_kernels.tools import bench_model as BM
from cute_kernels.tools import bench_model_families as F
from cute_kernels.tools.bench import records
from test_bench_model import TINY, registered  # noqa: F401  (the tiny shapes; the autouse fixture)

W = 16


@pytest.fixture
def cpu_as_gpu(monkeypatch):
    """CPU tensors take a GPU's routes (decode_attn runs its CPU path)."""
    monkeypatch.setattr(S, "_KERNEL_DEVICES", ("cuda", "meta", "cpu"))


def tiny(dtype=torch.float32, layers=2, window=W):
    return BM.build_model(F.mistral_config(layers, **TINY, sliding_window=window), "cpu", dtype)


def real_prefill(model, ids):
    """HF's own StaticCache after ``model(ids)`` (capacity ctx + EXTRA_SLOTS, as the benchmark's)."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=ids.shape[1] + BM.EXTRA_SLOTS)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    return cache


# ----------------------------------------------------------------------------------------- configs
def test_family_configs():
    ll, mi = F.family_config("llama", 32), F.family_config("mistral", 32)
    assert type(ll).__name__ == "LlamaConfig" and getattr(ll, "sliding_window", None) is None
    assert type(mi).__name__ == "MistralConfig" and mi.sliding_window == F.MISTRAL_WINDOW == 4096
    for c in (ll, mi):
        assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size,
                c.vocab_size, c.num_hidden_layers) == (4096, 32, 8, 128, 14336, 128256, 32)
    assert BM.llama_config is F.llama_config and BM.LLAMA3_8B is F.LLAMA3_8B
    assert F.model_meta("mistral", 4)["sliding_window"] == 4096 and "sliding_window" not in F.model_meta("llama", 4)
    with pytest.raises(ValueError, match="unknown model family"):
        F.family_config("gemma", 2)


def test_static_cache_of_the_mistral_config_has_window_sized_sliding_layers():
    cfg = F.mistral_config(2)
    for ctx, slots in ((32768, 4096), (4096, 4096), (1000, 1000 + BM.EXTRA_SLOTS)):
        cache = transformers.StaticCache(config=cfg, max_cache_len=ctx + BM.EXTRA_SLOTS)
        assert [layer.max_cache_len for layer in cache.layers] == [slots] * 2
        assert all(layer.is_sliding for layer in cache.layers)
        assert F.cache_len(cfg, ctx + BM.EXTRA_SLOTS) == slots
    assert F.cache_len(F.llama_config(2), 32776) == 32776


def test_read_bytes_count_the_window():
    mi, ll = F.mistral_config(4), F.llama_config(4)
    per_pos = 8 * 128 * 2 * 2 * 4  # KV heads x head dim x (K, V) x bf16 x layers
    assert BM.kv_bytes(ll, 2, 32768) == 2 * 32769 * per_pos
    assert BM.kv_bytes(mi, 2, 32768) == 2 * 4096 * per_pos  # the new token and the 4095 before it
    assert BM.kv_bytes(mi, 2, 4096) == 2 * 4096 * per_pos and BM.kv_bytes(mi, 2, 1000) == 2 * 1001 * per_pos


def test_family_argument():
    assert BM.parse_args([]).family == "llama"
    assert BM.parse_args(["--quick", "--family", "mistral"]).family == "mistral"


def test_bad_family_exits_2_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        BM.parse_args(["--family", "gemma"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--family" in err


# ------------------------------------------------------------------------------------------ cache
@pytest.mark.parametrize("ctx", [40, W, 10])  # full, exactly full, not yet full
def test_prefilled_cache_matches_hf_prefill_layout(ctx):
    model = tiny()
    cache, lengths = BM.make_cache(model, 2, ctx)
    real = real_prefill(model, torch.randint(0, 512, (2, ctx), generator=torch.Generator().manual_seed(1)))
    for ours, theirs in zip(cache.layers, real.layers):
        assert type(ours) is type(theirs) and ours.is_sliding
        assert ours.keys.shape == theirs.keys.shape == (2, 2, min(W, ctx + BM.EXTRA_SLOTS), 64)
        assert ours.cumulative_length_int == theirs.cumulative_length_int == ctx
        assert ours.get_mask_sizes(1) == theirs.get_mask_sizes(1)
        n = min(ctx, ours.keys.shape[2])  # slots HF's prefill filled
        assert (ours.keys[:, :, :n].abs().amax(dim=(0, 1, 3)) > 0).all() and not ours.keys[:, :, n:].any()
        assert theirs.keys[:, :, :n].abs().amax(dim=(0, 1, 3)).gt(0).all() and not theirs.keys[:, :, n:].any()
    assert lengths.tolist() == [ctx] * 2


def test_hf_prefill_keeps_the_last_w_positions_in_order():
    """Layer 0's keys do not depend on the window: HF's sliding buffer after a prefill of ctx tokens
    holds positions ctx - W .. ctx - 1 of the same model's full (window-less) cache, in order."""
    model, ctx = tiny(), 40
    full = BM.build_model(F.mistral_config(2, **TINY, sliding_window=None), "cpu", torch.float32)
    full.load_state_dict(model.state_dict())
    ids = torch.randint(0, 512, (2, ctx), generator=torch.Generator().manual_seed(2))
    sliding, every = real_prefill(model, ids), real_prefill(full, ids)
    assert not every.layers[0].is_sliding and every.layers[0].keys.shape[2] == ctx + BM.EXTRA_SLOTS
    torch.testing.assert_close(sliding.layers[0].keys, every.layers[0].keys[:, :, ctx - W:ctx])
    torch.testing.assert_close(sliding.layers[0].values, every.layers[0].values[:, :, ctx - W:ctx])


@pytest.mark.parametrize("side", BM.SIDES)
@pytest.mark.parametrize("ctx", [40, 10])
def test_decode_step_matches_a_real_prefill(cpu_as_gpu, side, ctx):
    """The benchmark's cache with HF's prefilled K/V copied in (same slots) gives a real step's logits;
    a full buffer's step reads exactly the last W keys (slot 0, position ctx - W, drops out).  Ours in
    bf16 (the kernels' dtypes: ``decode_attn``'s CPU path on every layer), the PyTorch sides in fp32."""
    model, B = tiny(torch.bfloat16 if side == BM.OURS else torch.float32), 2
    ids = torch.randint(0, 512, (B, ctx), generator=torch.Generator().manual_seed(3))
    real = real_prefill(model, ids)
    cache, lengths = BM.make_cache(model, B, ctx)
    for ours, theirs in zip(cache.layers, real.layers):
        ours.keys.copy_(theirs.keys)
        ours.values.copy_(theirs.values)
    step, restore = BM.DecodeStep(model, cache, lengths, B, ctx), F.snapshot(cache)
    BM.activate(model, BM.HF_SDPA)
    with torch.no_grad():
        ref = model(input_ids=step.ids, position_ids=step.pos, past_key_values=real, use_cache=True).logits
    BM.activate(model, side, ctx + 1)
    hf.reset_stats()
    out = step()
    if side == BM.OURS:
        assert hf.hf_stats == {"flash_attn": 0, "decode_attn": 2, "fallback": 0}
        assert (out.float() - ref.float()).abs().max() < 0.03 * ref.float().abs().max()
    else:
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    restore()
    torch.testing.assert_close(step(), out, atol=0, rtol=0)  # restored: the same step again
    if ctx > W:
        restore()
        cache.layers[0].keys[:, :, 0] = 1e4  # position ctx - W: outside the window
        torch.testing.assert_close(step(), out, atol=0, rtol=0)
        restore()
        cache.layers[0].keys[:, :, 1] += 1  # position ctx - W + 1: the oldest key in it
        assert (step().float() - out.float()).abs().max() > 1e-3
    BM.activate(model, BM.HF_SDPA)


def test_full_buffer_step_is_capturable_and_hf_s_update(monkeypatch):
    """The benchmark's sliding layers update a full buffer as HF's own update does (bitwise), without
    building a tensor from host data inside the step (what CUDA-graph capture refused)."""
    model, ctx = tiny(), 40
    cache, _ = BM.make_cache(model, 2, ctx)
    layer = cache.layers[0]
    assert "update" in vars(layer)
    plain = type(layer)(max_cache_len=layer.max_cache_len + 2 * W, sliding_window=W)  # HF's, same state
    plain.lazy_initialization(layer.keys, layer.values)
    plain.keys.copy_(layer.keys)
    plain.values.copy_(layer.values)
    plain.cumulative_length_int = ctx
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        k, v = (torch.randn(2, 2, 1, 64, generator=gen) for _ in range(2))
        want = plain.update(k, v)
        with monkeypatch.context() as m:
            m.setattr(torch, "tensor", lambda *a, **kw: pytest.fail("torch.tensor inside the step"))
            got = layer.update(k, v)
        assert got[0] is layer.keys and got[1] is layer.values
        torch.testing.assert_close(got, want, atol=0, rtol=0)
        assert layer.cumulative_length_int == plain.cumulative_length_int
    ours = vars(layer)["update"]
    F.sliding_layers(cache, ctx)  # again (every DecodeStep does): the override is not wrapped twice
    assert vars(layer)["update"] is ours and layer.cumulative_length_int == ctx


def test_run_point_on_cpu_runs_every_side(cpu_as_gpu):
    model = tiny(torch.bfloat16)
    res = BM.run_point(model, 2, 40, modes=("eager",), rounds=2, iters=2, profile_steps=0, bw_bytes_per_us=1e6,
                       log=lambda s: None)
    assert set(res["configs"]) == {f"{s}/eager" for s in BM.SIDES} and not res["notes"]
    assert res["hf_stats"] == {"flash_attn": 0, "decode_attn": 2 * 2, "fallback": 0}
    assert res["logits_vs_sdpa"][BM.HF_SDPA] == 0.0  # each side's first steps on the same keys
    assert res["logits_vs_sdpa"][BM.OURS] < 0.03 and res["logits_vs_sdpa"][BM.SDPA_GQA] < 0.03
    assert res["read_bytes"] == BM.weight_bytes(model, 2) + 2 * W * 2 * 64 * 2 * 2 * 2


# ----------------------------------------------------------------------------------------- record
def test_record_names_the_family_and_loads(cpu_as_gpu, tmp_path, monkeypatch):
    monkeypatch.setenv("CK_COMMIT", "abc1234def")
    model = tiny(torch.bfloat16, layers=1)
    p = BM.run_point(model, 1, 40, rounds=1, iters=1, profile_steps=0, bw_bytes_per_us=2e6, log=lambda s: None)
    stems = {}
    for family in F.FAMILIES:
        args = BM.parse_args(["--quick", "--layers", "1", "--family", family])
        doc = {"meta": BM.run_meta(args, 1), "bandwidth": {"bound_TBps": 2.0, "how": "test"}, "points": [p],
               "summary": BM.summarize([p])}
        stems[family] = BM.write_results(doc, str(tmp_path)).rsplit("/", 1)[1]
    date = stems["llama"].split("-", 2)[2][:10]
    assert stems == {"llama": f"model-decode-{date}-abc1234", "mistral": f"model-decode-mistral-{date}-abc1234"}
    for family, stem in stems.items():
        back = json.loads((tmp_path / f"{stem}.json").read_text())
        assert back["meta"]["family"] == family
        assert (back["meta"]["model"].get("sliding_window") == 4096) == (family == "mistral")
        doc = records.load(tmp_path / f"{stem}.json")
        assert doc["kind"] == "model-decode" and doc["meta"]["family"] == family
        assert doc["meta"]["commit"] == "abc1234def" and doc["meta"]["date"] == date
        assert doc["rows"][0]["shape"] == "b1_ctx40" and doc["source"] == f"{stem}.json"
    md = (tmp_path / f"{stems['mistral']}.md").read_text()
    assert md.startswith("# End-to-end decode: Mistral (Llama-3-8B shapes, sliding window 4096), 1 layers")


def test_gpu_session_runs_the_mistral_family():
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / "profiles" / "gpu_session.sh").read_text()
    (line,) = [ln for ln in script.splitlines() if ln.strip().startswith("bench-model-mistral)")]
    assert "profiles/bench_model.py --family mistral" in line and "bench-model-mistral.log" in line
    assert "#   bench-model-mistral " in script.split("set -o pipefail", 1)[0]
