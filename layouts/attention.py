"""Tile descriptions of the attention kernels, and the functions that turn them into CuTe layouts
(the ``make_*`` functions run inside a DSL context; the backward's tile is :mod:`layouts.attention_backward`).

:class:`DecodeTile` is the split-KV decode kernel's tile: ``m_tile`` query rows (query heads of one KV
head x new tokens) against ``n_tile`` KV tokens per pipeline stage, ``stages`` of them in a shared-
memory ring; the CTA's warps split the rows (16 per warp, the ``mma.sync`` m16n8k16 M) and then the
stage's tokens; :func:`decode_tile` picks it from static facts.  :class:`FwdTile` is the FlashAttention
forward's (:func:`fwd_tile`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .target import set_dsl_arch_env

set_dsl_arch_env()

# the DSL, imported at the first read of one of its names (a compile), not with this module
from .lazy import LazyModule  # noqa: E402
cute = LazyModule("cutlass.cute")
warpgroup = LazyModule("cutlass.cute.nvgpu.warpgroup")

from .tiles import DTYPE_BYTES, dtype as _dtype  # noqa: E402

cutlass = LazyModule("cutlass")
sm90_helpers = LazyModule("cutlass.utils.hopper_helpers")
OperandMajorMode = LazyModule("cutlass.cute.nvgpu", "OperandMajorMode")
LayoutEnum = LazyModule("cutlass.tensor_utils", "LayoutEnum")

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
        return DTYPE_BYTES[self.dtype]

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


# ================================================================================================
# The dense forward (FlashAttention-2 structure on Hopper wgmma)
# ================================================================================================
#: dynamic shared memory one CTA may take on H100 / H200 (227 KB)
FWD_SMEM_CAPACITY = 227 * 1024
#: barriers (Q + 2 x stages x {full, empty}) and the 1024-byte alignment of the first buffer
FWD_SMEM_SLACK = 1024
FWD_WGMMA_M = 64  # rows of one warpgroup's wgmma
#: head dims the forward supports (multiples of 16 for the QK wgmma's K, of 8 for the PV wgmma's N)
FWD_HEAD_DIMS = (64, 96, 128, 256)
#: registers per thread after ``setmaxnreg``, (producer, consumer), by consumer warpgroup count:
#: the 64K-register file split over one producer warpgroup and 1..3 consumer warpgroups
FWD_REGS = {1: (56, 256), 2: (24, 240), 3: (32, 160)}
#: registers a consumer thread needs beside the tile's S, P and O (softmax state, masking, addressing)
FWD_REG_OVERHEAD = 32


@dataclass(frozen=True)
class FwdTile:
    """The attention forward CTA's tile and schedule (hashable: part of the compile-cache key).

    ``tile_m`` query rows per CTA, split into 64-row slices, one per consumer warpgroup (each computes
    whole rows of S = Q K^T, so softmax statistics never cross warpgroups); ``tile_n`` keys per K / V
    tile; ``stages`` slots in each of the two TMA rings (K tiles, V tiles), filled by a producer warp
    and read by every consumer warpgroup.  Q (``tile_m`` x ``head_dim``) is loaded once, and its
    buffer is reused by the epilogue for O (same layout, so a warpgroup only overwrites its own rows).

    Overlap of the softmax with the tensor cores:

    * always: a warpgroup issues S(n) = Q K(n)^T and O += P(n+1) V(n+1) back to back, then runs the
      softmax of S(n) while the PV wgmma runs (P of one tile lives across the next QK);
    * ``pingpong``: the consumer warpgroups take turns issuing their wgmmas (named barriers), so one
      warpgroup's softmax runs under the other's GEMMs;
    * ``rescale_before_pv``: O is rescaled by the previous tile's correction before its PV wgmma is
      issued (under the QK wgmma) rather than after the PV wgmma retires -- shortens the softmax
      critical path when O is large (head dim >= 128);
    * ``persistent``: one CTA per SM walks the tile order (grid-stride); O gets its own buffer, so
      the next tile's Q and K / V load under this tile's last KV tiles and its epilogue;
    * ``dynamic`` (with ``persistent``): instead of a fixed stride, each CTA's producer takes its next
      tile from a global counter (one atomic per tile), so the CTAs walk the tile order together as
      the hardware's CTA scheduler would (load balance and L2 locality of the longest-first order)
      and still overlap one tile's epilogue with the next tile's loads; ``prefetch_tile``: the producer
      claims its next tile before loading the current one (the atomic's round trip then runs under the
      loads, not between this tile's last load and the next tile's Q);
    * ``exp2_poly_share``: of every 8 scores of an unmasked tile, this many are exponentiated by a
      cubic on the FMA pipes instead of the MUFU unit (small head dims are bound by MUFU.EX2: a
      128 x 128 tile at D = 64 needs as many MUFU cycles as tensor-core cycles).

    ``p_smem``: P goes through a shared-memory buffer (stmatrix; the PV wgmma's A operand) instead of
    registers, so a thread holds only S and O: three warpgroups (192 rows, 160 registers) fit D = 96.
    """

    dtype: str  # "float16" | "bfloat16"
    head_dim: int  # one of FWD_HEAD_DIMS
    tile_m: int = 128
    tile_n: int = 128
    stages: int = 2
    pingpong: bool = True
    rescale_before_pv: bool = False
    exp2_poly_share: int = 0
    persistent: bool = False
    dynamic: bool = False
    p_smem: bool = False
    prefetch_tile: bool = False

    def __post_init__(self):
        if self.head_dim not in FWD_HEAD_DIMS:
            raise ValueError(f"FwdTile: head_dim {self.head_dim} must be one of {FWD_HEAD_DIMS}")
        if self.tile_m % FWD_WGMMA_M or not 1 <= self.tile_m // FWD_WGMMA_M <= 3:
            raise ValueError(f"FwdTile: tile_m {self.tile_m} must be 64, 128 or 192 (one 64-row slice per consumer warpgroup)")
        if self.tile_n % 16 or not 16 <= self.tile_n <= 256:
            raise ValueError(f"FwdTile: tile_n {self.tile_n} must be a multiple of 16 in 16..256 (wgmma N and P's K)")
        if self.stages < 2:
            raise ValueError("FwdTile: at least 2 stages per ring")
        if not 0 <= self.exp2_poly_share <= 8:
            raise ValueError(f"FwdTile: exp2_poly_share {self.exp2_poly_share} must be in 0..8 (of every 8 scores)")
        if self.pingpong and self.consumer_warpgroups < 2:
            raise ValueError("FwdTile: pingpong needs at least 2 consumer warpgroups")
        if self.dynamic and not self.persistent:
            raise ValueError("FwdTile: dynamic tile scheduling needs persistent CTAs")
        if self.prefetch_tile and not self.dynamic:
            raise ValueError("FwdTile: prefetch_tile claims the dynamic schedule's next tile early: needs dynamic")
        if self.smem_bytes() > FWD_SMEM_CAPACITY:
            raise ValueError(f"FwdTile: {self.smem_bytes()} B of shared memory > {FWD_SMEM_CAPACITY} B; fewer stages")
        limit = self.consumer_regs - FWD_REG_OVERHEAD
        if self.tile_regs_per_thread > limit:
            raise ValueError(f"FwdTile: S, P and O need {self.tile_regs_per_thread} registers per consumer thread "
                             f"(max {limit} with {self.consumer_warpgroups} consumer warpgroups); use a smaller tile")

    @property
    def consumer_warpgroups(self) -> int:
        return self.tile_m // FWD_WGMMA_M

    @property
    def threads(self) -> int:
        """The CTA: one producer warpgroup and the consumer warpgroups."""
        return 128 * (1 + self.consumer_warpgroups)

    @property
    def producer_regs(self) -> int:
        return FWD_REGS[self.consumer_warpgroups][0]

    @property
    def consumer_regs(self) -> int:
        return FWD_REGS[self.consumer_warpgroups][1]

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def q_bytes(self) -> int:
        """The Q tile (TMA transaction count of the Q barrier); O reuses the buffer."""
        return self.tile_m * self.head_dim * self.elem_bytes

    @property
    def kv_tile_bytes(self) -> int:
        """One K or V tile: the TMA transaction count of one slot of either ring."""
        return self.tile_n * self.head_dim * self.elem_bytes

    @property
    def tile_regs_per_thread(self) -> int:
        """Registers a consumer thread holds for S (fp32), P (16-bit pairs, unless ``p_smem``) and O (fp32)."""
        s = FWD_WGMMA_M * self.tile_n // 128  # a warpgroup's 64 x tile_n scores over its 128 threads
        return s + (0 if self.p_smem else s // 2) + FWD_WGMMA_M * self.head_dim // 128

    @property
    def p_bytes(self) -> int:  # the P buffer (p_smem)
        return self.tile_m * self.tile_n * self.elem_bytes if self.p_smem else 0

    def smem_bytes(self) -> int:
        """Q (= O unless persistent), the K and V rings, P (``p_smem``), barriers and alignment slack."""
        o = self.q_bytes if self.persistent else 0
        return self.q_bytes + o + 2 * self.stages * self.kv_tile_bytes + self.p_bytes + FWD_SMEM_SLACK


def fwd_tile(dtype: str, head_dim: int, causal: bool) -> FwdTile:
    """The forward tile per head dim, chosen from same-run A/B measurements against the variants
    (``profiles/ab_attention.py``, ``profiles/NOTES-attention.md``); intra-warpgroup overlap always:

    * D = 64: 192 query rows (three consumer warpgroups, 160 registers each) x 128 keys, 4 stages --
      the softmax is a large share of a tile at small D, and a third warpgroup hides its latency;
    * D = 96: 128 x 128, 2 stages;
    * D = 128: 128 x 128, 2 stages, O rescaled before its PV wgmma;
    * D = 256: 128 x 64 (O alone is 128 registers per thread), 2 stages, O rescaled before PV, no
      ping-pong (the warpgroups' own overlap is enough there and the ordering costs);
    * persistent (one CTA per SM) where O's own buffer fits beside Q and the rings (D <= 128); with
      causal the tiles are handed out dynamically (a static, even snaking, walk of the longest-first
      order lost to the hardware's own CTA scheduling on long shapes: s16384 556 vs ~620 TFLOP/s).

    Causal changes only the schedule (the diagonal tiles are masked at tile granularity)."""
    tile_m, tile_n, stages = {64: (192, 128, 4), 96: (128, 128, 2), 128: (128, 128, 2), 256: (128, 64, 2)}[head_dim]
    return FwdTile(dtype=dtype, head_dim=head_dim, tile_m=tile_m, tile_n=tile_n, stages=stages,
                   pingpong=head_dim != 256, rescale_before_pv=head_dim >= 128,
                   persistent=head_dim <= 128, dynamic=head_dim <= 128 and causal)


# ---- builders (call inside a DSL context) -------------------------------------------------------


def _fwd_atom(t: FwdTile):
    """The K-major swizzle atom for rows of ``head_dim`` 16-bit elements (128-byte swizzle for D = 64/128)."""
    kind = sm90_helpers.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, _dtype(t.dtype), t.head_dim)
    return warpgroup.make_smem_layout_atom(kind, _dtype(t.dtype))


def make_fwd_smem_layout_q(t: FwdTile):
    """(tile_m, head_dim) Q tile, K-major swizzled (the wgmma A operand of S = Q K^T).  The epilogue
    stages O in the same buffer with the same layout."""
    return cute.tile_to_shape(_fwd_atom(t), (t.tile_m, t.head_dim), (0, 1))


def make_fwd_smem_layout_kv(t: FwdTile):
    """(tile_n, head_dim, stages) ring of K or V tiles, rows of head_dim contiguous elements (as in
    global memory).  K is S = Q K^T's K-major B operand as is; V is O += P V's B operand through the
    transposed view (head_dim, tile_n): head_dim contiguous = MN-major."""
    return cute.tile_to_shape(_fwd_atom(t), (t.tile_n, t.head_dim, t.stages), (0, 1, 2))


def make_fwd_smem_layout_p(t: FwdTile):
    """(tile_m, tile_n) P tile (``FwdTile.p_smem``), keys contiguous: the C layout of S that stmatrix
    writes and the K-major A operand of O += P V (warpgroup w reads its rows 64 w ..)."""
    kind = sm90_helpers.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, _dtype(t.dtype), t.tile_n)
    return cute.tile_to_shape(warpgroup.make_smem_layout_atom(kind, _dtype(t.dtype)), (t.tile_m, t.tile_n), (0, 1))


def make_fwd_tiled_mma_qk(t: FwdTile):
    """S = Q K^T: one 64 x tile_n wgmma per consumer warpgroup, A (Q) and B (K) from shared memory."""
    dt = _dtype(t.dtype)
    return sm90_helpers.make_trivial_tiled_mma(
        dt, dt, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32,
        (t.consumer_warpgroups, 1, 1), tiler_mn=(FWD_WGMMA_M, t.tile_n),
    )


def make_fwd_tiled_mma_pv(t: FwdTile):
    """O += P V: one 64 x head_dim wgmma per consumer warpgroup, A (P, 16-bit) from registers (from
    shared memory, K-major, with ``p_smem``), B (V) from shared memory, MN-major."""
    dt = _dtype(t.dtype)
    a_source = warpgroup.OperandSource.SMEM if t.p_smem else warpgroup.OperandSource.RMEM
    return sm90_helpers.make_trivial_tiled_mma(
        dt, dt, OperandMajorMode.K, OperandMajorMode.MN, cutlass.Float32,
        (t.consumer_warpgroups, 1, 1), tiler_mn=(FWD_WGMMA_M, t.head_dim), a_source=a_source,
    )
