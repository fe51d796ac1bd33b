"""gemm's argument checks on the CPU (nothing compiled or launched): shape faults get their own
message whatever the device (CPU and meta operands included), non-tensors raise TypeError naming the
argument, ``tune=True`` validates before timing, ``warmup`` rejects unknown keys and negative sizes,
and the custom op's fake implementation fails on a K mismatch as the eager path does."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels
from cute_kernels import gemm
from cute_kernels.common import jit
from cute_kernels.gemm import host
from cute_kernels.gemm.validate import check_operands

BF = torch.bfloat16


def _t(*shape, dtype=BF, device="cpu"):
    return torch.empty(shape, dtype=dtype, device=device)


SHAPE_FAULTS = [  # (a, b, kwargs) builders on a device, the message expected
    (lambda d: (_t(8, 16, device=d), _t(32, 8, device=d), {}), r"K=16.*K=32"),
    (lambda d: (_t(2, 8, 16, device=d), _t(3, 16, 8, device=d), {}), "batch sizes differ"),
    (lambda d: (_t(8, 16, device=d), _t(16, 8, device=d), {"out": _t(8, 9, device=d)}), "out has shape"),
    (lambda d: (_t(8, 16, device=d), _t(16, 8, device=d), {"c": _t(9, 8, device=d), "beta": 1.0}), "c has shape"),
    (lambda d: (_t(8, 16, device=d), _t(2, 16, 8, device=d), {}), "2-D or both 3-D"),
    (lambda d: (_t(16, device=d), _t(16, 8, device=d), {}), "a must be 2-D"),
    (lambda d: (_t(8, 16, device=d), _t(16, 8, dtype=torch.float32, device=d), {}), "b must be float16 or bfloat16"),
    (lambda d: (_t(8, 16, device=d), _t(16, 8, device=d), {"out": _t(8, 8, dtype=torch.int32, device=d)}), "out dtype"),
]


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("make,match", SHAPE_FAULTS, ids=[f"fault{i}" for i in range(len(SHAPE_FAULTS))])
def test_shape_faults_before_device(make, match, device):
    """A CPU or meta operand with a shape / out= / c= fault gets the fault's message, not the device's."""
    a, b, kw = make(device)
    with pytest.raises((ValueError, TypeError), match=match):
        gemm(a, b, **kw)


def test_device_fault_after_shapes_are_right():
    with pytest.raises(ValueError, match="same CUDA device"):
        gemm(_t(8, 16), _t(16, 8))
    with pytest.raises(ValueError, match="same CUDA device"):
        gemm(_t(8, 16, device="meta"), _t(16, 8, device="meta"))
    # planning-only callers accept CPU / meta operands; out= on another device is named
    assert check_operands(_t(8, 16), _t(16, 8), None, None, None, allow_cpu=True) == (8, 8)
    with pytest.raises(ValueError, match="out is on meta"):
        check_operands(_t(8, 16), _t(16, 8), _t(8, 8, device="meta"), None, None, allow_cpu=True)


@pytest.mark.parametrize("args,kw,name", [
    (([[1.0]], _t(16, 8)), {}, "a"),
    ((_t(8, 16), 3.0), {}, "b"),
    ((_t(8, 16), _t(16, 8)), {"out": [0]}, "out"),
    ((_t(8, 16), _t(16, 8)), {"c": [[0.0]], "beta": 1.0}, "c"),
])
def test_non_tensor_arguments_raise_type_error(args, kw, name):
    with pytest.raises(TypeError, match=rf"gemm: {name} must be a torch.Tensor"):
        gemm(*args, **kw)


def test_tune_validates_before_running_candidates():
    """``tune=True`` with a bad argument raises the argument's error before the tuner compiles or
    times any candidate (it used to time 8 of them first)."""
    before = dict(jit.stats)
    with pytest.raises(ValueError, match="K=16"):
        gemm(_t(8, 16), _t(32, 8), tune=True)
    with pytest.raises(TypeError, match="a must be a torch.Tensor"):
        gemm([[1.0]], _t(16, 8), tune=True)
    with pytest.raises(TypeError, match="out must be a torch.Tensor"):
        gemm(_t(8, 16), _t(16, 8), out=[0], tune=True)
    with pytest.raises(ValueError, match="same CUDA device"):
        gemm(_t(8, 16), _t(16, 8), tune=True)
    assert jit.stats == before


@pytest.mark.parametrize("tune", ["yes", "", 1, 0, None])
def test_tune_must_be_a_bool(tune):
    """A string (or an int, or None) is not taken for its truth value: "" used to run untuned, "yes" tuned."""
    before = dict(jit.stats)
    with pytest.raises(TypeError, match=f"gemm: tune must be a bool, got {type(tune).__name__}"):
        gemm(_t(8, 16), _t(16, 8), tune=tune)
    assert jit.stats == before


@pytest.mark.parametrize("spec,exc,match", [
    (dict(m=64, n=64, k=64, mm=3), ValueError, r"unknown gemm key\(s\) \['mm'\]"),
    (dict(m=64, n=64, k=64, tile_n=128, foo=1), ValueError, r"\['foo', 'tile_n'\]"),
    (dict(m=-1, n=64, k=64), ValueError, "m must be >= 0"),
    (dict(m=64, n=-8, k=64), ValueError, "n must be >= 0"),
    (dict(m=64, n=64, k=-64), ValueError, "k must be >= 0"),
    (dict(m=64, n=64, k=64, batch=-2), ValueError, "batch must be >= 0"),
    (dict(m=64, n=64), ValueError, r"needs \['k'\]"),
    (dict(m=64.5, n=64, k=64), TypeError, "m must be an int"),
    (dict(m=64, n=64, k=64, a_major="rows"), ValueError, "a_major"),
    ([64, 64, 64], TypeError, "must be a dict"),
])
def test_warmup_rejects_bad_specs(spec, exc, match):
    before = dict(jit.stats)
    with pytest.raises(exc, match=match):
        cute_kernels.warmup([("gemm", spec)])
    assert jit.stats["compiles"] == before["compiles"]


def test_warmup_rejects_bad_entries():
    with pytest.raises(ValueError, match="unknown kernel 'gemmm'"):
        cute_kernels.warmup([("gemmm", dict(m=1, n=1, k=1))])
    with pytest.raises(ValueError, match=r"\(kernel_name, spec\) pair"):
        cute_kernels.warmup([("gemm",)])
    with pytest.raises(ValueError, match="m must be >= 0"):
        host.warmup_gemm(-1, 8, 8)
    with pytest.raises(ValueError, match="k must be >= 0"):
        host.explain(8, 8, -1)


def test_fake_impl_raises_on_k_mismatch():
    """The custom op's fake implementation checks like the eager path (what torch.compile traces)."""
    with FakeTensorMode():
        a, b = torch.empty(8, 16, dtype=BF), torch.empty(32, 8, dtype=BF)
        with pytest.raises(ValueError, match=r"K=16.*K=32"):
            torch.ops.cute_kernels.gemm(a, b, None, 1.0, 0.0, None)
        with pytest.raises(ValueError, match="beta != 0 needs c"):
            torch.ops.cute_kernels.gemm(a, torch.empty(16, 8, dtype=BF), None, 1.0, 1.0, None)
        out = torch.ops.cute_kernels.gemm(a, torch.empty(16, 8, dtype=BF), None, 1.0, 0.0, torch.float32)
        assert out.shape == (8, 8) and out.dtype == torch.float32
    # meta tensors take the same fake implementation
    with pytest.raises(ValueError, match=r"K=16.*K=32"):
        torch.ops.cute_kernels.gemm(_t(8, 16, device="meta"), _t(32, 8, device="meta"), None, 1.0, 0.0, None)


def test_fits_layout_size_one_strides():
    """fits_layout: a size-1 dim's stride passes as it is when the compiled layout takes it (the unit dim
    1; another a multiple of 16 bytes below 2^40, 0 included), else the plan's canonical view is taken."""
    from cute_kernels.gemm.validate import canonical_strides, fits_layout

    bf = torch.bfloat16
    a = torch.randn(1, 64, dtype=bf)  # a decode step's activation: row stride 64 (128 bytes)
    assert fits_layout(a, "row") and canonical_strides(a, "row") is not a  # (the view it saves)
    assert fits_layout(a.as_strided((1, 64), (0, 1)), "row")
    assert not fits_layout(torch.randn(2, 65, dtype=bf)[:1, :64], "row")  # 130 bytes
    assert not fits_layout(a.as_strided((1, 64), (1 << 40, 1)), "row")  # past a TMA stride
    col = torch.randn(64, 1, dtype=bf)  # (K, 1) column-major B: its size-1 dim is N, stride 64
    assert fits_layout(col.as_strided((64, 1), (1, 64)), "col") and not fits_layout(col.as_strided((64, 1), (1, 3)), "col")
    big = torch.randn(8, 8, dtype=bf)  # K = 1: the unit dim itself has size 1, stride 1 needed
    assert fits_layout(big[:, :1], "row") and not fits_layout(big[:, ::2][:, :1], "row")  # (strides (8, 1) / (8, 2))
    batched = torch.randn(1, 4, 64, dtype=bf)
    assert fits_layout(batched, "row") and fits_layout(batched.expand(1, 4, 64), "row")


def test_out_dtype_as_a_string_is_named_as_one():
    """``out_dtype="float32"`` (a string, as some frameworks spell dtypes) is refused with its repr, so the
    message does not read as if torch.float32 were refused."""
    a = torch.randn(16, 64, dtype=BF)
    with pytest.raises(TypeError, match=r"out_dtype must be float16, bfloat16 or float32 \(a torch.dtype\), got 'float32'"):
        gemm(a, a.t(), out_dtype="float32")
