"""Split-KV decode attention (1..16 new tokens against a long, optionally paged, KV cache) with GQA.

Decode has no query parallelism, so each (batch, KV head)'s sequence is split into ``num_splits``
chunks, one CTA each; each writes a partial state (fp32 output + natural-log LSE) and the merge kernel
(:mod:`cute_kernels.attention.merge`, a programmatic dependent) combines them in split order (bitwise
deterministic).  With one split the kernel writes the output directly.

Kernel (:class:`DecodeAttnKernel`), one CTA per (split, KV head x row block, batch):

* rows = the ``G = Hq/Hkv`` query heads of one KV head times the ``Sq`` new tokens (``r = t*G + g``),
  padded to ``m_tile``, so every K/V byte is read once per CTA for all of them;
* K/V tiles stream through a swizzled smem ring (:mod:`layouts.attention`): contiguous caches up to
  :data:`~cute_kernels.attention.decode_plan.TMA_EF_MAX_KV_BYTES` through TMA with the L2 evict-first
  hint, larger and paged ones with ``cp.async`` (paged: gathered through the block table);
* ``mma.sync`` m16n8k16 computes ``S = Q K^T`` and ``O += P V`` with P in registers; warps split the
  rows (``warps_m``) and tokens (``warps_n``), each with its own
  :class:`~cute_kernels.common.softmax.OnlineSoftmax`, merged through shared memory at the end;
* bottom-right causal mask: token ``t`` of the new ones sees cache positions ``<= L - Sq + t``;
* sliding windows (``window_size``, FlashAttention-3's sides) and left padding (``cache_leftpad``) are
  compile-time flags (``DecodeConfig.window`` / ``leftpad``; the plain configurations compile to the
  same code): each CTA walks only the KV tiles of its sequence's visible range ``[k_lo, L)`` (``k_lo =
  max(cache_leftpad[b], L - Sq - window_left)``), split over the splits, masks each row's own bounds,
  and never reads below ``k_lo`` (cp.async rows clamped into the range, TMA V rows below it zeroed); a
  window's left side also bounds the split count's planning (:func:`~.decode_plan.window_capacity`).

Lengths stay on the device: every choice comes from static sizes (:mod:`.decode_plan`).  The kernel
clamps lengths to the capacity and page ids to ``[0, num_pages)``, so bad values give wrong numbers,
never out-of-bounds accesses; ``checked=True`` (or ``CUTE_KERNELS_CHECKED=1``) validates them on the
host (this synchronizes).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..common import jit
from ..common.dtypes import to_cutlass
from ..common import fastpath
from ..common.fastpath import BoundedCache, LauncherCache
from ..testing import LAUNCHES
from . import decode_plan as _plan_mod
from . import forward_host as fh
from .forward_validate import check_softcap
from .decode_plan import (  # noqa: F401  (the planning API, re-exported)
    TMA_EF_MAX_KV_BYTES, DecodeConfig, _check_workspace, choose_num_splits, decode_attn_workspace, explain, load_for,
    make_config, workspace_numel,
)
from .decode_reference import decode_attn_reference  # noqa: F401  (re-exported)


__all__ = ["decode_attn", "decode_attn_workspace", "decode_attn_reference", "explain", "DecodeConfig",
           "TMA_EF_MAX_KV_BYTES", "load_for", "choose_num_splits", "make_config",
           "workspace_numel", "precompile", "get_decode_kernel", "decode_builder"]


def __getattr__(name: str):
    """``DecodeAttnKernel``: the kernel class, from its DSL module (imported at this first read)."""
    if name == "DecodeAttnKernel":
        from .decode_kernel import DecodeAttnKernel

        return DecodeAttnKernel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def decode_builder(cfg: DecodeConfig):
    def build():  # (the DSL and the kernel module imported here: only a compile runs this)
        import cutlass
        import cutlass.cute as cute
        from cutlass import Float32, Int32
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor

        from .decode_kernel import DecodeAttnKernel

        dt = to_cutlass(cfg.dtype)
        D = cfg.head_dim
        s64 = cute.sym_int64
        B, Sq, Hq, Hkv = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()

        def row_strides():  # fresh symbols per tensor: shared ones would make the compiled call demand equal strides
            return (s64(divisibility=8), s64(divisibility=8), s64(divisibility=8), 1)

        mQ = make_fake_tensor(dt, (B, Sq, Hq, D), row_strides(), assumed_align=16)
        kv_shape = (cute.sym_int(), cfg.page_size, Hkv, D) if cfg.paged else (B, cute.sym_int(), Hkv, D)
        mK = make_fake_tensor(dt, kv_shape, row_strides(), assumed_align=16)
        mV = make_fake_tensor(dt, kv_shape, row_strides(), assumed_align=16)
        mSeq = make_fake_compact_tensor(cutlass.Int32, (B,), assumed_align=4)
        mBT = None
        if cfg.paged:
            mBT = make_fake_tensor(cutlass.Int32, (B, cute.sym_int()), (s64(), 1), assumed_align=4)
        mO = make_fake_compact_tensor(dt, (B, Sq, Hq, D), stride_order=(3, 2, 1, 0), assumed_align=16)
        mLSE = make_fake_compact_tensor(cutlass.Float32, (B, Hq, Sq), stride_order=(2, 1, 0), assumed_align=4)
        mOp = mLSEp = None
        if cfg.split:
            P = cute.sym_int()
            mOp = make_fake_compact_tensor(
                cutlass.Float32, (P, B, Sq, Hq, D), stride_order=(4, 3, 2, 1, 0), assumed_align=16
            )
            mLSEp = make_fake_compact_tensor(
                cutlass.Float32, (P, B, Sq, Hq), stride_order=(3, 2, 1, 0), assumed_align=4
            )
        k = DecodeAttnKernel(cfg.tile, cfg.paged, cfg.page_size, cfg.causal, cfg.split, cfg.load, cfg.softcap, cfg.sink,
                             cfg.window, cfg.leftpad)
        # softcapping / sinks: softcap_scale, then the sink vector (any stride; its length the host checks);
        # windows: the two sides; left padding: a (B,) int32 tensor like the lengths
        variant = (Float32(1.0),) * cfg.softcap + (
            make_fake_tensor(cutlass.Float32, (cute.sym_int(),), (s64(),), assumed_align=4),) * cfg.sink + (
            Int32(0), Int32(0)) * cfg.window + (
            make_fake_compact_tensor(cutlass.Int32, (B,), assumed_align=4),) * cfg.leftpad
        return k, (mQ, mK, mV, mSeq, mBT, mO, mLSE, mOp, mLSEp, Float32(1.0),
                   make_fake_stream(use_tvm_ffi_env_stream=True)) + variant

    return build


def get_decode_kernel(cfg: DecodeConfig):
    """The compiled kernel (+ merge) for ``cfg``, from the memory / disk cache or compiled now."""
    return jit.get_compiled("decode_attn", cfg, decode_builder(cfg))


def _warm(cfg):
    """``warmup([("decode_attn", cfg)])``: cfg is a :class:`DecodeConfig` (``explain(...)["config"]``)."""
    if not isinstance(cfg, DecodeConfig):
        raise TypeError(f"warmup: a decode_attn spec must be a DecodeConfig (explain(...)['config']), "
                        f"got {type(cfg).__name__}")
    get_decode_kernel(cfg)


jit.register_warmup("decode_attn", _warm)


def precompile(configs, processes: Optional[int] = None) -> list[str]:
    """Compile decode configs into the disk cache in parallel processes; later ``get_decode_kernel``
    calls load them in ~1 ms.  Returns error strings."""
    return jit.precompile_configs(get_decode_kernel, configs, processes)


def _aligned(q, k_cache) -> bool:
    return (q.data_ptr() | k_cache.data_ptr()) % 16 == 0 and not any(st % 8 for st in q.stride()[:-1])


def _run(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, workspace, num_splits, causal, scale,
         key=None, softcap=0.0, learnable_sink=None, window=None, cache_leftpad=None) -> None:
    """Launch a validated CUDA call (out (B, Sq, Hq, D) and lse (B, Hq, Sq) float32 written) through a
    launcher (:func:`.forward_host.decode_launcher`), kept under ``key`` for later calls with the same metadata (not for an
    empty batch, nor a q that needed an aligned copy).  ``causal`` and ``window`` normalized
    (:func:`~.decode_plan.check_window`)."""
    B, Sq, Hq, D = q.shape
    if B == 0:
        return
    cfg, P = _plan_mod.plan(q, k_cache, block_table, num_splits, causal, bool(softcap), learnable_sink is not None,
                            window, cache_leftpad is not None)
    fn = get_decode_kernel(cfg)
    if fn is None:  # jit.dry_run: planned, nothing compiled or launched
        return
    if not _aligned(q, k_cache):
        q, key = q.clone(memory_format=torch.contiguous_format), None  # (contiguous() keeps a misaligned q)
    if P > 1 and workspace is not None:
        _check_workspace(workspace, P, B, Sq, Hq, D)
    launch = fh.decode_launcher(jit.direct(fn), fn, P, q.shape, q.dtype, q.device,
                       (q, k_cache, v_cache, cache_seqlens, block_table, workspace), cfg.variant_args, learnable_sink,
                       cache_leftpad, window)
    launch(q, k_cache, v_cache, out, lse, scale, cache_seqlens, block_table, workspace,
           *_variant_values(softcap, learnable_sink, cache_leftpad))
    if key is not None:
        if len(key) == 14 and key[12] is None and key[13] is None:  # a plain key, no block table or workspace:
            # the fast path's guard for its tensors, and the rest of the key (LauncherCache)
            launch.guard = fastpath.metadata_guard(q, k_cache, v_cache, cache_seqlens)
            launch.rest = (key[0], key[1], key[2], bool, key[3])
            if key[0] is None and window is None:  # without out: later lengths of a growing cache (_grown)
                gk = _grow_key(key)
                grown = _GROWN.get(gk) or _GROWN.setdefault(gk, (cfg.n_tile, BoundedCache(limit=64)))
                grown[1][-(-k_cache.shape[1] // cfg.n_tile)] = launch
        _launchers[key] = launch


# ------------------------------------------------------------------------------------------------
# torch.library ops and the public function
# ------------------------------------------------------------------------------------------------
def _decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, workspace, num_splits, causal, softmax_scale,
                 key=None, softcap=0.0, learnable_sink=None, window_left=-1, window_right=-1, cache_leftpad=None):
    # (the sides as decode_attn normalized them; normalizing again keeps a direct op call honest)
    causal, window = _plan_mod.check_window((window_left, window_right), causal)
    if q.device.type not in _KERNEL_DEVICES:
        LAUNCHES["decode_attn:cpu"] += 1
        o, l = decode_attn_reference(q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale, softcap,
                                     learnable_sink, window or (-1, -1), cache_leftpad)
        out.copy_(o.to(out.dtype))
        lse.copy_(l)
        return
    _run(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, workspace, num_splits, causal, softmax_scale, key,
         softcap, learnable_sink, window, cache_leftpad)


@torch.library.custom_op(
    "cute_kernels::decode_attn_", mutates_args=("out", "lse", "workspace"), device_types=None
)
def _decode_attn_out_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: Optional[torch.Tensor],
    out: torch.Tensor,
    lse: torch.Tensor,
    workspace: Optional[torch.Tensor],
    num_splits: Optional[int],
    causal: bool,
    softmax_scale: float,
    softcap: float = 0.0,
    learnable_sink: Optional[torch.Tensor] = None,
    window_left: int = -1,
    window_right: int = -1,
    cache_leftpad: Optional[torch.Tensor] = None,
) -> None:
    _decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, workspace, num_splits, causal, softmax_scale,
                 None, softcap, learnable_sink, window_left, window_right, cache_leftpad)


@_decode_attn_out_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, workspace, num_splits, causal, softmax_scale,
      softcap=0.0, learnable_sink=None, window_left=-1, window_right=-1, cache_leftpad=None):
    return None


@torch.library.custom_op("cute_kernels::decode_attn", mutates_args=())
def _decode_attn_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: Optional[torch.Tensor],
    num_splits: Optional[int],
    causal: bool,
    softmax_scale: float,
    softcap: float = 0.0,
    learnable_sink: Optional[torch.Tensor] = None,
    window_left: int = -1,
    window_right: int = -1,
    cache_leftpad: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, Sq, Hq, D = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    _decode_attn_out_op(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, None, num_splits, causal, softmax_scale,
                        softcap, learnable_sink, window_left, window_right, cache_leftpad)
    return out, lse


@_decode_attn_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, softmax_scale, softcap=0.0,
      learnable_sink=None, window_left=-1, window_right=-1, cache_leftpad=None):
    B, Sq, Hq, D = q.shape
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        q.new_empty((B, Hq, Sq), dtype=torch.float32),
    )


# ------------------------------------------------------------------------------------------------
# the host fast path: a launcher per call metadata, made after a call with that metadata passed
# every check (validate, scale, num_splits) and launched
# ------------------------------------------------------------------------------------------------
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_FAST_TYPES = fh.FAST_TYPES
#: call metadata (:func:`_key`) -> launcher (:func:`.forward_host.decode_launcher`)
_launchers = LauncherCache()
#: devices the kernel runs on (CPU tensors run the torch reference; tests add "cpu" with a stub kernel)
_KERNEL_DEVICES = ("cuda",)
#: decode_attn's default window_size (no window)
_NO_WINDOW = (-1, -1)
_ENV, _ENV_CHECKED = _plan_mod.ENV, _plan_mod.ENV_CHECKED
#: a growing cache's launchers (:func:`_grown`): the metadata of a checked plain call without ``out``
#: except the cache length and the K / V strides -> (the KV tile, {KV tiles of the length: launcher})
_GROWN = BoundedCache(limit=64)


def _grow_key(key) -> tuple:
    """A plain key (:func:`_key`, no block table or workspace) less the cache length and the K / V
    strides, which grow with it (a DynamicCache's keys are a new, longer tensor every step)."""
    return key[:8], key[8][0], key[8][2], key[8][3], key[11]


def _grown(key, q, k_cache, v_cache, cache_seqlens, num_splits, causal):
    """The launcher for a plain call without ``out`` whose metadata differs from an earlier checked
    call's (:data:`_GROWN`) only in the cache length and the K / V strides: made once per number of KV
    tiles of the length (what the split count depends on) and shared by every length with that count,
    instead of validating, planning and making a launcher for every new length (a DynamicCache's every
    step).  The strides that changed are checked here as ``validate`` checks them; what
    the key leaves to the compiled function (dtypes, devices, v's shape, alignment) it checks on every
    call, as for any launcher.  None: no such earlier call, a stride the kernel does not take, or an
    empty cache (the checked path says what)."""
    ks, vs = key[9], key[10]
    if len(key[8]) != 4 or len(ks) != 4 or len(vs) != 4:  # (another rank: the checks name it)
        return None
    grown = _GROWN.get(_grow_key(key))
    L = key[8][1]
    if grown is None or L < 1 or ks[3] != 1 or vs[3] != 1 or (ks[0] | ks[1] | ks[2] | vs[0] | vs[1] | vs[2]) & 7:
        return None
    n_tile, by_tiles = grown
    tiles = -(-L // n_tile)
    launch = by_tiles.get(tiles)
    if launch is None:  # (its extents are of this call's tensors; the path takes no out to test them against)
        cfg, P = _plan_mod.plan_uncached(q, k_cache, None, num_splits, causal)
        fn = get_decode_kernel(cfg)
        launch = by_tiles[tiles] = fh.decode_launcher(jit.direct(fn), fn, P, q.shape, q.dtype, q.device,
                                                      (q, k_cache, v_cache, cache_seqlens, None, None))
    return launch


def _no_backward():
    raise ValueError("decode_attn: an input requires grad, and decode_attn has no backward; call it under "
                     "torch.no_grad() / torch.inference_mode(), or use flash_attn (differentiable)")


def _key(q, k, v, s, bt, out, ws, num_splits, causal, variant=None) -> tuple:
    """What :func:`~.decode_plan.validate` and the plan read from a call that the compiled function's own
    argument checks (:func:`~cute_kernels.common.jit.direct`) leave open: q's shape, dtype and device
    (``get_device()``: -1 for every non-CUDA device, which never has a launcher), k's shape, the
    strides of q, k, v, the block table and the workspace (the partial states are views of its
    storage), the int tensors' dtypes (the compiled function takes uint32 for int32), the block
    table's shape, the workspace's size, the types of the optional tensors (a fake one never hits),
    num_splits (with its type: True is not 1 here) and causal.  The rest -- the other dtypes and
    devices, v's, out's and the lengths' shapes, out's and the lengths' contiguity, 16-byte alignment
    -- the compiled function checks on every call.  ``variant``: ``(softcap, learnable_sink,
    window_size, cache_leftpad)`` of a call with softcapping, a sink, a window or a left padding
    (:func:`.forward_host.variant_key` joins the key, and the window's sides as given -- a tuple of
    ints / None, else no key -- and the padding tensor's metadata, never its values)."""
    # (the parts calls of one model vary in first: a key unlike the last hit's differs early, LauncherCache)
    key = (None if out is None else type(out), type(num_splits), num_splits, causal,
           q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), v.stride(), s.dtype,
           None if bt is None else (type(bt), bt.shape, bt.stride(), bt.dtype),
           None if ws is None else (type(ws), ws.shape, ws.stride()))
    if variant is not None:
        softcap, sink, window, pad = variant
        if sink is not None and type(sink) not in _FAST_TYPES:
            raise TypeError("fast path: a learnable_sink of another type")
        if window.__class__ is not tuple or len(window) != 2 or not all(
                w is None or w.__class__ is int for w in window):
            raise TypeError("fast path: a window_size that is not a pair of ints / None")
        if pad is not None:
            if type(pad) not in _FAST_TYPES:
                raise TypeError("fast path: a cache_leftpad of another type")
            pad = (pad.shape, pad.stride(), pad.dtype, pad.get_device())
        key = (key, fh.variant_key(softcap, sink), window, pad)
    return key


def _variant_values(softcap, learnable_sink, cache_leftpad) -> tuple:
    """The tensors / values a launcher of a variant configuration takes after the workspace: softcap
    (when not 0), the sink, the left padding (when given); a window's sides are the launcher's own."""
    vals = fh.variant_values(softcap, learnable_sink)
    return vals if cache_leftpad is None else vals + (cache_leftpad,)


def decode_attn(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    cache_seqlens: torch.Tensor,
    block_table: Optional[torch.Tensor] = None,
    num_splits: Optional[int] = None,
    causal: bool = True,
    softmax_scale: Optional[float] = None,
    return_lse: bool = False,
    out: Optional[torch.Tensor] = None,
    workspace: Optional[torch.Tensor] = None,
    checked: Optional[bool] = None,
    softcap: float = 0.0,
    learnable_sink: Optional[torch.Tensor] = None,
    window_size=_NO_WINDOW,
    cache_leftpad: Optional[torch.Tensor] = None,
):
    """Decode attention of 1..16 new tokens per sequence against a KV cache (split-k, GQA, paged).

    Args:
        q: (B, Sq, Hq, D) float16/bfloat16, 1 <= Sq <= 16, D in {64, 128, 256}, head dim contiguous.
        k_cache, v_cache: contiguous layout (B, Lmax, Hkv, D), or paged (num_pages, page_size, Hkv, D)
            with ``block_table``; rows 16-byte aligned; Hq a multiple of Hkv (GQA/MQA).
        cache_seqlens: (B,) int32, every cached token *including* the Sq new ones (0 allowed: the
            output is 0 and the LSE -inf).  They stay on the device (no host sync).
        block_table: (B, pages_per_seq) int32 page ids, or None for the contiguous layout.
        num_splits: KV splits per (batch, KV head), an int >= 1 (TypeError for other types, ValueError
            below 1); None picks from SM count, batch, heads and the
            static capacity (Lmax or pages_per_seq * page_size), never from the lengths; 1 disables
            splitting.  A fixed value with ``workspace`` is CUDA-graph capturable.
        causal: bottom-right causal among the new tokens (token t sees positions <= L - Sq + t).
        softmax_scale: default D ** -0.5.
        return_lse: also return the (B, Hq, Sq) float32 natural-log LSE.
        out: optional (B, Sq, Hq, D) contiguous output buffer, not overlapping an input or the
            workspace (ValueError).
        workspace: optional float32 buffer of at least ``workspace_numel(num_splits, B, Sq, Hq, D)``
            elements (:func:`decode_attn_workspace`).
        checked: validate device values (lengths within the capacity, page ids in range) on the host;
            this synchronizes.  Default: env ``CUTE_KERNELS_CHECKED``.  Checked, a length outside
            [0, capacity] or a page id outside [0, num_pages) (negative ids included) among the pages
            a length uses raises ValueError.  Unchecked, bad values give wrong results but never
            out-of-bounds memory accesses: lengths are clamped to [0, capacity] and page ids to
            [0, num_pages) (a negative id reads page 0), on the GPU and on the CPU path alike.
        softcap: score softcapping, ``flash_attn``'s (FlashAttention's definition: the scaled scores
            become ``softcap * tanh(s / softcap)`` before the mask), a finite number >= 0, 0 off.
        learnable_sink: ``flash_attn``'s (FlashAttention-4's): a (Hq,) float32 tensor on q's device,
            one logit per query head added to each row's softmax denominator (not scaled); the LSE
            is ``log(sum_j exp(s_j) + exp(sink))``, a row without keys gets 0 and the sink.  With
            splits it enters split 0's partial state only, so the merge counts it once.
        window_size: ``(left, right)`` sliding window, FlashAttention-3's (``flash_attn_with_kvcache``):
            each side an int >= -1 or None, -1 / None unbounded (sides below -1, FlashAttention-4's,
            raise ValueError here).  Bottom-right aligned like the causal mask: new token ``t`` sits at
            cache position ``p = L - Sq + t`` (L = cache_seqlens[b]) and sees key ``j`` when ``p - left
            <= j`` (left >= 0) and ``j <= p + right`` (right >= 0).  With ``causal=True`` the right side
            must be 0 or -1 / None (ValueError otherwise) and is 0.  Every combination of sides,
            causal or not, paged or not, with or without splits, softcap, sinks and ``cache_leftpad``
            runs on the kernel; only the KV tiles the window reaches are read, and a window's left side
            bounds the split count's planning (the keys any row can see: ``left + Sq``).
        cache_leftpad: optional (B,) int32 tensor on q's device: sequence b's keys are the cache
            positions ``[cache_leftpad[b], cache_seqlens[b])``; positions below are never read (they
            may hold anything, NaN included).  Positions stay cache positions (FlashAttention-3's
            convention: its reference shifts keys and length by the padding, which leaves ``p`` and
            the window where they are), so causal and the window bound the same keys as without it.
            Paged caches too (FlashAttention-3 on Hopper allows it, FlashAttention-2 refuses it): the
            block table is indexed by cache position, padding included.  Checked, a value outside
            [0, cache_seqlens[b]] raises ValueError; unchecked, it is clamped to that range.

    Returns ``out`` or ``(out, lse)``.  Deterministic: the same inputs give the same bits.  Not
    differentiable: with grad enabled, an input that requires grad raises ValueError (a result
    without gradients would be silently wrong); ``flash_attn`` has the backward.
    """
    key = hit = last_key = last_hit = None
    fast = (checked is None or checked is False) and not _is_compiling()
    if fast:  # the fast path (see _key)
        last_key, last_hit, guard, rest = _launchers.last
        if (guard is not None and window_size is _NO_WINDOW and softcap.__class__ is float and not softcap
                and learnable_sink is None and cache_leftpad is None and block_table is None and workspace is None
                and rest == (None if out is None else type(out), type(num_splits), num_splits, type(causal), causal)):
            if guard.check(q, k_cache, v_cache, cache_seqlens):  # the last hit's tensors, none requiring grad
                hit = last_hit
            else:
                guard = False  # (failed: see below)
        plain = True
    if hit is not None:
        pass
    elif fast and type(q) in _FAST_TYPES and type(k_cache) in _FAST_TYPES and type(v_cache) in _FAST_TYPES \
            and type(cache_seqlens) in _FAST_TYPES:
        # the grad check on the plain tensors' own attributes
        if _grad_enabled() and (q.requires_grad or k_cache.requires_grad or v_cache.requires_grad or (
                learnable_sink is not None and getattr(learnable_sink, "requires_grad", False))):
            _no_backward()
        # softcapping, sinks, windows, left padding: in the key (_key), their tensors after the launch's others
        plain = (learnable_sink is None and cache_leftpad is None and softcap.__class__ is float and not softcap
                 and (window_size is _NO_WINDOW or window_size is None
                      or (window_size.__class__ is tuple and window_size == _NO_WINDOW
                          and window_size[0].__class__ is int and window_size[1].__class__ is int)))
        try:
            if plain:  # _key's tuple, written out (a call with ten arguments shows in decode's host time)
                key = (None if out is None else type(out), type(num_splits), num_splits, causal,
                       q.shape, q.stride(), q.dtype, q.get_device(), k_cache.shape, k_cache.stride(), v_cache.stride(),
                       cache_seqlens.dtype,
                       None if block_table is None else (type(block_table), block_table.shape, block_table.stride(),
                                                         block_table.dtype),
                       None if workspace is None else (type(workspace), workspace.shape, workspace.stride()))
            else:
                key = _key(q, k_cache, v_cache, cache_seqlens, block_table, out, workspace, num_splits, causal,
                           (softcap, learnable_sink, window_size, cache_leftpad))
            # LauncherCache: the last hit's key compared, not hashed (a bool causal: a tensor would compare
            # equal to its value where the dict, hashing it by identity, finds nothing)
            if causal.__class__ is bool and key == last_key:
                hit = last_hit  # a repeat arms the last hit; a guard failing its own key's call (inference
                if guard is False or rest is None:  # mode...) disarms it for the run
                    _launchers.repeat(key, hit, guard is False)
            else:
                hit = _launchers.get(key)  # (LauncherCache.hit written out: remembered unarmed)
                if hit is not None:
                    _launchers.last = (key, hit, None, None)
                elif plain and out is None and block_table is None and workspace is None:
                    hit = _grown(key, q, k_cache, v_cache, cache_seqlens, num_splits, causal)
                    if hit is not None:  # (the step's next layers: the last hit, compared, not hashed)
                        _launchers.last = (key, hit, None, None)
        except (AttributeError, TypeError):  # a non-tensor, an unhashable argument: the checks say what
            key = hit = None
    elif _grad_enabled() and (getattr(q, "requires_grad", False) or getattr(k_cache, "requires_grad", False)
                              or getattr(v_cache, "requires_grad", False)
                              or (learnable_sink is not None and getattr(learnable_sink, "requires_grad", False))):
        _no_backward()
    # forward_host.run_hit's steps written out (a call and star-args show in decode's host time): the
    # default scale, checked_env's test of an unset variable, a plain configuration's launch without
    # star-args
    if hit is not None and return_lse.__class__ is bool and (
            checked is False or _ENV_CHECKED not in _ENV or not _plan_mod.checked_env()):
        scale = hit.default_scale if softmax_scale is None else fh.fast_scale(hit, softmax_scale)
        if scale is not None:
            try:
                if plain:
                    o, lse = hit(q, k_cache, v_cache, out, return_lse, scale, cache_seqlens, block_table, workspace)
                else:
                    o, lse = hit(q, k_cache, v_cache, out, return_lse, scale, cache_seqlens, block_table, workspace,
                                 *_variant_values(softcap, learnable_sink, cache_leftpad))
            except Exception:  # the compiled function refused an argument: the checks below name it
                pass
            else:
                return (o, lse) if return_lse else o
    # under torch.compile: no data_ptr / host-sync checks here (the op re-plans in eager code); fake
    # tensors (FakeTensorMode, make_fx) go through the custom ops too: their fakes give the shapes
    compiling = torch.compiler.is_compiling() or isinstance(q, FakeTensor)
    _plan_mod.validate(q, k_cache, v_cache, cache_seqlens, block_table, out, workspace, check_ptrs=not compiling,
                       devices=False, learnable_sink=learnable_sink, cache_leftpad=cache_leftpad)
    B, Sq, Hq, D = q.shape
    scale = _plan_mod.resolve_scale(softmax_scale, D)
    # (against a traced symbolic scale: only softcap's own range)
    softcap = check_softcap(softcap, scale if type(scale) is float else 1.0, "decode_attn")
    num_splits = _plan_mod.check_num_splits(num_splits)
    _plan_mod.check_flag(causal, "causal", "decode_attn")
    # FlashAttention-3's sides (>= -1); causal folded into the right side of a window config
    causal, window = _plan_mod.check_window(window_size, causal)
    wl, wr = window if window is not None else (-1, -1)
    _plan_mod.check_flag(checked, "checked", "decode_attn", allow_none=True)
    _plan_mod.check_flag(return_lse, "return_lse", "decode_attn")
    # devices last: a bad scalar with meta tensors is named as such
    _plan_mod.check_devices(q, k_cache, v_cache, cache_seqlens, block_table, out, workspace, learnable_sink,
                            cache_leftpad)
    if not compiling and _plan_mod.checked_default(checked):
        _plan_mod.check_device_values(k_cache, cache_seqlens, block_table, cache_leftpad, window, Sq)
    if not compiling and workspace is not None:
        if q.device.type == "cuda":
            P = _plan_mod.plan(q, k_cache, block_table, num_splits, causal, bool(softcap), learnable_sink is not None,
                               window, cache_leftpad is not None)[1]
        else:
            P = num_splits or 1
        _check_workspace(workspace, P, B, Sq, Hq, D)
    if compiling and out is None and workspace is None:
        o, lse = _decode_attn_op(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, scale, softcap,
                                 learnable_sink, wl, wr, cache_leftpad)
        return (o, lse) if return_lse else o
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    # eager calls skip the dispatcher; under torch.compile the custom op is traced
    if compiling:
        _decode_attn_out_op(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, workspace, num_splits, causal,
                            scale, softcap, learnable_sink, wl, wr, cache_leftpad)
    else:
        _decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, workspace, num_splits, causal, scale,
                     key, softcap, learnable_sink, wl, wr, cache_leftpad)
    return (out, lse) if return_lse else out
