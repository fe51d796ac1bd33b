"""The dense attention backward's tile (FlashAttention-2/3 structure on Hopper wgmma) and the functions
that turn it into CuTe layouts (the ``make_*`` functions run inside a DSL context).  The forward's tile,
whose shared-memory budget and wgmma M it shares, is in :mod:`layouts.attention`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .target import set_dsl_arch_env

set_dsl_arch_env()

# the DSL, imported at the first read of one of its names (a compile), not with this module
from .lazy import LazyModule  # noqa: E402
cutlass = LazyModule("cutlass")
cute = LazyModule("cutlass.cute")
sm90_helpers = LazyModule("cutlass.utils.hopper_helpers")
OperandMajorMode = LazyModule("cutlass.cute.nvgpu", "OperandMajorMode")
warpgroup = LazyModule("cutlass.cute.nvgpu.warpgroup")
LayoutEnum = LazyModule("cutlass.tensor_utils", "LayoutEnum")

from .attention import FWD_SMEM_CAPACITY, FWD_SMEM_SLACK, FWD_WGMMA_M  # noqa: E402
from .tiles import DTYPE_BYTES, dtype as _dtype  # noqa: E402

#: head dims the backward supports (D = 256 through ``BwdTile.kv_split_d``: dK + dV of 64 keys over all
#: 256 columns would take 256 registers per thread of one warpgroup)
BWD_HEAD_DIMS = (64, 96, 128, 256)
#: registers per thread after ``setmaxnreg``: (producer, consumer) with two consumer warpgroups
BWD_REGS = (24, 240)
#: keys per consumer warpgroup (the wgmma M of S^T = K Q^T)
BWD_WG_KEYS = 64
#: the query rows the pre-pass buffers (LSE, Delta, the fp32 dQ accumulator) are padded to: a multiple
#: of every backward ``tile_m``
BWD_ROW_PAD = 128


@dataclass(frozen=True)
class BwdTile:
    """The attention backward CTA's tile (hashable: part of the compile-cache key).

    One CTA per (KV tile of ``tile_n`` keys, query head, batch): one producer warpgroup (warp 0 loads
    K and V once, then Q, dO, LSE and Delta of every query tile into a ``stages``-deep TMA ring) and
    ``tile_n / 64`` consumer warpgroups, warpgroup w owning keys 64w .. 64w + 63 of the tile and their
    dK, dV accumulators.  Per query tile of ``tile_m`` rows, every consumer warpgroup computes the
    transposed scores S^T = K Q^T and dP^T = V dO^T (64 x tile_m: rows are keys, so P^T and dS^T are
    the register A operands of dV += P^T dO and dK += dS^T Q), writes dS^T to shared memory, and
    computes its part of dQ = dS K, added into the fp32 dQ accumulator in global memory:

    * ``dq_split_m`` (tile_m = 128): warpgroup w computes dQ rows 64w .. 64w + 63 (all head dims);
    * otherwise (tile_m = 64): warpgroup w computes the columns w * D/2 .. of all 64 rows.

    ``kv_split_d`` (D = 256, whose dK + dV per key would not fit one warpgroup's registers): 64 keys and
    two consumer warpgroups that split everything by columns -- S^T and dP^T by queries (tile_m / 2
    each), dK, dV and dQ by head dims (D / 2 each); P^T and dS^T both go through shared memory (the A
    operands of dV += P^T dO, dK += dS^T Q from there) and the ring has one stage (shared memory): the
    ring's hand-back orders the reuse of the P^T / dS^T buffers.
    """

    dtype: str  # "float16" | "bfloat16"
    head_dim: int  # one of BWD_HEAD_DIMS
    tile_m: int = 64
    tile_n: int = 128
    stages: int = 2
    dq_split_m: bool = False
    kv_split_d: bool = False
    #: dK += dS^T Q reads dS^T from the stage's shared-memory buffer (not registers) and runs on into the
    #: next query tile, whose S^T wait then hands this tile's stage back (the tensor pipe does not drain
    #: per tile); not with ``kv_split_d`` (its dK reads shared memory already, with one stage)
    dk_carry: bool = False
    #: the deterministic mode's dQ warps: 1, or 2 taking the query tiles by parity (each tile's ordered adds
    #: complete while the other warp hands on the next tile: the wait is off the per-tile cycle); the
    #: default mode has one
    dq_warps: int = 1
    #: the deterministic mode's dQ accumulators: 1, or 2 -- KV tile n adds into accumulator n % 2, in turn
    #: among its own group only (its predecessor arrived twice as many steps earlier), and the post-pass
    #: sums the two in a fixed order; the default mode has one
    dq_groups: int = 1
    #: dV += P^T dO issued as soon as P^T is in registers, before the wait for dP^T, so the tensor pipe has
    #: it to run while dS^T is computed (otherwise after dS^T is stored, as FlashAttention's order: then
    #: both warpgroups compute dS^T, met on the same barrier, with nothing in flight); not with
    #: ``kv_split_d`` (whose P^T goes through shared memory to both warpgroups); windows and D 64's 128-row
    #: tile spill with it
    dv_early: bool = False
    #: Q + LSE and dO + Delta in rings of their own (keys split; ``kv_split_d`` always has them), so the
    #: consumers wait for Q alone before S^T and for dO before dP^T, and hand dO back after dV, Q after
    #: dK (FlashAttention-4's SM90 order); not with ``dk_carry`` (whose stage goes back a tile later)
    qdo_rings: bool = False

    def __post_init__(self):
        if self.head_dim not in BWD_HEAD_DIMS:
            raise ValueError(f"BwdTile: head_dim {self.head_dim} must be one of {BWD_HEAD_DIMS}")
        if self.head_dim > 128 and not self.kv_split_d:
            raise ValueError(f"BwdTile: head_dim {self.head_dim} needs kv_split_d (dK + dV of 64 keys would take "
                             f"{self.head_dim} registers per thread)")
        if self.kv_split_d and (self.tile_n != BWD_WG_KEYS or self.tile_m != FWD_WGMMA_M or self.dq_split_m
                                or self.stages != 1):
            raise ValueError("BwdTile: kv_split_d takes tile_n = tile_m = 64, dQ split by columns and 1 stage")
        if self.tile_n % BWD_WG_KEYS or not 1 <= self.tile_n // BWD_WG_KEYS <= 2:
            raise ValueError(f"BwdTile: tile_n {self.tile_n} must be 64 or 128 (64 keys per consumer warpgroup)")
        if self.tile_m not in (64, 128) or BWD_ROW_PAD % self.tile_m:
            raise ValueError(f"BwdTile: tile_m {self.tile_m} must be 64 or 128")
        if self.dq_split_m and self.tile_m != FWD_WGMMA_M * self.consumer_warpgroups:
            raise ValueError("BwdTile: dq_split_m needs 64 query rows per consumer warpgroup")
        if not self.dq_split_m and self.tile_m != FWD_WGMMA_M:
            raise ValueError("BwdTile: a dQ split by columns needs tile_m = 64")
        if self.dq_cols_per_wg % 8:
            raise ValueError(f"BwdTile: {self.dq_cols_per_wg} dQ columns per warpgroup is not a wgmma N")
        if self.dq_warps not in (1, 2):
            raise ValueError(f"BwdTile: dq_warps {self.dq_warps} must be 1 or 2")
        if self.dq_groups not in (1, 2):
            raise ValueError(f"BwdTile: dq_groups {self.dq_groups} must be 1 or 2")
        if self.dk_carry and self.kv_split_d:
            raise ValueError("BwdTile: dk_carry is for tiles without kv_split_d")
        if self.dv_early and self.kv_split_d:
            raise ValueError("BwdTile: dv_early is for tiles without kv_split_d")
        if self.qdo_rings and (self.kv_split_d or self.dk_carry):
            raise ValueError("BwdTile: qdo_rings is for tiles without kv_split_d (which has the two rings) "
                             "or dk_carry")
        if self.stages < 2 and not self.kv_split_d:
            raise ValueError("BwdTile: at least 2 stages (a dS^T buffer per stage; the kernel writes one while "
                             "the other warpgroup may read the previous one)")
        if self.smem_bytes() > FWD_SMEM_CAPACITY:
            raise ValueError(f"BwdTile: {self.smem_bytes()} B of shared memory > {FWD_SMEM_CAPACITY} B")

    @property
    def two_rings(self) -> bool:
        """Whether Q + LSE and dO + Delta come through rings of their own (:attr:`qdo_rings`, ``kv_split_d``)."""
        return self.kv_split_d or self.qdo_rings

    @property
    def consumer_warpgroups(self) -> int:
        return 2 if self.kv_split_d else self.tile_n // BWD_WG_KEYS

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumer_warpgroups)

    @property
    def producer_regs(self) -> int:
        return BWD_REGS[0]

    @property
    def consumer_regs(self) -> int:
        return BWD_REGS[1]

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def dq_cols_per_wg(self) -> int:
        """dQ columns one consumer warpgroup computes (the N of its dQ wgmma)."""
        return self.head_dim if self.dq_split_m else self.head_dim // self.consumer_warpgroups

    @property
    def q_tile_bytes(self) -> int:
        """One Q or dO tile."""
        return self.tile_m * self.head_dim * self.elem_bytes

    @property
    def kv_tile_bytes(self) -> int:
        """The K or the V tile (loaded once per CTA)."""
        return self.tile_n * self.head_dim * self.elem_bytes

    @property
    def stage_bytes(self) -> int:
        """One ring stage: Q, dO, and the fp32 LSE and Delta of its rows (the TMA transaction count)."""
        return 2 * self.q_tile_bytes + 2 * 4 * self.tile_m

    @property
    def ds_bytes(self) -> int:
        """One dS^T (or P^T) buffer."""
        return self.tile_n * self.tile_m * self.elem_bytes

    @property
    def ds_buffers(self) -> int:
        """16-bit (keys, queries) buffers: a dS^T per ring stage, or (``kv_split_d``) dS^T and P^T."""
        return 2 if self.kv_split_d else self.stages

    @property
    def dq_rows_per_wg(self) -> int:
        """dQ rows one consumer warpgroup computes (the M of its dQ wgmma)."""
        return FWD_WGMMA_M

    @property
    def dq_wg_bytes(self) -> int:
        """One warpgroup's fp32 dQ tile, staged in shared memory for the TMA reduce-add."""
        return self.dq_rows_per_wg * self.dq_cols_per_wg * 4

    def smem_bytes(self) -> int:
        """K, V, the Q / dO / LSE / Delta ring, the dS^T (and P^T) buffers (:attr:`ds_buffers`), the
        warpgroups' fp32 dQ tiles, barriers and alignment slack."""
        return (2 * self.kv_tile_bytes + self.stages * self.stage_bytes + self.ds_buffers * self.ds_bytes
                + self.consumer_warpgroups * self.dq_wg_bytes + 3 * FWD_SMEM_SLACK)


def bwd_tile(dtype: str, head_dim: int, window: bool = False, softcap: bool = False) -> BwdTile:
    """The backward tile per head dim: 128 keys per CTA (two consumer warpgroups), two stages.  D = 64:
    128 query rows per step, dQ split by rows (FlashAttention-3/4's choice: S^T + dP^T + dK + dV take
    192 registers per thread; 1.08-1.10x the 64-row tile's main kernel on the H200), except with a
    sliding window (its third, far-edge loop spills 27 values there) or softcapping (``softcap``: the
    capped scores' tanh and ``1 - tanh^2`` spill 45 values there).  D = 96 / 128: 64 query rows,
    dQ split by columns (128 rows do not fit: D 128's dK + dV alone take 128 registers, D 96's ring
    267 KB of shared memory).  D = 256: :attr:`BwdTile.kv_split_d` (64 x 64, one stage)."""
    if head_dim == 256:
        return BwdTile(dtype=dtype, head_dim=head_dim, tile_m=64, tile_n=64, stages=1, kv_split_d=True)
    if head_dim == 64 and not window and not softcap:
        return BwdTile(dtype=dtype, head_dim=head_dim, tile_m=128, tile_n=128, stages=2, dq_split_m=True)
    return BwdTile(dtype=dtype, head_dim=head_dim, tile_m=64, tile_n=128, stages=2, dq_split_m=False)


# ---- builders (call inside a DSL context) -------------------------------------------------------


def _bwd_atom(t: BwdTile, major_size: int):
    """The swizzle atom of a buffer of 16-bit rows whose contiguous mode is read in slices of
    ``major_size`` elements (a K-major operand's K, an MN-major one's per-warpgroup N or M): the widest
    swizzle that divides it."""
    kind = sm90_helpers.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, _dtype(t.dtype), major_size)
    return warpgroup.make_smem_layout_atom(kind, _dtype(t.dtype))


def make_bwd_smem_layout_q(t: BwdTile):
    """(tile_m, head_dim, stages) ring of Q (or dO) tiles, head_dim contiguous: the K-major B operand of
    S^T = K Q^T (dP^T = V dO^T) and, through the transposed view, the MN-major B operand of
    dK += dS^T Q (dV += P^T dO) with N = head_dim."""
    return cute.tile_to_shape(_bwd_atom(t, t.head_dim), (t.tile_m, t.head_dim, t.stages), (0, 1, 2))


def make_bwd_smem_layout_k(t: BwdTile):
    """(tile_n, head_dim) K tile: the K-major A operand of S^T = K Q^T and, transposed, the MN-major B
    operand of dQ = dS K (each warpgroup reads ``dq_cols_per_wg`` columns: the atom divides them)."""
    major = math.gcd(t.head_dim, t.dq_cols_per_wg)
    return cute.tile_to_shape(_bwd_atom(t, major), (t.tile_n, t.head_dim), (0, 1))


def make_bwd_smem_layout_v(t: BwdTile):
    """(tile_n, head_dim) V tile: the K-major A operand of dP^T = V dO^T."""
    return cute.tile_to_shape(_bwd_atom(t, t.head_dim), (t.tile_n, t.head_dim), (0, 1))


def make_bwd_smem_layout_ds(t: BwdTile):
    """(tile_n, tile_m, ds_buffers) dS^T, one per ring stage, query rows contiguous (the C layout of S^T,
    written by stmatrix); the transposed view (tile_m, tile_n) is dQ = dS K's MN-major A operand (64
    rows per warpgroup).  One buffer per stage: a warpgroup writes stage s's while the other may still
    read the previous stage's (no barrier before the write).  ``kv_split_d``: buffer 0 dS^T, 1 P^T, both
    also the K-major A operands of dK += dS^T Q, dV += P^T dO."""
    return cute.tile_to_shape(_bwd_atom(t, FWD_WGMMA_M), (t.tile_n, t.tile_m, t.ds_buffers), (0, 1, 2))


def make_bwd_smem_layout_dq(t: BwdTile):
    """(dq_rows_per_wg, dq_cols_per_wg, consumer_warpgroups) fp32: each consumer warpgroup's dQ tile,
    rows of ``dq_cols_per_wg`` floats swizzled (the widest swizzle dividing them: conflict-free float2
    stores of the accumulator), the source of the TMA reduce-add into the fp32 dQ accumulator."""
    f32 = cutlass.Float32
    kind = sm90_helpers.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, f32, t.dq_cols_per_wg)
    atom = warpgroup.make_smem_layout_atom(kind, f32)
    return cute.tile_to_shape(atom, (t.dq_rows_per_wg, t.dq_cols_per_wg, t.consumer_warpgroups), (0, 1, 2))


def make_bwd_smem_layout_kv_acc(t: BwdTile):
    """(64, head_dim) fp32: one consumer warpgroup's dK or dV tile, staged for the TMA reduce-add into the
    GQA accumulators (``FlashBwdConfig.kv_reduce``), rows swizzled as the dQ tile's; its bytes, 256 per
    head dim, are those of a 128-key K (or V) tile in 16 bits, whose buffer holds it."""
    f32 = cutlass.Float32
    kind = sm90_helpers.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, f32, t.head_dim)
    atom = warpgroup.make_smem_layout_atom(kind, f32)
    return cute.tile_to_shape(atom, (BWD_WG_KEYS, t.head_dim), (0, 1))


def make_bwd_tiled_mma_sdp(t: BwdTile):
    """S^T = K Q^T and dP^T = V dO^T: one 64 x tile_m wgmma per consumer warpgroup (its 64 keys), both
    operands K-major from shared memory; ``kv_split_d``: the 64 keys' 64 x tile_m / 2 half of the
    queries per warpgroup."""
    dt = _dtype(t.dtype)
    atoms, n = ((1, 2, 1), t.tile_m // 2) if t.kv_split_d else ((t.consumer_warpgroups, 1, 1), t.tile_m)
    return sm90_helpers.make_trivial_tiled_mma(
        dt, dt, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32, atoms, tiler_mn=(FWD_WGMMA_M, n),
    )


def make_bwd_tiled_mma_dkv(t: BwdTile, a_smem: bool = False):
    """dV += P^T dO and dK += dS^T Q: one 64 x head_dim wgmma per consumer warpgroup, A (P^T / dS^T in
    16 bits) from registers, B (dO / Q) MN-major from shared memory; ``kv_split_d``: 64 x head_dim / 2
    per warpgroup (its columns), A K-major from shared memory.  ``a_smem``: A K-major from shared memory
    at the full tile too (``BwdTile.dk_carry``'s dK from the stage's dS^T buffer: no register operand has
    to stay intact while it runs on into the next query tile)."""
    dt = _dtype(t.dtype)
    if t.kv_split_d:
        return sm90_helpers.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.MN, cutlass.Float32, (1, 2, 1),
            tiler_mn=(FWD_WGMMA_M, t.head_dim // 2),
        )
    a_source = warpgroup.OperandSource.SMEM if a_smem else warpgroup.OperandSource.RMEM
    return sm90_helpers.make_trivial_tiled_mma(
        dt, dt, OperandMajorMode.K, OperandMajorMode.MN, cutlass.Float32,
        (t.consumer_warpgroups, 1, 1), tiler_mn=(FWD_WGMMA_M, t.head_dim), a_source=a_source,
    )


def make_bwd_tiled_mma_dq(t: BwdTile):
    """dQ = dS K: A (dS, the transposed view of dS^T) and B (K, transposed) MN-major from shared memory;
    warpgroups split the rows (``dq_split_m``) or the columns."""
    dt = _dtype(t.dtype)
    atoms = (t.consumer_warpgroups, 1, 1) if t.dq_split_m else (1, t.consumer_warpgroups, 1)
    return sm90_helpers.make_trivial_tiled_mma(
        dt, dt, OperandMajorMode.MN, OperandMajorMode.MN, cutlass.Float32, atoms,
        tiler_mn=(FWD_WGMMA_M, t.dq_cols_per_wg),
    )
