"""Online softmax and attention-state (LSE) arithmetic shared by the attention kernels.

Conventions, the same everywhere in the package:

* Scores are scaled by ``softmax_scale`` and exponentiated in base 2: the kernels carry
  ``scale_log2 = softmax_scale * log2(e)`` (:data:`LOG2_E`) and compute ``exp2(s * scale_log2 - m_s)``
  with ``m_s = m * scale_log2``, one FMA and one MUFU.EX2 per score.
* A row's running state is its max raw score ``m`` and the sum ``l`` of ``exp2(s * scale_log2 - m_s)``;
  the output accumulator holds the unnormalized ``sum_j p_j v_j`` and is rescaled by
  ``exp2((m_old - m_new) * scale_log2)`` when the max grows.  Normalization (``/ l``) is deferred to
  the end.
* The log-sum-exp a kernel writes is in **natural log** (FlashAttention's base, not FlashInfer's
  base 2): ``lse = (m_s + log2(l)) * ln(2)`` (:data:`LN_2`).
* A row that saw no key has ``m = -inf`` and ``l = 0``: its scaled max is taken as 0 (so ``exp2`` of
  ``-inf`` gives 0, never NaN), its output is 0 and its LSE ``-inf``.
* Softcapping (FlashAttention's ``softcap * tanh(s * softmax_scale / softcap)``) keeps ``tanh(s *
  softmax_scale / softcap)`` as the raw score and ``scale_log2 = softcap * log2(e)``
  (:func:`softcap_scores`); a sink logit joins a row's denominator once, at the end
  (:func:`finalize_with_sink`): ``lse = log(sum_j exp(s_j) + exp(sink))``, ``O = 0``, ``lse = sink``
  for a row without keys.

Two states over disjoint key sets merge exactly (the decode kernel's cross-warp combine, the split
merge kernel): with raw states, weights ``exp2(m_i * scale_log2 - max_s)``; with normalized states
``(o_i, lse_i)``, weights ``exp2((lse_i - max lse) * log2(e))``; then ``o = sum w_i o_i / sum w_i``.

The ``@cute.jit`` functions and :class:`OnlineSoftmax` run inside a DSL trace (kernel code); the
merge's torch form is :func:`cute_kernels.attention.merge.merge_states_torch`.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .host import LN_2, LOG2_E  # noqa: E402,F401  (host constants, in a module without the DSL)


#: 2^f ~= 1 + c1 f + c2 f^2 + c3 f^3 on [0, 1): a minimax fit of the relative error with the constant
#: term pinned to 1 (so 2^0 is exact), max relative error 8.6e-5 -- far below the 16-bit rounding of P
EXP2_POLY3 = (0.6951168179512024, 0.22764474153518677, 0.07706727832555771)
_ROUND_SHIFT = 12582912.0  # 1.5 * 2^23: adding it (rounding down) leaves floor(x) in the low mantissa bits


def _f32_hex(x: float) -> str:
    import struct

    return "0f%08X" % struct.unpack("<I", struct.pack("<f", x))[0]


_EXP2_POLY3_PTX = (
    "{\n\t.reg .f32 xc, r, rb, f, p;\n\t.reg .b32 ri, pi, e;\n\t"
    f"max.f32 xc, $1, {_f32_hex(-127.0)};\n\t"
    f"add.rm.f32 r, xc, {_f32_hex(_ROUND_SHIFT)};\n\t"
    f"sub.f32 rb, r, {_f32_hex(_ROUND_SHIFT)};\n\t"
    "sub.f32 f, xc, rb;\n\t"
    f"fma.rn.f32 p, f, {_f32_hex(EXP2_POLY3[2])}, {_f32_hex(EXP2_POLY3[1])};\n\t"
    f"fma.rn.f32 p, p, f, {_f32_hex(EXP2_POLY3[0])};\n\t"
    f"fma.rn.f32 p, p, f, {_f32_hex(1.0)};\n\t"
    "mov.b32 ri, r;\n\tmov.b32 pi, p;\n\tshl.b32 e, ri, 23;\n\tadd.s32 pi, pi, e;\n\t"
    "mov.b32 $0, pi;\n\t}"
)


@dsl_user_op
def exp2_poly3(x: Float32, *, loc=None, ip=None) -> Float32:
    """``2^x`` for finite ``x <= 0`` on the FMA / integer pipes instead of the MUFU unit: x is clamped
    at -127, split into floor and fraction by one round-down add, 2^fraction by the cubic
    :data:`EXP2_POLY3`, and the floor added into the exponent bits.  Relative error <= 8.6e-5;
    ``x <= -127`` gives a value below 2^-126 (not 0: callers keep -inf scores on ``exp2``).  Spreading
    a share of a tile's exponentials over the FMA pipes lifts the MUFU bound of small head dims
    (FlashAttention-4's idea)."""
    return Float32(llvm.inline_asm(T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)], _EXP2_POLY3_PTX, "=f,f",
                                   has_side_effects=False, is_align_stack=False,
                                   asm_dialect=llvm.AsmDialect.AD_ATT))


@cute.jit
def quad_max(v: Float32) -> Float32:
    """Max over the 4 lanes of a quad (the threads that share an MMA accumulator row)."""
    v = cute.arch.fmax(v, cute.arch.shuffle_sync_bfly(v, offset=2))
    return cute.arch.fmax(v, cute.arch.shuffle_sync_bfly(v, offset=1))


@cute.jit
def quad_sum(v: Float32) -> Float32:
    """Sum over the 4 lanes of a quad."""
    v = v + cute.arch.shuffle_sync_bfly(v, offset=2)
    return v + cute.arch.shuffle_sync_bfly(v, offset=1)


@cute.jit
def scaled_max(m: Float32, scale_log2: Float32) -> Float32:
    """``m * scale_log2``, or 0 for a row that saw no key (``m = -inf``): the offset subtracted before
    ``exp2``, chosen so an empty row gives ``exp2(-inf) = 0`` instead of ``exp2(NaN)``."""
    m_s = m * scale_log2
    if m == -Float32.inf:
        m_s = Float32(0.0)
    return m_s


@cute.jit
def safe_max(m: Float32) -> Float32:
    """``m``, or 0 when ``m = -inf`` (the unscaled form of :func:`scaled_max`, for natural-log LSEs)."""
    m_safe = m
    if m == -Float32.inf:
        m_safe = Float32(0.0)
    return m_safe


@cute.jit
def raw_state_weight(m: Float32, max_scaled: Float32, scale_log2: Float32) -> Float32:
    """Weight of a raw state with running max ``m`` in a merge whose scaled max is ``max_scaled``
    (from :func:`scaled_max`): ``exp2(m * scale_log2 - max_scaled)``, one FMA + EX2."""
    return cute.math.exp2(m * scale_log2 - max_scaled, fastmath=True)


@cute.jit
def lse_state_weight(lse: Float32, lse_max_safe: Float32) -> Float32:
    """Weight of a normalized state with natural-log ``lse`` in a merge whose max LSE is
    ``lse_max_safe`` (from :func:`safe_max`): ``exp(lse - lse_max)``, computed in base 2."""
    return cute.math.exp2((lse - lse_max_safe) * LOG2_E, fastmath=True)


@cute.jit
def inv_or_zero(l: Float32) -> Float32:
    """``1 / l``, or 0 for an empty row (``l = 0``): the deferred normalization.  ``rcp.approx`` (one
    MUFU.RCP, at most 1 ulp off; FlashAttention's choice): a non-empty row's sum is at least 1 (its
    max term is ``exp2(0)``), far from the denormals where the exact division takes its slow path."""
    inv = Float32(0.0)
    if l > 0.0:
        inv = cute.arch.rcp_approx(l)
    return inv


@cute.jit
def lse_from_scaled(max_scaled: Float32, l: Float32) -> Float32:
    """Natural-log LSE of a raw state: ``(max_scaled + log2(l)) * ln 2``, ``-inf`` for ``l = 0``.
    ``lg2.approx`` (one MUFU.LG2, absolute error ~2^-22 on ``l >= 1``, as :func:`inv_or_zero`'s sum)."""
    lse = -Float32.inf
    if l > 0.0:
        lse = (max_scaled + cute.math.log2(l, fastmath=True)) * LN_2
    return lse


@cute.jit
def lse_from_safe_max(lse_max_safe: Float32, w_sum: Float32) -> Float32:
    """Natural-log LSE of a merge of normalized states: ``lse_max + log(sum w)`` (``-inf`` when every
    weight is 0, as ``log(0)``)."""
    return lse_max_safe + cute.math.log(w_sum, fastmath=False)


@dataclass(frozen=True)
class OnlineSoftmax:
    """Running (max, sum) of the ``n_rows`` accumulator rows one thread holds, updated tile by tile.

    Build it inside a kernel with :meth:`create` (its state lives in registers)::

        softmax = OnlineSoftmax.create(scale_log2, n_rows)
        for each KV tile:  S = Q K^T (masked scores = -inf)
            for r in rows:  softmax.update_row(r, S_row(r), O_row(r))   # S_row becomes P in place
            O += P V
        m, l = softmax.row_max[r], quad_sum(softmax.row_sum[r])

    The row max is reduced over the quad (:func:`quad_max`), the row sum is kept per thread (reduce
    it once at the end).  A row with only masked scores keeps ``m = -inf``, ``l = 0``, ``O = 0``.
    Frozen: the DSL treats a frozen dataclass as read-only in dynamic control flow (its tensors'
    contents still change).
    """

    scale_log2: Float32
    n_rows: int
    row_max: cute.Tensor
    row_sum: cute.Tensor
    #: score softcapping (None: off): the raw scores become ``tanh(s * softcap_scale)`` before the mask
    #: (:meth:`softcap`), ``softcap_scale = softmax_scale / softcap``, and ``scale_log2`` is then
    #: ``softcap * log2(e)``
    softcap_scale: Float32 = None

    @staticmethod
    def create(scale_log2: Float32, n_rows: int, softcap_scale: Float32 = None) -> "OnlineSoftmax":
        row_max = cute.make_rmem_tensor((n_rows,), Float32)
        row_sum = cute.make_rmem_tensor((n_rows,), Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        return OnlineSoftmax(scale_log2, n_rows, row_max, row_sum, softcap_scale)

    @cute.jit
    def softcap(self, s: cute.Tensor):
        """Softcapping of a tile of raw scores in place (a no-op without ``softcap_scale``):
        :func:`softcap_scores`.  Call it before the mask (``tanh(-inf)`` would be -1)."""
        if cutlass.const_expr(self.softcap_scale is not None):
            softcap_scores(s, self.softcap_scale)

    @cute.jit
    def update_row(self, r, s_row: cute.Tensor, o_row: cute.Tensor):
        """Row ``r``: new max from the scores ``s_row`` (overwritten with ``p = exp2(s * scale_log2 -
        m_new_s)``), the sum and the output row ``o_row`` rescaled by ``exp2((m_old - m_new) *
        scale_log2)`` and the tile's ``p`` added to the sum."""
        corr = self.step_row(r, s_row)
        o_row.store(o_row.load() * corr)

    @cute.jit
    def step_row(self, r, s_row: cute.Tensor, poly_share: cutlass.Constexpr[int] = 0) -> Float32:
        """:meth:`update_row` without touching O: returns the correction ``exp2((m_old - m_new) *
        scale_log2)`` the caller applies to the output row later (when an in-flight wgmma still
        accumulates into it).

        ``poly_share``: of every 8 scores, this many are exponentiated by :func:`exp2_poly3` (FMA
        pipes) and the rest by ``exp2`` (MUFU); only for rows without ``-inf`` scores (unmasked
        tiles) and a row max that is finite."""
        m_cur = s_row.load().reduce(cute.ReductionOp.MAX, -Float32.inf, 0)
        m_cur = quad_max(m_cur)
        m_prev = self.row_max[r]
        m_new = cute.arch.fmax(m_prev, m_cur)
        m_scaled = scaled_max(m_new, self.scale_log2)
        if cutlass.const_expr(poly_share == 0):
            p = cute.math.exp2(s_row.load() * self.scale_log2 - m_scaled, fastmath=True)
            s_row.store(p)
        else:
            for j in cutlass.range_constexpr(cute.size(s_row)):
                x = s_row[j] * self.scale_log2 - m_scaled
                if cutlass.const_expr(j % 8 < poly_share):
                    s_row[j] = exp2_poly3(x)
                else:
                    s_row[j] = cute.math.exp2(x, fastmath=True)
            p = s_row.load()
        corr = cute.math.exp2(m_prev * self.scale_log2 - m_scaled, fastmath=True)
        self.row_sum[r] = self.row_sum[r] * corr + p.reduce(cute.ReductionOp.ADD, Float32.zero, 0)
        self.row_max[r] = m_new
        return corr


@cute.jit
def softcap_scores(s: cute.Tensor, softcap_scale: Float32):
    """``s = tanh(s * softcap_scale)`` in place (registers): FlashAttention's softcapping
    ``softcap * tanh(s * softmax_scale / softcap)`` with the factor ``softcap`` left to the softmax's
    scale (``scale_log2 = softcap * log2(e)``), as FlashAttention-2/3 fold it.  ``tanh.approx.f32``
    (one MUFU.TANH per score, FlashAttention's choice): its relative error, about 2^-11, bounds the
    score's error by ``softcap * 2^-11``."""
    s.store(cute.math.tanh(s.load() * softcap_scale, fastmath=True))


@cute.jit
def finalize_with_sink(m: Float32, l: Float32, scale_log2: Float32, sink_log2: Float32):
    """``(o_scale, lse)`` of a row's raw state (running max ``m`` of its raw scores, ``-inf`` if it saw no
    key, and its quad-reduced sum ``l`` relative to ``scaled_max(m)``) with a sink logit added to its
    softmax denominator (FlashAttention-4's ``learnable_sink``; ``sink_log2 = sink * log2(e)``, the
    sink in natural-log units of the scaled scores, not multiplied by the softmax scale):
    ``lse = log(sum_j exp(s_j) + exp(sink))`` and ``O = acc * o_scale`` for the unnormalized
    accumulator ``acc``.  The max is taken with the sink (a sink far above every score cannot
    overflow the sum); a row without keys gets ``O = 0`` and ``lse = sink``; ``sink = -inf`` is no sink."""
    m_s = m * scale_log2  # -inf for a row without keys
    m_new = cute.arch.fmax(m_s, sink_log2)
    m_safe = m_new
    if m_new == -Float32.inf:
        m_safe = Float32(0.0)
    corr = cute.math.exp2(m_s - m_safe, fastmath=True)
    l_new = l * corr + cute.math.exp2(sink_log2 - m_safe, fastmath=True)
    return inv_or_zero(l_new) * corr, lse_from_scaled(m_safe, l_new)


@cute.jit
def probs_from_lse(s_mn: cute.Tensor, lse_log2_of_col, scale_log2: Float32):
    """Recompute softmax probabilities in place from a stored LSE (an attention backward): the
    (rows, cols) scores ``s_mn`` become ``exp2(s * scale_log2 - lse_log2)``, where ``lse_log2_of_col(c)``
    gives the base-2 LSE (``lse * log2(e)``) of column ``c``'s query (the scores are transposed: one
    query per column).  A masked score (``-inf``) gives 0; so does a query whose LSE is stored as
    ``+inf`` (no key, or a padding row)."""
    for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
        lse = lse_log2_of_col(c)
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            s_mn[r, c] = cute.math.exp2(s_mn[r, c] * scale_log2 - lse, fastmath=True)


@cute.jit
def softcap_probs_from_lse(s_mn: cute.Tensor, p_mn: cute.Tensor, lse_log2_of_col, scale_log2: Float32,
                           masked: cutlass.Constexpr[bool]):
    """Softcapping's :func:`probs_from_lse` (an attention backward): the capped scores ``t = tanh(s *
    softmax_scale / softcap)`` in ``s_mn`` (:func:`softcap_scores`; masked ones ``-inf``) give ``P =
    exp2(t * scale_log2 - LSE_log2)`` (``scale_log2 = softcap * log2(e)``) in ``p_mn``'s 16-bit type
    into ``p_mn``, and ``s_mn`` becomes ``P (1 - t^2)``: dS^T = P (1 - t^2) (dP^T - Delta) is the
    gradient of the uncapped scaled score (the softmax scale still to come, as without softcapping).
    A masked score gives 0 (``1 - t^2``, -inf there, clamped at 0 in ``masked`` tiles: no ``0 * inf``)."""
    for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
        lse = lse_log2_of_col(c)
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            t = s_mn[r, c]
            p = cute.math.exp2(t * scale_log2 - lse, fastmath=True)
            p_mn[r, c] = p.to(p_mn.element_type)
            d = Float32(1.0) - t * t
            if const_expr(masked):
                d = cute.arch.fmax(d, Float32(0.0))
            s_mn[r, c] = p * d
