"""Exact merging of partial attention states (split-KV attention).

The *attention state* of one query row over a key subset ``S`` is ``o = sum_j exp(s_j - lse) v_j``
(normalized within ``S``) and ``lse = log sum_j exp(s_j)`` (**natural log**, scaled scores).  States
over disjoint subsets merge exactly into the state over their union::

    m   = max_i lse_i
    w_i = exp(lse_i - m)
    o   = sum_i w_i * o_i / sum_i w_i
    lse = m + log(sum_i w_i)

An empty subset has ``lse = -inf``; its ``o`` is ignored (treated as 0 even if it holds NaN), and
if every part is empty the result is ``o = 0, lse = -inf``.  A part with ``lse = +inf`` dominates, as
in ``torch.logsumexp``: when ``m = +inf`` the weights are ``w_i = 1`` for the parts with
``lse_i = +inf`` and 0 for the others, so ``o`` is the mean of the infinite parts' outputs and
``lse = +inf`` (``exp(lse_i - m)`` would be ``exp(nan)`` for them).  The kernel's merge step
(:meth:`MergeStatesKernel.merge_row`, :func:`_part_weight`) and the torch math
(:func:`merge_states_torch`) implement this one definition.  The LSE base is *e* (as in
FlashAttention), not 2 (FlashInfer): convert base-2 LSEs with ``lse_e = lse_2 * ln(2)``.

CUDA tensors run a CuTe kernel (:class:`MergeStatesKernel`, also the split decode's combine step),
CPU tensors torch ops with the same math, both in part order (deterministic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..common.args import tensor_fault
from ..common import jit  # sets CUTE_DSL_ARCH before cutlass is imported
from ..common import softmax as sm
from ..common.dtypes import TORCH_TO_NAME, name_of, to_cutlass
from ..common.fastpath import BoundedCache
from ..testing import LAUNCHES

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32, Int32, const_expr  # noqa: E402

__all__ = ["merge_states", "merge_state", "MergeStatesKernel", "MergeConfig", "launch_merge", "merge_builder"]


# ------------------------------------------------------------------------------------------------
# CuTe combine kernel
# ------------------------------------------------------------------------------------------------
@cute.jit
def _part_weight(lse: Float32, lse_max_safe: Float32) -> Float32:
    """A part's weight in the merge (module doc): ``exp(lse - max)``, or, when the max is +inf, 1 for
    the parts at +inf and 0 for the others (``lse_from_safe_max`` then gives +inf)."""
    w = sm.lse_state_weight(lse, lse_max_safe)
    if lse_max_safe == Float32.inf:
        w = Float32(0.0)
        if lse == Float32.inf:
            w = Float32(1.0)
    return w


class MergeStatesKernel:
    """Merge ``P`` partial states per row; one warp per row, lanes split the head dimension.

    Tensors, indexed by a row coordinate ``(b, s, h)`` so the decode kernel's layouts need no copies
    (every stride a run-time value except the last mode's 1):

    * ``mOp``  (P, B, S, H, D)  partial outputs (fp32/fp16/bf16)
    * ``mLp``  (P, B, S, H)     partial LSEs, float32, natural log
    * ``mO``   (B, S, H, D)     merged output (dtype_out)
    * ``mL``   (B, S, H)        merged LSE, float32

    Each lane scans the P LSEs of its row for the max, then accumulates ``w_p * o_p`` in part order
    (bitwise reproducible) with 16-byte vector loads, skipping parts with ``lse = -inf``.
    """

    def __init__(
        self, dtype_in, dtype_out, head_dim: int, num_warps: int = 4, unroll: int = 8, pdl: bool = False
    ):
        # pdl: launched as a programmatic dependent of the kernel producing the parts (waits on
        # griddepcontrol.wait before reading them; a no-op without the launch attribute)
        self.pdl = pdl
        self.dtype_in = dtype_in
        self.dtype_out = dtype_out
        self.head_dim = head_dim
        self.num_warps = num_warps
        self.unroll = unroll
        # 16-byte vectors on the input side
        self.vec = 128 // dtype_in.width
        while head_dim % self.vec != 0:
            self.vec //= 2
        assert self.vec >= 1
        self.chunks = head_dim // self.vec  # vectors per row
        self.chunks_per_lane = (self.chunks + 31) // 32

    @cute.jit
    def __call__(
        self,
        mOp: cute.Tensor,
        mLp: cute.Tensor,
        mO: cute.Tensor,
        mL: cute.Tensor,
        stream,
    ):
        n_rows = mO.shape[0] * mO.shape[1] * mO.shape[2]
        grid_x = cute.ceil_div(n_rows, self.num_warps)
        self.kernel(mOp, mLp, mO, mL).launch(
            grid=[grid_x, 1, 1],
            block=[32 * self.num_warps, 1, 1],
            stream=stream,
            # an explicit occupancy bound: without it ptxas squeezes registers and serializes the
            # unrolled loads (one 16-byte load in flight per lane instead of `unroll`)
            min_blocks_per_mp=1,
            use_pdl=self.pdl,
        )

    @cute.jit
    def merge_row(
        self,
        mOp: cute.Tensor,
        mLp: cute.Tensor,
        mO: cute.Tensor,
        mL: cute.Tensor,
        b: Int32,
        s: Int32,
        h: Int32,
        lane: Int32,
    ):
        """Merge the P parts of row (b, s, h); called by the 32 lanes of one warp.

        Parts are read with L2-only loads (ld.global.cg): each is read once, so L1 would only hold
        lines nobody reads again."""
        num_parts = mLp.shape[0]
        n_groups = (num_parts + 31) // 32
        # 1) max LSE: lanes read 32 parts at a time, butterfly max (order-independent, exact)
        lse_max = -Float32.inf
        for g in cutlass.range(n_groups, unroll=1):
            p = g * 32 + lane
            lse_l = -Float32.inf
            if p < num_parts:
                lse_l = self._ld_lse(mLp, p, b, s, h)
            lse_max = cute.arch.fmax(lse_max, lse_l)
        lse_max = cute.arch.warp_reduction_max(lse_max)
        lse_max_safe = sm.safe_max(lse_max)
        # 2) weighted sum in part order; lane q holds the weight of part g*32+q
        acc = cute.make_rmem_tensor((self.vec, self.chunks_per_lane), Float32)
        acc.fill(0.0)
        w_sum = Float32(0.0)
        for g in cutlass.range(n_groups, unroll=1):
            p_l = g * 32 + lane
            w_l = Float32(0.0)
            if p_l < num_parts:
                w_l = _part_weight(self._ld_lse(mLp, p_l, b, s, h), lse_max_safe)
            n_in_group = cutlass.min(num_parts - g * 32, 32)
            # blocks of `unroll` parts: issue all loads first (clamped to a valid part), then FMA
            for q0 in cutlass.range(0, n_in_group, self.unroll, unroll=1):
                vals = cute.make_rmem_tensor((self.vec, self.chunks_per_lane, self.unroll), Float32)
                ws = cute.make_rmem_tensor((self.unroll,), Float32)
                # shuffles first: ptxas does not hoist loads across shfl.sync
                for u in cutlass.range_constexpr(self.unroll):
                    q = cutlass.min(q0 + u, n_in_group - 1)
                    w = cute.arch.shuffle_sync(w_l, q)
                    if q0 + u >= n_in_group:
                        w = Float32(0.0)
                    ws[u] = w
                for u in cutlass.range_constexpr(self.unroll):
                    q = cutlass.min(q0 + u, n_in_group - 1)
                    gOp = mOp[g * 32 + q, b, s, h, None]
                    for j in cutlass.range_constexpr(self.chunks_per_lane):
                        c = lane + 32 * j
                        if const_expr(self.chunks % 32 != 0):
                            c = cutlass.min(c, self.chunks - 1)
                        tmp = cute.make_rmem_tensor((self.vec,), self.dtype_in)
                        cute.copy(self._atom_cg(self.dtype_in, self.vec), cute.local_tile(gOp, (self.vec,), (c,)), tmp)
                        vals[None, j, u].store(tmp.load().to(Float32))
                for u in cutlass.range_constexpr(self.unroll):
                    w = ws[u]
                    w_sum += w
                    for j in cutlass.range_constexpr(self.chunks_per_lane):
                        for e in cutlass.range_constexpr(self.vec):
                            # skip empty parts exactly (their o may hold anything, even NaN)
                            contrib = w * vals[e, j, u]
                            if w == 0.0:
                                contrib = Float32(0.0)
                            acc[e, j] = acc[e, j] + contrib
        inv = Float32(0.0)
        if w_sum > 0.0:
            inv = cute.arch.rcp_approx(w_sum)
        gO = mO[b, s, h, None]
        for j in cutlass.range_constexpr(self.chunks_per_lane):
            c = lane + 32 * j
            if const_expr(self.chunks % 32 == 0) or c < self.chunks:
                out = cute.local_tile(gO, (self.vec,), (c,))
                out.store((acc[None, j].load() * inv).to(self.dtype_out))
        if lane == 0:
            mL[b, s, h] = sm.lse_from_safe_max(lse_max_safe, w_sum)

    @staticmethod
    def _atom_cg(dtype, n):
        return cute.make_copy_atom(
            cute.nvgpu.CopyG2ROp(),
            dtype,
            num_bits_per_copy=n * dtype.width,
            load_cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL,
        )

    @cute.jit
    def _ld_lse(self, mLp: cute.Tensor, p: Int32, b: Int32, s: Int32, h: Int32) -> Float32:
        r = cute.make_rmem_tensor((1,), Float32)
        cute.copy(self._atom_cg(Float32, 1), cute.local_tile(mLp[None, b, s, h], (1,), (p,)), r)
        return r[0]

    @cute.kernel
    def kernel(self, mOp: cute.Tensor, mLp: cute.Tensor, mO: cute.Tensor, mL: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        n_h = mO.shape[2]
        n_s = mO.shape[1]
        n_rows = mO.shape[0] * n_s * n_h
        row = bidx * self.num_warps + warp
        if row < n_rows:
            h = row % n_h
            bs = row // n_h
            s = bs % n_s
            b = bs // n_s
            self.merge_row(mOp, mLp, mO, mL, b, s, h, lane)


@dataclass(frozen=True)
class MergeConfig:
    dtype_in: str  # "float32" | "float16" | "bfloat16"
    dtype_out: str
    head_dim: int
    num_warps: int = 4


def merge_builder(cfg: MergeConfig):
    def build():
        from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

        din, dout = to_cutlass(cfg.dtype_in), to_cutlass(cfg.dtype_out)
        D = cfg.head_dim
        sym = cute.sym_int
        P, B, S, H = sym(), sym(), sym(), sym()
        vin = 128 // din.width
        vout = 128 // dout.width
        # strides: all run-time except the head dim's 1; rows stay 16-byte aligned (checked on host)
        s_in = [cute.sym_int64(divisibility=vin if D % vin == 0 else 1) for _ in range(4)]
        s_out = [cute.sym_int64(divisibility=vout if D % vout == 0 else 1) for _ in range(3)]
        s_l = [cute.sym_int64() for _ in range(4)]
        s_lo = [cute.sym_int64() for _ in range(3)]
        mOp = make_fake_tensor(din, (P, B, S, H, D), (*s_in, 1), assumed_align=16)
        mLp = make_fake_tensor(cutlass.Float32, (P, B, S, H), tuple(s_l), assumed_align=4)
        mO = make_fake_tensor(dout, (B, S, H, D), (*s_out, 1), assumed_align=16)
        mL = make_fake_tensor(cutlass.Float32, (B, S, H), tuple(s_lo), assumed_align=4)
        k = MergeStatesKernel(din, dout, D, cfg.num_warps)
        return k, (mOp, mLp, mO, mL, make_fake_stream(use_tvm_ffi_env_stream=True))

    return build


def get_merge_kernel(cfg: MergeConfig):
    return jit.get_compiled("merge_states", cfg, merge_builder(cfg))


def _warm(cfg):
    """``warmup([("merge_states", MergeConfig(...))])``: dtype names and a head dim whose rows are whole
    16-byte vectors (other head dims run in torch)."""
    if not isinstance(cfg, MergeConfig):
        raise TypeError(f"warmup: a merge_states spec must be a MergeConfig, got {type(cfg).__name__}")
    for name in ("dtype_in", "dtype_out"):
        if getattr(cfg, name) not in TORCH_TO_NAME.values():
            raise ValueError(f"warmup: MergeConfig.{name} must be one of {sorted(TORCH_TO_NAME.values())}, "
                             f"got {getattr(cfg, name)!r}")
    for name in ("head_dim", "num_warps"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"warmup: MergeConfig.{name} must be an int >= 1, got {v!r}")
    get_merge_kernel(cfg)


jit.register_warmup("merge_states", _warm)


def _row_aligned(t: torch.Tensor) -> bool:
    """16-byte aligned base and row strides (what the kernel's vector loads assume)."""
    es = t.element_size()
    return t.data_ptr() % 16 == 0 and all((st * es) % 16 == 0 for st in t.stride()[:-1])


def launch_merge(o_parts5: torch.Tensor, lse_parts4: torch.Tensor, out4: torch.Tensor, lse_out3: torch.Tensor):
    """Run the CuTe merge on 5-d/4-d views: (P,B,S,H,D), (P,B,S,H) -> (B,S,H,D), (B,S,H)."""
    cfg = MergeConfig(name_of(o_parts5.dtype), name_of(out4.dtype), int(o_parts5.shape[-1]))
    LAUNCHES["merge_states"] += 1
    get_merge_kernel(cfg)(o_parts5, lse_parts4, out4, lse_out3)


# ------------------------------------------------------------------------------------------------
# torch math (CPU tensors, and the reference for tests)
# ------------------------------------------------------------------------------------------------
def merge_states_torch(o_parts: torch.Tensor, lse_parts: torch.Tensor):
    """Reference merge in float32 torch ops; same math and part order as the kernel."""
    o32 = o_parts.float()
    lse = lse_parts.float()
    m = lse.amax(dim=0)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w = torch.exp(lse - m_safe.unsqueeze(0))  # exp(-inf) = 0 for empty parts
    # a max of +inf: the parts at +inf weigh 1, the others 0 (the kernel's _part_weight)
    w = torch.where(torch.isposinf(m_safe).unsqueeze(0), torch.isposinf(lse).float(), w)
    w_sum = w.sum(dim=0)
    contrib = torch.where((w > 0).unsqueeze(-1), w.unsqueeze(-1) * o32, torch.zeros_like(o32))
    acc = contrib.sum(dim=0)
    inv = torch.where(w_sum > 0, 1.0 / w_sum, torch.zeros_like(w_sum))
    o = acc * inv.unsqueeze(-1)
    lse_out = m_safe + torch.log(w_sum)
    # NaN LSEs propagate (max would hide them)
    nan_rows = torch.isnan(lse).any(dim=0)
    if nan_rows.any():
        lse_out = torch.where(nan_rows, torch.full_like(lse_out, float("nan")), lse_out)
        o = torch.where(nan_rows.unsqueeze(-1), torch.full_like(o, float("nan")), o)
    return o, lse_out


def _check_states(o_parts: torch.Tensor, lse_parts: torch.Tensor):
    """Types, shapes, dtypes, then devices (last); every message starts with the argument."""
    for name, t in (("o_parts", o_parts), ("lse_parts", lse_parts)):
        if fault := tensor_fault(t):
            raise TypeError(f"merge_states: {name} {fault}")
    if o_parts.dim() < 2:
        raise ValueError(f"merge_states: o_parts must be (P, ..., D), got shape {tuple(o_parts.shape)}")
    if tuple(lse_parts.shape) != tuple(o_parts.shape[:-1]):
        raise ValueError(
            f"merge_states: lse_parts shape {tuple(lse_parts.shape)} must equal o_parts.shape[:-1] "
            f"= {tuple(o_parts.shape[:-1])}"
        )
    if o_parts.shape[0] < 1:
        raise ValueError("merge_states: o_parts needs at least one part (P >= 1)")
    if lse_parts.dtype != torch.float32:
        raise TypeError(f"merge_states: lse_parts must be float32, got {lse_parts.dtype}")
    if o_parts.dtype not in TORCH_TO_NAME:
        raise TypeError(f"merge_states: o_parts must be float32/float16/bfloat16, got {o_parts.dtype}")
    _check_devices("merge_states", (("o_parts", o_parts), ("lse_parts", lse_parts)))


def _check_devices(who: str, named) -> None:
    """One device for all (CUDA: the kernel; CPU: torch ops; meta: the fake implementation's shapes);
    the message names the first tensor that differs."""
    dev = named[0][1].device
    for name, t in named[1:]:
        if t.device != dev:
            raise ValueError(f"{who}: {name} is on {t.device}, {named[0][0]} on {dev}: all must be on one device")


def _check_pair(o_a, lse_a, o_b, lse_b) -> None:
    """merge_state's own checks, so each message names merge_state's arguments."""
    named = (("o_a", o_a), ("lse_a", lse_a), ("o_b", o_b), ("lse_b", lse_b))
    for name, t in named:
        if fault := tensor_fault(t):
            raise TypeError(f"merge_state: {name} {fault}")
    if o_a.dim() < 1:
        raise ValueError(f"merge_state: o_a must be (..., D), got shape {tuple(o_a.shape)}")
    if o_b.shape != o_a.shape:
        raise ValueError(f"merge_state: shapes differ: o_b shape {tuple(o_b.shape)} must equal o_a shape "
                         f"{tuple(o_a.shape)}")
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        if t.shape != o_a.shape[:-1]:
            raise ValueError(f"merge_state: shapes differ: {name} shape {tuple(t.shape)} must equal o_a.shape[:-1] = "
                             f"{tuple(o_a.shape[:-1])}")
    if o_a.dtype not in TORCH_TO_NAME:
        raise TypeError(f"merge_state: o_a must be float32/float16/bfloat16, got {o_a.dtype}")
    if o_b.dtype != o_a.dtype:
        raise TypeError(f"merge_state: o_b dtype {o_b.dtype} must equal o_a dtype {o_a.dtype}")
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        if t.dtype != torch.float32:
            raise TypeError(f"merge_state: {name} must be float32, got {t.dtype}")
    _check_devices("merge_state", named)


def _merge_states_impl(o_parts: torch.Tensor, lse_parts: torch.Tensor):
    P, D = o_parts.shape[0], o_parts.shape[-1]
    rest = tuple(o_parts.shape[1:-1])
    n = math.prod(rest)
    if o_parts.device.type in _KERNEL_DEVICES:
        op = o_parts.reshape(P, 1, 1, n, D)
        if op.stride(-1) != 1 or not _row_aligned(op):
            op = op.contiguous()
        out = torch.empty((1, 1, n, D), dtype=o_parts.dtype, device=o_parts.device)
        lse_out = torch.empty((1, 1, n), dtype=torch.float32, device=o_parts.device)
        # else the torch path: an odd head dim's rows cannot be 16-byte aligned
        if _row_aligned(op) and (n == 0 or _row_aligned(out)):
            if n > 0:
                launch_merge(op, lse_parts.reshape(P, 1, 1, n), out, lse_out)
            return out.reshape(*rest, D), lse_out.reshape(rest)
    LAUNCHES["merge_states:torch"] += 1
    o, lse = merge_states_torch(o_parts, lse_parts)
    return o.to(o_parts.dtype), lse


@torch.library.custom_op("cute_kernels::merge_states", mutates_args=())
def _merge_states_op(o_parts: torch.Tensor, lse_parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _merge_states_impl(o_parts, lse_parts)


@_merge_states_op.register_fake
def _(o_parts, lse_parts):
    return (
        o_parts.new_empty(o_parts.shape[1:]),
        lse_parts.new_empty(lse_parts.shape[1:]),
    )


# ------------------------------------------------------------------------------------------------
# the host fast path: a launcher per call metadata, made after a call with that metadata passed the
# checks and launched the kernel on the tensors as they are (issue 19: host time per call)
# ------------------------------------------------------------------------------------------------
_is_compiling = torch.compiler.is_compiling
_empty = torch.empty
#: tensor types the fast path takes (subclasses such as FakeTensor always take the checked path)
_FAST_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
#: devices the kernel runs on (other tensors: torch ops; tests add "cpu" with a stub kernel)
_KERNEL_DEVICES = ("cuda",)
_launchers = BoundedCache()  # (a key per shape)


def _key(o_parts, lse_parts) -> tuple:
    """What the checks and the launch decision read that the compiled function's own argument checks
    (:func:`~cute_kernels.common.jit.direct`) leave open: o_parts' shape, strides, dtype and device
    (``get_device()``: -1 for every non-CUDA device, which never has a launcher) and lse_parts' shape
    and strides (fewer row dims are viewed before the call, and a view of another shape can succeed).
    The rest -- lse_parts' dtype and device, 16-byte alignment -- the compiled function checks on
    every call."""
    return (o_parts.shape, o_parts.stride(), o_parts.dtype, o_parts.get_device(), lse_parts.shape, lse_parts.stride())


def _prepare(key, o_parts: torch.Tensor, lse_parts: torch.Tensor) -> None:
    """Cache a launcher when the kernel takes the tensors as they are: at most three row dims
    (viewed as the kernel's (B, S, H) with size-1 dims in front, no copy), rows 16-byte aligned in
    o_parts and in the output, at least one row."""
    P, D, rest = o_parts.shape[0], o_parts.shape[-1], tuple(o_parts.shape[1:-1])
    out_aligned = (D * o_parts.element_size()) % 16 == 0
    if (len(rest) > 3 or math.prod(rest) == 0 or o_parts.stride(-1) != 1 or not _row_aligned(o_parts)
            or not out_aligned):
        return
    cfg = MergeConfig(name_of(o_parts.dtype), name_of(o_parts.dtype), int(D))
    fn = get_merge_kernel(cfg)
    _launchers[key] = _launcher(jit.direct(fn), fn, P, rest, D, o_parts.dtype, o_parts.device)


def _launcher(fn, keep, P, rest, D, dtype, dev):
    """``launch(o_parts, lse_parts) -> (o, lse)``: allocate both outputs, launch (5-d o_parts as they
    are, fewer row dims as views with size-1 dims in front), count (a refused call raises uncounted)."""
    f32 = torch.float32
    oshape, lshape = jit.size_args((*rest, D)), jit.size_args(rest)
    if len(rest) == 3:
        def launch(o_parts, lse_parts):
            o, lse = _empty(*oshape, dtype=dtype, device=dev), _empty(*lshape, dtype=f32, device=dev)
            fn(o_parts, lse_parts, o, lse)
            LAUNCHES["merge_states"] += 1
            return o, lse
    else:
        rows = (1,) * (3 - len(rest)) + rest
        op5, lp4, o4, l3 = (P, *rows, D), (P, *rows), (*rows, D), rows

        def launch(o_parts, lse_parts):
            o, lse = _empty(*oshape, dtype=dtype, device=dev), _empty(*lshape, dtype=f32, device=dev)
            fn(o_parts.view(op5), lse_parts.view(lp4), o.view(o4), lse.view(l3))
            LAUNCHES["merge_states"] += 1
            return o, lse
    launch.keep = keep  # the compiled object owns fn's CUDA library
    return launch


def merge_states(o_parts: torch.Tensor, lse_parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge P partial attention states exactly (the math: module doc).

    Args:
        o_parts: (P, ..., D) partial outputs, each normalized within its part (float32, float16 or
            bfloat16).
        lse_parts: (P, ...) float32 **natural-log** LSE of each part (``-inf``: an empty part, ignored).

    Returns ``(o, lse)``: o (..., D) in o_parts' dtype, lse (...) float32; rows where every part is
    empty give ``o = 0, lse = -inf``.
    """
    key = None
    if not _is_compiling():  # the fast path (_key); anything unusual takes the checks below
        try:
            if type(o_parts) in _FAST_TYPES and type(lse_parts) in _FAST_TYPES:
                key = _key(o_parts, lse_parts)
                hit = _launchers.get(key)
            else:
                hit = None
        except (AttributeError, TypeError):
            key = hit = None
        if hit is not None:
            try:
                return hit(o_parts, lse_parts)
            except Exception:  # the compiled function refused an argument: the checks below name it
                pass
    _check_states(o_parts, lse_parts)
    if key is None or o_parts.device.type not in _KERNEL_DEVICES or isinstance(o_parts, FakeTensor):
        return _merge_states_op(o_parts, lse_parts)  # torch.compile, fake / CPU / meta tensors
    res = _merge_states_impl(o_parts, lse_parts)  # eager: no dispatcher
    _prepare(key, o_parts, lse_parts)
    return res


def merge_state(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two attention states (o_a, lse_a) and (o_b, lse_b) over disjoint key sets.

    o: (..., D), lse: (...) float32, **natural-log** LSE; see :func:`merge_states` for the math.
    Returns ``(o, lse)`` with o in o_a's dtype.
    """
    _check_pair(o_a, lse_a, o_b, lse_b)
    return merge_states(torch.stack([o_a, o_b]), torch.stack([lse_a, lse_b]))
