"""Split-k decode attention (q_len 1..16 against a long, optionally paged, KV cache) with GQA.

Why split-k: at decode time there is no query parallelism, so the KV sequence of each (batch, KV head)
is split into ``num_splits`` chunks, one CTA each; every CTA produces a partial attention state
(fp32 output normalized within its chunk + natural-log LSE) and a combine kernel merges them exactly
(:mod:`cute_kernels.merge`, same math as :func:`cute_kernels.merge_states`), in split order, so the
result is bitwise deterministic.  With ``num_splits == 1`` the attention kernel writes the final output
directly.

Kernel (:class:`DecodeAttnKernel`), one CTA per (split, KV head x row block, batch):

* rows = the ``G = Hq/Hkv`` query heads of one KV head times the ``Sq`` new tokens (row ``r = t*G + g``),
  padded to ``m_tile`` (16/32/64) so every K/V byte is read once per CTA for all of them;
* K/V tiles of ``n_tile`` tokens stream through a ``stages``-deep shared-memory ring with 16-byte
  ``cp.async`` (swizzled, bank-conflict-free); paged caches are gathered through the block table row by
  row (no extra pass); rows past the length are clamped to a valid row and masked;
* tensor cores (``mma.sync`` m16n8k16, fp32 accumulation): ``S = Q K^T`` and ``O += P V`` with P kept in
  registers; the warps split the rows (``warps_m``) and the tile's tokens (``warps_n``); each warp runs
  its own online softmax (exp2 with ``softmax_scale*log2(e)`` folded in) and the warps' states are merged
  through shared memory at the end;
* bottom-right causal mask for ``Sq > 1``: token ``t`` (0-based among the new tokens) sees cache
  positions ``<= L - Sq + t``.

Lengths stay on the device: the split count and every compile-time choice come from static sizes.  In
the default mode the kernel clamps lengths to the cache capacity and page ids to ``[0, num_pages)``, so
bad values give wrong numbers but never out-of-bounds accesses; ``checked=True`` (or
``CUTE_KERNELS_CHECKED=1``) validates them on the host (this synchronizes).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch

from ..common import jit
from ..common.arch import current_arch
from .merge import LOG2_E

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32  # noqa: E402

from .decode_kernel import DecodeAttnKernel  # noqa: E402

__all__ = ["decode_attn", "DecodeConfig", "DecodeAttnKernel", "choose_num_splits", "make_config"]


_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


@dataclass(frozen=True)
class DecodeConfig:
    """Everything the compiled decode kernel specializes on (lengths, batch, heads, splits are not)."""

    dtype: str  # "float16" | "bfloat16"
    head_dim: int  # 64 | 128 | 256
    m_tile: int  # 16 | 32 | 64 rows (query heads x new tokens) per CTA
    n_tile: int  # KV tokens per pipeline stage
    stages: int
    num_threads: int
    paged: bool
    page_size: int  # 0 when not paged
    causal: bool
    split: bool  # False: num_splits == 1, write the output directly
    q_in_regs: bool
    min_blocks_per_mp: int = 1
    merge_mode: str = "pdl"  # "kernel" | "pdl" | "fused" (split only)
    load: str = "cpasync"  # "cpasync" | "tma" (contiguous caches only)
    pdl_in: bool = True  # launched as a programmatic dependent of the previous kernel
    # paged: block-table entries read one tile ahead.  Off: measured slower (session 4 run 3, H200:
    # b64 L2048 paged-16 135.7 vs 134.6 us, b4 L65536 paged-16 325.5 vs 273.6 us)
    page_prefetch: bool = False
    # load="tma": K/V loads hinted L2 evict-first.  Session 4 run 2 (bench_l2hint.py, b1 L32768)
    # read-only flush 37.7 vs 38.0 us, write-32MB/decode/read pipeline 65.0 vs 70.7; session 5 run 1
    # (bench_decode --candidate tma_ef, same rounds): b1 L32768 44.7 vs 47.4 us, but slower on every
    # shape of >= 256 MB (b1 L131072 517 vs 479, b4 L65536 267 vs 248, b32 L4096 139 vs 132, b8 L8192
    # 77.2 vs 76.1).  Hence the default by size (auto_load); CUTE_KERNELS_DECODE_LOAD overrides.
    kv_evict_first: bool = False


#: The TMA K/V load variant (``load="tma"``, via :func:`override_config`): it hung in session 2 (TMA
#: copies issued under ``if tidx == 0`` inside the DSL's own elect.sync); fixed, and the repro passed
#: 12/12 cases bit-identical to cp.async on the H200 (session 3 run 2).  Not the default: it measured
#: within +-0.5% of cp.async on every benchmark shape (session 3 run 3).


def _cdtype(name):
    return {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[name]


def _decode_builder(cfg: DecodeConfig):
    def build():
        from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor

        dt = _cdtype(cfg.dtype)
        D = cfg.head_dim
        s64 = cute.sym_int64
        B, Sq, Hq, Hkv = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()
        mQ = make_fake_tensor(
            dt, (B, Sq, Hq, D), (s64(divisibility=8), s64(divisibility=8), s64(divisibility=8), 1),
            assumed_align=16,
        )
        if cfg.paged:
            NP = cute.sym_int()
            kv_shape = (NP, cfg.page_size, Hkv, D)
        else:
            kv_shape = (B, cute.sym_int(), Hkv, D)
        mK = make_fake_tensor(
            dt, kv_shape, (s64(divisibility=8), s64(divisibility=8), s64(divisibility=8), 1), assumed_align=16
        )
        mV = make_fake_tensor(
            dt, kv_shape, (s64(divisibility=8), s64(divisibility=8), s64(divisibility=8), 1), assumed_align=16
        )
        mSeq = make_fake_compact_tensor(cutlass.Int32, (B,), assumed_align=4)
        mBT = None
        if cfg.paged:
            mBT = make_fake_tensor(cutlass.Int32, (B, cute.sym_int()), (s64(), 1), assumed_align=4)
        mO = make_fake_compact_tensor(dt, (B, Sq, Hq, D), stride_order=(3, 2, 1, 0), assumed_align=16)
        mLSE = make_fake_compact_tensor(cutlass.Float32, (B, Hq, Sq), stride_order=(2, 1, 0), assumed_align=4)
        mOp = mLSEp = mCnt = None
        if cfg.split and cfg.merge_mode == "fused":
            mCnt = make_fake_compact_tensor(cutlass.Int32, (cute.sym_int(),), assumed_align=4)
        if cfg.split:
            P = cute.sym_int()
            mOp = make_fake_compact_tensor(
                cutlass.Float32, (P, B, Sq, Hq, D), stride_order=(4, 3, 2, 1, 0), assumed_align=16
            )
            mLSEp = make_fake_compact_tensor(
                cutlass.Float32, (P, B, Sq, Hq), stride_order=(3, 2, 1, 0), assumed_align=4
            )
        k = DecodeAttnKernel(
            dt, D, cfg.m_tile, cfg.n_tile, cfg.stages, cfg.num_threads, cfg.paged, cfg.page_size,
            cfg.causal, cfg.split, cfg.q_in_regs, cfg.min_blocks_per_mp, cfg.merge_mode,
            cfg.load, cfg.pdl_in, cfg.page_prefetch, cfg.kv_evict_first,
        )
        return k, (
            mQ, mK, mV, mSeq, mBT, mO, mLSE, mOp, mLSEp, mCnt, Float32(1.0),
            make_fake_stream(use_tvm_ffi_env_stream=True),
        )

    return build


def get_decode_kernel(cfg: DecodeConfig):
    return jit.get_compiled("decode_attn", cfg, _decode_builder(cfg))


jit.register_warmup("decode_attn", get_decode_kernel)


def _precompile_one(cfg: DecodeConfig) -> str:
    try:
        get_decode_kernel(cfg)
        return ""
    except Exception as e:  # reported, and raised again where the config is used
        return f"{cfg}: {type(e).__name__}: {e}"


def precompile(configs, processes: Optional[int] = None) -> list[str]:
    """Compile decode configs into the disk cache in parallel processes (``cute.compile`` is not
    thread-safe); later ``get_decode_kernel`` calls load them in ~1 ms.  Returns error strings."""
    import concurrent.futures as cf
    import multiprocessing as mp

    configs = list(dict.fromkeys(configs))
    if not configs:
        return []
    if not jit.disk_cache_enabled():
        return [_precompile_one(c) for c in configs]
    n = processes or max(1, min(len(configs), (os.cpu_count() or 2) - 1, 16))
    if n == 1:
        return [e for e in map(_precompile_one, configs) if e]
    with cf.ProcessPoolExecutor(n, mp_context=mp.get_context("spawn")) as ex:
        return [e for e in ex.map(_precompile_one, configs) if e]


# ------------------------------------------------------------------------------------------------
# host side: config heuristic, split count, validation
# ------------------------------------------------------------------------------------------------
#: set by benchmarks / tuning (``with override_config(...)``); None = heuristic
_CONFIG_OVERRIDE: dict | None = None

#: K/V load path for contiguous caches (paged caches always gather with cp.async):
#: ``CUTE_KERNELS_DECODE_LOAD`` = ``auto`` (default: :data:`TMA_EF_MAX_KV_BYTES`) | ``cpasync`` |
#: ``tma`` | ``tma_ef`` (TMA with L2 evict-first K/V).
_LOAD_CHOICES = {"auto": None, "cpasync": ("cpasync", False), "tma": ("tma", False), "tma_ef": ("tma", True)}
_env_load = os.environ.get("CUTE_KERNELS_DECODE_LOAD", "auto").strip().lower() or "auto"
if _env_load not in _LOAD_CHOICES:
    raise ValueError(f"CUTE_KERNELS_DECODE_LOAD={_env_load!r}: expected one of {sorted(_LOAD_CHOICES)}")
LOAD_CHOICE = _env_load

#: ``auto``: contiguous caches of at most this many K+V bytes load through TMA with the L2
#: evict-first hint, larger ones with cp.async.  Why: a call that starts with dirty lines in L2 (the
#: previous kernel's output, or do_bench's flush) has them written back while it streams K/V unless
#: its own lines are the first victims; the hint saves a roughly fixed few microseconds, while the
#: TMA + hint stream itself runs 1-5% slower, a cost that grows with the bytes.  Measured (H200,
#: b1 hq32 hkv8, do_bench, same process; session 6 run 1 ``bench_decode --size-sweep``): 64 MiB
#: 27.7 vs 30.4 us, 128 MiB 45.3 vs 47.7, 256 MiB 79.0 vs 77.6, 512 MiB 142.6 vs 135.8; session 5
#: run 1: 128 MiB 44.7 vs 47.4, every shape of >= 256 MiB 1-8% slower.  The bound sits between.
TMA_EF_MAX_KV_BYTES = 192 << 20


def auto_load(paged: bool, kv_bytes: int) -> tuple[str, bool]:
    """Pure Python: (load, kv_evict_first) for a cache of ``kv_bytes`` (K + V, static capacity)."""
    if LOAD_CHOICE != "auto":
        return _LOAD_CHOICES[LOAD_CHOICE]
    return ("tma", True) if not paged and 0 < kv_bytes <= TMA_EF_MAX_KV_BYTES else ("cpasync", False)


class override_config:
    """Context manager forcing DecodeConfig fields for benchmarks, tuning and tests: tiles (n_tile,
    stages, num_threads, min_blocks_per_mp) and variants - ``merge_mode`` ("kernel" / "pdl" / "fused"),
    ``pdl_in``, ``load="tma"`` (contiguous caches), ``kv_evict_first`` (TMA only: L2 evict-first K/V
    loads), ``page_prefetch`` (paged: block-table entries one tile ahead).  Process-global, not
    thread-safe; plans made under it are cached under its keys."""

    def __init__(self, **kw):
        self.kw = kw

    def __enter__(self):
        global _CONFIG_OVERRIDE
        self.prev = _CONFIG_OVERRIDE
        _CONFIG_OVERRIDE = dict(self.kw)
        return self

    def __exit__(self, *exc):
        global _CONFIG_OVERRIDE
        _CONFIG_OVERRIDE = self.prev


def _m_tile_for(rows: int) -> int:
    return 16 if rows <= 16 else (32 if rows <= 32 else 64)


def make_config(
    dtype: torch.dtype,
    head_dim: int,
    rows: int,
    paged: bool,
    page_size: int,
    causal: bool,
    split: bool,
    kv_bytes: int = 0,
) -> DecodeConfig:
    """Tile choice from static facts only.  ``rows`` = (Hq/Hkv) * Sq; ``kv_bytes`` = K + V bytes of
    the cache's static capacity (picks the load path, :func:`auto_load`; 0: cp.async under ``auto``)."""
    load, evict_first = auto_load(paged, kv_bytes)
    m_tile = _m_tile_for(rows)
    num_threads = 128
    warps_n = (num_threads // 32) // (m_tile // 16)
    # ~32 KB of K+V per stage (64 tokens at D=128), at least 16 tokens per warp; fewer tokens per
    # warp at D=256 with one warp column (registers); a ~96 KB ring, so two CTAs share an SM
    n_tile = max(8192 // head_dim, 16 * warps_n)
    if warps_n == 1:
        n_tile = 32 if head_dim == 256 else 64
    stages = max(2, min(4, (96 * 1024) // (n_tile * 4 * head_dim)))
    kw = dict(
        n_tile=n_tile, stages=stages, num_threads=num_threads, min_blocks_per_mp=1,
        # programmatic dependent launch on both kernels: the decode kernel's prologue overlaps the
        # previous kernel's tail and the merge's launch overlaps the decode tail (session 3 run 3:
        # +2-3% on b1/b8, within noise on the long shapes; both wait before reading their inputs)
        merge_mode="pdl", load=load, pdl_in=True, page_prefetch=False,
        kv_evict_first=evict_first,
    )
    if _CONFIG_OVERRIDE:
        kw.update(_CONFIG_OVERRIDE)
    # the warps split the rows first; every warp needs >= 16 tokens of the tile
    warps = kw["num_threads"] // 32
    warps_m = m_tile // 16
    if warps % warps_m != 0 or (kw["n_tile"] // (warps // warps_m)) % 16 != 0:
        raise ValueError(f"decode_attn: tile config {kw} does not fit m_tile={m_tile}")
    return DecodeConfig(
        dtype=_DTYPES[dtype],
        head_dim=head_dim,
        m_tile=m_tile,
        n_tile=kw["n_tile"],
        stages=kw["stages"],
        num_threads=kw["num_threads"],
        paged=paged,
        page_size=page_size if paged else 0,
        causal=causal,
        split=split,
        q_in_regs=head_dim <= 128,
        min_blocks_per_mp=kw["min_blocks_per_mp"],
        merge_mode=kw["merge_mode"] if split else "kernel",
        load=kw["load"] if not paged else "cpasync",  # TMA: contiguous caches only
        pdl_in=bool(kw["pdl_in"]),
        page_prefetch=bool(kw["page_prefetch"]) and paged,
        kv_evict_first=bool(kw["kv_evict_first"]) and kw["load"] == "tma" and not paged,
    )


def smem_bytes(cfg: DecodeConfig) -> int:
    el = 2
    q = cfg.m_tile * cfg.head_dim * el
    kv = 2 * cfg.n_tile * cfg.head_dim * cfg.stages * el
    warps_n = (cfg.num_threads // 32) // (cfg.m_tile // 16)
    return 1024 + q + kv + 2 * 4 * warps_n * cfg.m_tile + 2048


def choose_num_splits(
    batch: int, heads_kv: int, row_blocks: int, capacity: int, n_tile: int, sm_count: int, per_sm: int
) -> int:
    """Split count from static sizes: fill the SMs with whole waves, keep chunks long.

    Model: time(s) = waves(s) * (tiles per split + fixed cost of a CTA) + (s > 1) * combine cost,
    waves(s) = ceil(batch*heads_kv*row_blocks*s / (SMs * CTAs per SM)); costs in tiles."""
    tiles = max(1, -(-capacity // n_tile))
    base = batch * heads_kv * row_blocks
    slots = sm_count * per_sm
    cta_cost, combine_cost = 3.0, 3.0
    best, best_t = 1, None
    max_s = min(256, tiles, max(1, 4 * -(-slots // base)))
    for s in range(1, max_s + 1):
        waves = -(-(base * s) // slots)
        t = waves * (-(-tiles // s) + cta_cost) + (combine_cost if s > 1 else 0.0)
        if best_t is None or t < best_t - 1e-9:
            best, best_t = s, t
    return best


def workspace_numel(num_splits: int, batch: int, seqlen_q: int, heads_q: int, head_dim: int) -> int:
    """float32 elements of a decode workspace: partial outputs and LSEs of every split, then int32
    merge counters (zero-initialized by :func:`decode_attn_workspace`, left at zero by the kernel)."""
    if num_splits <= 1:
        return 1
    rows = batch * seqlen_q * heads_q
    return num_splits * rows * (head_dim + 1) + rows


def _checked_default(checked: Optional[bool]) -> bool:
    if checked is not None:
        return bool(checked)
    return os.environ.get("CUTE_KERNELS_CHECKED", "0") not in ("0", "", "false", "off")


def _validate(q, k_cache, v_cache, cache_seqlens, block_table, out, workspace, check_ptrs=True):
    def err(cls, msg):
        raise cls(f"decode_attn: {msg}")

    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", cache_seqlens)):
        if not isinstance(t, torch.Tensor):
            err(TypeError, f"{name} must be a tensor")
    if q.dim() != 4:
        err(ValueError, f"q must be (batch, seqlen_q, heads_q, head_dim), got shape {tuple(q.shape)}")
    B, Sq, Hq, D = q.shape
    if q.dtype not in _DTYPES:
        err(TypeError, f"q must be float16 or bfloat16, got {q.dtype}")
    if not 1 <= Sq <= 16:
        err(ValueError, f"seqlen_q must be in 1..16 (decode / speculative verification), got {Sq}")
    if D not in (64, 128, 256):
        err(ValueError, f"head_dim must be 64, 128 or 256, got {D}")
    if k_cache.dim() != 4 or v_cache.dim() != 4:
        err(ValueError, f"k_cache/v_cache must be 4-d, got {tuple(k_cache.shape)} / {tuple(v_cache.shape)}")
    if k_cache.shape != v_cache.shape:
        err(ValueError, f"k_cache and v_cache shapes differ: {tuple(k_cache.shape)} vs {tuple(v_cache.shape)}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        err(TypeError, f"k_cache/v_cache dtype ({k_cache.dtype}/{v_cache.dtype}) must equal q's ({q.dtype})")
    Hkv = k_cache.shape[2]
    if k_cache.shape[3] != D:
        err(ValueError, f"cache head_dim {k_cache.shape[3]} != q head_dim {D}")
    if Hkv < 1 or Hq < 1 or Hq % Hkv != 0:
        err(ValueError, f"heads_q ({Hq}) must be a multiple of heads_kv ({Hkv})")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            err(ValueError, f"{name} must be contiguous in the head dim (stride(-1) == 1), got stride {t.stride()}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if (check_ptrs and t.data_ptr() % 16 != 0) or any(s % 8 != 0 for s in t.stride()[:-1]):
            err(ValueError, f"{name} rows must be 16-byte aligned (strides multiple of 8 elements), got {t.stride()}")
    devs = {t.device for t in (q, k_cache, v_cache, cache_seqlens)}
    if block_table is not None:
        devs.add(block_table.device)
    if len(devs) != 1:
        err(ValueError, f"all tensors must be on one device, got {sorted(map(str, devs))}")
    if cache_seqlens.dtype != torch.int32:
        err(TypeError, f"cache_seqlens must be int32, got {cache_seqlens.dtype}")
    if cache_seqlens.dim() != 1 or cache_seqlens.shape[0] != B:
        err(ValueError, f"cache_seqlens must be ({B},), got {tuple(cache_seqlens.shape)}")
    if block_table is None:
        if k_cache.shape[0] != B:
            err(ValueError, f"contiguous cache batch ({k_cache.shape[0]}) != q batch ({B})")
    else:
        if block_table.dtype != torch.int32:
            err(TypeError, f"block_table must be int32, got {block_table.dtype}")
        if block_table.dim() != 2 or block_table.shape[0] != B:
            err(ValueError, f"block_table must be ({B}, pages_per_seq), got {tuple(block_table.shape)}")
        if block_table.shape[1] < 1:
            err(ValueError, "block_table needs at least one page column")
        if block_table.stride(-1) != 1:
            err(ValueError, "block_table must be contiguous along pages")
        ps = k_cache.shape[1]
        if not 1 <= ps <= 1024:
            err(ValueError, f"page_size must be in 1..1024, got {ps}")
    if out is not None:
        if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or not out.is_contiguous():
            err(ValueError, f"out must be a contiguous {q.dtype} tensor of shape {tuple(q.shape)} on {q.device}")
        if check_ptrs and out.data_ptr() % 16 != 0:
            err(ValueError, "out must be 16-byte aligned")
    if workspace is not None:
        if workspace.dtype != torch.float32 or not workspace.is_contiguous() or workspace.device != q.device:
            err(ValueError, "workspace must be a contiguous float32 tensor on q's device")
        if check_ptrs and workspace.data_ptr() % 16 != 0:
            err(ValueError, "workspace must be 16-byte aligned")


def _capacity(k_cache, block_table) -> int:
    return k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]


def _kv_bytes(batch: int, k_cache, block_table) -> int:
    """K + V bytes of the cache's static capacity (what :func:`auto_load` decides on)."""
    _, _, Hkv, D = k_cache.shape
    return 2 * batch * _capacity(k_cache, block_table) * Hkv * D * k_cache.element_size()


def _check_device_values(k_cache, cache_seqlens, block_table):
    """Checked mode: validate lengths and page ids (synchronizes with the device)."""
    cap = _capacity(k_cache, block_table)
    lens = cache_seqlens.detach().to("cpu", torch.int64)
    if lens.numel() and int(lens.min()) < 0:
        raise ValueError(f"decode_attn: negative cache_seqlens: {lens.tolist()}")
    if lens.numel() and int(lens.max()) > cap:
        what = "Lmax" if block_table is None else "block_table width x page_size"
        raise ValueError(
            f"decode_attn: cache_seqlens (max {int(lens.max())}) exceed the cache capacity {cap} ({what})"
        )
    if block_table is not None:
        ps = k_cache.shape[1]
        bt = block_table.detach().to("cpu", torch.int64)
        for b, L in enumerate(lens.tolist()):
            used = bt[b, : -(-L // ps)]
            if used.numel() and (int(used.min()) < 0 or int(used.max()) >= k_cache.shape[0]):
                raise ValueError(
                    f"decode_attn: block_table[{b}] has page ids outside [0, {k_cache.shape[0]}) "
                    f"among its first {used.numel()} pages: {used.tolist()}"
                )


_PLANS: dict = {}


def _plan(q, k_cache, block_table, num_splits, causal):
    """(DecodeConfig, num_splits) from static facts only; memoized (host overhead per call)."""
    key = (
        tuple(q.shape), q.dtype, k_cache.shape[2], k_cache.shape[1], block_table is not None,
        _capacity(k_cache, block_table), num_splits, causal,
        tuple(sorted(_CONFIG_OVERRIDE.items())) if _CONFIG_OVERRIDE else None,
    )
    hit = _PLANS.get(key)
    if hit is None:
        hit = _PLANS[key] = _plan_uncached(q, k_cache, block_table, num_splits, causal)
    return hit


def _plan_uncached(q, k_cache, block_table, num_splits, causal):
    B, Sq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    rows = (Hq // Hkv) * Sq
    paged = block_table is not None
    page_size = k_cache.shape[1] if paged else 0
    kv_bytes = _kv_bytes(B, k_cache, block_table)
    cfg1 = make_config(q.dtype, D, rows, paged, page_size, causal, split=False, kv_bytes=kv_bytes)
    if num_splits is None:
        row_blocks = -(-rows // cfg1.m_tile)
        # one CTA per SM per wave, although two fit: the kernel is bandwidth-bound, so a second
        # resident CTA shares the SM's bandwidth instead of adding to it, and half the splits halve
        # the merge traffic.  Measured (session 3 run 3, H200): b1 hq32 hkv8 L32768 P=16 47.6 us vs
        # P=32 48.5 us; b8 L8192 P=2 77.4 vs P=4 78.0 (both with PDL); the long shapes within 0.3%.
        # Small pages are the exception: each KV tile's gather first waits on block-table reads, and
        # a second resident CTA per SM hides that latency.  Measured (session 4 runs 3-4, H200,
        # 16-token pages): b4 hq64 hkv8 L65536 P=8 261.9 us vs P=4 275.9, b1 hq32 hkv32 L131072
        # 503.4 vs 534.0, b8 L8192 78.9 vs 81.5, b1 L32768 49.6 vs 50.3; where the batch already
        # fills the SMs twice over (b64 L2048) the rule still gives P=1.  Pages larger than a KV tile
        # need a table read only every few tiles and keep the contiguous rule (not measured).
        small_pages = paged and page_size <= cfg1.n_tile
        num_splits = choose_num_splits(
            B, Hkv, row_blocks, _capacity(k_cache, block_table), cfg1.n_tile, current_arch().sm_count,
            2 if small_pages else 1,
        )
    num_splits = int(num_splits)
    if num_splits < 1:
        raise ValueError(f"decode_attn: num_splits must be >= 1, got {num_splits}")
    cfg = cfg1 if num_splits == 1 else make_config(q.dtype, D, rows, paged, page_size, causal, split=True,
                                                   kv_bytes=kv_bytes)
    return cfg, num_splits


def explain(batch: int, heads_q: int, heads_kv: int, capacity: int, *, head_dim: int = 128, sq: int = 1,
            page_size: int | None = None, dtype=torch.bfloat16, num_splits: int | None = None,
            causal: bool = True) -> dict:
    """What ``decode_attn`` would run, on any machine (no GPU, nothing compiled): the real planning
    code (:func:`_plan_uncached`) on meta tensors.  ``capacity`` = Lmax of a contiguous cache, or the
    block-table width x ``page_size`` of a paged one (rounded up to whole pages)."""
    for name, v in (("batch", batch), ("heads_q", heads_q), ("heads_kv", heads_kv), ("capacity", capacity),
                    ("head_dim", head_dim), ("sq", sq)):
        if v < 1:
            raise ValueError(f"explain: {name} must be >= 1, got {v}")
    q = torch.empty(batch, sq, heads_q, head_dim, dtype=dtype, device="meta")
    bt = None
    if page_size:
        pages = -(-capacity // page_size)
        k = torch.empty(batch * pages, page_size, heads_kv, head_dim, dtype=dtype, device="meta")
        bt = torch.empty(batch, pages, dtype=torch.int32, device="meta")
    else:
        k = torch.empty(batch, capacity, heads_kv, head_dim, dtype=dtype, device="meta")
    if heads_q % heads_kv:
        raise ValueError(f"explain: heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv})")
    cfg, splits = _plan_uncached(q, k, bt, num_splits, causal)
    kv_bytes = _kv_bytes(batch, k, bt)
    row_blocks = -(-((heads_q // heads_kv) * sq) // cfg.m_tile)
    ctas = batch * heads_kv * row_blocks * splits
    return {"config": cfg, "num_splits": splits, "load": cfg.load + ("+evict_first" if cfg.kv_evict_first else ""),
            "kv_bytes": kv_bytes, "ctas": ctas, "ctas_per_sm": round(ctas / current_arch().sm_count, 2),
            "merge": cfg.merge_mode if splits > 1 else "none"}


def _launch(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, workspace, num_splits, causal, softmax_scale):
    """Launch on CUDA tensors; out (B,Sq,Hq,D), lse (B,Hq,Sq) fp32 are written."""
    B, Sq, Hq, D = q.shape
    if B == 0:
        return
    cfg, P = _plan(q, k_cache, block_table, num_splits, causal)
    fn = get_decode_kernel(cfg)
    if q.stride(-1) != 1 or any(s % 8 != 0 for s in q.stride()[:-1]) or q.data_ptr() % 16 != 0:
        q = q.contiguous()
    scale_log2 = float(softmax_scale) * LOG2_E
    if P == 1:
        fn(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, None, None, None, scale_log2)
        return
    rows = B * Sq * Hq
    need = P * rows * (D + 1)
    if workspace is None:
        workspace = torch.empty(need, dtype=torch.float32, device=q.device)
    elif workspace.numel() < workspace_numel(P, B, Sq, Hq, D):
        raise ValueError(
            f"decode_attn: workspace has {workspace.numel()} float32 elements, needs {need} "
            f"(num_splits={P}); see decode_attn_workspace()"
        )
    o_part = workspace[: P * rows * D].view(P, B, Sq, Hq, D)
    lse_part = workspace[P * rows * D : need].view(P, B, Sq, Hq)
    cnt = None
    if cfg.merge_mode == "fused":
        if workspace.numel() >= need + rows:  # a caller's workspace: zeros from decode_attn_workspace
            cnt = workspace[need : need + rows].view(torch.int32)
        else:  # our own per-call workspace
            cnt = _counters(q.device, rows)
    fn(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, o_part, lse_part, cnt, scale_log2)


_COUNTERS: dict = {}


def _counters(device, n: int) -> torch.Tensor:
    """Zeroed int32 merge counters for the fused merge, cached per (device, stream): the kernel
    leaves them at zero and launches on one stream are ordered.  While a CUDA graph is being
    captured a fresh buffer is used (captured as a memset), so graphs never share counters."""
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(n, dtype=torch.int32, device=device)
    key = (device.index if device.index is not None else torch.cuda.current_device(), torch.cuda.current_stream(device).cuda_stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf[:n]


def decode_attn_workspace(
    q: torch.Tensor, num_splits: int
) -> torch.Tensor:
    """A workspace for ``decode_attn(..., num_splits=num_splits, workspace=ws)`` (CUDA-graph friendly).

    Zero-filled: its tail holds the fused merge's counters, which must start at 0 (the kernel leaves
    them at 0).  Reuse it only for decode_attn calls of the same or smaller sizes."""
    B, Sq, Hq, D = q.shape
    return torch.zeros(
        workspace_numel(num_splits, B, Sq, Hq, D), dtype=torch.float32, device=q.device
    )


# ------------------------------------------------------------------------------------------------
# float32 torch reference (CPU path and tests)
# ------------------------------------------------------------------------------------------------
def decode_attn_reference(
    q, k_cache, v_cache, cache_seqlens, block_table=None, causal=True, softmax_scale=None
):
    """Float32 torch reference (no tricks, one sequence at a time; reads the lengths on the host).

    Returns (out float32 (B, Sq, Hq, D), lse float32 (B, Hq, Sq), natural log); rows that see no
    key get out = 0 and lse = -inf."""
    B, Sq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    G = Hq // Hkv
    scale = D ** -0.5 if softmax_scale is None else float(softmax_scale)
    out = torch.zeros(B, Sq, Hq, D, dtype=torch.float32, device=q.device)
    lse = torch.full((B, Hq, Sq), float("-inf"), dtype=torch.float32, device=q.device)
    lens = cache_seqlens.to("cpu", torch.int64).tolist()
    for b in range(B):
        L = int(lens[b])
        if L <= 0:
            continue
        if block_table is None:
            kb, vb = k_cache[b, :L], v_cache[b, :L]
        else:
            ps = k_cache.shape[1]
            pages = block_table[b, : -(-L // ps)].long()
            kb = k_cache[pages].reshape(-1, Hkv, D)[:L]
            vb = v_cache[pages].reshape(-1, Hkv, D)[:L]
        qb = q[b].float().view(Sq, Hkv, G, D)
        s = torch.einsum("tkgd,lkd->kgtl", qb, kb.float()) * scale  # (Hkv, G, Sq, L)
        if causal:
            pos = torch.arange(L, device=q.device)
            lim = L - Sq + torch.arange(Sq, device=q.device)  # (Sq,)
            s = s.masked_fill(pos[None, None, None, :] > lim[None, None, :, None], float("-inf"))
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        p = torch.exp(s - m)
        l = p.sum(-1, keepdim=True)
        p = p / torch.where(l > 0, l, torch.ones_like(l))
        o = torch.einsum("kgtl,lkd->tkgd", p, vb.float())  # (Sq, Hkv, G, D)
        out[b] = o.reshape(Sq, Hq, D)
        lse[b] = (m + torch.log(l)).squeeze(-1).reshape(Hq, Sq)
    return out, lse


# ------------------------------------------------------------------------------------------------
# torch.library ops and the public function
# ------------------------------------------------------------------------------------------------
def _decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, workspace, num_splits, causal, softmax_scale):
    if q.device.type != "cuda":
        o, l = decode_attn_reference(q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale)
        out.copy_(o.to(out.dtype))
        lse.copy_(l)
        return
    _launch(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, workspace, num_splits, causal, softmax_scale)


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
) -> None:
    _decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, workspace, num_splits, causal, softmax_scale)


@_decode_attn_out_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, workspace, num_splits, causal, softmax_scale):
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
) -> tuple[torch.Tensor, torch.Tensor]:
    B, Sq, Hq, D = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    _decode_attn_out_op(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, None, num_splits, causal, softmax_scale)
    return out, lse


@_decode_attn_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, softmax_scale):
    B, Sq, Hq, D = q.shape
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        q.new_empty((B, Hq, Sq), dtype=torch.float32),
    )


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
):
    """Decode attention of 1..16 new tokens per sequence against a KV cache (split-k, GQA, paged).

    Args:
        q: (B, Sq, Hq, D) float16/bfloat16, 1 <= Sq <= 16, D in {64, 128, 256}, head dim contiguous.
        k_cache, v_cache: contiguous layout (B, Lmax, Hkv, D), or paged (num_pages, page_size, Hkv, D)
            with ``block_table``; rows 16-byte aligned; Hq a multiple of Hkv (GQA/MQA).
        cache_seqlens: (B,) int32, every cached token *including* the Sq new ones (0 allowed: the
            output is 0 and the LSE -inf).  They stay on the device (no host sync).
        block_table: (B, pages_per_seq) int32 page ids, or None for the contiguous layout.
        num_splits: KV splits per (batch, KV head); None picks from SM count, batch, heads and the
            static capacity (Lmax or pages_per_seq * page_size), never from the lengths; 1 disables
            splitting.  A fixed value with ``workspace`` is CUDA-graph capturable.
        causal: bottom-right causal among the new tokens (token t sees positions <= L - Sq + t).
        softmax_scale: default D ** -0.5.
        return_lse: also return the (B, Hq, Sq) float32 natural-log LSE.
        out: optional (B, Sq, Hq, D) contiguous output buffer.
        workspace: optional float32 buffer of at least ``workspace_numel(num_splits, B, Sq, Hq, D)``
            elements (:func:`decode_attn_workspace`).
        checked: validate device values (lengths within the capacity, page ids in range) on the host;
            this synchronizes.  Default: env ``CUTE_KERNELS_CHECKED``.  Unchecked, bad values give
            wrong results but never out-of-bounds memory accesses (lengths and page ids are clamped).

    Returns ``out`` or ``(out, lse)``.  Deterministic: the same inputs give the same bits.
    """
    # under torch.compile: no data_ptr / host-sync checks here (the op re-plans in eager code)
    compiling = torch.compiler.is_compiling()
    _validate(q, k_cache, v_cache, cache_seqlens, block_table, out, workspace, check_ptrs=not compiling)
    B, Sq, Hq, D = q.shape
    scale = D ** -0.5 if softmax_scale is None else float(softmax_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"decode_attn: softmax_scale must be a positive finite number, got {softmax_scale}")
    if num_splits is not None:
        num_splits = int(num_splits)
        if num_splits < 1:
            raise ValueError(f"decode_attn: num_splits must be >= 1, got {num_splits}")
    if not compiling and _checked_default(checked):
        _check_device_values(k_cache, cache_seqlens, block_table)
    if not compiling and workspace is not None:
        if q.device.type == "cuda":
            P = _plan(q, k_cache, block_table, num_splits, causal)[1]
        else:
            P = num_splits or 1
        need = workspace_numel(P, B, Sq, Hq, D)
        if workspace.numel() < need:
            raise ValueError(
                f"decode_attn: workspace has {workspace.numel()} float32 elements, needs {need} "
                f"(num_splits={P}); see decode_attn_workspace()"
            )
    if compiling and out is None and workspace is None:
        o, lse = _decode_attn_op(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, scale)
        return (o, lse) if return_lse else o
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    # eager calls skip the dispatcher; under torch.compile the custom op is traced
    run = _decode_attn_out_op if compiling else _decode_impl
    run(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, workspace, num_splits, causal, scale)
    return (out, lse) if return_lse else out
