"""The attention backward's pre- and post-pass kernels (around :mod:`.backward_kernel`), SIMT, one CTA
per (64 query / key rows, head, batch), 8 threads per row (``D / 8`` contiguous elements each).

Pre-pass (:class:`BwdPrepass`), per query row ``q`` of every head:

* ``Delta[q] = rowsum(dO * O)`` in fp32, minus the incoming LSE gradient ``dLSE[q]`` when there is one
  (``L = logsumexp(s)`` gives ``dL/ds = P``, so ``dS = P (dP - Delta + dLSE)``);
* ``LSE_log2[q] = LSE[q] * log2(e)`` (the main kernel's ``P = exp2(S * scale_log2 - LSE_log2)``), and
  ``+inf`` for a row that saw no key (forward LSE ``-inf``) or a padding row (``q >= Sq``), so that
  its P is 0 (``exp2(-inf)``) with no mask and no NaN;
* the row of the fp32 dQ accumulator zeroed.

Both row buffers are (B, Hq, Sq_pad) and the accumulator (B, Hq, Sq_pad, D), ``Sq_pad`` = Sq rounded
up to :data:`layouts.attention_backward.BWD_ROW_PAD`: the main kernel loads whole query tiles of them by TMA
(16-byte-aligned rows) and adds whole dQ tiles, padding rows included.

Post-pass (:class:`BwdConvert`): ``dst = src * scale`` in the input dtype for (B, S, H, D) views of
any strides -- dQ (scale: softmax_scale) from the accumulator's (B, Sq, Hq, D) view, dK (softmax_scale)
and dV (1) from their (B, Sk, Hkv, D) fp32 accumulators (the query heads of a KV head already added).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from layouts import attention_backward as LB

from ..common.dtypes import to_cutlass
from ..common.softmax import LOG2_E
from . import forward_seqlen as fsl
from .backward_config import BwdPrepostConfig, padded_first_row  # noqa: F401  (BwdPrepostConfig re-exported)

ROWS = 64  # rows per CTA
THREADS = 128
ROW_THREADS = 8  # threads per row
PASSES = ROWS // (THREADS // ROW_THREADS)


@cute.jit
def _row_slice(mX: cute.Tensor, batch, row, head, part, elems: cutlass.Constexpr[int]) -> cute.Tensor:
    """Elements ``part * elems ..`` of row ``row`` of head ``head`` of a (B, S, H, D) tensor."""
    return cute.local_tile(mX[batch, row, head, None], (elems,), (part,))


class BwdPrepass:
    """Delta, LSE_log2 and the zeroed dQ accumulator (module docstring)."""

    def __init__(self, cfg: BwdPrepostConfig):
        self.cfg = cfg
        self.dtype = to_cutlass(cfg.dtype)
        self.D = cfg.head_dim
        self.elems = cfg.head_dim // ROW_THREADS

    @cute.jit
    def __call__(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: cute.Tensor,
                 mLSE2: cute.Tensor, mDelta: cute.Tensor, mdQacc: cute.Tensor, stream):
        """out, dout (B, Sq, Hq, D); lse, dlse (B, Hq, Sq) fp32 (dlse read only with ``has_dlse``); the
        outputs (B, Hq, Sq_pad) and (B, Hq, Sq_pad, D) fp32."""
        self.launch(mO, mdO, mLSE, mdLSE, mLSE2, mDelta, mdQacc, stream)

    @cute.jit
    def call_varlen(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: cute.Tensor,
                    mLSE2: cute.Tensor, mDelta: cute.Tensor, mdQacc: cute.Tensor, stream, mCuSeqlens: cute.Tensor,
                    max_seqlen: Int32):
        """Packed: one batch of packed rows (the outputs' padded), a CTA row per 64 rows of the longest
        sequence's padded length, grid z the sequence."""
        self.launch(mO, mdO, mLSE, mdLSE, mLSE2, mDelta, mdQacc, stream, mCuSeqlens, max_seqlen)

    @cute.jit
    def launch(self, mO, mdO, mLSE, mdLSE, mLSE2, mDelta, mdQacc, stream, mCuSeqlens=None, max_seqlen=None):
        batch, seqlen_q, num_heads = mO.shape[0], mO.shape[1], mO.shape[2]
        blocks = (mLSE2.shape[2] + ROWS - 1) // ROWS
        if const_expr(self.cfg.varlen):
            batch = mCuSeqlens.shape[0] - 1
            blocks = (max_seqlen + LB.BWD_ROW_PAD - 1) // LB.BWD_ROW_PAD * (LB.BWD_ROW_PAD // ROWS)
        self.kernel(mO, mdO, mLSE, mdLSE, mLSE2, mDelta, mdQacc, Int32(seqlen_q), mCuSeqlens, max_seqlen).launch(
            grid=[blocks, num_heads, batch], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: cute.Tensor, mLSE2: cute.Tensor,
               mDelta: cute.Tensor, mdQacc: cute.Tensor, seqlen_q: Int32, mCuSeqlens, max_seqlen):
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        part = tidx % ROW_THREADS
        # dense: row r of the batch slice in and out; packed: row off + r in, off_p + r out, rows up to the
        # sequence's padded length written (past it the next sequence's rows begin)
        off, off_p, written = Int32(0), Int32(0), Int32(0)
        if const_expr(self.cfg.varlen):
            off, seqlen_q, off_p, written = _packed_rows(mCuSeqlens, batch, seqlen_q, max_seqlen)
            batch = 0
        for p in cutlass.range_constexpr(PASSES):
            row = m_block * ROWS + p * (THREADS // ROW_THREADS) + tidx // ROW_THREADS
            acc = Float32(0.0)
            if row < seqlen_q:
                o = _row_slice(mO, batch, off + row, head, part, self.elems).load().to(Float32)
                do = _row_slice(mdO, batch, off + row, head, part, self.elems).load().to(Float32)
                acc = (o * do).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            for i in cutlass.range_constexpr(3):  # the row's 8 lanes (an aligned group of the warp)
                acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=ROW_THREADS >> (i + 1))
            if const_expr(self.cfg.varlen):
                if row < written:
                    self.write_row(mLSE, mdLSE, mLSE2, mDelta, mdQacc, acc, batch, head, row, off, off_p, seqlen_q,
                                   part)
            else:
                self.write_row(mLSE, mdLSE, mLSE2, mDelta, mdQacc, acc, batch, head, row, off, off_p, seqlen_q, part)

    @cute.jit
    def write_row(self, mLSE, mdLSE, mLSE2, mDelta, mdQacc, acc, batch, head, row, off, off_p, seqlen_q, part):
        """Row ``row``'s LSE_log2 and Delta (from the row sums ``acc``) at ``off_p + row``, and its dQ
        accumulator row zeroed."""
        if part == 0:
            lse2 = Float32.inf
            delta = Float32(0.0)
            if row < seqlen_q:
                lse = mLSE[batch, head, off + row]
                if lse != -Float32.inf:
                    lse2 = lse * LOG2_E
                delta = acc
                if const_expr(self.cfg.has_dlse):
                    delta = acc - mdLSE[batch, head, off + row]
            mLSE2[batch, head, off_p + row] = lse2
            mDelta[batch, head, off_p + row] = delta
        zeros = cute.make_rmem_tensor((self.elems,), Float32)
        zeros.fill(0.0)
        dst = cute.local_tile(mdQacc[batch, head, off_p + row, None], (self.elems,), (part,))
        dst.store(zeros.load())


@cute.jit
def _packed_rows(mCuSeqlens: cute.Tensor, batch, total, max_seqlen):
    """``(off, length, off_p, written)`` of packed sequence ``batch``: its first row and length (clamped as
    the main kernel clamps them), its first row in the padded buffers (the main kernel's ``off_p``) and
    its padded length there (a multiple of :data:`layouts.attention_backward.BWD_ROW_PAD`)."""
    off, length, _, _ = fsl.sequence_bounds(batch, total, total, mCuSeqlens, mCuSeqlens, max_seqlen, max_seqlen, True)
    pad = LB.BWD_ROW_PAD
    return off, length, padded_first_row(off, batch), (length + pad - 1) // pad * pad


class BwdConvert:
    """``dst = src * scale`` in the input dtype (module docstring)."""

    def __init__(self, cfg: BwdPrepostConfig):
        self.cfg = cfg
        self.dtype = to_cutlass(cfg.dtype)
        self.elems = cfg.head_dim // ROW_THREADS

    @cute.jit
    def __call__(self, mSrc: cute.Tensor, mDst: cute.Tensor, scale: Float32, stream):
        """src (B, S, H, D) fp32 and dst (B, S, H, D) in the input dtype, any strides (stride(-1) = 1)."""
        self.launch(mSrc, mDst, scale, stream)

    @cute.jit
    def call_varlen(self, mSrc: cute.Tensor, mDst: cute.Tensor, scale: Float32, stream, mCuSeqlens: cute.Tensor,
                    max_seqlen: Int32):
        """Packed (dQ): src the padded accumulator's one batch, dst the packed rows, grid z the sequence."""
        self.launch(mSrc, mDst, scale, stream, mCuSeqlens, max_seqlen)

    @cute.jit
    def launch(self, mSrc, mDst, scale, stream, mCuSeqlens=None, max_seqlen=None):
        batch, seqlen, num_heads = mDst.shape[0], mDst.shape[1], mDst.shape[2]
        blocks = (seqlen + ROWS - 1) // ROWS
        if const_expr(self.cfg.varlen):
            batch, blocks = mCuSeqlens.shape[0] - 1, (max_seqlen + ROWS - 1) // ROWS
        self.kernel(mSrc, mDst, scale, Int32(seqlen), mCuSeqlens, max_seqlen).launch(
            grid=[blocks, num_heads, batch], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mSrc: cute.Tensor, mDst: cute.Tensor, scale: Float32, seqlen: Int32, mCuSeqlens, max_seqlen):
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        part = tidx % ROW_THREADS
        off, off_p = Int32(0), Int32(0)  # packed: rows off + r of dst from rows off_p + r of src
        if const_expr(self.cfg.varlen):
            off, seqlen, off_p, _ = _packed_rows(mCuSeqlens, batch, seqlen, max_seqlen)
            batch = 0
        groups = const_expr(self.cfg.groups)
        for p in cutlass.range_constexpr(PASSES):
            row = m_block * ROWS + p * (THREADS // ROW_THREADS) + tidx // ROW_THREADS
            if row < seqlen:
                v = _row_slice(mSrc, batch, off_p + row, head, part, self.elems).load()
                for g in cutlass.range_constexpr(1, groups):  # the other accumulators, in order
                    v = v + _row_slice(mSrc, batch + g * (mSrc.shape[0] // groups), off_p + row, head, part,
                                       self.elems).load()
                _row_slice(mDst, batch, off + row, head, part, self.elems).store((v * scale).to(self.dtype))


# ---- compile entries ----------------------------------------------------------------------------


def prepost_builder(cfg: BwdPrepostConfig):
    """``() -> (kernel, fake_args)`` for :func:`cute_kernels.common.jit.get_compiled`.

    * prepass: ``(out, dout, lse, dlse, lse_log2, delta, dq_accum)`` -- out / dout (B, Sq, Hq, D) of
      any 16-byte strides, lse / dlse (B, Hq, Sq) fp32 of any strides (without ``has_dlse`` pass lse
      again), the outputs compact with Sq_pad a multiple of :data:`layouts.attention_backward.BWD_ROW_PAD`;
    * convert: ``(src, dst, scale)`` -- (B, S, H, D) fp32 with 16-byte strides and the input dtype."""

    def build():
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor

        dt = to_cutlass(cfg.dtype)
        D = cfg.head_dim
        f32 = cutlass.Float32
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        B, S, H = (cute.sym_int() for _ in range(3))

        def strides(div):
            return (cute.sym_int64(divisibility=div), cute.sym_int64(divisibility=div),
                    cute.sym_int64(divisibility=div), 1)

        packed = ()
        if cfg.varlen:  # cu_seqlens_q, max_seqlen_q
            packed = (make_fake_compact_tensor(Int32, (cute.sym_int(),)), Int32(0))
        if cfg.kind == "convert":
            k = BwdConvert(cfg)
            Bs = cute.sym_int() if cfg.groups > 1 else B  # (G accumulators: G B batches)
            mSrc = make_fake_tensor(f32, (Bs, cute.sym_int() if cfg.varlen else S, H, D), strides(4), assumed_align=16)
            mDst = make_fake_tensor(dt, (B, S, H, D), strides(8), assumed_align=16)
            return (k.call_varlen if cfg.varlen else k), (mSrc, mDst, Float32(1.0), stream, *packed)
        k = BwdPrepass(cfg)
        Sp = cute.sym_int(divisibility=LB.BWD_ROW_PAD)
        mO = make_fake_tensor(dt, (B, S, H, D), strides(8), assumed_align=16)
        mdO = make_fake_tensor(dt, (B, S, H, D), strides(8), assumed_align=16)
        mLSE = make_fake_tensor(f32, (B, H, S), tuple(cute.sym_int64() for _ in range(3)), assumed_align=4)
        mdLSE = make_fake_tensor(f32, (B, H, S), tuple(cute.sym_int64() for _ in range(3)), assumed_align=4)
        mLSE2 = make_fake_compact_tensor(f32, (B, H, Sp), stride_order=(2, 1, 0), assumed_align=16)
        mDelta = make_fake_compact_tensor(f32, (B, H, Sp), stride_order=(2, 1, 0), assumed_align=16)
        mdQ = make_fake_compact_tensor(f32, (B, H, Sp, D), stride_order=(3, 2, 1, 0), assumed_align=16)
        return (k.call_varlen if cfg.varlen else k), (mO, mdO, mLSE, mdLSE, mLSE2, mDelta, mdQ, stream, *packed)

    return build
