"""``torch.compile`` sees every public op as a ``torch.ops.cute_kernels.*`` custom op with a fake
implementation: ``torch.compile(fullgraph=True)`` of functions calling each public function traces on
fake CUDA tensors (``FakeTensorMode``: no GPU needed), static and dynamic shapes, and gives the right
output shapes, dtypes and devices.  CPU only; the GPU runs of the compiled ops are in the per-kernel
tests (``test_gpu_torch_compile``)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import cute_kernels
from cute_kernels.integrations import sdpa as S

BF16 = torch.bfloat16
PUBLIC_OPS = {"gemm", "flash_attn", "flash_attn_", "decode_attn", "decode_attn_", "merge_states"}
# The public functions load their modules (and register their ops) at first use (``import cute_kernels``
# stays cheap): resolve them, so this file does not depend on another having done it first.
for _name in ("gemm", "flash_attn", "decode_attn", "merge_states"):
    getattr(cute_kernels, _name)


def registered_ops() -> set:
    return {n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("cute_kernels::")}


def test_every_public_op_is_a_custom_op_with_a_fake():
    from torch._library.simple_registry import singleton

    ops = registered_ops()
    assert PUBLIC_OPS <= ops, f"missing torch.ops.cute_kernels ops: {PUBLIC_OPS - ops}"
    no_fake = sorted(n for n in ops if singleton.find(f"cute_kernels::{n}").fake_impl.kernel is None)
    assert not no_fake, f"custom ops without a fake implementation: {no_fake}"


def test_fake_cuda_tensors_work_without_a_gpu():
    """The premise of this file: fake tensors on a CUDA device need no CUDA runtime."""
    with FakeTensorMode(allow_non_fake_inputs=False):
        t = torch.empty(4, 8, dtype=BF16, device="cuda")
    assert isinstance(t, FakeTensor) and t.device.type == "cuda"


def test_ops_called_directly_on_fake_tensors():
    with FakeTensorMode(allow_non_fake_inputs=False):
        a = torch.empty(33, 64, dtype=BF16, device="cuda")
        b = torch.empty(64, 48, dtype=BF16, device="cuda")
        c = torch.ops.cute_kernels.gemm(a, b, None, 1.0, 0.0, torch.float32)
        assert (c.shape, c.dtype) == ((33, 48), torch.float32)
        q = torch.empty(2, 5, 8, 128, dtype=BF16, device="cuda")
        k = torch.empty(2, 70, 2, 128, dtype=BF16, device="cuda")
        o, lse = torch.ops.cute_kernels.flash_attn(q, k, k, True, 0.1)
        assert (o.shape, o.dtype, lse.shape, lse.dtype) == (q.shape, BF16, (2, 8, 5), torch.float32)
        lens = torch.empty(2, dtype=torch.int32, device="cuda")
        o, lse = torch.ops.cute_kernels.decode_attn(q, k, k, lens, None, None, False, 0.1)
        assert (o.shape, o.dtype, lse.shape, lse.dtype) == (q.shape, BF16, (2, 8, 5), torch.float32)
        o, lse = torch.ops.cute_kernels.merge_states(torch.empty(3, 2, 5, 8, 128, dtype=BF16, device="cuda"),
                                                     torch.empty(3, 2, 5, 8, device="cuda"))
        assert (o.shape, o.dtype, lse.shape) == ((2, 5, 8, 128), BF16, (2, 5, 8))


# ------------------------------------------------------------------------------- compiled functions
def f_gemm(a, b):
    return cute_kernels.gemm(a, b), cute_kernels.gemm(a, b, out_dtype=torch.float32, alpha=0.5)


def f_flash(q, k, v):
    o, lse = cute_kernels.flash_attn(q, k, v, causal=True, return_lse=True)
    return o * 2, lse + 1, cute_kernels.flash_attn(q, k, v, softmax_scale=0.25)


def f_flash_out(q, k, v, out):
    cute_kernels.flash_attn(q, k, v, causal=True, softmax_scale=0.1, out=out)
    return out + 1


def f_decode(q, k, v, lens):
    o, lse = cute_kernels.decode_attn(q, k, v, cache_seqlens=lens, softmax_scale=0.125, return_lse=True)
    return o * 2, lse


def f_decode_default_scale(q, k, v, lens):  # dynamic=True: D ** -0.5 of a symbolic D
    return cute_kernels.decode_attn(q, k, v, cache_seqlens=lens)


def f_merge(o_parts, lse_parts):
    o, lse = cute_kernels.merge_states(o_parts, lse_parts)
    (oa, ob), (la, lb) = o_parts.unbind(0), lse_parts.unbind(0)  # no getitem: see f_sdpa
    o2, lse2 = cute_kernels.merge_state(oa, la, ob, lb)
    return o + o2, lse + lse2


def f_sdpa(q, k, v):
    """(B, H, S, D): prefill (flash_attn), one decode row (decode_attn), causal with Sq < Sk (flash_attn
    on the first Sq keys).  Views by narrow, not getitem: a CPU-only torch build cannot run tensor
    getitem on fake CUDA tensors under dynamo ('PyTorch is not linked with support for cuda devices')."""
    last = q.narrow(2, q.shape[2] - 1, 1)
    return (cute_kernels.sdpa(q, k, v, is_causal=True, enable_gqa=True),
            cute_kernels.sdpa(last, k, v, enable_gqa=True),
            cute_kernels.sdpa(last, k, v, is_causal=True, enable_gqa=True))


def inputs(name):
    e = lambda *s, dtype=BF16: torch.empty(*s, dtype=dtype, device="cuda")  # noqa: E731
    if name == "gemm":
        return e(40, 64), e(64, 96)
    if name == "flash":
        return e(2, 100, 8, 128), e(2, 300, 2, 128), e(2, 300, 2, 128)
    if name == "flash_out":
        return e(2, 100, 8, 64), e(2, 300, 2, 64), e(2, 300, 2, 64), e(2, 100, 8, 64)
    if name in ("decode", "decode_default_scale"):
        return e(3, 4, 8, 128), e(3, 1000, 2, 128), e(3, 1000, 2, 128), e(3, dtype=torch.int32)
    if name == "merge":
        return e(2, 3, 5, 8, 128), e(2, 3, 5, 8, dtype=torch.float32)
    if name == "sdpa":
        return e(2, 8, 64, 128), e(2, 2, 64, 128), e(2, 2, 64, 128)
    raise KeyError(name)


def expected(name):
    f32 = torch.float32
    return {
        "gemm": [((40, 96), BF16), ((40, 96), f32)],
        "flash": [((2, 100, 8, 128), BF16), ((2, 8, 100), f32), ((2, 100, 8, 128), BF16)],
        "flash_out": [((2, 100, 8, 64), BF16)],
        "decode": [((3, 4, 8, 128), BF16), ((3, 8, 4), f32)],
        "decode_default_scale": [((3, 4, 8, 128), BF16)],
        "merge": [((3, 5, 8, 128), BF16), ((3, 5, 8), f32)],
        "sdpa": [((2, 8, 64, 128), BF16), ((2, 8, 1, 128), BF16), ((2, 8, 1, 128), BF16)],
    }[name]


FUNCS = {"gemm": f_gemm, "flash": f_flash, "flash_out": f_flash_out, "decode": f_decode,
         "decode_default_scale": f_decode_default_scale, "merge": f_merge, "sdpa": f_sdpa}

def cases():
    for name in FUNCS:
        for dynamic in (False, True):
            for backend in ("eager", "aot_eager"):
                yield pytest.param(name, dynamic, backend, id=f"{name}-{'dynamic' if dynamic else 'static'}-{backend}")


def _aot_input_mutation_works() -> bool:
    """aot_eager applies an input mutation with ``copy_`` on the fake CUDA input; a CPU-only torch build
    raises 'PyTorch is not linked with support for cuda devices' there even for ``out.add_(x)``."""
    def g(x, out):
        out.add_(x)
        return out + 1

    torch._dynamo.reset()
    try:
        with FakeTensorMode(allow_non_fake_inputs=False):
            x = torch.empty(4, device="cuda")
            torch.compile(g, fullgraph=True, backend="aot_eager")(x, torch.empty(4, device="cuda"))
        return True
    except Exception:
        return False
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("name,dynamic,backend", list(cases()))
def test_compile_fullgraph_on_fake_cuda_tensors(name, dynamic, backend):
    if name == "flash_out" and backend == "aot_eager" and not _aot_input_mutation_works():
        pytest.skip("this torch build cannot apply any input mutation to a fake CUDA tensor under aot_eager "
                    "(plain out.add_(x) fails too); the eager backend traces the out= op")
    torch._dynamo.reset()
    try:
        with FakeTensorMode(allow_non_fake_inputs=False):
            args = inputs(name)
            res = torch.compile(FUNCS[name], fullgraph=True, backend=backend, dynamic=dynamic)(*args)
    finally:
        torch._dynamo.reset()
    res = res if isinstance(res, tuple) else (res,)
    got = [(tuple(r.shape), r.dtype) for r in res]
    assert got == expected(name)
    assert all(r.device.type == "cuda" for r in res)


def test_sdpa_compiled_routes_to_the_kernel_ops():
    """Under torch.compile the kernels trace as their custom ops (the graph holds them, not torch's SDPA)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    cnt = CompileCounterWithBackend("eager")
    before = dict(S.sdpa_stats)
    try:
        with FakeTensorMode(allow_non_fake_inputs=False):
            torch.compile(f_sdpa, fullgraph=True, backend=cnt)(*inputs("sdpa"))
    finally:
        torch._dynamo.reset()
    targets = {str(n.target) for g in cnt.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert any("cute_kernels.flash_attn" in t for t in targets), targets
    assert any("cute_kernels.decode_attn" in t for t in targets), targets
    assert not any("scaled_dot_product_attention" in t for t in targets), targets
    assert S.sdpa_stats == before, "traced calls are not counted (sdpa_stats counts eager calls only)"
