"""Tile descriptions of the attention kernels, and the functions that turn them into CuTe layouts.

:class:`DecodeTile` is the split-KV decode kernel's tile: ``m_tile`` query rows (query heads of one KV
head x new tokens) against ``n_tile`` KV tokens per pipeline stage, ``stages`` of them in a shared-
memory ring; the CTA's warps split the rows (16 per warp, the ``mma.sync`` m16n8k16 M) and then the
stage's tokens.  :func:`decode_tile` is the heuristic that picks it from static facts; the ``make_*``
functions run inside a DSL context.
"""

from __future__ import annotations

from dataclasses import dataclass

from .target import set_dsl_arch_env

set_dsl_arch_env()

import cutlass.cute as cute  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402

from .tiles import dtype as _dtype  # noqa: E402

MMA_M = 16  # rows of one warp's mma.sync m16n8k16
DECODE_THREADS = 128
#: K + V ring budget of one CTA: two CTAs share an SM's 228 KB.
DECODE_RING_BYTES = 96 * 1024
#: shared memory beyond Q, the ring and the per-warp row states: barriers and alignment slack.
DECODE_SMEM_SLACK = 1024 + 2048


@dataclass(frozen=True)
class DecodeTile:
    """The decode CTA's tile (hashable: part of the compile-cache key)."""

    dtype: str  # "float16" | "bfloat16"
    head_dim: int  # 64 | 128 | 256
    m_tile: int  # 16 | 32 | 64 query rows per CTA
    n_tile: int  # KV tokens per ring stage
    stages: int
    num_threads: int = DECODE_THREADS

    def __post_init__(self):
        if self.head_dim % 64:
            raise ValueError(f"DecodeTile: head_dim {self.head_dim} must be a multiple of 64")
        if self.m_tile % MMA_M or self.warps % self.warps_m:
            raise ValueError(f"DecodeTile: {self.warps} warps do not split m_tile={self.m_tile} in rows of {MMA_M}")
        if self.n_tile % self.warps_n or self.n_warp % 16:
            raise ValueError(f"DecodeTile: every warp needs a multiple of 16 of the n_tile={self.n_tile} tokens "
                             f"({self.warps_n} warps per row block)")
        if self.warp_merge_bytes > self.ring_bytes:
            raise ValueError("DecodeTile: the fp32 warp-merge buffer must fit in the K/V ring it reuses")

    @property
    def warps(self) -> int:
        return self.num_threads // 32

    @property
    def warps_m(self) -> int:
        """Warps along the rows (16 rows each)."""
        return self.m_tile // MMA_M

    @property
    def warps_n(self) -> int:
        """Warps along a stage's tokens; their softmax states are merged at the end."""
        return self.warps // self.warps_m

    @property
    def n_warp(self) -> int:
        """KV tokens per warp per stage."""
        return self.n_tile // self.warps_n

    @property
    def q_in_regs(self) -> bool:
        """Q's MMA fragments stay in registers across the KV loop (D <= 128; at D = 256 they would
        cost 64 registers per thread, so they are reloaded from shared memory every tile)."""
        return self.head_dim <= 128

    @property
    def acc_stride(self) -> int:
        """fp32 row stride of the warp-merge buffer: 8 words of padding keep the rows' banks apart."""
        return self.head_dim + 8

    @property
    def elem_bytes(self) -> int:
        return _dtype(self.dtype).width // 8

    @property
    def ring_bytes(self) -> int:
        """K and V stages."""
        return 2 * self.n_tile * self.head_dim * self.stages * self.elem_bytes

    @property
    def kv_stage_bytes(self) -> int:
        """Bytes one stage's K and V tiles bring (the TMA transaction count of a ring slot)."""
        return 2 * self.n_tile * self.head_dim * self.elem_bytes

    @property
    def warp_merge_bytes(self) -> int:
        """The fp32 (m_tile x head_dim) output of every token warp, merged after the KV loop."""
        return self.warps_n * self.m_tile * self.acc_stride * 4

    def smem_bytes(self) -> int:
        """Q, the K/V ring, the per-warp row max / sum, plus barriers and alignment slack."""
        q = self.m_tile * self.head_dim * self.elem_bytes
        return q + self.ring_bytes + 2 * 4 * self.warps_n * self.m_tile + DECODE_SMEM_SLACK


def decode_m_tile(rows: int) -> int:
    """Rows per CTA for ``rows`` = (Hq / Hkv) x Sq query rows per KV head."""
    return 16 if rows <= 16 else (32 if rows <= 32 else 64)


def decode_tile(dtype: str, head_dim: int, rows: int) -> DecodeTile:
    """The decode tile for ``rows`` query rows per KV head.

    ~32 KB of K + V per stage (64 tokens at D = 128), at least 16 tokens per warp; with one warp
    column (64 rows) 64 tokens (32 at D = 256, for registers); as many stages as fit in
    :data:`DECODE_RING_BYTES` (2..4), so two CTAs share an SM.
    """
    m_tile = decode_m_tile(rows)
    warps_n = (DECODE_THREADS // 32) // (m_tile // MMA_M)
    n_tile = max(8192 // head_dim, 16 * warps_n)
    if warps_n == 1:
        n_tile = 32 if head_dim == 256 else 64
    stages = max(2, min(4, DECODE_RING_BYTES // (n_tile * 4 * head_dim)))
    return DecodeTile(dtype=dtype, head_dim=head_dim, m_tile=m_tile, n_tile=n_tile, stages=stages)


# ---- builders (call inside a DSL context) -------------------------------------------------------


def make_decode_smem_layouts(t: DecodeTile):
    """(sQ, sKV) layouts of the cp.async / ldmatrix view: 8 x 64 atoms swizzled S<3,3,3> (16-byte
    chunks XOR-ed by row, bank-conflict-free for ldmatrix); sKV is (n_tile, head_dim, stages)."""
    atom = cute.make_composed_layout(cute.make_swizzle(3, 3, 3), 0, cute.make_layout((8, 64), stride=(64, 1)))
    sQ = cute.tile_to_shape(atom, (t.m_tile, t.head_dim), (0, 1))
    sKV = cute.tile_to_shape(atom, (t.n_tile, t.head_dim, t.stages), (0, 1, 2))
    return sQ, sKV


def make_decode_kv_tma_layout(t: DecodeTile):
    """The same K/V ring as the TMA unit addresses it: 128-byte-swizzle K-major atoms (S<3,4,3> on the
    byte address == S<3,3,3> on 16-bit elements, slots 1024-byte aligned), (n_tile, head_dim, stages)."""
    atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, _dtype(t.dtype))
    return cute.tile_to_shape(atom, (t.n_tile, t.head_dim, t.stages), (0, 1, 2))
