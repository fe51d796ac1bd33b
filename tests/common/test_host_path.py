"""The host fast paths (issue 19: host time per call), on the CPU with the kernels stubbed.

Every public op keeps a launcher per call *metadata* (shapes, strides, dtypes, devices, flags), made
only after a call with that metadata passed every check and launched; the attention ops leave to the
compiled function's own argument checks what it checks itself (``jit.direct``: other tensors' dtypes
and devices, shared sizes, alignment) and take the checked path when it refuses.  Checked here, with
CPU tensors standing in for CUDA ones (the ops' device checks opened to the CPU, the compiled kernels
replaced by recording stubs that refuse as the compiled function does; the real ones:
tests/attention/test_host_path_gpu.py):

* a hit launches without re-planning or fetching the kernel again (repeated calls never recompile);
* the fast path cannot skip validation: a call that differs from a cached one only in a stride, a
  dtype, a pointer's alignment, a scalar or a flag is checked in full and raises before any launch;
* the Python overhead per call of each op with the launch stubbed (a generous bound, so a slow shared
  2-core CI box does not flake; run with ``-s`` to see the numbers).
"""

from __future__ import annotations

import gc
import math
import time
import weakref

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels
from cute_kernels.attention import decode as DE
from cute_kernels.attention import forward as FW
from cute_kernels.attention import forward_host as FH
from cute_kernels.attention import merge as ME
from cute_kernels.common import jit
from cute_kernels.common import fastpath
from cute_kernels.common.fastpath import LauncherCache
from cute_kernels.gemm import host as GH
from cute_kernels.gemm import launch as GL
from cute_kernels.gemm import plan as GP
from cute_kernels.testing import count_launches
from _check import misaligned
from conftest import Stub

BF = torch.bfloat16
#: generous: the stubbed per-call overhead is a few microseconds on a quiet machine
OVERHEAD_BOUND_US = 15.0


def rejected(call, exc=(ValueError, TypeError), match=None):
    """``call()`` raises before anything is counted (launched or run on the CPU)."""
    with count_launches() as n, pytest.raises(exc, match=match):
        call()
    assert n.total() == 0, n


def launcher_of(fn):
    return fn.__closure__ and next((c.cell_contents for c in fn.__closure__ if isinstance(c.cell_contents, Stub)), None)


# ----------------------------------------------------------------------------------------------- gemm
def test_gemm_hits_reuse_the_plan(stubbed):
    a, b, out = torch.randn(64, 32, dtype=BF), torch.randn(32, 48, dtype=BF), torch.empty(64, 48, dtype=BF)
    with count_launches() as n:
        for _ in range(5):
            assert cute_kernels.gemm(a, b, out=out) is out
            res = cute_kernels.gemm(a, b)
    assert n["gemm"] == 10 and res.shape == (64, 48) and res.dtype == BF
    # one plan (and kernel fetch) per signature, with and without out=: the hits never planned again
    assert Stub.made == 2 and len(GH._launchers) == 2 and len(GP._plans) == 2
    p = GP.plan(a, b, out)
    assert p.kind == "swapped"  # M <= 64: out^T = b^T a^T
    stub = p.fn.fn  # the same compiled kernel for both signatures
    assert len(stub.calls) == 10
    a2, b2, d, c, alpha, beta = stub.calls[0]
    assert (alpha, beta) == (1.0, 0.0)
    if p.fn.torch_order:  # the swapped entry takes the problem's operands as they are
        assert stub.key[-1] is True and a2 is a and b2 is b and d is out and c is out
    else:  # the kernel's own operand order, as views
        assert a2.shape == (48, 32) and b2.shape == (32, 64) and d.shape == (48, 64)
        assert d.data_ptr() == out.data_ptr() and d.stride() == (1, 48)


@pytest.mark.parametrize("odd", [False, True], ids=["contiguous", "odd-row-stride"])
@pytest.mark.parametrize("lead", [(1,), (1, 1)], ids=["2d", "batched-1"])
def test_gemm_size_one_dims_take_the_launcher(stubbed, monkeypatch, lead, odd):
    """A decode step's M = 1 activation against a weight's transpose (the plan notes a canonical-stride
    view for its size-1 dims): the second call hits the launcher (no planning), which passes the kernel
    the same operands the planned call did -- the activation as it is when its size-1 strides fit the
    compiled layout (a contiguous one: 16-byte multiples), else the canonical view (``odd``: a row
    stride of 65 elements, 130 bytes)."""
    k, n = 64, 96
    a, w = torch.randn(*lead, k + odd, dtype=BF)[..., :k], torch.randn(n, k, dtype=BF)
    if len(lead) == 2:
        w = w.expand(1, n, k)
    b = w.mT
    first = cute_kernels.gemm(a, b)
    out = torch.empty_like(first)
    cute_kernels.gemm(a, b, out=out)
    p = GP.plan(a, b)
    assert p.a_fix and len(GH._launchers) == 2
    planned = []
    monkeypatch.setattr(GP, "plan", lambda *args, **kw: planned.append(1))
    for _ in range(3):
        assert cute_kernels.gemm(a, b).shape == first.shape
        assert cute_kernels.gemm(a, b, out=out) is out
    assert not planned and len(GH._launchers) == 2
    fn = p.fn.fn if isinstance(p.fn, GL.SwappedLauncher) and p.fn.torch_order else p.fn
    fn = fn.fn if isinstance(fn, GL.WorkspaceLauncher) else fn
    calls = [c[:4] for c in fn.calls]
    assert len(calls) == 8
    for c in calls[1:]:  # every call's operands as the planned one's: same shapes and strides
        assert [(t.shape, t.stride()) for t in c] == [(t.shape, t.stride()) for t in calls[0]]
    assert calls[1][0].data_ptr() == a.data_ptr() and (calls[1][0].stride() != a.stride()) == odd


def test_gemm_cache_is_dropped_with_the_plans(stubbed):
    a, b = torch.randn(128, 64, dtype=BF), torch.randn(64, 256, dtype=BF)
    cute_kernels.gemm(a, b)
    assert len(GH._launchers) == 1
    GP.clear_plans()  # what the tuner does after storing a result
    assert not GH._launchers
    cute_kernels.gemm(a, b)
    assert len(GH._launchers) == 1 and Stub.made == 2


def test_gemm_hit_with_other_metadata_is_checked(stubbed):
    a, b, out = torch.randn(64, 32, dtype=BF), torch.randn(32, 48, dtype=BF), torch.empty(64, 48, dtype=BF)
    cute_kernels.gemm(a, b, out=out)
    made = Stub.made
    strided = torch.empty(64, 64, dtype=BF)[:, ::2]  # same shape and dtype, no unit stride
    rejected(lambda: cute_kernels.gemm(strided, b, out=out), ValueError, "gemm: a of shape")
    rejected(lambda: cute_kernels.gemm(a, b.float(), out=out), TypeError, "gemm: b must be float16 or bfloat16")
    rejected(lambda: cute_kernels.gemm(a, b, out=out.expand(2, 64, 48)[0].as_strided((64, 48), (0, 1))),
             ValueError, "stride of 0")
    rejected(lambda: cute_kernels.gemm(a, b, out=out.float(), out_dtype=BF), TypeError, "does not match out_dtype")
    rejected(lambda: cute_kernels.gemm(a, b, out=out, beta=1.0), ValueError, "beta != 0 needs c")
    rejected(lambda: cute_kernels.gemm(a, b, out=out, alpha=True), TypeError, "alpha")
    rejected(lambda: cute_kernels.gemm(a, b, out=[[0.0]]), TypeError, "gemm: out must be a torch.Tensor")
    rejected(lambda: cute_kernels.gemm(a, b, out=out, out_dtype=[torch.float32]), TypeError, "out_dtype")
    # a misaligned pointer is no error for gemm, but another plan: planned afresh (a staged into an aligned
    # copy: its rows are only element-aligned)
    a_mis = misaligned((64, 32))
    with count_launches() as n:
        cute_kernels.gemm(a_mis, b, out=out)
    assert n["gemm"] == 1 and Stub.made == made + 1
    plans = list(GP._plans.values())
    assert len(plans) == 2 and [bool(p.a_stage) for p in plans].count(True) == 1


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
def test_gemm_fake_tensors_after_a_real_call(stubbed):
    """A fake call of a cached real signature never reaches a launcher (nothing launched)."""
    a, b = torch.randn(64, 32, dtype=BF), torch.randn(32, 48, dtype=BF)
    cute_kernels.gemm(a, b)
    with FakeTensorMode() as mode, count_launches() as n:
        fa, fb = mode.from_tensor(a), mode.from_tensor(b)
        res = cute_kernels.gemm(fa, fb)
    assert res.shape == (64, 48) and n.as_dict() == {"gemm:fake": 1}


class _CountingCache(LauncherCache):
    """GH._launchers counting its dict lookups: the key path's (a guarded last hit makes none)."""

    __slots__ = ("gets",)

    def __init__(self, *args):
        super().__init__(*args)
        self.gets = 0

    def get(self, key, default=None):
        self.gets += 1
        return super().get(key, default)


def entry(L, b):
    """gemm's launcher entry for b (``(key, launcher, guard, rest)``; armed when guard is not None)."""
    return L.armed.get(b.data_ptr(), fastpath.NO_LAST)


def test_gemm_repeats_take_the_guarded_last_hit(stubbed, monkeypatch):
    """The third call in a row with the same metadata takes the last hit on its guard (gemm's first test:
    no key, no dict lookup, no requires_grad read), in and out of grad mode; a call that differs in a
    fact the key holds (strides, dtype, a pointer's 16-byte alignment, c's presence), in out's overlap,
    or with an input requiring grad under grad mode, takes the key path and its checks."""
    L = _CountingCache()
    monkeypatch.setattr(GH, "_launchers", L)
    a, b, out = torch.randn(64, 32, dtype=BF), torch.randn(32, 48, dtype=BF), torch.empty(64, 48, dtype=BF)
    for i in range(3):  # a miss (the launcher made), a dict hit (remembered), a repeat (armed)
        assert cute_kernels.gemm(a, b, out=out) is out
        assert (entry(L, b)[2] is not None) == (i == 2) and L.gets == i + 1
    with count_launches() as n:
        for mode in (torch.enable_grad, torch.no_grad, torch.enable_grad):
            with mode():
                for _ in range(3):
                    assert cute_kernels.gemm(a, b, out=out) is out
                    res = cute_kernels.gemm(a, b, out=torch.empty(64, 48, dtype=BF))  # (another out, alike)
    assert n["gemm"] == 18 and L.gets == 3 and len(L) == 1 and res.shape == (64, 48)

    def key_path(call, made=0):
        """``call()`` takes the key path (a dict lookup), launches once, and leaves the last hit armed
        when a launcher was found (``made``: launchers added, 0 for a hit)."""
        gets, size = L.gets, len(L)
        with count_launches() as n:
            res = call()
        assert n["gemm"] == 1 and L.gets > gets and len(L) == size + made
        return res

    key_path(lambda: cute_kernels.gemm(a.mT.contiguous().mT, b, out=out), made=1)  # other strides
    key_path(lambda: cute_kernels.gemm(a.half(), b.half(), out=out.half()), made=1)  # another dtype
    for _ in range(2):  # re-armed on the first launcher
        cute_kernels.gemm(a, b, out=out)
    gets = L.gets
    cute_kernels.gemm(a, b, out=out)
    assert L.gets == gets and entry(L, b)[2] is not None
    # a misaligned a (a sliced view of the same shape, strides and dtype: the guard passes, the pointer
    # test not): planned afresh (a staged into an aligned copy, no launcher)
    made = Stub.made
    key_path(lambda: cute_kernels.gemm(misaligned((64, 32)), b, out=out))
    assert Stub.made == made + 1
    for _ in range(3):
        cute_kernels.gemm(a, b, out=out)
    assert entry(L, b)[2] is not None
    # an out overlapping a, b alike: the launcher's overlap test refuses it, the checks name it
    buf = torch.empty(64 * 48 + 64 * 32, dtype=BF)
    rejected(lambda: cute_kernels.gemm(buf[:64 * 32].view(64, 32), b, out=buf[64 * 8:64 * 8 + 64 * 48].view(64, 48)),
             ValueError, "out overlaps a")
    rejected(lambda: cute_kernels.gemm(a, b.half(), out=out), TypeError, "same dtype")
    rejected(lambda: cute_kernels.gemm(a, b, out=out, out_dtype=torch.float32), TypeError, "does not match out_dtype")
    rejected(lambda: cute_kernels.gemm(a, b, out=out, beta=1.0), ValueError, "beta != 0 needs c")
    # an input requiring grad under grad mode: the differentiable op (out= refused there; without out,
    # a result with a grad_fn); under no_grad the launcher, as without a guard
    a_grad = a.clone().requires_grad_()
    with pytest.raises(ValueError, match="out="):
        cute_kernels.gemm(a_grad, b, out=out)
    for _ in range(3):
        cute_kernels.gemm(a, b)
    assert entry(L, b)[2] is not None
    res = cute_kernels.gemm(a_grad, b)
    assert res.requires_grad and res.grad_fn is not None
    with torch.no_grad():
        res = key_path(lambda: cute_kernels.gemm(a_grad, b))
    assert not res.requires_grad


def test_gemm_weight_requiring_grad_under_no_grad_takes_its_guard(stubbed, monkeypatch):
    """``gemm(x, w.t())`` under no_grad with a weight requiring grad (a model's Parameter: its transpose
    view requires grad too, no_grad or not) arms a guard that records requires_grad, tested with grad
    mode off only: the fourth call takes it (no dict lookup); the same call under grad mode is the
    differentiable op (its result has a grad_fn) and leaves the entry armed for the next no_grad calls."""
    L = _CountingCache()
    monkeypatch.setattr(GH, "_launchers", L)
    w = torch.nn.Parameter(torch.randn(48, 32, dtype=BF))
    x = torch.randn(64, 32, dtype=BF)
    with torch.no_grad():
        assert w.t().requires_grad
        for i in range(3):
            res = cute_kernels.gemm(x, w.t())
            assert not res.requires_grad and res.shape == (64, 48)
        assert L.gets == 3 and entry(L, w)[2] is not None and entry(L, w)[4] is True
        with count_launches() as n:
            for _ in range(3):
                cute_kernels.gemm(x, w.t())
        assert n["gemm"] == 3 and L.gets == 3  # (the guard path)
    res = cute_kernels.gemm(x, w.t())  # grad mode: through the differentiable op (its _run: one lookup)
    assert res.requires_grad and res.grad_fn is not None and L.gets == 4
    with torch.no_grad(), count_launches() as n:
        cute_kernels.gemm(x, w.t())
        assert n["gemm"] == 1 and L.gets == 4 and entry(L, w)[2] is not None
    with torch.no_grad():  # the weight's detached transpose instead: its guard fails (requires_grad), the
        wd = w.detach().t()  # entry is disarmed for _REARM_AFTER repeats, then armed with the launcher's own
        for i in range(GH._REARM_AFTER + 2):  # (the failing call, the countdown, the arming repeat)
            assert entry(L, w)[2] is None or i == 0
            cute_kernels.gemm(x, wd)
        assert entry(L, w)[2] is not None and entry(L, w)[4] is False


def test_gemm_arms_more_weights_than_the_launcher_bound(stubbed, monkeypatch):
    """A model with more linears than launchers are kept (Llama-3-70B: 560 > 512): every weight's entry
    arms and stays (fastpath.MAX_ARMED), so the fourth round of calls makes no dict lookup."""
    L = _CountingCache()
    monkeypatch.setattr(GH, "_launchers", L)
    x = torch.randn(16, 32, dtype=BF)
    ws = [torch.randn(32, 48, dtype=BF) for _ in range(fastpath.MAX_ENTRIES + 88)]
    for _ in range(3):  # a miss (the one launcher), dict hits, repeats that arm
        for w in ws:
            cute_kernels.gemm(x, w)
    gets = L.gets
    with count_launches() as n:
        for w in ws:
            cute_kernels.gemm(x, w)
    assert n["gemm"] == len(ws) and L.gets == gets and len(L) == 1
    assert all(entry(L, w)[2] is not None for w in ws)


def test_gemm_guarded_last_hit_states(stubbed, monkeypatch):
    """Calls alternating between two weights (a model's linears) each arm b's own entry on their second
    call and then take its guard; one weight alternating between two shapes of a (prefill and decode)
    never arms (no guard to fail); out=c exactly arms (its guard over a, b, out); a guard failing its own
    key's call (inference mode) disarms it for _REARM_AFTER repeats, then arming is tried again; the
    planner's clear forgets them all."""
    L = _CountingCache()
    monkeypatch.setattr(GH, "_launchers", L)
    ops = [(torch.randn(m, k, dtype=BF), torch.randn(k, n, dtype=BF), torch.empty(m, n, dtype=BF))
           for m, n, k in ((64, 48, 32), (128, 256, 64))]
    with count_launches() as n:
        for i in range(4):
            for a, b, out in ops:
                assert cute_kernels.gemm(a, b, out=out) is out
                assert (entry(L, b)[2] is not None) == (i >= 2)  # (a miss, a dict hit, the repeat that arms)
    assert n["gemm"] == 8 and len(L) == 2 and L.gets == 6  # (the fourth round: guards only)
    a, b, _ = ops[0]
    a2 = torch.randn(96, 32, dtype=BF)  # the same weight with another M: the key path, unarmed
    with count_launches() as n:
        for _ in range(3):
            for x in (a, a2):
                cute_kernels.gemm(x, b)
                assert entry(L, b)[2] is None and entry(L, b)[3] is None
    assert n["gemm"] == 6 and len(L) == 4
    a, b, d = ops[0]
    for i in range(3):
        assert cute_kernels.gemm(a, b, out=d, c=d, beta=1.0) is d
    assert entry(L, b)[2] is not None and entry(L, b)[3][2] is True  # rest: c is out
    gets = L.gets
    with count_launches() as n:
        assert cute_kernels.gemm(a, b, out=d, c=d, beta=0.5) is d
        assert cute_kernels.gemm(a, b, out=d, c=d.clone(), beta=0.5) is d  # c alike but not out: the key path
    assert n["gemm"] == 2 and L.gets == gets + 1
    for _ in range(3):
        cute_kernels.gemm(a, b)
    assert entry(L, b)[2] is not None
    with torch.inference_mode(), count_launches() as n:
        for _ in range(3):
            cute_kernels.gemm(a, b)
        assert entry(L, b)[2] is None and entry(L, b)[3] == GH._REARM_AFTER - 2  # (disarmed, counting down)
    assert n["gemm"] == 3 and len(L) == 5
    for _ in range(GH._REARM_AFTER - 2):  # out of inference mode: the key path until arming is tried again
        assert entry(L, b)[2] is None
        cute_kernels.gemm(a, b)
    cute_kernels.gemm(a, b)  # (the repeat that arms: a weight used with one shape is not left disarmed)
    assert entry(L, b)[2] is not None
    made = Stub.made
    GP.clear_plans()
    assert entry(L, b) == fastpath.NO_LAST and not L and not L.armed
    for _ in range(4):
        cute_kernels.gemm(a, b)
    assert Stub.made == made + 1 and entry(L, b)[2] is not None
    # a stale hint: another tensor at b's address (b's memory viewed with another shape) fails the entry's
    # guard and takes the key path: its own launcher, a result of its own shape, correct on a real device
    bv, a16 = b.view(16, 96), torch.randn(64, 16, dtype=BF)
    gets = L.gets
    with count_launches() as n:
        for i in range(4):
            assert cute_kernels.gemm(a16, bv).shape == (64, 96)
            assert i == 0 or entry(L, bv)[1].plan.shape == (64, 96)  # (a miss first: made, no entry)
    assert n["gemm"] == 4 and L.gets == gets + 3 and entry(L, bv)[2] is not None


def test_gemm_traced_calls_never_read_the_last_hit(stubbed):
    """A torch.compile'd function calling gemm (the custom op) tests ``is_compiling`` before the last hit,
    so its graph holds no guard on the launcher cache: eager calls that arm, change or grow it between
    calls of the compiled function recompile nothing."""
    torch._dynamo.reset()
    a, b = torch.randn(64, 32, dtype=BF), torch.randn(32, 48, dtype=BF)
    a2, b2 = torch.randn(128, 64, dtype=BF), torch.randn(64, 256, dtype=BF)
    for _ in range(3):
        cute_kernels.gemm(a, b)
    assert entry(GH._launchers, b)[2] is not None

    @torch.compile(backend="eager", fullgraph=True)
    def f(x, y):
        return cute_kernels.gemm(x, y) * 2

    f(a, b)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i in range(4):
            for _ in range(3):
                cute_kernels.gemm(*((a2, b2) if i % 2 else (a, b)))
            cute_kernels.gemm(a2, b2.mT.contiguous().mT)  # (another key: the cache grows)
            assert f(a, b).shape == (64, 48)
    torch._dynamo.reset()


def test_swapped_entry_arguments():
    """The swapped entry's fake arguments are the transposes of the kernel's, in the problem's order."""
    a, b = torch.empty(16, 4096, dtype=BF, device="meta"), torch.empty(4096, 4096, dtype=BF, device="meta")
    with jit.dry_run():
        p = GP.make_plan(a, b, allow_cpu=True)
    assert p.kind == "swapped"
    cfg = p.kernels[-1][1]
    k0, args0 = GL.fake_args(cfg, "bfloat16", "bfloat16", "bfloat16")
    k1, args1 = GL.fake_args(cfg, "bfloat16", "bfloat16", "bfloat16", swapped=True)
    assert isinstance(k1, GL.SwappedEntry) and type(k1.kernel) is type(k0) and len(args1) == len(args0)
    # (a, b, d, c) of the entry = (b^T, a^T, d^T, c^T) of the kernel
    for mine, theirs in zip(args1[:4], (args0[1], args0[0], args0[2], args0[3])):
        assert tuple(map(str, mine.shape)) == tuple(map(str, theirs.shape))[::-1]
    a, b = torch.empty(512, 512, dtype=BF, device="meta"), torch.empty(512, 512, dtype=BF, device="meta")
    with jit.dry_run():
        persistent = GP.make_plan(a, b, allow_cpu=True).kernels[-1][1]
    with pytest.raises(ValueError, match="rank-2 split-K configs only"):
        GL.fake_args(persistent, "bfloat16", "bfloat16", "bfloat16", swapped=True)


# ---------------------------------------------------------------------------------------- decode_attn
def decode_inputs(B=2, Hq=8, Hkv=2, D=64, L=40):
    return (torch.randn(B, 1, Hq, D, dtype=BF), torch.randn(B, L, Hkv, D, dtype=BF),
            torch.randn(B, L, Hkv, D, dtype=BF), torch.full((B,), L // 2, dtype=torch.int32))


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_hits(stubbed, num_splits):
    q, k, v, s = decode_inputs()
    with count_launches() as n:
        DE.decode_attn(q, k, v, cache_seqlens=s, num_splits=num_splits)
        made = Stub.made  # (the miss fetches the kernel to launch it and to make the launcher)
        for _ in range(4):
            o, lse = DE.decode_attn(q, k, v, cache_seqlens=s, num_splits=num_splits, return_lse=True)
    assert n["decode_attn"] == 5 and Stub.made == made and len(DE._launchers) == 1
    assert o.shape == q.shape and lse.shape == (2, 8, 1) and lse.dtype == torch.float32
    (stub,) = {launcher_of(f) for f in DE._launchers.values()}
    *_, o_part, lse_part, scale_log2 = stub.calls[-1]
    assert scale_log2 == pytest.approx(64 ** -0.5 / math.log(2))
    if num_splits == 1:
        assert o_part is None and lse_part is None
    else:
        assert o_part.shape == (3, 2, 1, 8, 64) and lse_part.shape == (3, 2, 1, 8) and o_part.is_contiguous()
    # a given workspace: the partial states are views of it, at the documented offsets
    ws = DE.decode_attn_workspace(q, num_splits)
    DE.decode_attn(q, k, v, cache_seqlens=s, num_splits=num_splits, workspace=ws)
    DE.decode_attn(q, k, v, cache_seqlens=s, num_splits=num_splits, workspace=ws, softmax_scale=0.5)
    *_, o_part, lse_part, scale_log2 = stub.calls[-1]
    assert scale_log2 == pytest.approx(0.5 / math.log(2))
    if num_splits > 1:
        n_o = 3 * 2 * 8 * 64
        assert o_part.data_ptr() == ws.data_ptr() and lse_part.data_ptr() == ws[n_o:].data_ptr()
        assert o_part.shape == (3, 2, 1, 8, 64) and lse_part.shape == (3, 2, 1, 8)


def test_bounded_cache_drops_the_oldest_insertion():
    c = fastpath.BoundedCache(limit=3)
    for i in range(5):
        c[i] = i
    c[4] = "again"  # (an existing key: nothing dropped)
    assert list(c.items()) == [(2, 2), (3, 3), (4, "again")]
    lc = LauncherCache(limit=2)
    lc["a"], lc["b"] = 1, 2
    lc.hit("b")
    lc["c"] = 3  # drops "a" and forgets the last hit, as every change does
    assert list(lc) == ["b", "c"] and lc.last == fastpath.NO_LAST and lc.limit == 2
    c.setdefault(5, 5)  # (setdefault and update insert through the bound too)
    c.update({6: 6, 7: 7})
    assert list(c) == [5, 6, 7] and c.setdefault(7, "not used") == 7
    assert isinstance(GP._plans, fastpath.BoundedCache) and isinstance(ME._launchers, fastpath.BoundedCache)


def test_scratch_pool_is_shared_grows_and_keeps_old_buffers(monkeypatch):
    """fresh_or_scratch's scratch: a view of one pool per (device, dtype) shared by every launcher; a
    larger request makes a new, larger buffer (doubling) and the old one stays referenced (a captured
    graph may still write into it); fresh requests never come from the pool."""
    monkeypatch.setattr(fastpath, "_SCRATCH", {})
    dev = torch.device("cpu")
    a = fastpath.fresh_or_scratch(torch.empty, (2, 3, 5), torch.float32, dev)
    b = fastpath.fresh_or_scratch(torch.empty, (4, 7), torch.float32, dev)
    sa, sb = a(False), b(False)
    assert sa.shape == (2, 3, 5) and sb.shape == (4, 7) and sa.is_contiguous() and sb.is_contiguous()
    assert sa.data_ptr() == sb.data_ptr() and a(False) is sa and a.scratch == [sa]
    assert a(True).data_ptr() != sa.data_ptr()
    big = fastpath.fresh_or_scratch(torch.empty, (3000,), torch.float32, dev)(False)
    pool = fastpath._SCRATCH[(dev, torch.float32)]
    assert len(pool) == 2 and pool[-1].numel() == 3000 and big.data_ptr() == pool[-1].data_ptr()
    assert pool[0].data_ptr() == sa.data_ptr()  # (kept: still a's scratch)
    bigger = fastpath.fresh_or_scratch(torch.empty, (3001,), torch.float32, dev)(False)
    assert len(pool) == 3 and pool[-1].numel() == 6000 and bigger.numel() == 3001


@pytest.mark.parametrize("num_splits", [None, 4])
def test_decode_over_a_growing_cache_keeps_bounded_caches(stubbed, monkeypatch, num_splits):
    """Transformers' DynamicCache: every decode step a longer cache, so new metadata, a new plan and a
    new launcher.  The launchers and plans stay within their bound (the oldest dropped, remade when
    asked again), and every launcher of a split shape shares one set of partial states and the scratch
    LSE (not a set each: the device memory a long generation would pile up)."""
    from cute_kernels.attention import decode_plan as DP

    monkeypatch.setattr(DE._launchers, "limit", 8)
    monkeypatch.setattr(DP._PLANS, "limit", 8)
    q = torch.randn(1, 1, 8, 64, dtype=BF)
    caches = [(torch.randn(1, L, 2, 64, dtype=BF), torch.randn(1, L, 2, 64, dtype=BF),
               torch.full((1,), L, dtype=torch.int32)) for L in range(100, 140)]
    calls, call = [], Stub.__call__
    monkeypatch.setattr(Stub, "__call__", lambda self, *a: (calls.append(a), call(self, *a))[1])
    out = torch.empty_like(q)  # (with out=: a launcher per length; without, _grown's: the next test)
    for k, v, s in caches + caches[:2]:  # (the first two again, after they were dropped)
        for _ in range(3):  # a step's layers: the first takes the checked path, the others the launcher
            DE.decode_attn(q, k, v, cache_seqlens=s, num_splits=num_splits, out=out)
    assert len(DE._launchers) == 8 and len(DP._PLANS) == 8 and len(calls) == 3 * 42
    lse = {c[6].data_ptr() for i, c in enumerate(calls) if i % 3}
    assert len(lse) == 1, "the unread LSE: one scratch for every launcher"
    if num_splits:
        assert len({c[7].data_ptr() for c in calls}) == 1, "one set of partial states for every launcher"


def test_split_partials_of_every_shape_share_one_pool(stubbed, monkeypatch):
    """A continuously batched server: split decode calls whose batch size changes call by call take their
    partial states from one pool buffer per stream (the largest launch's size), not a set per shape; a
    larger shape grows the pool and the smaller shapes move to the new buffer at their next call."""
    monkeypatch.setattr(fastpath, "_POOLS", fastpath.BoundedCache(limit=64))
    monkeypatch.setattr(fastpath, "_POOL_GRAIN", 256)  # (a buffer just the size asked, rounded up)
    calls, call = [], Stub.__call__
    monkeypatch.setattr(Stub, "__call__", lambda self, *a: (calls.append(a), call(self, *a))[1])
    k, v = (torch.randn(8, 300, 2, 64, dtype=BF) for _ in range(2))

    def step(b):
        """One split decode call of batch b: the data pointer of the storage its partial states are in."""
        q = torch.randn(b, 1, 8, 64, dtype=BF)
        DE.decode_attn(q, k[:b], v[:b], cache_seqlens=torch.full((b,), 300, dtype=torch.int32), num_splits=4)
        o_part, lse_part = calls[-1][7], calls[-1][8]
        assert o_part.shape == (4, b, 1, 8, 64) and lse_part.shape == (4, b, 1, 8)
        assert lse_part.data_ptr() == o_part.data_ptr() + o_part.numel() * 4  # (consecutive views)
        return o_part.untyped_storage().data_ptr()

    first = {step(b) for b in (3, 1, 2, 3, 1, 2)}
    (pool,) = fastpath._POOLS.values()
    assert len(first) == 1 and pool.numel() == 4 * 3 * 8 * 65 // 256 * 256 + 256  # (batch 3's, rounded up)
    old = weakref.ref(pool)
    del pool
    grown = {step(8)}
    assert grown != first and {step(b) for b in (1, 2, 3, 8)} == grown, "every shape moves to the grown buffer"
    (pool,) = fastpath._POOLS.values()
    assert pool.numel() == 4 * 8 * 8 * 65  # (a multiple of 256 already)
    calls.clear()
    for stub in Stub.cache.values():  # (the stubs record their calls' arguments)
        stub.calls.clear()
    gc.collect()
    assert old() is None, "the outgrown buffer is freed once no shape's views hold it"


def test_pools_are_bounded(monkeypatch):
    """At most _POOLS.limit pool buffers are kept (one per (device, stream): a server making a stream per
    request would otherwise keep one per stream); a dropped pool's views are carved again on demand."""
    monkeypatch.setattr(fastpath, "_POOLS", fastpath.BoundedCache(limit=1))
    cpu, meta = {}, {}
    (a,) = fastpath.pooled_views(cpu, torch.device("cpu"), ((4, 8),))
    (b,) = fastpath.pooled_views(meta, torch.device("meta"), ((4, 8),))  # (another key: cpu's pool dropped)
    assert len(fastpath._POOLS) == 1 and b.device.type == "meta"
    (a2,) = fastpath.pooled_views(cpu, torch.device("cpu"), ((4, 8),))  # carved again from a new pool
    assert a2.shape == (4, 8) and a2.device.type == "cpu" and len(fastpath._POOLS) == 1


@pytest.mark.parametrize("layout,num_splits", [("bshd", None), ("bhsd", None), ("bhsd", 3)])
def test_decode_over_a_growing_cache_takes_grown_launchers(stubbed, monkeypatch, layout, num_splits):
    """Without out=, a longer cache of otherwise the same metadata (a DynamicCache's next step, also as
    Transformers holds it: (B, H, L, D) transposed) takes a launcher made once per number of KV tiles
    (DE._GROWN): no checked path, no plan or launcher per length.  Each call still gets its own
    tensors and its tile count's split; a stride the kernel does not take, or an empty cache, goes to
    the checks, which name it."""
    monkeypatch.setattr(DE, "_GROWN", fastpath.BoundedCache(limit=64))
    q = torch.randn(2, 1, 8, 64, dtype=BF)

    def cache(L):
        if layout == "bshd":
            return torch.randn(2, L, 2, 64, dtype=BF), torch.randn(2, L, 2, 64, dtype=BF)
        return (torch.randn(2, 2, L, 64, dtype=BF).transpose(1, 2), torch.randn(2, 2, L, 64, dtype=BF).transpose(1, 2))

    calls, call = [], Stub.__call__
    monkeypatch.setattr(Stub, "__call__", lambda self, *a: (calls.append(a), call(self, *a))[1])
    lengths = list(range(60, 400, 7))
    with count_launches() as n:
        for L in lengths:
            k, v = cache(L)
            s = torch.full((2,), L, dtype=torch.int32)
            for _ in range(2):
                DE.decode_attn(q, k, v, cache_seqlens=s, num_splits=num_splits)
            assert calls[-1][1] is k and calls[-1][2] is v and calls[-1][3] is s
    assert n["decode_attn"] == 2 * len(lengths) and len(DE._launchers) == 1  # (only the first length's)
    (n_tile, by_tiles), = DE._GROWN.values()
    assert sorted(by_tiles) == sorted({-(-L // n_tile) for L in lengths})
    from cute_kernels.attention import decode_plan as DP
    for L, (i, c) in zip(lengths, list(enumerate(calls))[::2]):  # each call's split: its own length's
        P = DP.plan_uncached(q, torch.empty(2, L, 2, 64, dtype=BF), None, num_splits, True)[1]
        assert (c[7] is None) == (P == 1) and (P == 1 or c[7].shape[0] == P)
    # what the grown launchers do not take goes to the checks
    k, v = cache(500)
    bad = torch.empty(2, 500, 2, 68, dtype=BF)[..., :64]  # rows 136 B apart: not 16-byte multiples
    rejected(lambda: DE.decode_attn(q, bad, v, cache_seqlens=torch.full((2,), 5, dtype=torch.int32)), ValueError,
             "16-byte aligned")
    s5 = torch.full((2,), 5, dtype=torch.int32)
    for k3 in (k[0], k[..., 0]):  # another rank (its key's shape is shorter: found by test_properties)
        rejected(lambda k3=k3: DE.decode_attn(q, k3, v, cache_seqlens=s5), ValueError, "k_cache must be 4-d")
    made = len(DE._launchers)
    DE.decode_attn(q, k[:, :0], v[:, :0], cache_seqlens=torch.zeros(2, dtype=torch.int32))  # an empty cache:
    assert len(DE._launchers) == made + 1  # checked, and a launcher of its own


def test_decode_hit_with_other_metadata_is_checked(stubbed, monkeypatch):
    q, k, v, s = decode_inputs()
    DE.decode_attn(q, k, v, cache_seqlens=s)
    rejected(lambda: DE.decode_attn(q, misaligned(tuple(k.shape)), v, cache_seqlens=s), ValueError, "16-byte aligned")
    rejected(lambda: DE.decode_attn(q, k, v.half(), cache_seqlens=s), TypeError, "v_cache dtype")
    rejected(lambda: DE.decode_attn(q, k, v, cache_seqlens=s.long()), TypeError, "cache_seqlens must be int32")
    rejected(lambda: DE.decode_attn(q, k, v, cache_seqlens=s, num_splits=True), TypeError, "num_splits")
    rejected(lambda: DE.decode_attn(q, k, v, cache_seqlens=s, softmax_scale=-1.0), ValueError, "softmax_scale")
    rejected(lambda: DE.decode_attn(q, k, v, cache_seqlens=s, softmax_scale=math.nan), ValueError, "softmax_scale")
    rejected(lambda: DE.decode_attn(q, k, v, cache_seqlens=s, softmax_scale=torch.tensor(0.1)), TypeError)
    padded = torch.empty(2, 40, 2, 68, dtype=BF)[..., :64]  # rows 136 bytes apart
    rejected(lambda: DE.decode_attn(q, padded, v, cache_seqlens=s), ValueError, "16-byte aligned")
    # a misaligned q is valid: the launcher's kernel refuses it, the checked path copies it (no new launcher)
    with count_launches() as n:
        DE.decode_attn(misaligned(tuple(q.shape)), k, v, cache_seqlens=s)
    assert n["decode_attn"] == 1 and len(DE._launchers) == 1
    # checked mode (the environment variable, read on every call) validates lengths on a cached key
    bad = torch.full((2,), 99, dtype=torch.int32)
    DE.decode_attn(q, k, v, cache_seqlens=bad)  # unchecked: clamped, runs
    monkeypatch.setenv("CUTE_KERNELS_CHECKED", "1")
    rejected(lambda: DE.decode_attn(q, k, v, cache_seqlens=bad), ValueError, "exceed the cache capacity")
    monkeypatch.setenv("CUTE_KERNELS_CHECKED", "0")
    with count_launches() as n:
        DE.decode_attn(q, k, v, cache_seqlens=bad)
    assert n["decode_attn"] == 1
    rejected(lambda: DE.decode_attn(q, k, v, cache_seqlens=bad, checked=True), ValueError, "exceed")


def test_decode_cpu_reference_is_never_cached(monkeypatch):
    """CPU tensors run the torch reference every time (no launcher is made for them)."""
    monkeypatch.setattr(DE, "_launchers", LauncherCache())
    q, k, v, s = decode_inputs()
    with count_launches() as n:
        DE.decode_attn(q, k, v, cache_seqlens=s)
        DE.decode_attn(q, k, v, cache_seqlens=s)
    assert n.as_dict() == {"decode_attn:cpu": 2} and not DE._launchers


# ----------------------------------------------------------------------------------------- flash_attn
def test_launcher_cache_forgets_its_last_hit_on_any_change():
    """LauncherCache.last (the attention fast paths compare a call's key with it before hashing it, or
    check its guard) never names a launcher the dict no longer holds under that key."""
    none = (None, None, None, None)
    c = LauncherCache({(1,): "a"})
    assert c.last == none and c.hit((2,)) is None and c.last == none
    assert c.hit((1,)) == "a" and c.last == ((1,), "a", None, None)
    for change in (lambda: c.__setitem__((1,), "b"), lambda: c.pop((1,)), lambda: c.clear(),
                   lambda: c.update({(3,): "c"}), lambda: c.setdefault((4,), "d"), lambda: c.popitem(),
                   lambda: c.__delitem__(next(iter(c))), lambda: c.__ior__({(5,): "e"})):
        c[(1,)] = "a"
        assert c.hit((1,)) == "a" and c.last[1] == "a"
        change()
        assert c.last == none, change


def test_launcher_cache_remembers_a_guard(stubbed):
    """A dict hit is remembered unarmed; a repeat arms its launcher's guard (fastpath.metadata_guard) and
    rest; a guard that fails a call whose key is the last one (here: inference mode, another dispatch
    state than the guard's) is disarmed in ``last``, so the calls after it take the key path alone."""
    q, k = torch.randn(2, 3), torch.randn(4)

    def launch():
        pass
    launch.guard, launch.rest = fastpath.metadata_guard(q, k), ("rest",)
    assert launch.guard is not None and launch.guard.check(q, k) and not launch.guard.check(k, q)
    c = LauncherCache({(1,): launch})
    assert c.hit((1,)) is launch and c.last == ((1,), launch, None, None)
    # no guard where it cannot stand for a key: a tensor requiring grad, one passed twice, not a tensor
    assert fastpath.metadata_guard(q.clone().requires_grad_()) is None
    assert fastpath.metadata_guard(k, k) is None and fastpath.metadata_guard(k, 1) is None
    dq, dk, dv, ds = decode_inputs()
    for i in range(3):  # a miss, a dict hit (unarmed), a repeat (armed)
        DE.decode_attn(dq, dk, dv, cache_seqlens=ds)
        assert (DE._launchers.last[2] is not None) == (i == 2)
    with torch.inference_mode(), count_launches() as n:
        for _ in range(3):
            DE.decode_attn(dq, dk, dv, cache_seqlens=ds)
        assert DE._launchers.last[2:] == (None, False) and n["decode_attn"] == 3 and len(DE._launchers) == 1


def test_fast_paths_take_the_launcher_now_under_the_key(stubbed):
    """A call with the metadata of the call before it takes the last hit; a launcher replaced under that
    key (the checked path stores a new one) is the one the next call takes, and a key alternating
    with another still finds its own."""
    q, k, v, s = decode_inputs()
    o = torch.empty_like(q)
    DE.decode_attn(q, k, v, cache_seqlens=s, out=o)
    DE.decode_attn(q, k, v, cache_seqlens=s, out=o)
    (key,) = DE._launchers
    assert key == DE._key(q, k, v, s, None, o, None, None, True) and DE._launchers.last[0] == key
    calls = []
    old = DE._launchers[key]

    def spy(*args):
        calls.append(args)
        return old(*args)
    spy.default_scale, spy.keep, spy.guard, spy.rest = old.default_scale, old.keep, None, None
    DE._launchers[key] = spy
    with count_launches() as n:
        for _ in range(3):
            DE.decode_attn(q, k, v, cache_seqlens=s, out=o)
            DE.decode_attn(q, k, v, cache_seqlens=s)  # (another key: the last hit alternates)
    assert len(calls) == 3 and n["decode_attn"] == 6 and len(DE._launchers) == 2
    fq, fk = torch.randn(1, 16, 4, 64, dtype=BF), torch.randn(1, 24, 2, 64, dtype=BF)
    FW.flash_attn(fq, fk, fk)
    FW.flash_attn(fq, fk, fk)
    assert FW._launchers.last[0] == FH.dense_key(fq, fk, fk, None, False, (-1, -1))
    FW._launchers.clear()
    with count_launches() as n:
        FW.flash_attn(fq, fk, fk)
    assert n["flash_attn"] == 1 and len(FW._launchers) == 1  # re-made, not the forgotten one


def test_guarded_last_hits_check_what_the_key_did(stubbed):
    """After a repeat through the key the next calls with the same metadata take the launcher on its guard
    (LauncherCache.last, fastpath.metadata_guard); a call that differs in a fact the key held, or with an
    input requiring grad, still takes the key path and its checks (the same errors, nothing launched)."""
    q, k, v, s = decode_inputs()
    o = torch.empty_like(q)
    for _ in range(3):  # a miss, a dict hit, a repeat that arms the guard
        DE.decode_attn(q, k, v, cache_seqlens=s, out=o)
    assert DE._launchers.last[2] is not None  # a guard that passed
    with count_launches() as n:
        for _ in range(3):
            assert DE.decode_attn(q, k, v, cache_seqlens=s, out=o) is o
    assert n["decode_attn"] == 3 and len(DE._launchers) == 1
    rejected(lambda: DE.decode_attn(q, k, v, cache_seqlens=s, out=q.view(q.shape)), ValueError, "out overlaps q")
    rejected(lambda: DE.decode_attn(q, k, v.half(), cache_seqlens=s, out=o), TypeError, "v_cache dtype")
    rejected(lambda: DE.decode_attn(q, k, v, cache_seqlens=s.long(), out=o), TypeError, "cache_seqlens must be int32")
    rejected(lambda: DE.decode_attn(q, k, v, cache_seqlens=s, out=o, num_splits=True), TypeError, "num_splits")
    rejected(lambda: DE.decode_attn(q, k, v, cache_seqlens=s, out=o, causal=torch.tensor(True)), TypeError, "causal")
    rejected(lambda: DE.decode_attn(q, k, v, cache_seqlens=s, out=o, softmax_scale=-1.0), ValueError, "softmax_scale")
    rejected(lambda: DE.decode_attn(q, misaligned(tuple(k.shape)), v, cache_seqlens=s, out=o), ValueError, "16-byte")
    rejected(lambda: DE.decode_attn(q, k.clone().requires_grad_(), v, cache_seqlens=s, out=o), ValueError,
             "requires grad")
    rejected(lambda: DE.decode_attn(q, k, v, cache_seqlens=s, out=o.float()), ValueError, "out must be")
    fq, fk, fo = torch.randn(1, 16, 4, 64, dtype=BF), torch.randn(1, 24, 2, 64, dtype=BF), torch.empty(1, 16, 4, 64, dtype=BF)
    for _ in range(2):
        FW.flash_attn(fq, fk, fk, out=fo)
    # k passed twice: its launcher has no guard (the check refuses a repeated tensor), for later calls too
    assert FW._launchers.last[2] is None
    fv = fk.clone()
    FW.flash_attn(fq, fk, fv, out=fo)
    assert FW._launchers.last[2] is None
    FW._launchers.clear()
    for _ in range(3):
        FW.flash_attn(fq, fk, fv, out=fo)
    assert FW._launchers.last[2] is not None
    with count_launches() as n:
        for _ in range(3):
            assert FW.flash_attn(fq, fk, fv, out=fo) is fo
    assert n["flash_attn"] == 3
    rejected(lambda: FW.flash_attn(fq, fk, fv, out=fq.view(fq.shape)), ValueError, "out overlaps q")
    rejected(lambda: FW.flash_attn(fq, fk, fv, out=fo, causal=1), TypeError, "causal")
    rejected(lambda: FW.flash_attn(fq, fk, fv.half(), out=fo), TypeError, "v dtype")
    rejected(lambda: FW.flash_attn(fq, fk, fv, out=fo, softmax_scale=0.0), ValueError, "softmax_scale")
    # an input requiring grad takes the differentiable path (out= refused there), as without a guard
    named_grad = fk.clone().requires_grad_()
    with pytest.raises(ValueError):
        FW.flash_attn(fq, named_grad, fv, out=fo)
    with count_launches() as n:
        FW.flash_attn(fq, fk, fv, out=fo, window_size=(4, 0))  # another window: another launcher
    assert n["flash_attn"] == 1 and len(FW._launchers) == 2


def test_flash_attn_hits_and_checks(stubbed):
    q, k = torch.randn(1, 16, 4, 64, dtype=BF), torch.randn(1, 24, 2, 64, dtype=BF)
    with count_launches() as n:
        FW.flash_attn(q, k, k)
        made = Stub.made
        for _ in range(3):
            out, lse = FW.flash_attn(q, k, k, return_lse=True)
    assert n["flash_attn"] == 4 and Stub.made == made and out.shape == q.shape and lse.shape == (1, 4, 16)
    rejected(lambda: FW.flash_attn(misaligned(tuple(q.shape)), k, k), ValueError, "16-byte aligned")
    rejected(lambda: FW.flash_attn(q, k, k.half()), TypeError, "v dtype")
    rejected(lambda: FW.flash_attn(q, k, k, softmax_scale=0.0), ValueError, "softmax_scale")
    rejected(lambda: FW.flash_attn(q, k, k, softmax_scale="0.1"), TypeError, "softmax_scale")
    rejected(lambda: FW.flash_attn(q, k, k, out=torch.empty(1, 16, 4, 64, dtype=BF).half()), TypeError, "out dtype")
    assert Stub.made == made


@pytest.mark.parametrize("op", ["flash", "decode"])
def test_attention_guarded_last_hit_states(stubbed, monkeypatch, op):
    """As gemm's: calls alternating between two keys (out= and allocating, a window and none) never arm,
    so never run a guard that fails; a repeat arms (no dict lookup: the last key compared); a guard failing
    its own key's call (inference mode) disarms it for that run, until another launcher is hit; a clear
    forgets the last hit."""
    L = _CountingCache()
    if op == "flash":
        monkeypatch.setattr(FW, "_launchers", L)
        q, k, v = (torch.randn(1, 16, 4, 64, dtype=BF) for _ in range(3))
        o = torch.empty_like(q)
        calls = [lambda: FW.flash_attn(q, k, v, out=o), lambda: FW.flash_attn(q, k, v, out=o, window_size=(4, 0)),
                 lambda: FW.flash_attn(q, k, v, out=o), lambda: FW.flash_attn(q, k, v)]
        name = "flash_attn"
    else:
        monkeypatch.setattr(DE, "_launchers", L)
        q, k, v, s = decode_inputs()
        o = torch.empty_like(q)
        calls = [lambda: DE.decode_attn(q, k, v, cache_seqlens=s, out=o), lambda: DE.decode_attn(q, k, v, cache_seqlens=s)]
        calls *= 2
        name = "decode_attn"
    for pair in (calls[:2], calls[2:]):
        with count_launches() as n:
            for _ in range(4):
                for call in pair:
                    call()
                    assert L.last[2] is None and L.last[3] is None
        assert n[name] == 8
    assert len(L) == 2 + (op == "flash")
    call = calls[0]
    gets = L.gets
    for i in range(4):  # a dict hit (unarmed), a repeat (the last key compared: armed), two on the guard
        call()
        assert (L.last[2] is not None) == (i >= 1) and L.gets == gets + 1
    checks = []

    class Spy:  # the armed guard, counting its checks: the calls of the run take it
        def check(self, *ts, g=L.last[2]):
            checks.append(g.check(*ts))
            return checks[-1]
    L.last = L.last[:2] + (Spy(),) + L.last[3:]
    call()
    assert checks == [True] and L.last[2] is not None
    with torch.inference_mode(), count_launches() as n:
        for _ in range(3):
            call()
            assert L.last[2] is None and L.last[3] is False
    assert n[name] == 3 and L.gets == gets + 1 and checks == [True, False]
    call()  # out of inference mode: still disarmed until another launcher is hit
    assert L.last[3] is False
    calls[1]()
    for i in range(3):
        call()
        assert (L.last[2] is not None) == (i >= 1)
    L.clear()
    assert L.last == fastpath.NO_LAST and not L
    for i in range(4):
        call()
    assert len(L) == 1 and L.last[2] is not None


@pytest.mark.parametrize("op", ["flash", "decode"])
def test_attention_traced_calls_never_read_the_last_hit(stubbed, op):
    """As gemm's: a torch.compile'd caller of flash_attn / decode_attn holds no guard on the launcher
    cache, so eager calls that arm, change or grow it between its calls recompile nothing."""
    torch._dynamo.reset()
    if op == "flash":
        mk = lambda s: [torch.randn(1, s, 4, 64, dtype=BF) for _ in range(3)]  # noqa: E731
        a, b = mk(128), mk(256)
        call = lambda t: FW.flash_attn(*t)  # noqa: E731
        cache = FW._launchers
    else:
        s = torch.full((1,), 64, dtype=torch.int32)
        mk = lambda L: [torch.randn(1, 1, 8, 64, dtype=BF), torch.randn(1, L, 2, 64, dtype=BF),  # noqa: E731
                        torch.randn(1, L, 2, 64, dtype=BF)]
        a, b = mk(64), mk(128)
        call = lambda t: DE.decode_attn(*t, cache_seqlens=s)  # noqa: E731
        cache = DE._launchers
    for _ in range(3):
        call(a)
    assert cache.last[2] is not None

    @torch.compile(backend="eager", fullgraph=True)
    def f(t):
        return call(t) * 2

    f(a)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i in range(4):
            for _ in range(3):
                call(b if i % 2 else a)
            assert f(a).shape == a[0].shape
    torch._dynamo.reset()


def test_flash_attn_packed_hits_and_checks(stubbed, monkeypatch):
    """Packed calls: a launcher per metadata (max_seqlen, window and causal included, never the
    cu_seqlens values); anything else that differs is checked in full; checked mode reads the
    lengths on every call, a cached key or not."""
    q, k = torch.randn(40, 4, 64, dtype=BF), torch.randn(50, 2, 64, dtype=BF)
    cu_q, cu_k = torch.tensor([0, 15, 40], dtype=torch.int32), torch.tensor([0, 20, 50], dtype=torch.int32)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=25, max_seqlen_k=30, causal=True)
    with count_launches() as n:
        FW.flash_attn(q, k, k, **kw)
        made = Stub.made
        for _ in range(3):
            out, lse = FW.flash_attn(q, k, k, return_lse=True, **kw)
    assert n["flash_attn"] == 4 and Stub.made == made and out.shape == q.shape and lse.shape == (4, 40)
    (stub,) = {launcher_of(f) for f in FW._launchers.values()}
    args = stub.calls[-1]
    assert args[6] is cu_q and args[7] is cu_k and args[8:10] == (25, 30) and len(args) == 13
    FW.flash_attn(q, k, k, **{**kw, "max_seqlen_q": 26})
    FW.flash_attn(q, k, k, **{**kw, "window_size": (8, 0)})
    assert len(FW._launchers) == 3
    rejected(lambda: FW.flash_attn(q, k, k.half(), **kw), TypeError, "v dtype")
    rejected(lambda: FW.flash_attn(q, k, k, **{**kw, "cu_seqlens_q": cu_q.long()}), (TypeError, ValueError),
             "cu_seqlens_q")
    rejected(lambda: FW.flash_attn(q, k, k, **{**kw, "max_seqlen_q": -1}), ValueError, "max_seqlen_q")
    rejected(lambda: FW.flash_attn(q, k, k, softmax_scale=0.0, **kw), ValueError, "softmax_scale")
    rejected(lambda: FW.flash_attn(q, k, k, **{**kw, "window_size": (-2, 0)}), ValueError, "window")
    with count_launches() as n:  # an unhashable window_size: the checked path, every time
        FW.flash_attn(q, k, k, **{**kw, "window_size": [8, 0]})
    assert n["flash_attn"] == 1 and len(FW._launchers) == 3
    too_long = torch.tensor([0, 30, 40], dtype=torch.int32)  # same metadata, a sequence past max_seqlen_q
    with count_launches() as n:
        FW.flash_attn(q, k, k, **{**kw, "cu_seqlens_q": too_long})  # unchecked: clamped on the device
    assert n["flash_attn"] == 1
    monkeypatch.setenv("CUTE_KERNELS_CHECKED", "1")
    rejected(lambda: FW.flash_attn(q, k, k, **{**kw, "cu_seqlens_q": too_long}), ValueError, "max_seqlen_q")
    monkeypatch.setenv("CUTE_KERNELS_CHECKED", "0")
    rejected(lambda: FW.flash_attn(q, k, k, checked=True, **{**kw, "cu_seqlens_q": too_long}), ValueError,
             "max_seqlen_q")
    assert Stub.made == made + 3  # one per new key (its launch makes its launcher), one for the unhashable window


def test_flash_attn_window_and_paged_hits(stubbed):
    """Windowed dense calls and paged calls (q dense or packed) have launchers too: the window sides,
    the block table and seqused_k reach the kernel in its order; a refused hit is checked in full."""
    q, k = torch.randn(2, 16, 4, 64, dtype=BF), torch.randn(2, 24, 2, 64, dtype=BF)
    with count_launches() as n:
        for _ in range(3):
            FW.flash_attn(q, k, k, causal=True, window_size=(8, 0))
    assert n["flash_attn"] == 3 and len(FW._launchers) == 1
    (stub,) = {launcher_of(f) for f in FW._launchers.values()}
    assert len(stub.calls[-1]) == 9 and stub.calls[-1][7:] == (8, 0)
    FW.flash_attn(q, k, k, causal=True, window_size=(4, 0))
    assert len(FW._launchers) == 2
    with count_launches() as n:  # an unhashable window_size: the checked path, every time
        FW.flash_attn(q, k, k, causal=True, window_size=[8, 0])
    assert n["flash_attn"] == 1 and len(FW._launchers) == 2
    rejected(lambda: FW.flash_attn(q, k, k.half(), causal=True, window_size=(8, 0)), TypeError, "v dtype")

    pool = torch.randn(7, 16, 2, 64, dtype=BF)
    bt = torch.tensor([[3, 1], [0, 5]], dtype=torch.int32)
    used = torch.tensor([20, 9], dtype=torch.int32)
    kw = dict(block_table=bt, seqused_k=used, causal=True)
    made = Stub.made
    with count_launches() as n:
        for _ in range(3):
            out, lse = FW.flash_attn(q, pool, pool, return_lse=True, **kw)
    assert n["flash_attn"] == 3 and out.shape == q.shape and lse.shape == (2, 4, 16)
    assert Stub.made == made + 1 and len(FW._launchers) == 3  # one fetch: its launch makes the launcher
    args = launcher_of(FW._launchers[FH.paged_key(q, pool, pool, bt, used, None, None, None, None, True, (-1, -1))]).calls[-1]
    assert len(args) == 11 and args[6] is bt and args[7] is used
    qp = torch.randn(30, 4, 64, dtype=BF)
    cu = torch.tensor([0, 12, 30], dtype=torch.int32)
    pk = dict(kw, cu_seqlens_q=cu, max_seqlen_q=18)
    with count_launches() as n:
        for _ in range(3):
            FW.flash_attn(qp, pool, pool, **pk)
    assert n["flash_attn"] == 3 and len(FW._launchers) == 4
    args = launcher_of(FW._launchers[FH.paged_key(qp, pool, pool, bt, used, cu, 18, None, None, True, (-1, -1))]).calls[-1]
    assert len(args) == 13 and args[6] is cu and args[7] == 18 and args[8] is bt and args[9] is used
    rejected(lambda: FW.flash_attn(q, pool, pool.half(), **kw), TypeError, "v dtype")
    rejected(lambda: FW.flash_attn(q, pool, pool, **{**kw, "block_table": bt.long()}), TypeError, "block_table")
    rejected(lambda: FW.flash_attn(q, pool, pool, **{**kw, "seqused_k": used.long()}), TypeError, "seqused_k")
    rejected(lambda: FW.flash_attn(q, pool, pool, checked=True, **{**kw, "seqused_k": used + 100}), ValueError,
             "seqused_k")


# --------------------------------------------------------------------------------------- merge_states
@pytest.mark.parametrize("shape", [(3, 2, 1, 4, 64), (3, 4, 64), (3, 64)])
def test_merge_hits_and_checks(stubbed, shape):
    o, lse = torch.randn(shape), torch.randn(shape[:-1])
    with count_launches() as n:
        cute_kernels.merge_states(o, lse)
        made = Stub.made
        for _ in range(3):
            mo, ml = cute_kernels.merge_states(o, lse)
    assert n.as_dict() == {"merge_states": 4} and Stub.made == made
    assert mo.shape == shape[1:] and ml.shape == shape[1:-1] and mo.dtype == o.dtype
    (stub,) = {launcher_of(f) for f in ME._launchers.values()}
    op, lp, oo, lo = stub.calls[-1]
    assert op.shape == (3, *(1,) * (5 - len(shape)), *shape[1:]) and oo.dim() == 4 and lo.dim() == 3
    rejected(lambda: cute_kernels.merge_states(o, lse.half()), TypeError, "lse_parts must be float32")
    rejected(lambda: cute_kernels.merge_states(o.double(), lse), TypeError, "o_parts must be")
    rejected(lambda: cute_kernels.merge_states(o, lse[:1]), ValueError, "lse_parts shape")
    # misaligned rows take the torch path (no launcher for them, nothing launched)
    with count_launches() as n:
        cute_kernels.merge_states(misaligned(shape, torch.float32), lse)
    assert n.as_dict() == {"merge_states:torch": 1}


# ----------------------------------------------------------------------------- Python overhead per call
def per_call_us(fn, n=300, rounds=15) -> float:
    """The fastest of ``rounds`` rounds of ``n`` back-to-back calls, per call, in this thread's CPU
    time (a busy shared machine preempts the test; that is not the ops' overhead)."""
    for _ in range(n):
        fn()
    best = math.inf
    for _ in range(rounds):
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time() - t0) / n)
    return best * 1e6


def test_overhead_per_call(stubbed, capsys, monkeypatch):
    """Each op's Python work per call with the kernel launch stubbed, outputs given where the op takes
    them; the output allocations merge_states cannot avoid are taken off at the cost of one
    ``torch.empty`` measured here (a CPU allocation: not the CUDA caching allocator's cost)."""
    monkeypatch.setattr(Stub, "__call__", lambda self, *args: None)  # record nothing (keep no tensor alive)
    a, b, out = torch.randn(256, 128, dtype=BF), torch.randn(128, 256, dtype=BF), torch.empty(256, 256, dtype=BF)
    q, k, v, s = decode_inputs(B=1, Hq=8, Hkv=1, D=128, L=256)
    qo = torch.empty_like(q)
    fq, fk, fo = torch.randn(1, 16, 8, 128, dtype=BF), torch.randn(1, 16, 8, 128, dtype=BF), torch.empty(1, 16, 8, 128, dtype=BF)
    op, lp = torch.randn(2, 1, 1, 8, 128), torch.randn(2, 1, 1, 8)
    calls = {  # name: (call, torch.empty calls it makes)
        "gemm(out=)": (lambda: cute_kernels.gemm(a, b, out=out), 0),
        "gemm": (lambda: cute_kernels.gemm(a, b), 1),
        "decode_attn(out=)": (lambda: cute_kernels.decode_attn(q, k, v, cache_seqlens=s, out=qo), 0),
        "flash_attn(out=)": (lambda: cute_kernels.flash_attn(fq, fk, fk, out=fo), 0),
        "merge_states": (lambda: cute_kernels.merge_states(op, lp), 2),
    }
    empty_us = per_call_us(lambda: torch.empty((256, 256), dtype=BF))
    us = {name: per_call_us(fn) for name, (fn, _) in calls.items()}
    with capsys.disabled():
        print("\nPython overhead per call, launch stubbed: " + ", ".join(f"{k} {v:.1f} us" for k, v in us.items())
              + f"; torch.empty {empty_us:.1f} us")
    for name, (_, allocs) in calls.items():
        assert us[name] - allocs * empty_us < OVERHEAD_BOUND_US, (name, us, empty_us)
