"""``flash_attn_backward``: the FlashAttention backward on Hopper for dense (B, S, H, D) tensors, host
side: validation, the buffers, and the three launches (:mod:`.backward_prepost`'s pre-pass,
:mod:`.backward_kernel`, the post-pass converting dQ, dK and dV).

``cute_kernels.flash_attn_backward`` (FlashAttention's ``_flash_attn_backward``); autograd calls it
through ``cute_kernels::flash_attn_backward`` (:mod:`.forward_autograd`).  The gradients are those of ``out, lse = flash_attn(q, k, v, causal=causal, softmax_scale=softmax_scale,
return_lse=True)``: ``lse`` (B, Hq, Sq) fp32, natural log, ``-inf`` for a row that sees no key (its
gradients are 0).  ``dlse`` (optional, (B, Hq, Sq) fp32): the gradient arriving at ``lse``.

Softcapping (``softcap``): a compile-time variant of the main kernel (P from the capped scores, dS times
``1 - tanh^2``).  Attention sinks (``learnable_sink``): q, k, v's gradients need nothing new (the
forward's LSE holds the sink, ``Delta = rowsum(dO * O)`` is unchanged: the sink has no value); the
sink's own gradient is computed here with torch from the pre-pass's Delta (which has ``dlse``
subtracted): ``d sink_h = -sum_{b, q} exp(sink_h - lse[b, h, q]) * Delta[b, h, q]`` (the sink's share of
its row's softmax times ``dlse - rowsum(dO * O)``).

Deterministic mode (``deterministic=True``): the main kernel's fp32 adds (dQ across KV tiles; with GQA,
dK / dV across a KV head's query heads) happen in a fixed order on int32 semaphores zeroed per call
(:mod:`.backward_kernel`), so repeated calls give the same bits; everything else is deterministic in
both modes.

Packed sequences (``cu_seqlens_q`` / ``cu_seqlens_k``): compile-time variants of the three kernels.
The tensors go in as one batch of packed rows; the grid's z is the sequence, whose kernels read its
bounds from cu_seqlens (clamped: bad values give wrong numbers, never an access outside the tensors).
The row buffers hold each sequence's rows from ``off_p = (first row + b * pad)`` rounded down to
``pad`` on, so a sequence's padded tiles are its own (the pre-pass fills its padding rows with +inf /
0); a KV tile's dK / dV rows past its sequence's keys are not written (a partial last tile by
predicated stores).

Buffers per call (fp32): LSE_log2 and Delta (B, Hq, Sq_pad), the dQ accumulator (B, Hq, Sq_pad, D)
(``Sq_pad``: Sq rounded up to :data:`layouts.attention_backward.BWD_ROW_PAD`), and with GQA the dK and dV
accumulators (B, Sk, Hkv, D) (zeroed here; the query heads of a KV head add into them).  Without GQA
the main kernel stores dk and dv itself.
"""

from __future__ import annotations

import torch

from layouts import attention as LA
from layouts import attention_backward as LB

from ..common.args import tensor_fault
from ..common import jit
from ..common.dtypes import name_of
from ..common.host import LOG2_E, WINDOW_UNBOUNDED
from . import backward_config as BC
from .backward_config import det_wait_span, padded_first_row
from .forward_config import gapped_pays
from .decode_plan import check_flag
from .forward_validate import _err, check_softcap, check_window, validate, validate_varlen

__all__ = ["flash_attn_backward", "validate_backward", "bwd_plan", "precompile", "warmup_flash_attn_backward",
           "sink_grad"]

_ALIGN = 8  # elements of a 16-bit type in 16 bytes: TMA boxes and vector accesses


def _check_like(name: str, t, shape: tuple, dtype, device) -> None:
    """A gradient-side tensor: a tensor of ``shape`` and ``dtype`` on ``device``, contiguous in the head
    dim, 16-byte-aligned strides and data pointer."""
    if fault := tensor_fault(t):
        _err(TypeError, f"{name} {fault}")
    if tuple(t.shape) != tuple(shape):
        _err(ValueError, f"{name} shape {tuple(t.shape)} must be {tuple(shape)}")
    if t.dtype != dtype:
        _err(TypeError, f"{name} dtype {t.dtype} must be {dtype}")
    if t.numel() and t.stride(-1) != 1:
        _err(ValueError, f"{name} must be contiguous in the head dim (stride(-1) == 1), got strides {t.stride()}")
    if t.numel() and any(s % _ALIGN for s in t.stride()[:-1]):
        _err(ValueError, f"{name} strides must be multiples of {_ALIGN} elements (16 bytes), got strides {t.stride()}")
    if t.data_ptr() % 16:
        _err(ValueError, f"{name} data pointer must be 16-byte aligned (offset {t.data_ptr() % 16})")
    if t.device != device:
        _err(ValueError, f"{name} is on {t.device}, q on {device}: all tensors must be on one device")


def _check_rows(name: str, t, shape: tuple, device) -> None:
    """An fp32 (B, Hq, Sq) (packed: (Hq, total_q)) row tensor (lse, dlse), any strides."""
    if fault := tensor_fault(t):
        _err(TypeError, f"{name} {fault}")
    if tuple(t.shape) != tuple(shape):
        what = "(batch, heads_q, seqlen_q)" if len(shape) == 3 else "(heads_q, total_q)"
        _err(ValueError, f"{name} shape {tuple(t.shape)} must be {what} = {tuple(shape)} "
                         "(as flash_attn(..., return_lse=True) returns it)")
    if t.dtype != torch.float32:
        _err(TypeError, f"{name} must be float32, got {t.dtype}")
    if t.device != device:
        _err(ValueError, f"{name} is on {t.device}, q on {device}: all tensors must be on one device")


def validate_backward(dout, q, k, v, out, lse, causal, softmax_scale, dq, dk, dv, dlse, window_size=None,
                      softcap=0.0, learnable_sink=None, packed=None):
    """Every check before a launch, each error naming its argument (``TypeError`` / ``ValueError``);
    returns ``(scale, causal, window, softcap, max_seqlen_q, max_seqlen_k)`` (:func:`~.forward_validate.check_window`:
    window None when it bounds nothing beyond causal; softcap a float, 0 off; the max_seqlens None when
    dense).  q, k, v, out, softcap, learnable_sink as :func:`~.forward_validate.validate` (packed:
    :func:`~.forward_validate.validate_varlen` with ``packed = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k)``); dout and dq like q, dk and dv like k; lse (and dlse) fp32 (B, Hq, Sq), packed (Hq,
    total_q)."""
    mq = mk = None
    if packed is None:
        scale = validate(q, k, v, out=out, softmax_scale=softmax_scale, softcap=softcap, learnable_sink=learnable_sink)
    else:
        scale, mq, mk = validate_varlen(q, k, v, *packed, out=out, softmax_scale=softmax_scale, softcap=softcap,
                                        learnable_sink=learnable_sink)
    softcap = check_softcap(softcap, scale)
    causal, window = check_window(window_size, causal)
    if q.shape[-1] not in LB.BWD_HEAD_DIMS:
        _err(ValueError, f"q head_dim {q.shape[-1]}: the backward supports head dims {LB.BWD_HEAD_DIMS}")
    _check_like("dout", dout, q.shape, q.dtype, q.device)
    rows = (q.shape[0], q.shape[2], q.shape[1]) if packed is None else (q.shape[1], q.shape[0])
    _check_rows("lse", lse, rows, q.device)
    if dlse is not None:
        _check_rows("dlse", dlse, rows, q.device)
    for name, t, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, k)):
        if t is not None:
            _check_like(name, t, like.shape, like.dtype, like.device)
            if any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape)):
                _err(ValueError, f"{name} has a stride of 0 (strides {t.stride()}): an expanded tensor "
                                 "cannot be written")
    return scale, causal, window, softcap, mq, mk


_PLANS: dict = {}


def bwd_plan(dtype: torch.dtype, head_dim: int, causal: bool, has_dlse: bool = False, window: bool = False,
             gqa: bool = False, softcap: bool = False, deterministic: bool = False, varlen: bool = False):
    """The configurations a call compiles (main, pre-pass, post-pass; packed with GQA also the dense
    post-pass that converts dK / dV); memoized.  ``window``: a sliding window of any sides (causal then
    False: it is the window's right side).  ``gqa``: more query heads than KV heads (dK, dV then summed in
    fp32 accumulators; else the main kernel stores them).  ``softcap``: score softcapping (any softcap >
    0; the value is a run-time argument).  Sinks compile nothing of their own.  ``deterministic``: the
    main kernel's ordered adds.  ``varlen``: packed sequences."""
    key = (dtype, head_dim, causal, has_dlse, window, gqa, softcap, deterministic, varlen)
    plan = _PLANS.get(key)
    if plan is None:
        main = BC.bwd_config(name_of(dtype), head_dim, causal and not window, window, direct_kv=not gqa,
                             softcap=softcap, deterministic=deterministic, varlen=varlen)
        plan = _PLANS[key] = plan_around(main, has_dlse)
    return plan


def plan_around(main: BC.FlashBwdConfig, has_dlse: bool = False) -> tuple:
    """A call's configurations around its main kernel's (:func:`bwd_plan`): (main, pre-pass, dQ's
    post-pass summing the main kernel's dQ accumulators), and with GQA where dQ's post-pass does not
    fit them, the dense one-accumulator post-pass for dK / dV."""
    name, D = main.dtype, main.head_dim
    groups = main.tile.dq_groups if main.deterministic else 1
    plan = (main, BC.BwdPrepostConfig("prepass", name, D, has_dlse, varlen=main.varlen),
            BC.BwdPrepostConfig("convert", name, D, varlen=main.varlen, groups=groups))
    if not main.direct_kv and (main.varlen or groups > 1):  # dK / dV: rows in, the same rows out, one batch
        plan += (BC.BwdPrepostConfig("convert", name, D),)
    return plan


def _compiled(plan):
    return tuple(_get_any(cfg) for cfg in plan)


def flash_attn_backward(dout, q, k, v, out, lse, *, causal=False, softmax_scale=None, dq=None, dk=None, dv=None,
                        dlse=None, window_size=None, softcap=0.0, learnable_sink=None, deterministic=False,
                        cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """``(dq, dk, dv)`` of ``out = flash_attn(q, k, v, causal=causal, softmax_scale=softmax_scale,
    window_size=window_size, softcap=softcap, learnable_sink=learnable_sink)`` for the output gradient
    ``dout`` (and the LSE gradient ``dlse``, if any); ``(dq, dk, dv, dsink)`` when ``learnable_sink`` is
    given, ``dsink`` the sink's gradient ((Hq,) fp32).  q, out, dout (B, Sq, Hq, D), k, v (B, Sk, Hkv,
    D) in float16 / bfloat16, D in :data:`layouts.attention_backward.BWD_HEAD_DIMS`, any 16-byte-aligned
    strides; lse (B, Hq, Sq) fp32 from the forward (with a sink: the forward's, which holds it).  ``dq``
    / ``dk`` / ``dv``: written in place if given (any 16-byte strides), else allocated.  GQA / MQA: dk,
    dv sum their query heads.  ``window_size=(left, right)`` as ``flash_attn``'s (-1: unbounded; causal
    is (-1, 0)).  ``softcap`` (0: off) and ``learnable_sink`` ((Hq,) fp32 or None) as ``flash_attn``'s.
    ``deterministic``: the same bits on every call for the same inputs (ordered fp32 adds; slower where
    many CTAs add into one query tile).  Packed sequences (``cu_seqlens_q`` / ``cu_seqlens_k`` (B + 1,)
    int32 on the device, host ints ``max_seqlen_q`` / ``max_seqlen_k``, as ``flash_attn``'s): q, out, dout
    (total_q, Hq, D), k, v (total_k, Hkv, D), lse and dlse (Hq, total_q); each sequence's causal diagonal
    and window are its own (bottom-right), an empty sequence gets no gradient rows, a query of a
    sequence without keys a zero row."""
    check_flag(deterministic, "deterministic", "flash_attn_backward")
    packed = None
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            given, missing = ("cu_seqlens_q", "cu_seqlens_k") if cu_seqlens_k is None else ("cu_seqlens_k",
                                                                                          "cu_seqlens_q")
            _err(ValueError, f"flash_attn_backward: {given} given without {missing} (packed sequences need both)")
        packed = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    elif max_seqlen_q is not None or max_seqlen_k is not None:
        _err(ValueError, "flash_attn_backward: max_seqlen_q / max_seqlen_k are for packed sequences (cu_seqlens_q "
                         "and cu_seqlens_k)")
    scale, causal, window, softcap, mq, mk = validate_backward(dout, q, k, v, out, lse, causal, softmax_scale, dq, dk,
                                                               dv, dlse, window_size, softcap, learnable_sink, packed)
    if packed is not None:  # one batch of packed rows: the dense views the kernels take
        B, Hq = cu_seqlens_q.shape[0] - 1, q.shape[1]
        q_, k_, v_, out_, dout_ = (t.unsqueeze(0) for t in (q, k, v, out, dout))
        lse_, dlse_ = lse.unsqueeze(0), None if dlse is None else dlse.unsqueeze(0)
        Sq, Sk = q.shape[0], k.shape[0]
        empty = B == 0 or mq == 0 or mk == 0
    else:
        B, Sq, Hq = q.shape[:3]
        Sk = k.shape[1]
        q_, k_, v_, out_, dout_, lse_, dlse_ = q, k, v, out, dout, lse, dlse
        empty = B == 0
    D, Hkv = q.shape[-1], k.shape[-2]
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    sink = learnable_sink is not None
    if empty or Hq == 0 or Sq == 0 or Sk == 0:  # nothing to launch: the gradients are 0
        for t in (dq, dk, dv):
            t.zero_()
        if not sink:
            return dq, dk, dv
        # no key: O = 0, lse = sink, so d sink = sum of dlse (exp(sink - lse) = 1, Delta = -dlse)
        dsink = torch.zeros(Hq, dtype=torch.float32, device=q.device)
        if dlse is not None and (Sk == 0 or mk == 0):
            dsink += dlse.sum((0, 2)) if packed is None else dlse.sum(1)
        return dq, dk, dv, dsink
    gqa = Hq != Hkv
    plan = bwd_plan(q.dtype, D, causal, dlse is not None, window is not None, gqa, bool(softcap), deterministic,
                    packed is not None)
    tile = plan[0].tile
    n_n = -(-(Sk if packed is None else mk) // tile.tile_n)  # KV tiles of a sequence
    if deterministic and q.is_cuda:  # turns that cannot finish would hang the GPU: refused before any launch
        _check_turns_finish(n_n, -(-(Sq if packed is None else mq) // tile.tile_m), causal, window, tile, q.device)
    main, pre, post, *post_kv = _compiled(plan)
    if main is None:  # jit.dry_run
        return (dq, dk, dv, torch.zeros(Hq, dtype=torch.float32, device=q.device)) if sink else (dq, dk, dv)
    pad = LB.BWD_ROW_PAD
    # the row buffers: dense (B, Hq, Sq rounded up to pad); packed one batch, each sequence's rows from
    # backward_config.padded_first_row on, so total_q + B * pad rows hold every sequence's padded tiles
    Bb, Sp = (B, -(-Sq // pad) * pad) if packed is None else (1, -(-(Sq + B * pad) // pad) * pad)
    f32 = dict(dtype=torch.float32, device=q.device)
    lse2 = torch.empty(Bb, Hq, Sp, **f32)
    delta = torch.empty(Bb, Hq, Sp, **f32)
    groups = tile.dq_groups if deterministic else 1  # dQ accumulators: batches g * Bb .. of one buffer
    dq_acc = torch.empty(groups * Bb, Hq, Sp, D, **f32)  # zeroed by the pre-pass (each sequence's padded rows)
    dk_, dv_ = (dk, dv) if packed is None else (dk.unsqueeze(0), dv.unsqueeze(0))
    if gqa:  # a KV head's query heads add into its rows
        dk_out, dv_out = torch.zeros(Bb, Sk, Hkv, D, **f32), torch.zeros(Bb, Sk, Hkv, D, **f32)
    else:  # the main kernel stores them
        dk_out, dv_out = dk_, dv_
    seq = () if packed is None else (cu_seqlens_q, cu_seqlens_k, mq, mk)
    pre(out_, dout_, lse_, lse_ if dlse_ is None else dlse_, lse2, delta, dq_acc[:Bb], *seq[:1], *seq[2:3])
    if groups > 1:
        dq_acc[Bb:].zero_()
    # softcapping: scores tanh(q.k * scale / softcap), softmax scale softcap (the forward's convention)
    scale_log2, variant = (softcap * LOG2_E, (scale / softcap,)) if softcap else (scale * LOG2_E, ())
    if deterministic:  # one zeroed int32 buffer: the query tiles' turns (64-row units), the KV tiles' turns
        n_m = Sp // LA.FWD_WGMMA_M  # (tile_m: a multiple of 64)
        n_q = groups * Bb * Hq * n_m  # (a set of query-tile turns per dQ accumulator)
        sem = torch.zeros(n_q + (B * Hkv * n_n if gqa else 0), dtype=torch.int32, device=q.device)
        variant += (sem[:n_q].view(groups * Bb, Hq, n_m),)
        if gqa:
            variant += (sem[n_q:].view(B, Hkv, n_n),)
    if packed is not None:
        seq = seq + (packed_numbering(deterministic, B, Sk, mk, tile.tile_n),)
    variant = seq + variant
    if window is None:
        main(q_, k_, v_, dout_, lse2, delta, dq_acc, dk_out, dv_out, scale_log2, *variant)
    else:  # sides of -1 (unbounded) reach past any length
        wl, wr = (WINDOW_UNBOUNDED if w < 0 else w for w in window)
        main(q_, k_, v_, dout_, lse2, delta, dq_acc, dk_out, dv_out, scale_log2, wl, wr, *variant)
    dq_ = dq if packed is None else dq.unsqueeze(0)
    if packed is None:
        post(dq_acc.permute(0, 2, 1, 3)[:, :Sq], dq_, scale)
    else:
        post(dq_acc.permute(0, 2, 1, 3), dq_, scale, cu_seqlens_q, mq)
    if gqa:
        post_dense = post_kv[0] if post_kv else post
        post_dense(dk_out, dk_, scale)
        post_dense(dv_out, dv_, 1.0)
    if sink:
        if packed is None:
            return dq, dk, dv, sink_grad(learnable_sink, lse, delta[:, :, :Sq])
        rows, valid = _packed_rows_in_padded(cu_seqlens_q, Sq)  # rows past the last sequence: no weight
        lse_rows = torch.where(valid, lse_, float("inf"))
        return dq, dk, dv, sink_grad(learnable_sink, lse_rows, torch.where(valid, delta[:, :, rows], 0.0))
    return dq, dk, dv


def _check_turns_finish(num_n: int, num_m: int, causal: bool, window, tile, device) -> None:
    """The deterministic mode's ValueError where its turns would make more KV tiles of one sequence and
    head wait on one another (:func:`~.backward_config.det_wait_span`) than the GPU runs at once (one CTA
    per SM): the backward would never finish."""
    span = det_wait_span(num_n, num_m, causal, window, tile.tile_m, tile.tile_n)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if span > sms:
        _err(ValueError, f"flash_attn_backward: deterministic=True here makes {span} KV tiles of {tile.tile_n} keys of "
                         f"one sequence and head wait on one another, more than this GPU runs at once ({sms} SMs): "
                         f"the backward could never finish. Use deterministic=False, or keys per sequence up to "
                         f"{sms * tile.tile_n}")


def packed_numbering(deterministic: bool, num_batch: int, total_k: int, max_seqlen_k: int, tile_n: int) -> int:
    """The packed main kernel's grid numbering (its ``gapped`` argument): 1 where
    :func:`.forward_seqlen.gapped_pays`, never in the deterministic mode: there a KV tile waits for the
    later-launched tiles of its (sequence, head), and :func:`_check_turns_finish` bounds how many of those
    must be resident for the row-per-sequence order (the dense grid's) only."""
    return int(not deterministic and gapped_pays(num_batch, total_k, max_seqlen_k, tile_n))


def _packed_rows_in_padded(cu_seqlens_q: torch.Tensor, total_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each packed query row, its row in the padded row buffers and whether a sequence holds it (on the
    device, no sync): row ``r`` of sequence ``b`` is ``r - cu_seqlens_q[b] + off_p[b]``, ``off_p`` the
    kernels' :func:`~.backward_config.padded_first_row`; rows past the last sequence map to row 0, not held."""
    rows = torch.arange(total_q, device=cu_seqlens_q.device, dtype=torch.int64)
    cu = cu_seqlens_q.long()
    nseq = cu.shape[0] - 1
    seq = torch.searchsorted(cu[1:], rows, right=True).clamp_max(nseq - 1)
    first = cu[:-1]
    off_p = padded_first_row(first, torch.arange(nseq, device=cu.device))
    valid = (rows >= cu[0]) & (rows < cu[-1])
    return torch.where(valid, rows - first[seq] + off_p[seq], 0), valid


def sink_grad(learnable_sink: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """The sink logits' gradient ((Hq,) fp32): ``-sum_{b, q} exp(sink_h - lse[b, h, q]) * delta[b, h, q]``
    for the forward's LSE (B, Hq, Sq) and the pre-pass's ``Delta = rowsum(dO * O) - dLSE`` (B, Hq, Sq).
    The sink takes ``exp(sink - lse)`` of its row's softmax; the output moves by ``-O`` times that per
    unit of sink, the LSE by that: ``dL/dsink = exp(sink - lse) (dLSE - rowsum(dO * O))``.  A row without
    keys has lse = sink (its gradient: its dLSE); a sink of -inf gets 0 (no NaN from ``-inf - -inf``)."""
    w = torch.exp(learnable_sink.float()[None, :, None] - lse)
    w = torch.where(torch.isneginf(learnable_sink)[None, :, None], torch.zeros_like(w), w)
    return -(w * delta).sum((0, 2))


def _get_any(cfg):
    """Compile (or load) one configuration of any of the three kernels (module level: picklable)."""
    if isinstance(cfg, BC.FlashBwdConfig):
        return jit.get_compiled("flash_attn_bwd", cfg, jit.lazy_builder(f"{__package__}.backward_kernel",
                                                                         "backward_builder", cfg))
    name = "flash_attn_bwd_pre" if cfg.kind == "prepass" else "flash_attn_bwd_post"
    return jit.get_compiled(name, cfg, jit.lazy_builder(f"{__package__}.backward_prepost", "prepost_builder", cfg))


def precompile(plans, processes=None) -> list[str]:
    """Compile the kernels of ``plans`` (:func:`bwd_plan` results) into the disk cache in parallel
    processes; returns error strings."""
    return jit.precompile_configs(_get_any, [c for p in plans for c in p], processes)


def warmup_flash_attn_backward(spec) -> None:
    """Compile (or load) the three kernels a backward call would run, without a GPU: ``spec`` is a
    :func:`bwd_plan` result or ``dict(dtype=torch.bfloat16 | "bfloat16", head_dim=64 | 96 | 128,
    causal=bool, dlse=bool, window=bool, gqa=bool, softcap=bool, deterministic=bool, varlen=bool)`` (``dlse``: a
    gradient arriving at the LSE; ``gqa``: more query heads than KV heads; ``softcap``: any softcap > 0;
    sinks need no kernel of their own; ``varlen``: packed sequences)."""
    if isinstance(spec, dict):
        extra = set(spec) - {"dtype", "head_dim", "causal", "dlse", "window", "gqa", "softcap", "deterministic",
                             "varlen"}
        if extra:
            raise ValueError(f"warmup flash_attn_backward: unknown keys {sorted(extra)} "
                             "(dtype, head_dim, causal, dlse, window, gqa, softcap, deterministic, varlen)")
        dtype = spec.get("dtype", torch.bfloat16)
        if isinstance(dtype, str):
            dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype, dtype)
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"warmup flash_attn_backward: dtype must be float16 or bfloat16, got {dtype}")
        head_dim = spec.get("head_dim", 128)
        if head_dim not in LB.BWD_HEAD_DIMS:
            raise ValueError(f"warmup flash_attn_backward: head_dim must be one of {LB.BWD_HEAD_DIMS}, got {head_dim}")
        softcap, det, varlen = spec.get("softcap", False), spec.get("deterministic", False), spec.get("varlen", False)
        for name, flag in (("softcap", softcap), ("deterministic", det), ("varlen", varlen)):
            if type(flag) is not bool:  # (common.jit's spec kinds check the older keys)
                raise TypeError(f"warmup flash_attn_backward: {name} must be a bool, got {type(flag).__name__} "
                                f"{flag!r}")
        spec = bwd_plan(dtype, head_dim, spec.get("causal", False), spec.get("dlse", False), spec.get("window", False),
                        spec.get("gqa", False), softcap, det, varlen)
    _compiled(spec)


jit.register_warmup("flash_attn_backward", warmup_flash_attn_backward)
