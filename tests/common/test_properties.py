"""Property-based argument suite of every public op (issue 19), on the CPU.

Each case draws a valid call (random small shapes, dtypes, layouts, optional arguments) and corrupts
exactly one argument -- its type, rank, dtype, device, a stride, a size, a length, ``out=``,
``workspace=``, a scalar, or (with ``checked=True``) a host-visible out-of-range block table or length.
The call must raise ``ValueError`` or ``TypeError`` (any other exception fails the case), the message
must start with the op's name and name the corrupted argument by its parameter name, and nothing may
get past validation: :func:`cute_kernels.testing.count_launches` (the ops' own counters, no
monkeypatching) must not move, neither a kernel launch nor a CPU / fake execution.
``test_*_valid_base`` checks the other half: the uncorrupted calls pass and are counted.

What runs where, without a GPU:

* ``gemm`` and ``flash_attn``: fake CUDA tensors (``FakeTensorMode``) -- validation runs in full,
  devices included (a corrupted device is a fake CPU / meta tensor), and a valid call returns a fake
  result (counted as ``"gemm:fake"``; flash_attn's fake path is its custom op).  Fake tensors have no
  data pointer, so pointer alignment is checked on real CPU tensors instead (flash_attn: every
  shape / stride / pointer fault is reported before the device check, so a CPU call with a misaligned
  pointer gets the pointer's message).  gemm checks no pointer: it runs misaligned operands on its
  cp.async path.
* ``decode_attn``, ``merge_states``, ``merge_state``: real CPU tensors; valid calls run the CPU paths
  (counted as ``"decode_attn:cpu"`` / ``"merge_states:torch"``); a corrupted device is a meta tensor.
* Not covered here: the CUDA launch itself (the counters' ``"gemm"`` / ``"flash_attn"`` /
  ``"decode_attn"`` / ``"merge_states"`` keys are exercised by the GPU tests), device-side values
  without ``checked=True`` (clamped by design, never validated), and ``sdpa``, which validates
  nothing itself: anything its kernels cannot take runs torch's own function (torch's errors).
"""

from __future__ import annotations

import math
import os
import re
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels
from cute_kernels.attention import forward as FW
from cute_kernels.common import jit
from cute_kernels.testing import count_launches
from _check import misaligned
from conftest import RUN_MATRIX

BF, FP, F32 = torch.bfloat16, torch.float16, torch.float32
HALF = (FP, BF)
# per op: issue 19's >= 1,000 with the whole matrix (CI); the quick tier draws 250 (fresh ones each run)
N_CASES = int(os.environ.get("CUTE_KERNELS_PROPERTY_CASES", "1000" if RUN_MATRIX else "250"))
SETTINGS = settings(max_examples=N_CASES, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BASE_SETTINGS = settings(SETTINGS, max_examples=max(1, N_CASES // 6))
pytestmark = pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")

NOT_TENSORS = st.sampled_from([None, 3, 2.5, "tensor", [[1.0]], (1, 2), object()])
BAD_SCALARS = st.sampled_from(["0.5", True, None, 1 + 2j, [1.0], torch.tensor(0.5)])


# ------------------------------------------------------------------------------------------ helpers
def names(msg: str, op: str, arg: str) -> bool:
    """``msg`` is ``"<op>: ..."`` and names ``arg`` as a word of its own (the article in "be a" / "as
    a" does not name gemm's ``a``)."""
    if not msg.startswith(op + ": "):
        return False
    body = re.sub(r"\b(be|as) a\b", r"\1", msg[len(op) + 2:])
    return re.search(rf"(?<![\w.]){re.escape(arg)}(?!\w)", body) is not None


def expect_rejected(op: str, arg: str, call):
    """``call()`` raises ValueError / TypeError naming ``arg``, and no op counted anything."""
    with count_launches() as n, pytest.raises((ValueError, TypeError)) as info:
        call()
    msg = str(info.value)
    assert names(msg, op, arg), f"the message does not name {arg!r}: {msg}"
    assert n.total() == 0, f"a corrupted {arg!r} got past validation: {n}"
    return msg


def empty(shape, dtype=BF, device="cuda", major="row"):
    """A tensor of ``shape``; major "col": the last two dims stored transposed; "bhsd": a (B, S, H, D)
    view of a (B, H, S, D) tensor (attention's transposed layout)."""
    if major == "col" and len(shape) >= 2:
        return torch.empty((*shape[:-2], shape[-1], shape[-2]), dtype=dtype, device=device).mT
    if major == "bhsd":
        b, s, h, d = shape
        return torch.empty((b, h, s, d), dtype=dtype, device=device).transpose(1, 2)
    return torch.empty(shape, dtype=dtype, device=device)


def with_strides(shape, strides, dtype=BF, device="cuda"):
    """A view of ``shape`` / ``strides`` into a fresh buffer (``as_strided``: a CPU-only torch cannot
    index fake CUDA tensors)."""
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else 1
    return torch.empty(span, dtype=dtype, device=device).as_strided(shape, strides)


def contiguous_strides(shape, pitch=None):
    """Row-major strides of ``shape``, the last dim padded to ``pitch`` elements."""
    strides, acc = [], 1
    for i, n in enumerate(reversed(shape)):
        strides.append(acc)
        acc *= (pitch or n) if i == 0 else n
    return tuple(reversed(strides))


def strided_badly(shape, dtype=BF, device="cuda", step=3):
    """``shape`` with every stride a multiple of ``step`` (no unit stride anywhere)."""
    return with_strides(shape, tuple(step * s for s in contiguous_strides(shape)), dtype, device)


def head_strided(shape, dtype=BF, device="cuda"):
    """``shape`` with stride 2 along the last dim."""
    return strided_badly(shape, dtype, device, step=2)


def padded_rows(shape, pad=4, dtype=BF, device="cuda"):
    """``shape`` with its last dim contiguous but rows ``shape[-1] + pad`` elements apart."""
    return with_strides(shape, contiguous_strides(shape, shape[-1] + pad), dtype, device)


def overlapping(shape, dtype=BF, device="cuda"):
    """``shape`` with stride 0 along its first dim of size > 1 (None if every dim is 1 but the last)."""
    i = next((i for i, n in enumerate(shape[:-1]) if n > 1), None)
    if i is None:
        return None
    strides = list(contiguous_strides(shape))
    strides[i] = 0
    return with_strides(shape, tuple(strides), dtype, device)


def other_half(dtype):
    return FP if dtype == BF else BF


MAJORS = st.sampled_from(["row", "col"])
OUT_DTYPES = (FP, BF, F32)


# --------------------------------------------------------------------------------------------- gemm
@st.composite
def gemm_base(draw):
    """A valid gemm call's description (sizes, dtypes, majors, optional out / c, scalars)."""
    lead = (draw(st.integers(1, 3)),) if draw(st.booleans()) else ()
    m, n, k = (draw(st.integers(1, 24)) for _ in range(3))
    has_c = draw(st.booleans())
    return {"lead": lead, "m": m, "n": n, "k": k, "dtype": draw(st.sampled_from(HALF)), "am": draw(MAJORS), "bm": draw(MAJORS),
                "out_dtype": draw(st.sampled_from((None, *OUT_DTYPES))), "has_out": draw(st.booleans()),
                "om": draw(MAJORS), "has_c": has_c, "c_dtype": draw(st.sampled_from(OUT_DTYPES)), "cm": draw(MAJORS),
                "alpha": draw(st.one_of(st.floats(-4, 4), st.integers(-3, 3))),
                "beta": draw(st.sampled_from((0.0, 1.0, -0.5, 2))) if has_c else 0.0}


def gemm_kwargs(p, device="cuda"):
    lead, m, n, k = p["lead"], p["m"], p["n"], p["k"]
    kw = {"a": empty((*lead, m, k), p["dtype"], device, p["am"]), "b": empty((*lead, k, n), p["dtype"], device, p["bm"]),
              "alpha": p["alpha"], "beta": p["beta"]}
    d_dtype = p["out_dtype"] or p["dtype"]
    if p["out_dtype"] is not None:
        kw["out_dtype"] = p["out_dtype"]
    if p["has_out"]:
        kw["out"] = empty((*lead, m, n), d_dtype, device, p["om"])
    if p["has_c"]:
        kw["c"] = empty((*lead, m, n), p["c_dtype"], device, p["cm"])
    return kw


def gemm_corruption(draw, p, kw):
    """(argument, new value) for one corruption drawn among those that apply to this call."""
    lead, m, n, k, dt = p["lead"], p["m"], p["n"], p["k"], p["dtype"]
    a_shape, b_shape, d_shape = (*lead, m, k), (*lead, k, n), (*lead, m, n)
    cases = {
        "a-type": lambda: ("a", draw(NOT_TENSORS)),
        "b-type": lambda: ("b", draw(NOT_TENSORS)),
        "a-rank": lambda: ("a", empty(draw(st.sampled_from([(k,), (2, 2, m, k), ()])), dt)),
        "b-rank": lambda: ("b", empty(draw(st.sampled_from([(n,), (2, 2, k, n), ()])), dt)),
        "a-dtype": lambda: ("a", empty(a_shape, draw(st.sampled_from([F32, torch.int8, torch.float64])))),
        "b-dtype": lambda: ("b", empty(b_shape, draw(st.sampled_from([F32, other_half(dt), torch.int32])))),
        "a-size-k": lambda: ("a", empty((*lead, m, k + draw(st.integers(1, 5))), dt)),
        "b-size-k": lambda: ("b", empty((*lead, k + draw(st.integers(1, 5)), n), dt)),
        "a-device": lambda: ("a", empty(a_shape, dt, draw(st.sampled_from(["cpu", "meta"])))),
        "b-device": lambda: ("b", empty(b_shape, dt, draw(st.sampled_from(["cpu", "meta"])))),
        "out-dtype-arg": lambda: ("out_dtype", draw(st.sampled_from([torch.int32, torch.float64, "float16", 3]))),
        "alpha": lambda: ("alpha", draw(BAD_SCALARS)),
        "beta": lambda: ("beta", draw(BAD_SCALARS)),
        "out-type": lambda: ("out", draw(NOT_TENSORS.filter(lambda x: x is not None))),
        "out-size": lambda: ("out", empty((*lead, m + draw(st.integers(1, 3)), n), p["out_dtype"] or dt)),
        "out-dtype": lambda: ("out", empty(d_shape, draw(st.sampled_from([torch.int32, torch.float64, torch.int8])))),
        "out-device": lambda: ("out", empty(d_shape, p["out_dtype"] or dt, draw(st.sampled_from(["cpu", "meta"])))),
        "c-type": lambda: ("c", draw(NOT_TENSORS.filter(lambda x: x is not None))),
        "c-size": lambda: ("c", empty((*lead, m, n + draw(st.integers(1, 3))), F32)),
        "c-dtype": lambda: ("c", empty(d_shape, draw(st.sampled_from([torch.int32, torch.float64])))),
        "c-device": lambda: ("c", empty(d_shape, F32, draw(st.sampled_from(["cpu", "meta"])))),
    }
    if "c" not in kw:
        cases["beta-without-c"] = lambda: ("beta", draw(st.sampled_from([1.0, -2.0, 0.5])))
    if lead:
        cases["b-size-batch"] = lambda: ("b", empty((lead[0] + 1, k, n), dt))
    if m > 1 and k > 1:
        cases["a-stride"] = lambda: ("a", strided_badly(a_shape, dt))
    if k > 1 and n > 1:
        cases["b-stride"] = lambda: ("b", strided_badly(b_shape, dt))
    if m > 1 and n > 1:
        cases["out-stride"] = lambda: ("out", strided_badly(d_shape, p["out_dtype"] or dt))
    if overlapping(d_shape) is not None:
        cases["out-overlap"] = lambda: ("out", overlapping(d_shape, p["out_dtype"] or dt))
    if p["out_dtype"] is not None:
        cases["out-vs-out_dtype"] = lambda: ("out", empty(d_shape, next(d for d in OUT_DTYPES if d != p["out_dtype"])))
    kind = draw(st.sampled_from(sorted(cases)))
    return kind, *cases[kind]()


@SETTINGS
@given(st.data())
def test_gemm_one_corruption(data):
    p = data.draw(gemm_base())
    with FakeTensorMode():
        kw = gemm_kwargs(p)
        kind, arg, value = gemm_corruption(data.draw, p, kw)
        kw[arg] = value
        note(f"{kind}: {arg}")
        expect_rejected("gemm", arg, lambda: cute_kernels.gemm(**kw))


@BASE_SETTINGS
@given(gemm_base())
def test_gemm_valid_base(p):
    """The uncorrupted calls pass: a fake result of the right shape and dtype, nothing compiled or
    launched (issue 19: gemm under FakeTensorMode used to compile and launch with null pointers)."""
    compiles = jit.stats["compiles"]
    with FakeTensorMode(), count_launches() as n:
        kw = gemm_kwargs(p)
        res = cute_kernels.gemm(**kw)
    assert res.shape == (*p["lead"], p["m"], p["n"])
    assert res.dtype == (kw["out"].dtype if "out" in kw else p["out_dtype"] or p["dtype"])
    assert n.as_dict() == {"gemm:fake": 1} and jit.stats["compiles"] == compiles


# ---------------------------------------------------------------------------------------- flash_attn
@st.composite
def flash_base(draw):
    hkv = draw(st.integers(1, 2))
    return {"b": draw(st.integers(1, 2)), "sq": draw(st.integers(1, 8)), "sk": draw(st.integers(1, 8)), "hkv": hkv,
                "hq": hkv * draw(st.integers(1, 3)), "d": draw(st.sampled_from(FW.HEAD_DIMS)),
                "dtype": draw(st.sampled_from(HALF)), "layouts": [draw(st.sampled_from(["row", "bhsd"])) for _ in range(4)],
                "has_out": draw(st.booleans()), "causal": draw(st.booleans()),
                "scale": draw(st.one_of(st.none(), st.floats(1e-3, 4.0)))}


def flash_kwargs(p, device="cuda"):
    qs, ks = (p["b"], p["sq"], p["hq"], p["d"]), (p["b"], p["sk"], p["hkv"], p["d"])
    lq, lk, lv, lo = p["layouts"]
    kw = {"q": empty(qs, p["dtype"], device, lq), "k": empty(ks, p["dtype"], device, lk),
              "v": empty(ks, p["dtype"], device, lv), "causal": p["causal"], "softmax_scale": p["scale"]}
    if p["has_out"]:
        kw["out"] = empty(qs, p["dtype"], device, lo)
    return kw


def flash_corruption(draw, p):
    b, sq, sk, hq, hkv, d, dt = p["b"], p["sq"], p["sk"], p["hq"], p["hkv"], p["d"], p["dtype"]
    qs, ks = (b, sq, hq, d), (b, sk, hkv, d)
    bad_d = draw(st.sampled_from([x for x in (16, 32, 48, 80, 100, 160, 512) if x not in FW.HEAD_DIMS]))
    other_d = draw(st.sampled_from([x for x in FW.HEAD_DIMS if x != d] or [d + 8]))
    cases = {}
    for arg, shape in (("q", qs), ("k", ks), ("v", ks), ("out", qs)):
        cases[f"{arg}-type"] = (lambda a=arg: (a, draw(NOT_TENSORS.filter(lambda x: a != "out" or x is not None))))
        cases[f"{arg}-rank"] = (lambda a=arg, s=shape: (a, empty(s[1:], dt)))
        cases[f"{arg}-head-stride"] = (lambda a=arg, s=shape: (a, head_strided(s, dt)))
        cases[f"{arg}-row-stride"] = (lambda a=arg, s=shape: (a, padded_rows(s, 4, dt)))
        cases[f"{arg}-device"] = (lambda a=arg, s=shape: (a, empty(s, dt, draw(st.sampled_from(["cpu", "meta"])))))
        if arg != "q":
            cases[f"{arg}-dtype"] = (lambda a=arg, s=shape: (a, empty(s, draw(st.sampled_from([other_half(dt), F32])))))
    cases.update({
        "q-dtype": lambda: ("q", empty(qs, draw(st.sampled_from([F32, torch.float64, torch.int16])))),
        "q-head-dim": lambda: ("q", empty((b, sq, hq, bad_d), dt)),
        "q-heads": lambda: ("q", empty((b, sq, hq + 1, d), dt)),  # not a multiple of Hkv > 1
        "k-head-dim": lambda: ("k", empty((b, sk, hkv, other_d), dt)),
        "k-batch": lambda: ("k", empty((b + 1, sk, hkv, d), dt)),
        "v-shape": lambda: ("v", empty((b, sk + draw(st.integers(1, 3)), hkv, d), dt)),
        "out-shape": lambda: ("out", empty((b, sq + 1, hq, d), dt)),
        "out-overlap": lambda: ("out", overlapping(qs, dt)),
        "softmax_scale": lambda: ("softmax_scale", draw(st.sampled_from(
            [0.0, -1.0, math.nan, math.inf, "0.1", True, [0.1], torch.tensor(0.1)]))),
    })
    if hkv == 1:  # every Hq is a multiple of one head
        del cases["q-heads"]
    if overlapping(qs, dt) is None:
        del cases["out-overlap"]
    kind = draw(st.sampled_from(sorted(cases)))
    return kind, *cases[kind]()


@SETTINGS
@given(st.data())
def test_flash_attn_one_corruption(data):
    p = data.draw(flash_base())
    with FakeTensorMode():
        kw = flash_kwargs(p)
        kind, arg, value = flash_corruption(data.draw, p)
        kw[arg] = value
        note(f"{kind}: {arg}")
        expect_rejected("flash_attn", arg, lambda: cute_kernels.flash_attn(**kw))


@settings(SETTINGS, max_examples=max(1, N_CASES // 3))
@given(flash_base(), st.sampled_from(["q", "k", "v", "out"]))
def test_flash_attn_misaligned_pointer(p, arg):
    """Real CPU tensors (fake ones have no pointer): the pointer's message comes before the device's."""
    p = dict(p, has_out=True, layouts=["row"] * 4)
    kw = flash_kwargs(p, device="cpu")
    kw[arg] = misaligned(tuple(kw[arg].shape), p["dtype"])
    msg = expect_rejected("flash_attn", arg, lambda: cute_kernels.flash_attn(**kw))
    assert "16-byte aligned" in msg


@BASE_SETTINGS
@given(flash_base())
def test_flash_attn_valid_base(p):
    with FakeTensorMode(), count_launches() as n:
        kw = flash_kwargs(p)
        out, lse = cute_kernels.flash_attn(**kw, return_lse=True)
    assert out.shape == (p["b"], p["sq"], p["hq"], p["d"]) and lse.shape == (p["b"], p["hq"], p["sq"])
    assert n.total() == 0  # the fake path is the custom op's fake implementation: nothing launched


# --------------------------------------------------------------------------------------- decode_attn
@st.composite
def decode_base(draw):
    hkv = draw(st.integers(1, 2))
    b = draw(st.integers(1, 3))
    paged = draw(st.booleans())
    page = draw(st.integers(1, 8)) if paged else 0
    pps = draw(st.integers(1, 3)) if paged else 0
    cap = page * pps if paged else draw(st.integers(1, 20))
    return {"b": b, "sq": draw(st.integers(1, 16)), "hkv": hkv, "hq": hkv * draw(st.sampled_from([1, 2, 4])),
                "d": draw(st.sampled_from([64, 128, 256])), "dtype": draw(st.sampled_from(HALF)), "paged": paged,
                "page": page, "pps": pps, "cap": cap, "lens": [draw(st.integers(0, cap)) for _ in range(b)],
                "has_out": draw(st.booleans()), "splits": draw(st.one_of(st.none(), st.integers(1, 4))),
                "has_ws": draw(st.booleans()), "causal": draw(st.booleans()), "checked": draw(st.booleans()),
                "scale": draw(st.one_of(st.none(), st.floats(1e-3, 4.0))), "seed": draw(st.integers(0, 2**16))}


def decode_kwargs(p):
    b, sq, hq, hkv, d, dt = p["b"], p["sq"], p["hq"], p["hkv"], p["d"], p["dtype"]
    if p["paged"]:
        kv = (b * p["pps"] + 1, p["page"], hkv, d)
        perm = torch.randperm(b * p["pps"] + 1, generator=torch.Generator().manual_seed(p["seed"]))
        kw = {"block_table": perm[: b * p["pps"]].view(b, p["pps"]).to(torch.int32).contiguous()}
    else:
        kv, kw = (b, p["cap"], hkv, d), {}
    kw.update(q=torch.zeros(b, sq, hq, d, dtype=dt), k_cache=torch.zeros(kv, dtype=dt), v_cache=torch.zeros(kv, dtype=dt),
              cache_seqlens=torch.tensor(p["lens"], dtype=torch.int32), num_splits=p["splits"], causal=p["causal"],
              softmax_scale=p["scale"], checked=p["checked"])
    if p["has_out"]:
        kw["out"] = torch.empty(b, sq, hq, d, dtype=dt)
    if p["has_ws"]:
        kw["workspace"] = torch.empty((p["splits"] or 1) * b * sq * hq * (d + 1) + 1)
    return kw


def decode_corruption(draw, p, kw):
    b, sq, hq, hkv, d, dt = p["b"], p["sq"], p["hq"], p["hkv"], p["d"], p["dtype"]
    qs, kvs = tuple(kw["q"].shape), tuple(kw["k_cache"].shape)
    meta = "meta"
    cases = {
        "q-type": lambda: ("q", draw(NOT_TENSORS)),
        "q-rank": lambda: ("q", torch.zeros(qs[1:], dtype=dt)),
        "q-dtype": lambda: ("q", torch.zeros(qs, dtype=draw(st.sampled_from([F32, torch.float64, torch.int16])))),
        "q-seqlen": lambda: ("q", torch.zeros((b, draw(st.sampled_from([0, 17, 20])), hq, d), dtype=dt)),
        "q-head-dim": lambda: ("q", torch.zeros((b, sq, hq, draw(st.sampled_from([32, 96, 100]))), dtype=dt)),
        "q-head-stride": lambda: ("q", torch.zeros((*qs[:-1], 2 * d), dtype=dt)[..., ::2]),
        "q-device": lambda: ("q", torch.zeros(qs, dtype=dt, device=meta)),
        "cache_seqlens-type": lambda: ("cache_seqlens", draw(NOT_TENSORS)),
        "cache_seqlens-rank": lambda: ("cache_seqlens", torch.zeros((b, 1), dtype=torch.int32)),
        "cache_seqlens-dtype": lambda: ("cache_seqlens", torch.zeros(b, dtype=draw(st.sampled_from([torch.int64, F32])))),
        "cache_seqlens-length": lambda: ("cache_seqlens", torch.zeros(b + draw(st.integers(1, 2)), dtype=torch.int32)),
        "cache_seqlens-stride": lambda: ("cache_seqlens", torch.zeros(2 * b, dtype=torch.int32)[::2]) if b > 1 else
                                         ("cache_seqlens", torch.zeros(b + 1, dtype=torch.int32)),
        "cache_seqlens-device": lambda: ("cache_seqlens", torch.zeros(b, dtype=torch.int32, device=meta)),
        "cache_seqlens-beyond-capacity": lambda: ("cache_seqlens", torch.full((b,), p["cap"] + 1, dtype=torch.int32)),
        "out-type": lambda: ("out", draw(NOT_TENSORS.filter(lambda x: x is not None))),
        "out-shape": lambda: ("out", torch.empty((b, sq, hq, d + 8), dtype=dt)),
        "out-dtype": lambda: ("out", torch.empty(qs, dtype=draw(st.sampled_from([other_half(dt), F32])))),
        "out-stride": lambda: ("out", torch.empty((*qs[:-1], 2 * d), dtype=dt)[..., ::2]),
        "out-pointer": lambda: ("out", misaligned(qs, dt)),
        "out-device": lambda: ("out", torch.empty(qs, dtype=dt, device=meta)),
        "workspace-type": lambda: ("workspace", draw(NOT_TENSORS.filter(lambda x: x is not None))),
        "workspace-dtype": lambda: ("workspace", torch.empty(4096, dtype=draw(st.sampled_from([FP, torch.float64])))),
        "workspace-stride": lambda: ("workspace", torch.empty(8192)[::2]),
        "workspace-pointer": lambda: ("workspace", torch.empty(8192)[1:]),
        "workspace-device": lambda: ("workspace", torch.empty(4096, device=meta)),
        "num_splits": lambda: ("num_splits", draw(st.sampled_from([0, -1, 2.5, "2", True, [2]]))),
        "softmax_scale": lambda: ("softmax_scale", draw(st.sampled_from(
            [0.0, -1.0, math.nan, math.inf, "0.1", True, [0.1], torch.tensor(0.1)]))),
    }
    if (p["splits"] or 1) > 1 or p["has_ws"]:
        cases["workspace-size"] = lambda: ("workspace", torch.empty(0))
    if hkv > 1:
        cases["q-heads"] = lambda: ("q", torch.zeros((b, sq, hq + 1, d), dtype=dt))
    for arg in ("k_cache", "v_cache"):
        cases.update({
            f"{arg}-type": lambda a=arg: (a, draw(NOT_TENSORS)),
            f"{arg}-rank": lambda a=arg: (a, torch.zeros(kvs[1:], dtype=dt)),
            f"{arg}-dtype": lambda a=arg: (a, torch.zeros(kvs, dtype=draw(st.sampled_from([other_half(dt), F32])))),
            f"{arg}-size": lambda a=arg: (a, torch.zeros((kvs[0] + 1, *kvs[1:]), dtype=dt)),
            f"{arg}-head-dim": lambda a=arg: (a, torch.zeros((*kvs[:-1], draw(st.sampled_from([32, 96, 2 * d]))), dtype=dt)),
            f"{arg}-head-stride": lambda a=arg: (a, torch.zeros((*kvs[:-1], 2 * d), dtype=dt)[..., ::2]),
            f"{arg}-row-stride": lambda a=arg: (a, torch.zeros((*kvs[:-1], d + 4), dtype=dt)[..., :d]),
            f"{arg}-pointer": lambda a=arg: (a, misaligned(kvs, dt)),
            f"{arg}-device": lambda a=arg: (a, torch.zeros(kvs, dtype=dt, device=meta)),
        })
    if p["paged"]:
        pps = p["pps"]
        cases.update({
            "block_table-type": lambda: ("block_table", draw(NOT_TENSORS.filter(lambda x: x is not None))),
            "block_table-rank": lambda: ("block_table", torch.zeros(b * pps, dtype=torch.int32)),
            "block_table-dtype": lambda: ("block_table", torch.zeros((b, pps), dtype=draw(st.sampled_from([torch.int64, F32])))),
            "block_table-rows": lambda: ("block_table", torch.zeros((b + 1, pps), dtype=torch.int32)),
            "block_table-no-pages": lambda: ("block_table", torch.zeros((b, 0), dtype=torch.int32)),
            "block_table-device": lambda: ("block_table", torch.zeros((b, pps), dtype=torch.int32, device=meta)),
        })
        if pps > 1:
            cases["block_table-stride"] = lambda: ("block_table", torch.zeros((b, 2 * pps), dtype=torch.int32)[:, ::2])
        if any(p["lens"]):
            cases["block_table-out-of-range"] = lambda: ("block_table", torch.full(
                (b, pps), draw(st.sampled_from([-1, kvs[0], kvs[0] + 7, 2**30])), dtype=torch.int32))
    kind = draw(st.sampled_from(sorted(cases)))
    arg, value = cases[kind]()
    extra = {"checked": True} if kind in ("cache_seqlens-beyond-capacity", "block_table-out-of-range") else {}
    return kind, arg, value, extra


@SETTINGS
@given(st.data())
def test_decode_attn_one_corruption(data):
    p = data.draw(decode_base())
    kw = decode_kwargs(p)
    kind, arg, value, extra = decode_corruption(data.draw, p, kw)
    kw[arg] = value
    kw.update(extra)
    note(f"{kind}: {arg}")
    expect_rejected("decode_attn", arg, lambda: cute_kernels.decode_attn(**kw))


@BASE_SETTINGS
@given(decode_base())
def test_decode_attn_valid_base(p):
    with count_launches() as n:
        out = cute_kernels.decode_attn(**decode_kwargs(p))
    assert out.shape == (p["b"], p["sq"], p["hq"], p["d"])
    assert n.as_dict() == {"decode_attn:cpu": 1}


# ----------------------------------------------------------------------------- merge_states / merge_state
@st.composite
def merge_base(draw):
    return {"p": draw(st.integers(1, 4)), "rest": tuple(draw(st.lists(st.integers(1, 4), max_size=3))),
                "d": draw(st.integers(1, 16)), "dtype": draw(st.sampled_from(OUT_DTYPES))}


def merge_corruption(draw, m):
    P, rest, d, dt = m["p"], m["rest"], m["d"], m["dtype"]
    o_shape, l_shape = (P, *rest, d), (P, *rest)
    cases = {
        "o_parts-type": lambda: ("o_parts", draw(NOT_TENSORS)),
        "o_parts-rank": lambda: ("o_parts", torch.zeros(draw(st.sampled_from([(), (d,)])), dtype=dt)),
        "o_parts-dtype": lambda: ("o_parts", torch.zeros(o_shape, dtype=draw(st.sampled_from([torch.float64, torch.int32])))),
        "o_parts-size": lambda: ("o_parts", torch.zeros((P, *rest, d)[:-2] + (o_shape[-2] + 1, d), dtype=dt)),
        "o_parts-device": lambda: ("o_parts", torch.zeros(o_shape, dtype=dt, device="meta")),
        "lse_parts-type": lambda: ("lse_parts", draw(NOT_TENSORS)),
        "lse_parts-shape": lambda: ("lse_parts", torch.zeros((*l_shape, 2))),
        "lse_parts-dtype": lambda: ("lse_parts", torch.zeros(l_shape, dtype=draw(st.sampled_from([FP, BF, torch.float64])))),
        "lse_parts-device": lambda: ("lse_parts", torch.zeros(l_shape, device="meta")),
    }
    kind = draw(st.sampled_from(sorted(cases)))
    return kind, *cases[kind]()


@SETTINGS
@given(st.data())
def test_merge_states_one_corruption(data):
    m = data.draw(merge_base())
    kw = {"o_parts": torch.zeros(m["p"], *m["rest"], m["d"], dtype=m["dtype"]), "lse_parts": torch.zeros(m["p"], *m["rest"])}
    kind, arg, value = merge_corruption(data.draw, m)
    kw[arg] = value
    note(f"{kind}: {arg}")
    expect_rejected("merge_states", arg, lambda: cute_kernels.merge_states(**kw))


@SETTINGS
@given(st.data())
def test_merge_state_one_corruption(data):
    m = data.draw(merge_base())
    o_shape, dt = (*m["rest"], m["d"]), m["dtype"]
    kw = {"o_a": torch.zeros(o_shape, dtype=dt), "lse_a": torch.zeros(m["rest"]), "o_b": torch.zeros(o_shape, dtype=dt),
              "lse_b": torch.zeros(m["rest"])}
    arg = data.draw(st.sampled_from(sorted(kw)))
    is_o = arg.startswith("o")
    shape = o_shape if is_o else m["rest"]
    kind = data.draw(st.sampled_from(["type", "shape", "dtype", "device"] + (["rank"] if arg == "o_a" else [])))
    value = {
        "type": lambda: data.draw(NOT_TENSORS),
        "shape": lambda: torch.zeros((*shape, 2), dtype=kw[arg].dtype),
        "dtype": lambda: torch.zeros(shape, dtype=data.draw(st.sampled_from(
            [torch.float64, torch.int32] + ([FP, BF] if not is_o else [x for x in OUT_DTYPES if x != dt] if arg == "o_b"
                                            else [])))),
        "device": lambda: torch.zeros(shape, dtype=kw[arg].dtype, device="meta"),
        "rank": lambda: torch.zeros((), dtype=dt),
    }[kind]()
    kw[arg] = value
    note(f"{kind}: {arg}")
    expect_rejected("merge_state", arg, lambda: cute_kernels.merge_state(**kw))


@BASE_SETTINGS
@given(merge_base())
def test_merge_valid_base(m):
    o, lse = torch.randn(m["p"], *m["rest"], m["d"]).to(m["dtype"]), torch.randn(m["p"], *m["rest"])
    with count_launches() as n:
        res = cute_kernels.merge_states(o, lse)
        cute_kernels.merge_state(o[0], lse[0], o[-1], lse[-1])
    assert res[0].shape == (*m["rest"], m["d"]) and n.as_dict() == {"merge_states:torch": 2}


# ------------------------------------------------------------------------- regressions (bugs this suite found)
def _decode_args(B=1, Hq=2, Hkv=1, D=64, L=4, device="cpu"):
    q = torch.zeros(B, 1, Hq, D, dtype=BF, device=device)
    k = torch.zeros(B, L, Hkv, D, dtype=BF, device=device)
    return {"q": q, "k_cache": k, "v_cache": k.clone(), "cache_seqlens": torch.full((B,), L, dtype=torch.int32, device=device)}


@pytest.mark.parametrize("arg", ["q", "k_cache", "v_cache", "cache_seqlens", "block_table"])
def test_decode_device_message_names_the_tensor(arg):
    """It said "all tensors must be on one device, got ['cpu', 'meta']" without naming any."""
    kw = _decode_args()
    kw["block_table"] = torch.zeros(1, 1, dtype=torch.int32)
    kw[arg] = kw[arg].to("meta")
    expect_rejected("decode_attn", arg, lambda: cute_kernels.decode_attn(**kw))


@pytest.mark.parametrize("q_shape,what", [((1, 20, 2, 64), "seqlen_q"), ((1, 1, 2, 96), "head_dim"),
                                           ((1, 1, 3, 64), "heads_q")])
def test_decode_q_shape_messages_name_q(q_shape, what):
    kw = _decode_args(Hkv=2 if what == "heads_q" else 1)
    kw["q"] = torch.zeros(q_shape, dtype=BF)
    msg = expect_rejected("decode_attn", "q", lambda: cute_kernels.decode_attn(**kw))
    assert what in msg


def test_decode_rejects_strided_lengths_and_tensor_scale():
    """A strided cache_seqlens passed validation (the compiled kernel takes a compact one); a tensor
    scale was accepted (float() of a CUDA tensor synchronizes)."""
    kw = _decode_args(B=2)
    expect_rejected("decode_attn", "cache_seqlens", lambda: cute_kernels.decode_attn(
        **dict(kw, cache_seqlens=torch.full((4,), 4, dtype=torch.int32)[::2])))
    expect_rejected("decode_attn", "softmax_scale", lambda: cute_kernels.decode_attn(**kw, softmax_scale=torch.tensor(0.1)))


def test_decode_meta_tensors_and_empty_page_pool():
    """Meta tensors reached the CPU reference (NotImplementedError); a paged cache without pages
    reached it too (IndexError; the kernel would clamp page ids into an empty pool)."""
    kw = _decode_args(device="meta")
    expect_rejected("decode_attn", "q", lambda: cute_kernels.decode_attn(**kw))
    kw = _decode_args(L=4)
    pool = torch.zeros(0, 4, 1, 64, dtype=BF)
    expect_rejected("decode_attn", "k_cache", lambda: cute_kernels.decode_attn(
        **dict(kw, k_cache=pool, v_cache=pool, block_table=torch.zeros(1, 1, dtype=torch.int32))))


def test_decode_under_fake_tensor_mode_compiles_nothing():
    """Under a plain FakeTensorMode decode_attn compiled its kernel and launched it on null pointers."""
    compiles = jit.stats["compiles"]
    with FakeTensorMode(), count_launches() as n:
        kw = _decode_args(B=2, device="cuda")
        out, lse = cute_kernels.decode_attn(**kw, return_lse=True)
        cute_kernels.decode_attn(**kw, out=torch.empty_like(kw["q"]))
    assert out.shape == kw["q"].shape and lse.shape == (2, 2, 1)
    assert n.total() == 0 and jit.stats["compiles"] == compiles


@pytest.mark.parametrize("scale", ["0.5", True])
def test_flash_attn_rejects_string_and_bool_scales(scale):
    """float("0.5") and float(True) made these valid scales."""
    with FakeTensorMode():
        q = torch.empty(1, 2, 2, FW.HEAD_DIMS[0], dtype=BF, device="cuda")
        expect_rejected("flash_attn", "softmax_scale", lambda: cute_kernels.flash_attn(q, q, q, softmax_scale=scale))


def test_outputs_with_zero_strides_are_rejected():
    """An expanded out= (several elements at one address) was accepted by gemm and flash_attn."""
    with FakeTensorMode():
        a, b = torch.empty(8, 16, dtype=BF, device="cuda"), torch.empty(16, 8, dtype=BF, device="cuda")
        out = torch.empty(1, 8, dtype=BF, device="cuda").expand(8, 8)
        expect_rejected("gemm", "out", lambda: cute_kernels.gemm(a, b, out=out))
        q = torch.empty(1, 2, 2, FW.HEAD_DIMS[0], dtype=BF, device="cuda")
        out = torch.empty(1, 1, 2, FW.HEAD_DIMS[0], dtype=BF, device="cuda").expand(1, 2, 2, FW.HEAD_DIMS[0])
        expect_rejected("flash_attn", "out", lambda: cute_kernels.flash_attn(q, q, q, out=out))


@pytest.mark.parametrize("arg,value", [("alpha", "2"), ("alpha", None), ("beta", 1j), ("alpha", True),
                                       ("alpha", torch.tensor(1.0)), ("beta", [0.0])])
def test_gemm_scalars_are_checked(arg, value):
    """Non-number alpha / beta reached the launch (float() failed there, or float("2") passed)."""
    with FakeTensorMode():
        a, b = torch.empty(8, 16, dtype=BF, device="cuda"), torch.empty(16, 8, dtype=BF, device="cuda")
        c = torch.empty(8, 8, dtype=BF, device="cuda")
        expect_rejected("gemm", arg, lambda: cute_kernels.gemm(a, b, c=c, **{arg: value}))
    import numpy as np

    with FakeTensorMode():  # numpy scalars and ints are numbers
        a, b = torch.empty(8, 16, dtype=BF, device="cuda"), torch.empty(16, 8, dtype=BF, device="cuda")
        assert cute_kernels.gemm(a, b, alpha=np.float32(0.5), beta=np.int64(0)).shape == (8, 8)


def test_gemm_under_fake_tensor_mode_compiles_nothing():
    """Issue 19: under a plain FakeTensorMode, gemm compiled and launched with null pointers.  Now a
    fake result (out= returned as given), counted as "gemm:fake", and a fake call never reuses a real
    call's cached plan (the plan signature includes the tensor type)."""
    from cute_kernels.gemm import plan as P

    compiles, plans = jit.stats["compiles"], len(P._plans)
    with FakeTensorMode(), count_launches() as n:
        a, b = torch.empty(3, 40, 64, dtype=BF, device="cuda"), torch.empty(3, 64, 24, dtype=BF, device="cuda").mT.mT
        out = torch.empty(3, 40, 24, dtype=F32, device="cuda")
        assert cute_kernels.gemm(a, b, out=out, c=out, beta=0.5) is out
        res = cute_kernels.gemm(torch.empty(40, 64, dtype=BF, device="cuda"), torch.empty(64, 24, dtype=BF, device="cuda"),
                                out_dtype=F32)
    assert (res.shape, res.dtype) == ((40, 24), F32)
    assert n.as_dict() == {"gemm:fake": 2} and jit.stats["compiles"] == compiles and len(P._plans) == plans


@pytest.mark.parametrize("arg", ["o_a", "lse_a", "o_b", "lse_b"])
def test_merge_state_checks_name_its_own_arguments(arg):
    """Mixed devices raised torch.stack's RuntimeError; an fp16 lse_b was promoted by torch.stack and
    accepted; rank and shape faults named merge_states' o_parts / lse_parts or nothing specific."""
    kw = {"o_a": torch.zeros(3, 8), "lse_a": torch.zeros(3), "o_b": torch.zeros(3, 8), "lse_b": torch.zeros(3)}
    bad = {"device": kw[arg].to("meta"), "shape": torch.zeros(*kw[arg].shape, 2),
           "dtype": kw[arg].to(torch.float64 if arg.startswith("o") else FP)}
    for value in bad.values():
        expect_rejected("merge_state", arg, lambda v=value: cute_kernels.merge_state(**dict(kw, **{arg: v})))
    if arg == "o_a":
        expect_rejected("merge_state", "o_a", lambda: cute_kernels.merge_state(**dict(kw, o_a=torch.zeros(()))))


def test_merge_states_empty_part_list_names_o_parts():
    expect_rejected("merge_states", "o_parts", lambda: cute_kernels.merge_states(torch.zeros(0, 3, 8), torch.zeros(0, 3)))


# ------------------------------------------------------------------------------ the tuning table (issue 19)
@pytest.mark.filterwarnings("ignore:cute-kernels. cannot read the tuning table")  # provoked here on purpose
def test_tuning_table_never_raises(tmp_path):
    """An unusable cache directory, an unreadable or malformed table, and a malformed entry mean
    "untuned" with one warning each; storing into a directory that cannot be created keeps the
    result in memory (one warning) instead of raising."""
    from cute_kernels.gemm import tuned

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with tuned.table_at(blocker / "sub" / "gemm_tuned.json"):  # its directory cannot be created
        assert tuned.lookup(64, 64, 64, 1, "bfloat16", "k", "mn", "bfloat16") is None
        with pytest.warns(jit.CompileCacheWarning, match="cannot write the tuning table"):
            tuned.store("x", {"splitk": "cluster"}, 1.0)
        assert tuned.load()["x"]["splitk"] == "cluster"  # kept for this process
    as_dir = tmp_path / "dir.json"
    as_dir.mkdir()
    with tuned.table_at(as_dir), pytest.warns(jit.CompileCacheWarning, match="cannot read the tuning table"):
        assert tuned.load() == {}
    for i, text in enumerate(["{not json", "[1, 2]", "null"]):
        path = tmp_path / f"bad{i}.json"
        path.write_text(text)
        with tuned.table_at(path), pytest.warns(jit.CompileCacheWarning, match="not a JSON object"):
            assert tuned.load() == {}
    key = tuned.key(64, 64, 64, 1, "bfloat16", "k", "mn", "bfloat16")
    for i, entry in enumerate([{"tile_n": 128}, {"tile_n": "big", "cluster": [1, 1], "swizzle": 1, "along_m": 0}, 7]):
        path = tmp_path / f"entry{i}.json"
        path.write_text(__import__("json").dumps({key: entry}))
        with tuned.table_at(path), pytest.warns(jit.CompileCacheWarning, match="unusable"):
            assert tuned.lookup(64, 64, 64, 1, "bfloat16", "k", "mn", "bfloat16") is None


def test_tuning_with_an_unusable_cache_dir_env(tmp_path, monkeypatch):
    """CUTE_KERNELS_CACHE_DIR under a file: planning (which reads the table) works, warning at most."""
    from cute_kernels.gemm import tuned
    from cute_kernels.gemm.host import explain

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(tuned, "_table", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jit.CompileCacheWarning)
        assert tuned.lookup(64, 64, 64, 1, "bfloat16", "k", "mn", "bfloat16") is None
        assert explain(64, 64, 64)[0]["kernel"]
    monkeypatch.setattr(tuned, "_table", None)


# ----------------------------------------------------------------------------------- GPU: the kernel counters
@pytest.mark.gpu
def test_kernel_launches_are_counted_on_the_gpu():
    """The other half of the hook: each op's kernel counter moves once per launch (CUDA tensors)."""
    dev = "cuda"
    a, b = torch.randn(256, 128, dtype=BF, device=dev), torch.randn(128, 256, dtype=BF, device=dev)
    q = torch.randn(2, 64, 4, 64, dtype=BF, device=dev)
    qd, kd = torch.randn(2, 1, 4, 64, dtype=BF, device=dev), torch.randn(2, 256, 2, 64, dtype=BF, device=dev)
    lens = torch.full((2,), 200, dtype=torch.int32, device=dev)
    o, lse = torch.randn(3, 2, 4, 64, device=dev), torch.randn(3, 2, 4, device=dev)
    with count_launches() as n:
        cute_kernels.gemm(a, b)
        cute_kernels.flash_attn(q, q, q)
        cute_kernels.decode_attn(qd, kd, kd, cache_seqlens=lens, num_splits=1)
        cute_kernels.merge_states(o, lse)
        torch.cuda.synchronize()
    assert n.as_dict() == {"gemm": 1, "flash_attn": 1, "decode_attn": 1, "merge_states": 1}
