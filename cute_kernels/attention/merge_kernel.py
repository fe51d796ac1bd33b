"""The CuTe kernel that merges partial attention states (:mod:`.merge`'s definition of the merge; the
split decode's combine step too), and its compile entry."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from ..common import softmax as sm
from ..common.dtypes import to_cutlass


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


def merge_builder(cfg):
    """The compile entry of a :class:`~.merge.MergeConfig` (its kernel and fake arguments)."""
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
