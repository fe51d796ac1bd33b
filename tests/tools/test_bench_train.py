"""The training-step benchmark (``cute-kernels bench train``, :mod:`cute_kernels.tools.bench.train`).

CPU: the kernel categoriser on real kernel names (ours as the CuTe DSL names them, PyTorch's SDPA
backends', cuBLAS's, torch's elementwise / loss / optimizer kernels), the split and the ratios, the
results row and document, the command's arguments, and the whole run on a tiny Llama on the CPU with a
wall-clock timer (ours falls back to HF's sdpa there; cuDNN / memory-efficient SDPA refuse the CPU and
are reported failed).  The GPU run (``--quick``) is in ``test_bench.py``.
"""

import json
import math
import statistics
import time

import pytest
import torch

from cute_kernels.tools import cli
from cute_kernels.tools.bench import records, results
from cute_kernels.tools.bench import train_report as R

transformers = pytest.importorskip(
    "transformers", minversion="5",
    reason="the Hugging Face integration needs transformers>=5 (pip install -e '.[hf]')")

from cute_kernels.tools import bench_model as BM  # noqa: E402
from cute_kernels.tools.bench import train as T  # noqa: E402

# ---- the categoriser ---------------------------------------------------------------------------------
# ours: the names the CuTe DSL gives our kernels (read from the compiled objects: "kernel_cutlass_" + the
# @cute.kernel method + the kernel object's repr without dots + the mangled arguments)
OURS_NAMES = {
    "kernel_cutlass_kernel_cute_kernelsattentionforward_kernelFlashAttnFwdSm90_object_at__CopyAtom_ThrID10_"
    "TVLayoutSrc1819201_TVLayoutDst1819201_Valuetypebf16_tensor0000o12811101213_CopyAtom_T_0": "attention",
    "kernel_cutlass_kernel_cute_kernelsattentionbackward_kernelFlashAttnBwdSm90_object_at__CopyAtom_ThrID10_"
    "TVLayoutSrc1409601_TVLayoutDst1409601_Valuetypebf16_tensor0000o12811101213_CopyAtom__0": "attention",
    "kernel_cutlass_kernel_cute_kernelsattentionbackward_prepostBwdPrepass_object_at__tensorptrbf16gmemalign16o128"
    "i64div8i64div8i64div81_tensorptrbf16gmemalign16o128i64div8i64div8i64div81_tens_0": "attention",
    "kernel_cutlass_kernel_cute_kernelsattentionbackward_prepostBwdConvert_object_at__tensorptrf32gmemalign16o128"
    "i64div4i64div4i64div41_tensorptrbf16gmemalign16o128i64div8i64div8i64div81___0": "attention",
    "kernel_cutlass_kernel_cute_kernelsattentiondecode_kernelDecodeAttnKernel_object_at__tensorptrbf16_0": "attention",
    "kernel_cutlass_kernel_cute_kernelsgemmkernelGemmSm90_object_at__CopyAtom_ThrID10_TVLayoutSrc1819201_"
    "TVLayoutDst1819201_Valuetypebf16_tensor00o111100_CopyAtom_ThrID10_TVLayoutSrc11638401_T_0": "gemm",
    "kernel_cutlass_kernel_cute_kernelsgemmsplitk_kernelGemmSm90SplitKCluster_object_at__CopyAtom_ThrID10_0": "gemm",
    "kernel_cutlass_kernel_cute_kernelsgemmcpasync_kernelGemmSm90CpAsync_object_at__tensorptrbf16gmemalign16_0": "gemm",
}
PEER_NAMES = {
    # torch's FlashAttention backend (FA2 sources in pytorch_flash)
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, "
    "Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, "
    "false>(pytorch_flash::Flash_fwd_params)": "attention",
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, "
    "2, false, false, cutlass::bfloat16_t>, true, false, false, false, false, false>(pytorch_flash::Flash_bwd_params)":
        "attention",
    "void pytorch_flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2>>"
    "(pytorch_flash::Flash_bwd_params)": "attention",
    "void pytorch_flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2>, true>"
    "(pytorch_flash::Flash_bwd_params)": "attention",
    # memory-efficient (xformers' cutlass kernels)
    "fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
    "cutlass::arch::Sm80, true, 64, 128, 128, true, true>::Params)": "attention",
    "fmha_cutlassB_bf16_aligned_128x64_k128_sm80(PyTorchMemEffAttentionBackward::AttentionBackwardKernel<"
    "cutlass::arch::Sm80, cutlass::bfloat16_t, true, false, true, 128, 64, 128, false>::Params)": "attention",
    # cuDNN
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0": "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0":
        "attention",
    # cuBLAS / cuBLASLt
    "nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NTN": "gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__"
    "5x_cublas": "gemm",
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>(cutlass_80_tensorop_"
    "bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8::Params)": "gemm",
    "cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_bf16_bf16_128x128x64_1x2x1_0_tnn_align8_warpspecialized_"
    "cooperative_epi_tma": "gemm",
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false, false, false>"
    "(cublasLt::cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*)": "gemm",
    "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false, false>(...)": "gemm",
    # the rest of a step: norms, RoPE, SiLU, the loss, the optimizer, the embedding's gradient, copies
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, "
    "c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul> >(int, "
    "at::native::BinaryFunctor<...>, std::array<char*, 3ul>)": "rest",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
    "float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<...>)": "rest",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
    "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)": "rest",
    "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, "
    "float*, float const*, long const*, float const*, bool, long, long, long, long)": "rest",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "TensorListMetadata<4>, at::native::(anonymous namespace)::PointwiseOpScalarListFunctor<c10::BFloat16, 4, 3, 3>, "
    "std::function<c10::BFloat16 (c10::BFloat16, c10::BFloat16)>, c10::Scalar>(...)": "rest",
    "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<c10::BFloat16, float, long>(long "
    "const*, c10::BFloat16 const*, c10::BFloat16*, int, long, int, int)": "rest",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy_contig<at::native::(anonymous namespace)::"
    "OpaqueType<2u>, unsigned int, 4, 128, 1>(...)": "rest",
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::(anonymous "
    "namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda(float)#1}>(...)":
        "rest",
    "Memset (Device)": "rest",
    "Memcpy DtoD (Device -> Device)": "rest",
    "some_new_kernel_name": "rest",
}


@pytest.mark.parametrize("name,want", list(OURS_NAMES.items()) + list(PEER_NAMES.items()))
def test_category(name, want):
    assert R.category(name) == want


def test_our_names_are_ours_before_any_pattern():
    """Our kernels' names carry "cutlass" and "Sm90" (GEMM patterns): the package path decides first."""
    for name in OURS_NAMES:
        assert "cutlass" in name and R.category(name) == OURS_NAMES[name]
    assert R.category("kernel_cutlass_kernel_cute_kernelsgemmkernelGemmSm90_flash_object") == "gemm"


def test_split_sums_per_step_by_category():
    kernels = [("nvjet_a", 30.0), ("pytorch_flash::flash_fwd_kernel", 10.0), ("elementwise", 6.0), ("nvjet_a", 30.0),
               ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop", 4.0), ("Memset (Device)", 2.0)]
    sp = R.split(kernels, steps=2)
    assert (sp["gemm"], sp["attention"], sp["rest"], sp["kernels"]) == (30.0, 7.0, 4.0, 41.0)
    assert sp["top"]["gemm"] == [["nvjet_a", 30.0]]
    assert [n for n, _ in sp["top"]["attention"]] == ["pytorch_flash::flash_fwd_kernel",
                                                      "cudnn_generated_fort_native_sdpa_sm90_flash_bprop"]
    assert R.split([], 1) == {"attention": 0.0, "gemm": 0.0, "rest": 0.0, "kernels": 0.0,
                              "top": {"attention": [], "gemm": [], "rest": []}}


def test_device_times_leave_out_user_annotations():
    """The optimizer's ``record_function`` range is mirrored on the device spanning its kernels: counted,
    the split's kernels summed to more than the step (a negative gap)."""
    from types import SimpleNamespace as NS

    from cute_kernels.tools.bench.timing import device_kernel_times

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def ev(name, us, device=cuda, annotation=False):
        return NS(name=name, device_type=device, is_user_annotation=annotation,
                  time_range=NS(elapsed_us=lambda: us))

    prof = NS(events=lambda: [ev("Optimizer.step#AdamW.step", 50.0, annotation=True),
                              ev("multi_tensor_apply_kernel", 20.0), ev("aten::add_", 9.0, device=cpu),
                              ev("Memcpy DtoD (Device -> Device)", 3.0)],
              key_averages=lambda: [])
    assert device_kernel_times(prof) == [("multi_tensor_apply_kernel", 20.0), ("Memcpy DtoD (Device -> Device)", 3.0)]


# ---- ratios, rows, documents ---------------------------------------------------------------------------
TIMES = {"cute_kernels": [100.0, 90.0, 95.0], "cute_kernels+gemm": [98.0, 92.0, 99.0],
         "sdpa_flash": [110.0, 100.0, 120.0], "sdpa_cudnn": [105.0, 112.0, 101.0]}
PEERS = ("sdpa_flash", "sdpa_cudnn")


def test_step_ratios_are_per_repetition_against_that_repetitions_best_backend():
    r = R.step_ratios(TIMES, PEERS)
    best = [105.0, 100.0, 101.0]
    for side, ts in TIMES.items():
        assert math.isclose(r[side], statistics.median(b / t for b, t in zip(best, ts)))
    assert R.step_ratios(TIMES, ()) == {}


def test_attention_ratios_against_the_backend_with_least_attention_time():
    splits = {"cute_kernels": {"attention": 8.0}, "sdpa_flash": {"attention": 12.0}, "sdpa_cudnn": {"attention": 10.0},
              "cute_kernels+gemm": {"attention": 0.0}}
    ratios, best = R.attention_ratios(splits, PEERS)
    assert best == "sdpa_cudnn" and ratios == {"cute_kernels": 1.25, "sdpa_flash": 10 / 12, "sdpa_cudnn": 1.0}
    assert R.attention_ratios({"cute_kernels": {"attention": 8.0}}, PEERS) == ({}, None)


def _splits(attn):
    return {s: {"attention": a, "gemm": 50.0, "rest": 20.0, "kernels": a + 70.0, "top": {}} for s, a in attn.items()}


def test_row_roles_ratios_and_the_attention_target():
    splits = _splits({"cute_kernels": 8.0, "cute_kernels+gemm": 8.2, "sdpa_flash": 12.0, "sdpa_cudnn": 9.0})
    row = R.make_row(4096, 2, TIMES, our_sides=T.OUR_SIDES, splits=splits, errors={"sdpa_efficient": "refused"},
                     losses={"cute_kernels": 11.8}, notes=["n"], memory={"resident": 58.0, "peak": 80.0})
    row = results.finish_row(row)
    assert row["shape"] == "b2_s4096" and row["tokens"] == 8192
    assert row["ours"] == "cute_kernels"  # the faster of our two sides (median 95 vs 98)
    roles = {n: e["role"] for n, e in row["impls"].items()}
    assert roles == {"cute_kernels": "ours", "cute_kernels+gemm": "variant", "sdpa_flash": "peer",
                     "sdpa_cudnn": "peer", "sdpa_efficient": "peer"}
    assert row["impls"]["sdpa_efficient"] == {"role": "peer", "error": "refused"}
    ours = row["impls"]["cute_kernels"]
    assert ours["tokens_per_s"] == pytest.approx(8192 / 95e-6) and ours["loss"] == 11.8
    assert ours["split"]["gap"] == pytest.approx(95.0 - 78.0)
    assert ours["attention_ratio"] == pytest.approx(9.0 / 8.0) and row["best_peer_attention"] == "sdpa_cudnn"
    assert row["attention_ratio"] == pytest.approx(1.125) and row["attention_target_met"] is True
    assert row["best_peer_step"] == "sdpa_cudnn"  # median 105 < 110
    assert row["ratio_vs_best_peer"] == pytest.approx(ours["step_ratio"])  # finish_row agrees per repetition
    slow = R.make_row(4096, 2, TIMES, our_sides=T.OUR_SIDES, splits=_splits({"cute_kernels": 8.5, "sdpa_cudnn": 9.0}))
    assert slow["attention_target_met"] is False
    none = R.make_row(4096, 2, {"sdpa_flash": [1.0]}, our_sides=T.OUR_SIDES, errors={"cute_kernels": "boom"})
    assert none["ours"] is None and none["attention_target_met"] is None
    assert none["impls"]["cute_kernels"]["role"] == "variant"  # no side of ours ran: none is "ours"


def test_loss_notes_flag_a_side_off_the_median():
    assert R.loss_notes({"a": 11.76, "b": 11.761, "c": 11.759}) == []
    (note,) = R.loss_notes({"a": 11.76, "b": 11.761, "c": 12.5})
    assert note.startswith("c: first-step loss 12.50000")
    assert R.loss_notes({"a": 1.0}) == []


def test_document_summary_and_markdown(monkeypatch):
    monkeypatch.setenv("CK_COMMIT", "abc1234")
    rows = [R.make_row(s, 1, TIMES, our_sides=T.OUR_SIDES,
                       splits=_splits({"cute_kernels": a, "sdpa_flash": 12.0, "sdpa_cudnn": 10.0}),
                       errors={"sdpa_efficient": "RuntimeError: No available kernel"}, notes=[f"note {s}"])
            for s, a in ((4096, 8.0), (8192, 9.5))]
    meta = results.run_meta(T.TIMER, 3, batch=1, warmup=2, model={"num_hidden_layers": 4}, step="s", sides_how="h",
                            split_how="p")
    doc = R.document(meta, rows)
    s = doc["summary"]
    assert s["attention_ratio_by_seq"] == {4096: 1.25, 8192: pytest.approx(10 / 9.5)}
    assert s["attention_target_met"] is False and s["geomean_vs_best_peer"] > 1
    md = R.markdown(doc)
    assert "4 layers" in md and "| 4096 | cute_kernels (ours) |" in md and "| 8192 | sdpa_efficient | failed" in md
    assert "seq 4096: 1.250x (cute_kernels vs sdpa_cudnn): met" in md and "seq 8192: 1.053x" in md and "NOT met" in md
    assert "- seq 8192: note 8192" in md and "sdpa_efficient failed: RuntimeError: No available kernel" in md
    for line in md.splitlines():
        if line.startswith("| 4096") or line.startswith("| 8192"):
            assert line.count("|") == len(R.HEADER) + 1, line


# ---- the command ---------------------------------------------------------------------------------------
def test_bench_lists_train(capsys):
    assert cli.main(["bench", "--help"]) == 0
    assert "train" in capsys.readouterr().out


def test_train_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: cute-kernels bench train") and "--seqs" in out and "--batch" in out


def test_arguments_and_presets():
    a = T.parse_args([])
    assert (a.layers, a.seqs, a.batch, a.repeats, a.warmup, a.profile_steps, a.sides) == (
        4, (4096, 8192), 1, 10, 3, 1, T.SIDES)
    a = T.parse_args(["--quick"])
    assert (a.layers, a.seqs, a.repeats, a.warmup) == (1, (1024,), 3, 2)
    a = T.parse_args(["--quick", "--seqs", "2k,512,2k", "--batch", "2", "--sides", "cute_kernels,sdpa_flash",
                      "--out-dir", "X", "--layers", "2"])
    assert (a.seqs, a.batch, a.sides, a.out, a.layers) == ((2048, 512), 2, ("cute_kernels", "sdpa_flash"), "X", 2)
    assert T.SIDES == ("cute_kernels", "cute_kernels+gemm", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient")


@pytest.mark.parametrize("argv,msg", [(["--seqs", "4k,x"], "comma-separated"), (["--seqs", "1"], ">= 2"),
                                      (["--batch", "0"], ">= 1"), (["--sides", "sdpa_math"], "unknown side"),
                                      (["--layers", "33"], "in 1..32"), (["--bogus"], "unrecognized")])
def test_bad_arguments_are_one_line(capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "train", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and err.count("\n") == 1 and err.startswith("cute-kernels bench train")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU exit")
def test_without_cuda_exits_2(capsys):
    assert cli.main(["bench", "train", "--quick"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and "needs a CUDA device" in cap.err


# ---- the run on the CPU --------------------------------------------------------------------------------
TINY = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "vocab_size": 512, "max_position_embeddings": 4096}


def _wall_us(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def test_run_on_cpu(tmp_path, monkeypatch):
    """Every side steps (or fails, reported) at two lengths; the same losses from the same weights and ids;
    each side its own model; the document is written and reads back."""
    monkeypatch.setenv("CK_COMMIT", "abc1234def")
    logs = []
    doc = T.run(BM.llama_config(2, **TINY), (32, 48), 2, device="cpu", precompile_kernels=False, time_one=_wall_us,
                repeats=2, warmup=2, profile_steps=1, log=logs.append, quick=True)
    assert [r["shape"] for r in doc["rows"]] == ["b2_s32", "b2_s48"]
    for r in doc["rows"]:
        ran = {n for n, e in r["impls"].items() if "median_us" in e}
        assert ran == {"cute_kernels", "cute_kernels+gemm", "sdpa_flash"}, r
        for side in ("sdpa_cudnn", "sdpa_efficient"):  # the CPU has neither backend
            assert "No viable backend" in r["impls"][side]["error"]
        assert r["ours"] in T.OUR_SIDES and r["best_peer_step"] == "sdpa_flash"
        losses = {n: e["loss"] for n, e in r["impls"].items() if "loss" in e}
        assert len(set(losses.values())) == 1 and 5 < next(iter(losses.values())) < 7  # ~ln(512)
        for e in r["impls"].values():
            if "median_us" in e:
                assert len(e["times_us"]) == 2 and e["tokens_per_s"] == pytest.approx(2 * r["params"]["seq"]
                                                                                      / (e["median_us"] * 1e-6))
                assert "split" not in e  # no CUDA kernels to profile on the CPU
        # ours runs HF's sdpa on CPU tensors: said so
        assert any(n.startswith("cute_kernels: attention did not run flash_attn") for n in r["notes"])
        assert any(n.startswith("cute_kernels+gemm: the patched linears made no gemm") for n in r["notes"])
        assert r["attention_ratio"] is None and r["attention_target_met"] is None
    assert doc["meta"]["model"]["num_hidden_layers"] == 2 and doc["meta"]["versions"]["transformers"]
    assert doc["summary"]["attention_target_met"] is None
    assert any("retrying with K/V heads expanded" in line for line in logs)
    js, md = results.write(doc, tmp_path, tag="quick", to_markdown=R.markdown)
    assert js.name == f"train-quick-{doc['meta']['date']}-abc1234def.json"
    back = records.load(js)
    assert back["kind"] == "train" and back["rows"][0]["impls"]["sdpa_flash"]["role"] == "peer"
    assert json.loads(js.read_text())["summary"]["attention_ratio_by_seq"] == {"32": None, "48": None}
    assert "| 32 | sdpa_cudnn | failed" in md.read_text()


def test_sides_have_their_own_models_with_the_same_weights():
    T.register_sides()
    sides = T.build_sides(BM.llama_config(1, **TINY), list(T.SIDES), "cpu")
    models = [s.model for s in sides.values()]
    assert len({id(m) for m in models}) == len(models)
    w = [m.model.layers[0].mlp.up_proj.weight for m in models]
    assert all(torch.equal(w[0], x) and x.data_ptr() != w[0].data_ptr() for x in w[1:])
    assert all(m.training and w[0].requires_grad for m in models)
    assert models[0].config._attn_implementation == "cute_kernels" and models[2].config._attn_implementation == "sdpa"
    assert "forward" in sides["cute_kernels+gemm"].model.lm_head.__dict__  # patched
    assert "forward" not in sides["cute_kernels"].model.lm_head.__dict__
    assert [s.backend for s in sides.values()] == [None, None, "FLASH_ATTENTION", "CUDNN_ATTENTION",
                                                   "EFFICIENT_ATTENTION"]


def test_expanded_kv_side_computes_the_same_step():
    """A backend that refuses enable_gqa runs HF's repeat_kv path instead: the same loss, and the same
    updated weights as enable_gqa, on the same initial weights."""
    T.register_sides()
    sides = T.build_sides(BM.llama_config(1, **TINY), ["sdpa_flash", "sdpa_cudnn"], "cpu")
    a, b = sides["sdpa_flash"], sides["sdpa_cudnn"]
    b.backend = a.backend  # the CPU's flash backend both ways
    b.expand_kv()
    assert b.model.config._attn_implementation == T.REPEAT_KV_NAME and b.kv_expanded
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(1))
    a.ids = b.ids = ids
    la, lb = float(a.step()), float(b.step())
    assert la == pytest.approx(lb, rel=1e-3)
    wa, wb = a.model.model.layers[0].self_attn.q_proj.weight, b.model.model.layers[0].self_attn.q_proj.weight
    assert (wa.float() - wb.float()).abs().max() <= 1e-2 * wa.float().abs().max()
