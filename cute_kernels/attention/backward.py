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

Buffers per call (fp32): LSE_log2 and Delta (B, Hq, Sq_pad), the dQ accumulator (B, Hq, Sq_pad, D)
(``Sq_pad``: Sq rounded up to :data:`layouts.attention.BWD_ROW_PAD`), and with GQA the dK and dV
accumulators (B, Sk, Hkv, D) (zeroed here; the query heads of a KV head add into them).  Without GQA
the main kernel stores dk and dv itself.
"""

from __future__ import annotations

import torch

from layouts import attention as LA

from ..common import jit
from ..common.dtypes import name_of
from ..common.softmax import LOG2_E
from . import backward_kernel as bk
from . import backward_prepost as bp
from .forward_softmax import WINDOW_UNBOUNDED
from .decode_plan import check_flag
from .forward_validate import _err, check_softcap, check_window, validate

__all__ = ["flash_attn_backward", "validate_backward", "bwd_plan", "precompile", "warmup_flash_attn_backward",
           "sink_grad"]

_ALIGN = 8  # elements of a 16-bit type in 16 bytes: TMA boxes and vector accesses


def _check_like(name: str, t, shape: tuple, dtype, device) -> None:
    """A gradient-side tensor: a tensor of ``shape`` and ``dtype`` on ``device``, contiguous in the head
    dim, 16-byte-aligned strides and data pointer."""
    if not isinstance(t, torch.Tensor):
        _err(TypeError, f"{name} must be a torch.Tensor, got {type(t).__name__}")
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
    """An fp32 (B, Hq, Sq) row tensor (lse, dlse), any strides."""
    if not isinstance(t, torch.Tensor):
        _err(TypeError, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        _err(ValueError, f"{name} shape {tuple(t.shape)} must be (batch, heads_q, seqlen_q) = {tuple(shape)} "
                         "(as flash_attn(..., return_lse=True) returns it)")
    if t.dtype != torch.float32:
        _err(TypeError, f"{name} must be float32, got {t.dtype}")
    if t.device != device:
        _err(ValueError, f"{name} is on {t.device}, q on {device}: all tensors must be on one device")


def validate_backward(dout, q, k, v, out, lse, causal, softmax_scale, dq, dk, dv, dlse, window_size=None,
                      softcap=0.0, learnable_sink=None):
    """Every check before a launch, each error naming its argument (``TypeError`` / ``ValueError``);
    returns ``(scale, causal, window, softcap)`` (:func:`~.forward_validate.check_window`: window None when
    it bounds nothing beyond causal; softcap a float, 0 off).  q, k, v, out, softcap, learnable_sink as
    :func:`~.forward_validate.validate`; dout and dq like q, dk and dv like k; lse (and dlse) fp32 (B, Hq,
    Sq)."""
    scale = validate(q, k, v, out=out, softmax_scale=softmax_scale, softcap=softcap, learnable_sink=learnable_sink)
    softcap = check_softcap(softcap, scale)
    causal, window = check_window(window_size, causal)
    if q.shape[-1] not in LA.BWD_HEAD_DIMS:
        _err(ValueError, f"q head_dim {q.shape[-1]}: the backward supports head dims {LA.BWD_HEAD_DIMS}")
    _check_like("dout", dout, q.shape, q.dtype, q.device)
    B, Sq, Hq, _ = q.shape
    _check_rows("lse", lse, (B, Hq, Sq), q.device)
    if dlse is not None:
        _check_rows("dlse", dlse, (B, Hq, Sq), q.device)
    for name, t, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, k)):
        if t is not None:
            _check_like(name, t, like.shape, like.dtype, like.device)
            if any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape)):
                _err(ValueError, f"{name} has a stride of 0 (strides {t.stride()}): an expanded tensor "
                                 "cannot be written")
    return scale, causal, window, softcap


_PLANS: dict = {}


def bwd_plan(dtype: torch.dtype, head_dim: int, causal: bool, has_dlse: bool = False, window: bool = False,
             gqa: bool = False, softcap: bool = False, deterministic: bool = False):
    """The three configurations a call compiles (main, pre-pass, post-pass); memoized.  ``window``: a
    sliding window of any sides (causal then False: it is the window's right side).  ``gqa``: more query
    heads than KV heads (dK, dV then summed in fp32 accumulators; else the main kernel stores them).
    ``softcap``: score softcapping (any softcap > 0; the value is a run-time argument).  Sinks compile
    nothing of their own.  ``deterministic``: the main kernel's ordered adds."""
    key = (dtype, head_dim, causal, has_dlse, window, gqa, softcap, deterministic)
    plan = _PLANS.get(key)
    if plan is None:
        name = name_of(dtype)
        plan = _PLANS[key] = (bk.bwd_config(name, head_dim, causal and not window, window, direct_kv=not gqa,
                                            softcap=softcap, deterministic=deterministic),
                              bp.BwdPrepostConfig("prepass", name, head_dim, has_dlse),
                              bp.BwdPrepostConfig("convert", name, head_dim))
    return plan


def _compiled(plan):
    return tuple(_get_any(cfg) for cfg in plan)


def flash_attn_backward(dout, q, k, v, out, lse, *, causal=False, softmax_scale=None, dq=None, dk=None, dv=None,
                        dlse=None, window_size=None, softcap=0.0, learnable_sink=None, deterministic=False):
    """``(dq, dk, dv)`` of ``out = flash_attn(q, k, v, causal=causal, softmax_scale=softmax_scale,
    window_size=window_size, softcap=softcap, learnable_sink=learnable_sink)`` for the output gradient
    ``dout`` (and the LSE gradient ``dlse``, if any); ``(dq, dk, dv, dsink)`` when ``learnable_sink`` is
    given, ``dsink`` the sink's gradient ((Hq,) fp32).  q, out, dout (B, Sq, Hq, D), k, v (B, Sk, Hkv,
    D) in float16 / bfloat16, D in :data:`layouts.attention.BWD_HEAD_DIMS`, any 16-byte-aligned
    strides; lse (B, Hq, Sq) fp32 from the forward (with a sink: the forward's, which holds it).  ``dq``
    / ``dk`` / ``dv``: written in place if given (any 16-byte strides), else allocated.  GQA / MQA: dk,
    dv sum their query heads.  ``window_size=(left, right)`` as ``flash_attn``'s (-1: unbounded; causal
    is (-1, 0)).  ``softcap`` (0: off) and ``learnable_sink`` ((Hq,) fp32 or None) as ``flash_attn``'s.
    ``deterministic``: the same bits on every call for the same inputs (ordered fp32 adds; slower where
    many CTAs add into one query tile)."""
    check_flag(deterministic, "deterministic", "flash_attn_backward")
    scale, causal, window, softcap = validate_backward(dout, q, k, v, out, lse, causal, softmax_scale, dq, dk, dv,
                                                       dlse, window_size, softcap, learnable_sink)
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    sink = learnable_sink is not None
    if B == 0 or Hq == 0 or Sq == 0 or Sk == 0:  # nothing to launch: the gradients are 0
        for t in (dq, dk, dv):
            t.zero_()
        if not sink:
            return dq, dk, dv
        # no key: O = 0, lse = sink, so d sink = sum of dlse (exp(sink - lse) = 1, Delta = -dlse)
        dsink = torch.zeros(Hq, dtype=torch.float32, device=q.device)
        if dlse is not None and Sk == 0:
            dsink += dlse.sum((0, 2))
        return dq, dk, dv, dsink
    gqa = Hq != Hkv
    plan = bwd_plan(q.dtype, D, causal, dlse is not None, window is not None, gqa, bool(softcap), deterministic)
    main, pre, post = _compiled(plan)
    if main is None:  # jit.dry_run
        return (dq, dk, dv, torch.zeros(Hq, dtype=torch.float32, device=q.device)) if sink else (dq, dk, dv)
    pad = LA.BWD_ROW_PAD
    Sp = (Sq + pad - 1) // pad * pad
    f32 = dict(dtype=torch.float32, device=q.device)
    lse2 = torch.empty(B, Hq, Sp, **f32)
    delta = torch.empty(B, Hq, Sp, **f32)
    dq_acc = torch.empty(B, Hq, Sp, D, **f32)  # zeroed by the pre-pass
    if gqa:  # a KV head's query heads add into its rows
        dk_out, dv_out = torch.zeros(B, Sk, Hkv, D, **f32), torch.zeros(B, Sk, Hkv, D, **f32)
    else:  # the main kernel stores them
        dk_out, dv_out = dk, dv
    pre(out, dout, lse, lse if dlse is None else dlse, lse2, delta, dq_acc)
    # softcapping: scores tanh(q.k * scale / softcap), softmax scale softcap (the forward's convention)
    scale_log2, variant = (softcap * LOG2_E, (scale / softcap,)) if softcap else (scale * LOG2_E, ())
    if deterministic:  # one zeroed int32 buffer: the query tiles' turns (64-row units), the KV tiles' turns
        n_m, n_n = Sp // LA.FWD_WGMMA_M, -(-Sk // plan[0].tile.tile_n)  # (tile_m: a multiple of 64)
        sem = torch.zeros(B * Hq * n_m + (B * Hkv * n_n if gqa else 0), dtype=torch.int32, device=q.device)
        variant += (sem[:B * Hq * n_m].view(B, Hq, n_m),)
        if gqa:
            variant += (sem[B * Hq * n_m:].view(B, Hkv, n_n),)
    if window is None:
        main(q, k, v, dout, lse2, delta, dq_acc, dk_out, dv_out, scale_log2, *variant)
    else:  # sides of -1 (unbounded) reach past any length
        wl, wr = (WINDOW_UNBOUNDED if w < 0 else w for w in window)
        main(q, k, v, dout, lse2, delta, dq_acc, dk_out, dv_out, scale_log2, wl, wr, *variant)
    post(dq_acc.permute(0, 2, 1, 3)[:, :Sq], dq, scale)
    if gqa:
        post(dk_out, dk, scale)
        post(dv_out, dv, 1.0)
    if sink:
        return dq, dk, dv, sink_grad(learnable_sink, lse, delta[:, :, :Sq])
    return dq, dk, dv


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
    if isinstance(cfg, bk.FlashBwdConfig):
        return jit.get_compiled("flash_attn_bwd", cfg, bk.backward_builder(cfg))
    name = "flash_attn_bwd_pre" if cfg.kind == "prepass" else "flash_attn_bwd_post"
    return jit.get_compiled(name, cfg, bp.prepost_builder(cfg))


def precompile(plans, processes=None) -> list[str]:
    """Compile the kernels of ``plans`` (:func:`bwd_plan` results) into the disk cache in parallel
    processes; returns error strings."""
    return jit.precompile_configs(_get_any, [c for p in plans for c in p], processes)


def warmup_flash_attn_backward(spec) -> None:
    """Compile (or load) the three kernels a backward call would run, without a GPU: ``spec`` is a
    :func:`bwd_plan` result or ``dict(dtype=torch.bfloat16 | "bfloat16", head_dim=64 | 96 | 128,
    causal=bool, dlse=bool, window=bool, gqa=bool, softcap=bool, deterministic=bool)`` (``dlse``: a gradient
    arriving at the LSE; ``gqa``: more query heads than KV heads; ``softcap``: any softcap > 0; sinks need
    no kernel of their own)."""
    if isinstance(spec, dict):
        extra = set(spec) - {"dtype", "head_dim", "causal", "dlse", "window", "gqa", "softcap", "deterministic"}
        if extra:
            raise ValueError(f"warmup flash_attn_backward: unknown keys {sorted(extra)} "
                             "(dtype, head_dim, causal, dlse, window, gqa, softcap, deterministic)")
        dtype = spec.get("dtype", torch.bfloat16)
        if isinstance(dtype, str):
            dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype, dtype)
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"warmup flash_attn_backward: dtype must be float16 or bfloat16, got {dtype}")
        head_dim = spec.get("head_dim", 128)
        if head_dim not in LA.BWD_HEAD_DIMS:
            raise ValueError(f"warmup flash_attn_backward: head_dim must be one of {LA.BWD_HEAD_DIMS}, got {head_dim}")
        softcap, det = spec.get("softcap", False), spec.get("deterministic", False)
        for name, flag in (("softcap", softcap), ("deterministic", det)):
            if type(flag) is not bool:  # (common.jit's spec kinds check the older keys)
                raise TypeError(f"warmup flash_attn_backward: {name} must be a bool, got {type(flag).__name__} "
                                f"{flag!r}")
        spec = bwd_plan(dtype, head_dim, spec.get("causal", False), spec.get("dlse", False), spec.get("window", False),
                        spec.get("gqa", False), softcap, det)
    _compiled(spec)


jit.register_warmup("flash_attn_backward", warmup_flash_attn_backward)
