"""The attention forward kernel's compile-time configuration (:class:`FlashFwdConfig`, the compile-cache
key of :mod:`.forward_kernel`) and how a call's facts choose it (:func:`fwd_config`); no DSL import
here: the host path plans with it on every call."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from layouts import attention as LA

from ..common.dtypes import HALF_NAMES
from .forward_validate import page_size_ok


def check_attention_config(cfg) -> None:
    """What every attention kernel configuration (:class:`FlashFwdConfig`,
    :class:`~.backward_config.FlashBwdConfig`) checks first: a 16-bit dtype, a tile of its own dtype and
    head dim, and causal folded into a window's right side."""
    who = type(cfg).__name__
    if cfg.dtype not in HALF_NAMES:
        raise ValueError(f"{who}: dtype {cfg.dtype!r} must be one of {HALF_NAMES}")
    if cfg.tile.dtype != cfg.dtype or cfg.tile.head_dim != cfg.head_dim:
        raise ValueError(f"{who}: tile {cfg.tile} does not match dtype {cfg.dtype} / D {cfg.head_dim}")
    if cfg.window and cfg.causal:
        raise ValueError(f"{who}: a window config folds causal into its right side (causal=False)")


@dataclass(frozen=True)
class FlashFwdConfig:
    """Everything the compiled forward specializes on (the compile-cache key).  B, Sq, Sk, Hq, Hkv and
    all strides are run-time values."""

    dtype: str  # "bfloat16" | "float16"
    head_dim: int  # 64 | 96 | 128 | 256
    causal: bool
    tile: LA.FwdTile
    #: SMs of the device (the persistent grid's size; part of the key so that a kernel built for one
    #: device never runs a short grid on a larger one)
    num_sms: int = 132
    #: the MMA bound of the benchmark (profiles/bench_attention.py): P = S in 16 bits, no mask and no
    #: softmax, so only the two GEMMs and the data movement remain; its output is not attention
    mma_only: bool = False
    #: the softmax bound (issue 34's softcap row): no wgmma; distinct run-time scores stand in for S, the
    #: mask, softcapping and softmax run as usual, so the MUFU / FMA work and the loads remain
    softmax_only: bool = False
    #: packed (total, H, D) sequences with cu_seqlens (:mod:`.forward_seqlen`)
    varlen: bool = False
    #: a sliding window, its two sides run-time values (causal is folded into it: ``causal`` is False)
    window: bool = False
    #: paged K/V (:mod:`.forward_paged`): the pool's page size (the TMA box height depends on it), 0 if not
    page_size: int = 0
    #: score softcapping: ``tanh(S * softcap_scale)`` before the mask (:func:`~..common.softmax.softcap_scores`);
    #: the entries take the run-time ``softcap_scale`` and ``scale_log2 = softcap * log2(e)``
    softcap: bool = False
    #: FlashAttention-4's ``learnable_sink``: a (Hq,) float32 logit per query head added to each row's softmax
    #: denominator in the epilogue (:func:`~..common.softmax.finalize_with_sink`)
    sink: bool = False

    def __post_init__(self):
        check_attention_config(self)
        if self.page_size and not page_size_ok(self.page_size):
            raise ValueError(f"FlashFwdConfig: page_size {self.page_size} must be a multiple of 16 in 16..256")
        if self.mma_only and (self.softcap or self.sink):
            raise ValueError("FlashFwdConfig: the MMA bound (mma_only) has no softmax to softcap or sink")
        if self.mma_only and self.softmax_only:
            raise ValueError("FlashFwdConfig: mma_only and softmax_only are two different bounds")

    @property
    def variant_args(self) -> tuple[str, ...]:
        """The run-time arguments an entry of this configuration takes after its others
        (:meth:`FlashAttnFwdSm90.variant`): ``softcap_scale`` (a float) with softcapping, then
        ``learnable_sink`` (a (Hq,) float32 tensor) with sinks; none for the plain configurations,
        whose entries keep their arguments."""
        return ("softcap_scale",) * self.softcap + ("learnable_sink",) * self.sink

    @property
    def paged(self) -> bool:
        return self.page_size > 0


#: KV tile of softcapping configurations with three consumer warpgroups (D = 64): 128 spills there
SOFTCAP_TILE_N_3WG = 112


def fwd_config(dtype: str, head_dim: int, causal: bool, num_sms: int = 132, varlen: bool = False,
               window: bool = False, page_size: int = 0, softcap: bool = False, sink: bool = False) -> FlashFwdConfig:
    """The configuration :func:`cute_kernels.flash_attn` compiles for these facts (tile from
    :func:`layouts.attention.fwd_tile`).  Varlen: the same tile and schedule, over the sequences' real
    query tiles (:mod:`.forward_seqlen`).  Window: ``causal`` must be False (it is the window's right
    side); its tiles are uneven, so it takes causal's schedule (dynamic, longest first).  Paged K/V:
    ``page_size`` > 0, dense or packed q (whose schedule it keeps).  Softcapping and sinks: the same
    tile and schedule (a few more instructions in the softmax / the epilogue), except softcapping with
    three consumer warpgroups (D = 64): :data:`SOFTCAP_TILE_N_3WG` keys per tile."""
    # a window's tiles are uneven, as causal ones: its schedule (dynamic where the tile is persistent)
    tile = LA.fwd_tile(dtype, head_dim, bool(causal) or bool(window))
    if softcap and tile.consumer_warpgroups == 3:
        # D = 64's three 160-register warpgroups: 128 keys per tile spill once 64 tanh per row block are
        # in flight (ptxas batches the MUFU.TANHs); 112 keys fit
        tile = dataclasses.replace(tile, tile_n=SOFTCAP_TILE_N_3WG)
    return FlashFwdConfig(dtype=dtype, head_dim=head_dim, causal=bool(causal), tile=tile, num_sms=int(num_sms),
                          varlen=bool(varlen), window=bool(window), page_size=int(page_size),
                          softcap=bool(softcap), sink=bool(sink))


def gapped_pays(num_batch: int, total: int, max_seqlen: int, tile: int) -> bool:
    """Whether a packed problem launches fewer wasted CTA-latencies in the gapped numbering than with a
    row of ``ceil(max_seqlen / tile)`` CTAs per sequence (host ints).  The row form wastes a short CTA
    per tile past a shorter sequence's end; the gapped one costs each CTA its search, one round of loads
    per 32x of sequences (two up to 1024), beside the one round that finds the sequence's bounds.  Both
    priced alike: gapped when ``B * ceil(max / tile) > gapped_grid_bound * (1 + rounds)`` (a 32-sequence
    batch up to 8192 long: gapped; 1024 sequences up to 512: rows)."""
    rounds, span = 1, 32
    while span < num_batch:
        rounds, span = rounds + 1, span * 32
    return num_batch * -(-max_seqlen // tile) > gapped_grid_bound(total, num_batch, tile) * (1 + rounds)


def gapped_grid_bound(total: int, num_batch: int, tile: int) -> int:
    """Numbers of the gapped numbering (comment above): ``ceil(total / tile) + B``, Python ints or the
    host entry's traced values alike."""
    return (total + tile - 1) // tile + num_batch


# ---- the forward's causal schedule over L2 sections (the kernel's is forward_softmax.tile_coords) ----------
#: bytes of L2 the K / V of one section of heads may take (H100 / H200: 50 MB of L2)
L2_KV_BYTES = 40 * 1024 * 1024
MAX_SECTION_HEADS = 64
_SECTION_SIZES = tuple(2 ** i for i in range(1, MAX_SECTION_HEADS.bit_length()))


def tile_coords_py(bid: int, num_m_blocks: int, num_heads: int, num_batch: int, seqlen_k: int,
                   qhead_per_kvhead: int, kv_token_bytes: int, causal: bool):
    """:func:`.forward_softmax.tile_coords` in plain Python (tests check it is a bijection)."""
    fit = (L2_KV_BYTES // kv_token_bytes) * qhead_per_kvhead // max(seqlen_k, 1)
    sw = max([1] + [p for p in _SECTION_SIZES if fit >= p]) if causal else 1
    num_hb = num_heads * num_batch
    section, in_section = divmod(bid, sw * num_m_blocks)
    width = sw if section < num_hb // sw else num_hb - (num_hb // sw) * sw
    m_block, r = divmod(in_section, width)
    batch, head = divmod(section * sw + r, num_heads)
    return (num_m_blocks - 1 - m_block if causal else m_block), head, batch
