"""The end-to-end decode benchmark (:mod:`cute_kernels.tools.bench_model`).

CPU, on a tiny Llama (hidden 128, 2 layers, GQA 4/2, head dim 64): the pre-filled StaticCache and the
decode step at position ctx (repeatable; writes slot ctx; reads exactly ctx + 1 keys) against an
independent float64 re-implementation of the step from the weights; the three sides agree (ours
through ``decode_attn``'s CPU path); ``run_point`` end to end (eager); bytes, buckets, verdicts,
argument parsing, the no-GPU exit, the written JSON / markdown.

GPU (``-m gpu``): ``main(["--quick", "--layers", "1"])`` end to end (< 2 min with a warm compile cache).
"""

import json
import math

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", minversion="5",
    reason="the Hugging Face integration needs transformers>=5 (pip install -e '.[hf]')")

from cute_kernels.integrations import hf
from cute_kernels.integrations import sdpa as S
from cute_kernels.tools import bench_model as BM

TINY = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "vocab_size": 512, "max_position_embeddings": 4096}
CTX = 40


@pytest.fixture(autouse=True)
def registered():
    BM.register_sides()
    hf.reset_stats()
    yield
    hf.reset_stats()


def tiny(dtype=torch.float32, layers=2):
    return BM.build_model(BM.llama_config(layers, **TINY), "cpu", dtype)


def point(model, batch=2, ctx=CTX):
    cache, lengths = BM.make_cache(model, batch, ctx)
    return cache, lengths, BM.DecodeStep(model, cache, lengths, batch, ctx)


def reference_step(model, cache, step) -> torch.Tensor:
    """The decode step in float64 from the weights, written independently of Transformers: RMSNorm,
    RoPE (default, theta from the config) at position ctx, GQA attention over the cache's first ctx keys
    plus the new one, SwiGLU MLP, final norm, lm_head.  Returns (B, vocab) logits."""
    cfg, m = model.config, model.model
    d = lambda t: t.detach().double()
    B, ctx, D, Hq, Hkv = step.ids.shape[0], step.ctx, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * d(w)

    inv = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = ctx * inv
    cos, sin = torch.cat([ang.cos(), ang.cos()]), torch.cat([ang.sin(), ang.sin()])

    def rope(x):
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    x = d(m.embed_tokens.weight)[step.ids[:, 0]]
    for i, layer in enumerate(m.layers):
        a = layer.self_attn
        h = norm(x, layer.input_layernorm.weight)
        q = rope((h @ d(a.q_proj.weight).T).view(B, Hq, D))
        k = rope((h @ d(a.k_proj.weight).T).view(B, Hkv, D))
        v = (h @ d(a.v_proj.weight).T).view(B, Hkv, D)
        K = torch.cat([d(cache.layers[i].keys[:, :, :ctx]), k[:, :, None]], 2)  # (B, Hkv, ctx + 1, D)
        V = torch.cat([d(cache.layers[i].values[:, :, :ctx]), v[:, :, None]], 2)
        G = Hq // Hkv
        s = torch.einsum("bhd,bhkd->bhk", q, K.repeat_interleave(G, 1)) / math.sqrt(D)
        o = torch.einsum("bhk,bhkd->bhd", s.softmax(-1), V.repeat_interleave(G, 1)).reshape(B, Hq * D)
        x = x + o @ d(a.o_proj.weight).T
        h = norm(x, layer.post_attention_layernorm.weight)
        mlp = layer.mlp
        x = x + (torch.nn.functional.silu(h @ d(mlp.gate_proj.weight).T) * (h @ d(mlp.up_proj.weight).T)) \
            @ d(mlp.down_proj.weight).T
    return norm(x, m.norm.weight) @ d(model.lm_head.weight).T


def test_cache_is_prefilled_and_the_step_repeats():
    model = tiny()
    cache, lengths, step = point(model)
    keys0 = cache.layers[0].keys.clone()
    assert cache.layers[0].keys.shape == (2, 2, CTX + BM.EXTRA_SLOTS, 64)
    assert keys0[:, :, :CTX].std() > 0.5 and not keys0[:, :, CTX:].any()
    for layer in cache.layers:  # every slot before ctx of every layer, K and V, holds random data
        for t in (layer.keys, layer.values):
            assert (t[:, :, :CTX].abs().amax(dim=(0, 1, 3)) > 0).all()
    a = step()
    assert lengths.tolist() == [CTX + 1] * 2  # every layer's update added one to its view of the buffer
    assert cache.layers[1].keys[:, :, CTX].abs().sum() > 0 and not cache.layers[1].keys[:, :, CTX + 1:].any()
    assert torch.equal(cache.layers[0].keys[:, :, :CTX], keys0[:, :, :CTX])
    b = step()  # the same slot again: the same logits
    assert a.shape == (2, 1, 512) and torch.equal(a, b)


@pytest.mark.parametrize("side", [BM.HF_SDPA, BM.SDPA_GQA])
def test_step_matches_a_float64_reference(side):
    model = tiny()
    cache, _, step = point(model)
    BM.activate(model, side, CTX + 1)
    ref = reference_step(model, cache, step)
    out = step()[:, 0].double()
    assert (out - ref).abs().max() <= 1e-4 * ref.abs().max()
    # exactly ctx + 1 keys are read: garbage past slot ctx changes nothing, a change before it does
    cache.layers[0].keys[:, :, CTX + 1:] = 1e4
    assert torch.equal(step()[:, 0].double(), out)
    cache.layers[0].keys[:, :, CTX - 1] += 1
    assert (step()[:, 0].double() - out).abs().max() > 1e-4


@pytest.fixture
def cpu_as_gpu(monkeypatch):
    """CPU tensors take a GPU's routes (decode_attn runs its CPU path)."""
    monkeypatch.setattr(S, "_KERNEL_DEVICES", ("cuda", "meta", "cpu"))


def test_run_point_on_cpu_runs_every_side(cpu_as_gpu):
    """bf16: ours (decode_attn's CPU path on the cache in place, the linears' patched forward) agrees
    with both PyTorch sides; every eager configuration is timed, the verdict is filled in."""
    model = tiny(torch.bfloat16)
    logs = []
    res = BM.run_point(model, 2, CTX, modes=("eager", "graph"), rounds=2, iters=2, profile_steps=0,
                       bw_bytes_per_us=1e6, log=logs.append)
    assert set(res["configs"]) == {f"{s}/eager" for s in BM.SIDES}  # no graphs on the CPU
    assert res["hf_stats"] == {"flash_attn": 0, "decode_attn": 2 * 2, "fallback": 0} and not res["notes"]
    assert res["logits_vs_sdpa"][BM.HF_SDPA] == 0.0
    assert 0 < res["logits_vs_sdpa"][BM.OURS] < 0.03 and res["logits_vs_sdpa"][BM.SDPA_GQA] < 0.03
    for c in res["configs"].values():
        assert len(c["rounds_us"]) == 2 and c["us"] > 0 and c["tokens_per_s"] == pytest.approx(2e6 / c["us"])
    assert res["status"] in ("pass", "pass (within scatter)", "at bound", "below") and res["ratio"] > 0
    assert set(res["per_mode"]) == {"eager"}
    assert res["read_bytes"] == BM.weight_bytes(model, 2) + BM.kv_bytes(model.config, 2, CTX)
    assert res["bound_us"] == pytest.approx(res["read_bytes"] / 1e6)
    assert len(logs) == 3
    assert "forward" not in model.lm_head.__dict__  # left on the PyTorch side


def test_read_bytes_of_the_llama3_shapes():
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(BM.llama_config(4), dtype=torch.bfloat16)
    h, f, kv, vocab = 4096, 14336, 1024, 128256
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    assert BM.weight_bytes(model, 8) == 2 * (4 * per_layer + h + vocab * h) + 2 * 8 * h
    assert BM.kv_bytes(model.config, 32, 32768) == 32 * 32769 * 8 * 128 * 2 * 2 * 4


@pytest.mark.parametrize("name,bucket", [
    ("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>(Flash_fwd_params)",
     "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)", "attention"),
    ("kernel_cutlass_kernel_cute_kernelsattentiondecode_kernelDecodeAttnKernel_object_at_0x7f", "attention"),
    ("kernel_cutlass_kernel_cute_kernelsattentionmergeMergeStatesKernel_object_at_0x7f", "attention"),
    ("kernel_cutlass_kernel_cute_kernelsgemmkernelGemmSm90_object_at_0x7f_tensorptrbf16", "gemm"),
    ("nvjet_hsh_64x8_64x16_2x1_v_bz_splitK_TNT", "gemm"),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4>(...)", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float>(...)", "gemm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>(...)", "rest"),
    ("void at::native::(anonymous namespace)::indexFuncLargeIndex<c10::BFloat16, long, unsigned int>(...)", "rest"),
    ("Memcpy DtoD (Device -> Device)", "rest"),
    ("some_new_kernel_name", "rest"),
])
def test_kernel_buckets(name, bucket):
    assert BM.bucket(name) == bucket


def test_split_sums_per_step():
    sp = BM.split([("nvjet_x", 30.0), ("flash_fwd", 10.0), ("elementwise", 6.0), ("nvjet_x", 30.0)], steps=2)
    assert (sp["gemm"], sp["attention"], sp["rest"], sp["kernels"]) == (30.0, 5.0, 3.0, 38.0)
    assert sp["top"]["gemm"] == [["nvjet_x", 30.0]]


def cfg(side, mode, us, scatter=0.01):
    return {f"{side}/{mode}": {"side": side, "mode": mode, "us": us, "scatter": scatter}}


@pytest.mark.parametrize("ours_us,torch_us,scatter,bound,status", [
    (90.0, 100.0, 0.01, None, "pass"),
    (101.0, 100.0, 0.02, None, "pass (within scatter)"),
    (120.0, 100.0, 0.01, 108.0, "below"),
    (110.0, 107.0, 0.01, 107.0, "at bound"),
])
def test_verdict(ours_us, torch_us, scatter, bound, status):
    configs = {**cfg(BM.OURS, "eager", ours_us + 50, scatter), **cfg(BM.OURS, "graph", ours_us, scatter),
               **cfg(BM.HF_SDPA, "graph", torch_us * 3), **cfg(BM.SDPA_GQA, "graph", torch_us, scatter),
               **cfg(BM.SDPA_GQA, "eager", torch_us + 40)}
    v = BM.verdict(configs, bound)
    assert v["status"] == status and v["ratio"] == pytest.approx(torch_us / ours_us)
    assert v["torch"] == f"{BM.SDPA_GQA}/graph" and v["ours"] == f"{BM.OURS}/graph"
    assert v["per_mode"]["eager"]["ratio"] == pytest.approx((torch_us + 40) / (ours_us + 50))


def test_summary_geomean():
    s = BM.summarize([{"ratio": 1.0, "status": "pass"}, {"ratio": 1.21, "status": "pass"}])
    assert s["geomean"] == pytest.approx(1.1) and s["every_point"] and s["target_met"]
    s = BM.summarize([{"ratio": 1.2, "status": "pass"}, {"ratio": 0.9, "status": "below"}])
    assert not s["every_point"] and not s["target_met"]


def test_arguments():
    a = BM.parse_args([])
    assert (a.batches, a.contexts, a.layers, a.rounds) == ((1, 8, 32), (4096, 32768), 4, 3)
    a = BM.parse_args(["--quick", "--contexts", "4k,1000", "--layers", "1"])
    assert (a.batches, a.contexts, a.layers, a.rounds) == ((1, 8), (4096, 1000), 1, 2)


@pytest.mark.parametrize("argv,msg", [(["--batches", "1,x"], "comma-separated"), (["--layers", "0"], "must be in"),
                                      (["--contexts", "0"], ">= 1"), (["--bogus"], "unrecognized")])
def test_bad_arguments_exit_2_in_one_line(capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        BM.parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and err.count("\n") == 1 and err.startswith(BM.PROG)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU exit")
def test_main_without_cuda_exits_2(capsys):
    assert BM.main(["--quick"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a CUDA GPU" in err


def test_results_are_written(cpu_as_gpu, tmp_path, monkeypatch):
    monkeypatch.setenv("CK_COMMIT", "abc1234def")
    model = tiny(torch.bfloat16, layers=1)
    p = BM.run_point(model, 1, CTX, rounds=1, iters=1, profile_steps=0, bw_bytes_per_us=2e6, log=lambda s: None)
    args = BM.parse_args(["--quick", "--layers", "1"])
    doc = {"meta": BM.run_meta(args, 1), "bandwidth": {"bound_TBps": 2.0, "how": "test"}, "points": [p],
           "summary": BM.summarize([p])}
    stem = BM.write_results(doc, str(tmp_path))
    assert stem.endswith("abc1234")
    back = json.loads((tmp_path / (stem.rsplit("/", 1)[1] + ".json")).read_text())
    assert back["meta"]["commit"] == "abc1234def" and back["meta"]["versions"]["transformers"]
    md = (tmp_path / (stem.rsplit("/", 1)[1] + ".md")).read_text()
    assert "| 1 | 40 | eager |" in md and "| 1 | 40 | best |" in md and f"{BM.OURS}/eager" in md


# -------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_quick_run_end_to_end(tmp_path, capsys):
    assert BM.main(["--quick", "--layers", "1", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("model-decode-*.json")
    doc = json.loads(path.read_text())
    assert [(p["batch"], p["ctx"]) for p in doc["points"]] == [(1, 4096), (8, 4096)]
    for p in doc["points"]:
        assert p["status"] != "error", p["notes"]
        assert p["hf_stats"]["fallback"] == 0 and p["hf_stats"]["decode_attn"] == 2
        assert f"{BM.OURS}/graph" in p["configs"], p["notes"]  # our path captures into a CUDA graph
        assert p["logits_vs_sdpa"][BM.OURS] < 0.03 and p["logits_vs_sdpa"][BM.SDPA_GQA] < 0.03
        assert {f"{s}/eager" for s in BM.SIDES} <= set(p["configs"])
        assert p["split"][BM.OURS]["gemm"] > 0 and p["split"][BM.OURS]["attention"] > 0
        assert p["bound_us"] > 0 and p["ratio"] > 0
    print(capsys.readouterr().out[-3000:])
