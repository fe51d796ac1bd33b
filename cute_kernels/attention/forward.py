"""``flash_attn``: the FlashAttention forward (prefill attention) on Hopper, host side.

``O = softmax(Q K^T * scale) V`` for q (B, Sq, Hq, D) against k/v (B, Sk, Hkv, D), never materializing
the scores; the kernel (:mod:`.forward_kernel`) also writes the natural-log LSE of every row, which
:func:`cute_kernels.merge_states` combines exactly across key splits.  Packed (variable-length)
sequences: q (total_q, Hq, D) and k/v (total_k, Hkv, D) with ``cu_seqlens_q`` / ``cu_seqlens_k`` on the
device and host ints ``max_seqlen_q`` / ``max_seqlen_k`` that size the grid.  Sliding windows
``window_size=(left, right)``, dense or packed.  Paged K/V: page pools (num_pages, page_size, Hkv, D)
with ``block_table`` and ``seqused_k`` on the device (the ``decode_attn`` conventions), q dense or
packed.  Device values (lengths, pages) never reach the host unless checked mode is on, so CUDA
graphs replay for any lengths up to the captured maxima.  Softcapping (``softcap``) and attention
sinks (FlashAttention-4's ``learnable_sink``) are compile-time variants of every kind of call, their
values run-time arguments; windows take FlashAttention-4's sides (None unbounded, negative sides past
the diagonal; -1 unbounded too).

One host path for every kind of call: the arguments are validated (:mod:`.forward_validate`: every
error names its argument, shape errors before device errors, nothing launched) into a :class:`Call`
(query rows dense or packed; K/V dense, packed or paged; the mask; the scale), and :func:`_run` plans
it (the compile key is the dtype, head dim, causal, packed, windowed, the page size and whether it
softcaps / has sinks: never lengths, batch, heads or the variants' values), handles empty problems without a launch, and launches through a launcher
(:func:`.forward_host.make_launcher`) that it keeps for later calls with the same metadata (the host
fast path: a key lookup, then the launcher).  Traced calls (``torch.compile``, fake tensors) go
through two ``torch.library`` custom ops taking every kind of call: a functional one (where autograd
formulas register) and one writing given ``out`` / ``lse`` buffers; eager calls skip the dispatcher.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..common import jit
from ..common.dtypes import HALF_TORCH, TORCH_TO_NAME, name_of
from ..common import fastpath
from ..common.fastpath import LauncherCache
from ..common.overlap import check_written
from ..common.host import tile_counter  # noqa: F401  (FW.tile_counter: the benches pass it to bare launches)
from . import forward_host as fh
from . import forward_autograd
from .forward_autograd import check_differentiable
from . import forward_config
from .decode_plan import check_flag, checked_default
from .forward_validate import (HEAD_DIMS, PAGE_SIZE_RULE, _check_ptrs, _err, _scale, check_cu_seqlens,  # noqa: F401
                               check_paged_values, check_softcap, check_unsupported, check_window, page_size_ok,
                               validate, validate_paged, validate_varlen)

__all__ = ["flash_attn", "validate", "validate_varlen", "check_window", "check_cu_seqlens", "plan", "get_forward_kernel", "warmup_flash_attn", "precompile", "HEAD_DIMS"]


# ------------------------------------------------------------------------------------------------
# plan and compiled kernels
# ------------------------------------------------------------------------------------------------
_PLANS: dict = {}


def plan(dtype: torch.dtype, head_dim: int, causal: bool, varlen: bool = False, window: bool = False,
         page_size: int = 0, softcap: bool = False, sink: bool = False):
    """The kernel configuration (``FlashFwdConfig``) for these static facts (and the SM count of the
    device, the persistent grid's size); memoized.  Lengths, batch, heads, max_seqlen, the window's
    sides, the softcap value and the sink logits are not part of it: they are run-time values of the
    compiled kernel (a window config has ``causal`` False: causal is its right side).  Paged K/V: the
    page size is (the TMA box height).  ``softcap`` / ``sink``: whether the call softcaps / has sinks."""
    key = (dtype, head_dim, causal, varlen, window, page_size, softcap, sink)
    cfg = _PLANS.get(key)
    if cfg is None:
        cfg = _PLANS[key] = forward_config.fwd_config(name_of(dtype), head_dim, causal and not window, _num_sms(),
                                                      varlen=varlen, window=window, page_size=page_size,
                                                      softcap=softcap, sink=sink)
    return cfg


def _num_sms() -> int:
    """SMs of the current CUDA device (the persistent grid), 132 (H100 / H200 SXM) without one."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return 132


def get_forward_kernel(cfg):
    """The compiled TVM-FFI function for ``cfg`` (memory / disk cache, or compiled now; None under
    :class:`jit.dry_run`)."""
    return jit.get_compiled("flash_attn_fwd", cfg, jit.lazy_builder(f"{__package__}.forward_kernel", "forward_builder", cfg))


def warmup_flash_attn(spec) -> None:
    """Compile (or load) the kernel a call would run, without a GPU: ``spec`` is a ``FlashFwdConfig``
    or ``dict(dtype=torch.bfloat16 | "bfloat16", head_dim=64 | 96 | 128 | 256, causal=bool, varlen=bool,
    window=bool, page_size=int, softcap=bool, sink=bool)`` (``window``: a sliding window of any sides; it
    takes causal in; ``page_size``: paged K/V, 0 for none; ``softcap``: any softcap > 0; ``sink``:
    ``learnable_sink`` given)."""
    if isinstance(spec, dict):
        extra = set(spec) - {"dtype", "head_dim", "causal", "varlen", "window", "page_size", "softcap", "sink"}
        if extra:
            raise ValueError(f"warmup flash_attn: unknown keys {sorted(extra)} "
                             "(dtype, head_dim, causal, varlen, window, page_size, softcap, sink)")
        dtype = spec.get("dtype", torch.bfloat16)
        if isinstance(dtype, str):
            dtype = next((t for t, n in TORCH_TO_NAME.items() if n == dtype), dtype)
        if dtype not in HALF_TORCH:
            raise ValueError(f"warmup flash_attn: dtype must be float16 or bfloat16, got {dtype}")
        head_dim = int(spec.get("head_dim", 128))
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"warmup flash_attn: head_dim must be one of {HEAD_DIMS}, got {head_dim}")
        page_size = int(spec.get("page_size", 0))
        if page_size and not page_size_ok(page_size):
            raise ValueError(f"warmup flash_attn: page_size must be 0 or {PAGE_SIZE_RULE}, got {page_size}")
        flags = {}
        for name in ("causal", "varlen", "window", "softcap", "sink"):
            flags[name] = spec.get(name, False)
            if type(flags[name]) is not bool:
                raise TypeError(f"warmup flash_attn: {name} must be a bool, got {type(flags[name]).__name__} "
                                f"{flags[name]!r}")
        spec = plan(dtype, head_dim, flags["causal"], flags["varlen"], flags["window"], page_size, flags["softcap"],
                    flags["sink"])
    get_forward_kernel(spec)


jit.register_warmup("flash_attn", warmup_flash_attn)


def precompile(configs, processes: Optional[int] = None) -> list[str]:
    """Compile forward configs into the disk cache in parallel processes (later calls load them in
    ~1 ms); returns error strings."""
    return jit.precompile_configs(get_forward_kernel, configs, processes)


# ------------------------------------------------------------------------------------------------
# one call description, one launch path
# ------------------------------------------------------------------------------------------------
DENSE, PACKED, PAGED, PAGED_PACKED = "dense", "packed", "paged", "paged_packed"


class Call(NamedTuple):
    """A validated ``flash_attn`` call: the query rows (dense (B, Sq, Hq, D) or packed by
    ``cu_seqlens_q``), the K/V source (dense, packed by ``cu_seqlens_k``, or paged by ``block_table`` /
    ``seqused_k``), the mask (causal, the window's sides: -1 unbounded, other negative sides
    FlashAttention-4's), the scale, and the variants (softcap: 0 off; the sink logits: None off).
    Every path (eager, the custom ops, the launcher a later call reuses) launches from one of these."""

    mode: str  # DENSE | PACKED | PAGED | PAGED_PACKED
    causal: bool
    scale: float
    window_left: int = -1
    window_right: int = -1
    cu_seqlens_q: Optional[torch.Tensor] = None
    cu_seqlens_k: Optional[torch.Tensor] = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    block_table: Optional[torch.Tensor] = None
    seqused_k: Optional[torch.Tensor] = None
    softcap: float = 0.0
    learnable_sink: Optional[torch.Tensor] = None

    @property
    def window(self) -> tuple[int, int]:
        return self.window_left, self.window_right

    @property
    def packed_q(self) -> bool:
        return self.mode in (PACKED, PAGED_PACKED)

    def device_tensors(self) -> tuple:
        """The device tensors a launch passes, in the kernel's order (:func:`.forward_host.make_launcher`)."""
        if self.mode == DENSE:
            return ()
        if self.mode == PACKED:
            return self.cu_seqlens_q, self.cu_seqlens_k
        if self.mode == PAGED:
            return self.block_table, self.seqused_k
        return self.cu_seqlens_q, self.block_table, self.seqused_k

    def max_seqlens(self) -> tuple:
        return {PACKED: (self.max_seqlen_q, self.max_seqlen_k), PAGED_PACKED: (self.max_seqlen_q,)}.get(self.mode, ())

    def variant_values(self) -> tuple:
        """What a launch passes after the device tensors (:func:`.forward_host.variant_values`)."""
        return fh.variant_values(self.softcap, self.learnable_sink)


def _op_call(causal, softmax_scale, window_left, window_right, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
             max_seqlen_k, block_table, seqused_k, softcap=0.0, learnable_sink=None) -> Call:
    """The :class:`Call` of a custom op's arguments (the mode from which optional tensors are given)."""
    if block_table is not None:
        mode = PAGED if cu_seqlens_q is None else PAGED_PACKED
    else:
        mode = DENSE if cu_seqlens_q is None else PACKED
    return Call(mode, causal, softmax_scale, window_left, window_right, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                max_seqlen_k, block_table, seqused_k, softcap, learnable_sink)


def _lse_shape(c: Call, q) -> tuple:
    """(B, Hq, Sq) for dense query rows, (Hq, total_q) for packed ones."""
    return (q.shape[1], q.shape[0]) if c.packed_q else (q.shape[0], q.shape[2], q.shape[1])


def _no_rows(c: Call, q) -> bool:
    if c.packed_q:
        return c.cu_seqlens_q.shape[0] < 2 or q.shape[0] == 0 or q.shape[1] == 0 or c.max_seqlen_q == 0
    return q.shape[0] == 0 or q.shape[1] == 0 or q.shape[2] == 0


def _run(c: Call, q, k, v, out, lse, key=None) -> None:
    """Launch a validated call (out / lse given), and keep its launcher under ``key`` for later calls
    with the same metadata (:mod:`.forward_host`).  No query row: nothing to do.  No key at all:
    O = 0, LSE = -inf or the head's sink (dense), or a one-row stand-in K/V whose lengths clamp to 0
    (packed).  Nothing here reads a device value (lengths, pages): CUDA graphs replay for any lengths
    up to the maxima."""
    if _no_rows(c, q):
        return
    if c.mode == DENSE and k.shape[1] == 0:
        out.zero_()
        if c.learnable_sink is None:
            lse.fill_(float("-inf"))
        else:  # FlashAttention-4's: a row without keys has the sink alone in its denominator
            lse.copy_(c.learnable_sink[None, :, None].expand(lse.shape))
        return
    if c.mode == PACKED and k.shape[0] == 0:
        k = v = k.new_zeros((1,) + tuple(k.shape[1:]))
        c, key = c._replace(max_seqlen_k=0), None
    paged = c.mode in (PAGED, PAGED_PACKED)
    sink = () if c.learnable_sink is None else (c.learnable_sink,)
    cfg = plan(q.dtype, q.shape[-1], c.causal, varlen=c.packed_q, window=c.window != (-1, -1),
               page_size=k.shape[1] if paged else 0, softcap=bool(c.softcap), sink=bool(sink))
    fn = get_forward_kernel(cfg)
    if fn is None:  # jit.dry_run: planned, nothing compiled or launched
        return
    dev = c.device_tensors()
    launch = fh.make_launcher(fn, q, _lse_shape(c, q), cfg.tile.dynamic, c.mode, c.window, c.max_seqlens(),
                              inputs=(q, k, v, *dev, *sink), out=out, variant=cfg.variant_args)
    launch(q, k, v, out, lse, c.scale, *dev, *c.variant_values())
    if key is not None:
        if len(key) == 12 and c.mode == DENSE and c.window == (-1, -1) and not sink and not c.softcap:
            # a plain dense key (forward_host.dense_key's) without a window: the fast path's guard for its
            # tensors, and the rest of the key (LauncherCache)
            launch.guard = fastpath.metadata_guard(q, k, v) if key[2] is None else fastpath.metadata_guard(q, k, v, out)
            launch.rest = (key[2] is None, key[3], key[4])
        _launchers[key] = launch


# ------------------------------------------------------------------------------------------------
# torch.library ops: one functional op (autograd formulas register on it), one writing given buffers
# ------------------------------------------------------------------------------------------------
@torch.library.custom_op("cute_kernels::flash_attn", mutates_args=())
def _flash_attn_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float,
                   window_left: int = -1, window_right: int = -1, cu_seqlens_q: Optional[torch.Tensor] = None,
                   cu_seqlens_k: Optional[torch.Tensor] = None, max_seqlen_q: int = 0, max_seqlen_k: int = 0,
                   block_table: Optional[torch.Tensor] = None, seqused_k: Optional[torch.Tensor] = None,
                   softcap: float = 0.0, learnable_sink: Optional[torch.Tensor] = None,
                   deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``deterministic``: the backward's mode (autograd's formula reads it; the forward is the same)."""
    c = _op_call(causal, softmax_scale, window_left, window_right, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                 max_seqlen_k, block_table, seqused_k, softcap, learnable_sink)
    out, lse = q.new_empty(q.shape), q.new_empty(_lse_shape(c, q), dtype=torch.float32)
    _check_ptrs(q, k, v)  # traced calls validated everything else on fake tensors
    _run(c, q, k, v, out, lse)
    return out, lse


@_flash_attn_op.register_fake
def _(q, k, v, causal, softmax_scale, window_left=-1, window_right=-1, cu_seqlens_q=None, cu_seqlens_k=None,
      max_seqlen_q=0, max_seqlen_k=0, block_table=None, seqused_k=None, softcap=0.0, learnable_sink=None,
      deterministic=False):
    c = _op_call(causal, softmax_scale, window_left, window_right, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                 max_seqlen_k, block_table, seqused_k, softcap, learnable_sink)
    return q.new_empty(q.shape), q.new_empty(_lse_shape(c, q), dtype=torch.float32)


forward_autograd.register(_flash_attn_op)


@torch.library.custom_op("cute_kernels::flash_attn_", mutates_args=("out", "lse"), device_types=None)
def _flash_attn_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                       causal: bool, softmax_scale: float, window_left: int = -1, window_right: int = -1,
                       cu_seqlens_q: Optional[torch.Tensor] = None, cu_seqlens_k: Optional[torch.Tensor] = None,
                       max_seqlen_q: int = 0, max_seqlen_k: int = 0, block_table: Optional[torch.Tensor] = None,
                       seqused_k: Optional[torch.Tensor] = None, softcap: float = 0.0,
                       learnable_sink: Optional[torch.Tensor] = None) -> None:
    _check_ptrs(q, k, v, out)
    # traced calls checked on fake tensors, without pointers (nor, symbolic, all of out's strides)
    check_written("flash_attn", "out", out, (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                                             ("cu_seqlens_k", cu_seqlens_k), ("block_table", block_table),
                                             ("seqused_k", seqused_k), ("learnable_sink", learnable_sink)))
    _run(_op_call(causal, softmax_scale, window_left, window_right, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                  max_seqlen_k, block_table, seqused_k, softcap, learnable_sink), q, k, v, out, lse)


@_flash_attn_out_op.register_fake
def _(q, k, v, out, lse, causal, softmax_scale, window_left=-1, window_right=-1, cu_seqlens_q=None,
      cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, block_table=None, seqused_k=None, softcap=0.0,
      learnable_sink=None):
    return None


def _traced(c: Call, q, k, v, out):
    """A traced call (torch.compile, fake tensors): through the custom ops."""
    args = (c.causal, c.scale, c.window_left, c.window_right, c.cu_seqlens_q, c.cu_seqlens_k, c.max_seqlen_q,
            c.max_seqlen_k, c.block_table, c.seqused_k, c.softcap, c.learnable_sink)
    if out is None:
        return _flash_attn_op(q, k, v, *args)
    lse = q.new_empty(_lse_shape(c, q), dtype=torch.float32)
    _flash_attn_out_op(q, k, v, out, lse, *args)
    return out, lse


# ------------------------------------------------------------------------------------------------
# validation of a call's arguments into a Call
# ------------------------------------------------------------------------------------------------
def _describe(q, k, v, causal, softmax_scale, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              window_size, checked, block_table, seqused_k, check_ptrs: bool, check_values: bool, softcap=0.0,
              learnable_sink=None) -> Call:
    """Every host check of a call (:mod:`.forward_validate`; each error names its argument, nothing
    launched), then the checked mode's reading of device values; returns its :class:`Call`."""
    causal, window = check_window(window_size, causal, negative=True)
    var = dict(softcap=softcap, learnable_sink=learnable_sink)
    check_flag(checked, "checked", "flash_attn", allow_none=True)
    wl, wr = window if window is not None else (-1, -1)
    if block_table is not None or seqused_k is not None:
        if block_table is None:
            _err(ValueError, "seqused_k is given without block_table (paged K/V needs both)")
        if seqused_k is None:
            _err(ValueError, "block_table is given without seqused_k (paged K/V needs both: the keys per sequence)")
        if cu_seqlens_k is not None:
            _err(ValueError, "cu_seqlens_k cannot be used with block_table (paged K/V lengths are seqused_k)")
        if cu_seqlens_q is None and max_seqlen_q is not None:
            _err(ValueError, "max_seqlen_q is given without cu_seqlens_q (packed queries need both)")
        scale, mq = validate_paged(q, k, v, block_table, seqused_k, cu_seqlens_q, max_seqlen_q, out, softmax_scale,
                                   max_seqlen_k, check_ptrs=check_ptrs, **var)
        if check_values and checked_default(checked, "flash_attn"):
            if cu_seqlens_q is not None:
                check_cu_seqlens(cu_seqlens_q, q.shape[0], mq, "cu_seqlens_q")
            check_paged_values(k, block_table, seqused_k)
        return Call(PAGED if cu_seqlens_q is None else PAGED_PACKED, causal, scale, wl, wr, cu_seqlens_q, None, mq, 0,
                    block_table, seqused_k, check_softcap(softcap, scale), learnable_sink)
    if (cu_seqlens_q is not None or cu_seqlens_k is not None or max_seqlen_q is not None
            or max_seqlen_k is not None):
        if cu_seqlens_q is None or cu_seqlens_k is None:
            given, missing = ("cu_seqlens_q", "cu_seqlens_k") if cu_seqlens_k is None else ("cu_seqlens_k", "cu_seqlens_q")
            if cu_seqlens_q is None and cu_seqlens_k is None:
                given = "max_seqlen_q" if max_seqlen_q is not None else "max_seqlen_k"
                _err(ValueError, f"{given} is given without cu_seqlens_q / cu_seqlens_k (packed sequences need all four)")
            _err(ValueError, f"{given} is given without {missing} (packed sequences need both)")
        scale, mq, mk = validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out,
                                        softmax_scale, check_ptrs=check_ptrs, **var)
        if check_values and checked_default(checked, "flash_attn"):
            check_cu_seqlens(cu_seqlens_q, q.shape[0], mq, "cu_seqlens_q")
            check_cu_seqlens(cu_seqlens_k, k.shape[0], mk, "cu_seqlens_k")
        return Call(PACKED, causal, scale, wl, wr, cu_seqlens_q, cu_seqlens_k, mq, mk,
                    softcap=check_softcap(softcap, scale), learnable_sink=learnable_sink)
    scale = validate(q, k, v, out, softmax_scale, check_ptrs=check_ptrs, **var)
    return Call(DENSE, causal, scale, wl, wr, softcap=check_softcap(softcap, scale), learnable_sink=learnable_sink)


# ------------------------------------------------------------------------------------------------
# the host fast path (:mod:`.forward_host`): launchers made by a checked call that launched
# ------------------------------------------------------------------------------------------------
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_FAST = fh.FAST_TYPES
#: call metadata (the ``forward_host`` keys) -> launcher (:func:`.forward_host.make_launcher`)
_launchers = LauncherCache()
#: flash_attn's default window_size (no window)
_NO_WINDOW = (-1, -1)


# ------------------------------------------------------------------------------------------------
# the public function
# ------------------------------------------------------------------------------------------------
def flash_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    return_lse: bool = False,
    out: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    window_size: tuple[int, int] = _NO_WINDOW,
    checked: Optional[bool] = None,
    block_table: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    learnable_sink: Optional[torch.Tensor] = None,
    deterministic: bool = False,
):
    """Attention forward ``softmax(q k^T * softmax_scale) v`` (FlashAttention: scores never stored).

    Args:
        q: (B, Sq, Hq, D) float16/bfloat16 CUDA tensor, D in {64, 96, 128, 256}.
        k, v: (B, Sk, Hkv, D), q's dtype and device; Hq a multiple of Hkv (GQA/MQA: query head h
            reads k/v head h // (Hq / Hkv)).
            Any strides with stride(-1) == 1 and every other stride a multiple of 8 elements
            (16 bytes), data pointers 16-byte aligned: (B, H, S, D) tensors viewed as (B, S, H, D)
            with ``.transpose(1, 2)`` run as they are, without a copy.
        causal: bottom-right aligned mask when Sq != Sk (FlashAttention >= 2.1): query i sees keys
            j <= i + Sk - Sq.  Rows that see no key give O = 0 and LSE = -inf.
        softmax_scale: default 1 / sqrt(D).
        return_lse: also return the (B, Hq, Sq) float32 natural-log LSE of each row
            (``merge_states(o_parts, lse_parts.transpose(-1, -2))`` merges key splits).
        out: optional (B, Sq, Hq, D) output buffer of q's dtype and device, same stride rules as q;
            its memory must not overlap an input's, nor its elements each other's (ValueError).
        cu_seqlens_q, cu_seqlens_k: packed (variable-length) sequences: q / out (total_q, Hq, D),
            k / v (total_k, Hkv, D), sequence b its rows ``cu_seqlens[b] .. cu_seqlens[b + 1] - 1``;
            (B + 1,) int32 tensors on q's device, both or neither.  Zero-length sequences are fine;
            rows outside every sequence are not written (garbage in a returned ``out``).  The LSE is
            (Hq, total_q).  Causal and the window apply per sequence (bottom-right aligned).
            K/V rows outside the sequences must be finite (a tile may read past a sequence's end;
            those keys are masked, but a NaN value would still reach O through a zero weight).
        max_seqlen_q, max_seqlen_k: with cu_seqlens, host ints >= the longest query / key sequence:
            they size the grid (never the compile key).  A longer sequence is cut to max_seqlen (no
            out-of-bounds access); ``checked`` raises instead.
        window_size: ``(left, right)`` sliding window, FlashAttention-4's: each side an int or None
            (unbounded); query i (at position ``p = i + Sk - Sq``) sees keys
            ``p - left <= j <= p + right``, so a negative right side ends the window before the
            diagonal and a negative left side starts it after (``left + right >= 0`` when both are
            bounded: an empty window raises, where FlashAttention-4 runs it as no window).  The one
            other difference: -1 is unbounded too (FlashAttention-2/3's convention), not "one key
            after the diagonal".  KV tiles outside every row's window are skipped.  ``causal`` is
            ``(None, 0)``: with ``causal=True`` the right side is 0 (a right side other than None,
            -1 or 0 raises).
        checked: with cu_seqlens, read them on the host and raise ValueError for a negative start, a
            decreasing entry, a last entry past total, or a sequence longer than max_seqlen; with
            block_table, a seqused_k outside [0, max_pages * page_size] or a used page id outside
            [0, num_pages) (this synchronizes; not CUDA-graph capturable).  Default: env
            ``CUTE_KERNELS_CHECKED``.
        block_table, seqused_k: paged K/V (the ``decode_attn`` conventions): k / v are page pools
            (num_pages, page_size, Hkv, D), page_size a multiple of 16 from 16 to 256; block_table
            (B, max_pages) int32 lists each sequence's pages (key j of sequence b is row
            ``j % page_size`` of page ``block_table[b, j // page_size]``); seqused_k (B,) int32 the
            number of keys of each sequence (the cached tokens, the new ones included).  q dense
            (B, Sq, Hq, D) or packed with cu_seqlens_q / max_seqlen_q (cu_seqlens_k not allowed).  Causal and windows are bottom-right aligned per sequence (query i of Lq
            sees keys j <= i + seqused_k - Lq), so chunked prefill attends to the cache and itself.
            max_seqlen_k may be given (FlashAttention's callers pass it): a host int, at most the
            capacity (block_table width x page_size); the lengths are seqused_k.
            Out-of-range lengths and page ids are clamped on the device (wrong numbers, no
            out-of-bounds access; ``checked`` raises).  Rows of a sequence's last page past its
            length are read and masked: they must be finite, as the rows around packed sequences.
        softcap: score softcapping (Gemma-2, Grok), FlashAttention's definition: the scaled scores
            become ``softcap * tanh(q k^T * softmax_scale / softcap)`` before the mask and the softmax;
            a finite number >= 0, 0 (the default) off.  A compile-time variant of the kernel (the
            value is a run-time argument); tanh is ``tanh.approx.f32`` as in FlashAttention, its
            error about ``softcap * 2**-11`` on a score.
        learnable_sink: FlashAttention-4's attention sinks (gpt-oss): a (Hq,) float32 tensor on q's
            device, one logit per query head, added to every row's softmax denominator and not
            multiplied by ``softmax_scale``: ``O = sum_j exp(s_j) v_j / (sum_j exp(s_j) +
            exp(sink_h))`` and ``LSE = log(sum_j exp(s_j) + exp(sink_h))`` over the scaled (and
            softcapped) scores s_j of the row's visible keys; a row that sees no key gets O = 0 and
            LSE = sink_h.  (Merging such LSEs across key splits counts each split's sink: keep the
            sink in one split only.)
        dropout_p, alibi_slopes: FlashAttention's; only 0 / None (a ValueError otherwise).
        deterministic: the backward's adds in a fixed order (bitwise repeatable gradients; the
            forward is repeatable in either mode).  Read only when an input requires grad.

    Softcapping, sinks and windows (sides >= -1) are differentiable (dense calls, as every backward):
    a ``learnable_sink`` that requires grad gets its gradient.

    Returns ``out`` or ``(out, lse)``.  Bad input raises ``TypeError``/``ValueError`` naming the
    argument before any launch; nothing synchronizes with the device (unless ``checked``); results are
    bitwise repeatable.  Unchecked calls never read cu_seqlens on the host: a CUDA graph captured
    with given max_seqlen replays correctly for any lengths up to them.
    """
    if alibi_slopes is not None or type(dropout_p) is not float or dropout_p:
        check_unsupported(dropout_p, alibi_slopes)
    if deterministic is not False:
        check_flag(deterministic, "deterministic", "flash_attn")
    key = hit = None
    # a dense call without softcapping or sinks (max_seqlen: the key's test below)
    dense = (softcap.__class__ is float and not softcap and learnable_sink is None and block_table is None
             and seqused_k is None and cu_seqlens_q is None and cu_seqlens_k is None)
    compiling = _is_compiling()  # first: a traced read of the last hit would make dynamo recompile as it changes
    last_key, last_hit, guard, rest = fastpath.NO_LAST if compiling else _launchers.last
    if (guard is not None and dense and window_size is _NO_WINDOW and max_seqlen_q is None and max_seqlen_k is None
            and (checked is None or checked is False) and rest == (out is None, type(causal), causal)):
        if guard.check(q, k, v) if out is None else guard.check(q, k, v, out):
            # the last hit's metadata (LauncherCache): its guard checked q, k, v (and out), none requiring grad
            hit, grad, fast = last_hit, False, True
        else:
            guard = False  # (failed: the key path below)
    if hit is None and type(q) in _FAST and type(k) in _FAST and type(v) in _FAST \
            and (checked is None or checked is False) and not compiling:  # the fast path (forward_host), the grad check on the tensors' own attributes
        grad = _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or (
            learnable_sink is not None and getattr(learnable_sink, "requires_grad", False)))  # then: the differentiable op
        fast = not grad
    elif hit is None:
        grad = _grad_enabled() and (getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
                                    or getattr(v, "requires_grad", False)
                                    or (learnable_sink is not None and getattr(learnable_sink, "requires_grad", False)))
        fast = False
    if fast:
        if dense:
            if hit is None:
                try:
                    if max_seqlen_q is None and max_seqlen_k is None and type(causal) is bool:
                        # forward_host.dense_key's tuple, written out (the most frequent call); LauncherCache: the
                        # last hit's key compared, not hashed (forward_host.int_sides: why)
                        key = (type(window_size), window_size, None if out is None else (type(out), out.stride()), bool,
                               causal, q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), v.stride())
                        if (window_size is _NO_WINDOW or fh.int_sides(window_size)) and key == last_key:
                            hit = last_hit  # a repeat arms the last hit; a guard failing its key's call disarms it
                            if guard is False or rest is None:  # for the run (inference mode...)
                                _launchers.repeat(key, hit, guard is False)
                        else:
                            hit = _launchers.get(key)  # (LauncherCache.hit written out: remembered unarmed)
                            if hit is not None:
                                _launchers.last = (key, hit, None, None)
                except (AttributeError, TypeError):  # a non-tensor, an unhashable argument: the checks say what
                    key = hit = None
            # run_hit's steps written out: the most frequent call, where a call and star-args show (the
            # default scale without a call to fast_scale)
            scale = (None if hit is None or return_lse.__class__ is not bool else hit.default_scale
                     if softmax_scale is None else fh.fast_scale(hit, softmax_scale))
            if scale is not None:
                try:
                    o, lse = hit(q, k, v, out, return_lse, scale)
                except Exception:  # the compiled function refused an argument: the checks name it
                    pass
                else:
                    return (o, lse) if return_lse else o
            res = None
        # softcapping or sinks: their keys and launch values (forward_host.variant_key / variant_values)
        elif softcap.__class__ is not float or softcap or learnable_sink is not None:
            key, res = _variant_hit(q, k, v, causal, softmax_scale, return_lse, out, cu_seqlens_q, cu_seqlens_k,
                                    max_seqlen_q, max_seqlen_k, window_size, checked, block_table, seqused_k,
                                    (softcap, learnable_sink))
        elif cu_seqlens_k is not None and (block_table is not None or seqused_k is not None):
            res = None  # an error the checks name
        elif block_table is not None or seqused_k is not None:
            key, hit = fh.lookup(_launchers, fh.paged_key, (q, k, v, block_table, seqused_k, cu_seqlens_q, max_seqlen_q,
                                 max_seqlen_k, out, causal, window_size), (q, k, v, block_table, seqused_k))
            res = fh.run_hit(hit, checked, softmax_scale, return_lse, q, k, v, out,
                             *((block_table, seqused_k) if cu_seqlens_q is None else (cu_seqlens_q, block_table, seqused_k)))
        else:
            key, hit = fh.lookup(_launchers, fh.packed_key, (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, out, causal, window_size), (q, k, v, cu_seqlens_q, cu_seqlens_k))
            res = fh.run_hit(hit, checked, softmax_scale, return_lse, q, k, v, out, cu_seqlens_q, cu_seqlens_k)
        if res is not None:
            return res
    return _checked(q, k, v, causal, softmax_scale, return_lse, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                    max_seqlen_k, window_size, checked, block_table, seqused_k, key, grad, softcap, learnable_sink,
                    deterministic)


def _variant_hit(q, k, v, causal, softmax_scale, return_lse, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                 max_seqlen_k, window_size, checked, block_table, seqused_k, variant):
    """The fast path of a call with softcapping or a sink (``variant``: ``(softcap, learnable_sink)``),
    any mode: ``(key, result)``, the result None when the checked path must run (no launcher under the
    key, which has the variant's metadata joined: :func:`.forward_host.variant_key`)."""
    if block_table is not None or seqused_k is not None:
        if cu_seqlens_k is not None:
            return None, None  # an error the checks name
        key, hit = fh.lookup(_launchers, fh.paged_key, (q, k, v, block_table, seqused_k, cu_seqlens_q, max_seqlen_q,
                             max_seqlen_k, out, causal, window_size), (q, k, v, block_table, seqused_k), variant)
        dev = (block_table, seqused_k) if cu_seqlens_q is None else (cu_seqlens_q, block_table, seqused_k)
    elif cu_seqlens_q is not None or cu_seqlens_k is not None:
        key, hit = fh.lookup(_launchers, fh.packed_key, (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                             max_seqlen_k, out, causal, window_size), (q, k, v, cu_seqlens_q, cu_seqlens_k), variant)
        dev = (cu_seqlens_q, cu_seqlens_k)
    elif max_seqlen_q is None and max_seqlen_k is None:
        key, hit = fh.lookup(_launchers, fh.dense_key, (q, k, v, out, causal, window_size), (q, k, v), variant)
        dev = ()
    else:
        return None, None
    if hit is None:
        return key, None
    return key, fh.run_hit(hit, checked, softmax_scale, return_lse, q, k, v, out, *dev, *fh.variant_values(*variant))


def _checked(q, k, v, causal, softmax_scale, return_lse, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
             window_size, checked, block_table, seqused_k, key, grad, softcap=0.0, learnable_sink=None,
             deterministic=False):
    """:func:`flash_attn`'s checked path: validate into a :class:`Call`, launch (eager) or trace the
    custom ops, and keep the launcher under ``key`` (the fast path's, None: none); ``grad``: an input
    requires grad (with grad enabled): through the functional op, which autograd records (with the
    backward's ``deterministic``)."""
    check_flag(return_lse, "return_lse", "flash_attn")
    tracing = torch.compiler.is_compiling() or isinstance(q, FakeTensor) or (isinstance(q, torch.Tensor) and q.is_meta)
    c = _describe(q, k, v, causal, softmax_scale, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  window_size, checked, block_table, seqused_k, check_ptrs=not tracing, check_values=not tracing,
                  softcap=softcap, learnable_sink=learnable_sink)
    if grad:
        check_differentiable(c, q, out)  # autograd records the functional op (forward_autograd)
        out, lse = _flash_attn_op(q, k, v, c.causal, c.scale, c.window_left, c.window_right, c.cu_seqlens_q,
                                  c.cu_seqlens_k, c.max_seqlen_q, c.max_seqlen_k, softcap=c.softcap,
                                  learnable_sink=c.learnable_sink, deterministic=deterministic)
    elif tracing:  # torch.compile / fake tensors: the custom ops (their fake implementations trace)
        out, lse = _traced(c, q, k, v, out)
    else:  # eager: no dispatcher
        if out is None:
            out = q.new_empty(q.shape)  # contiguous (B, Sq, Hq, D) / (total_q, Hq, D), whatever q's strides
        lse = q.new_empty(_lse_shape(c, q), dtype=torch.float32)
        _run(c, q, k, v, out, lse, key)
    return (out, lse) if return_lse else out
