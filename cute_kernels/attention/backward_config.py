"""The attention backward kernels' compile-time configurations (:class:`FlashBwdConfig`, the compile-cache
key of :mod:`.backward_kernel`; :class:`BwdPrepostConfig`, :mod:`.backward_prepost`'s), how a call's facts
choose them (:func:`bwd_config`), and the host's integer rules shared with the kernels
(:func:`det_wait_span`, :func:`padded_first_row`); no DSL import here: the host path plans with it on
every call."""

from __future__ import annotations

from dataclasses import dataclass


from layouts import attention_backward as LB

from ..common.dtypes import HALF_NAMES
from .forward_config import check_attention_config, tile_coords_py


@dataclass(frozen=True)
class FlashBwdConfig:
    """Everything the compiled backward specializes on (the compile-cache key).  B, Sq, Sk, Hq, Hkv
    and the strides of q, k, v, dout are run-time values."""

    dtype: str  # "bfloat16" | "float16"
    head_dim: int  # one of layouts.attention_backward.BWD_HEAD_DIMS
    causal: bool
    tile: LB.BwdTile
    #: a sliding window, its two sides run-time values (causal is folded into it: ``causal`` is False)
    window: bool = False
    #: the MMA bound of the benchmark (``cute-kernels bench attention --backward``): the mask, the
    #: exponentials and dS compiled out (P = S, dS = dP in 16 bits); loads, the five GEMMs and the
    #: dQ / dK / dV reductions as in the real kernel.  Wrong gradients: never planned for a call.
    mma_only: bool = False
    #: dK and dV stored by the kernel, scaled and in the input dtype (Hq == Hkv: no other CTA adds into
    #: a KV head's rows), instead of added into fp32 accumulators that a post-pass converts
    direct_kv: bool = False
    #: score softcapping (the forward's ``softcap * tanh(s * softmax_scale / softcap)``): the entries take
    #: a trailing run-time ``softcap_scale = softmax_scale / softcap`` and ``scale_log2 = softcap *
    #: log2(e)``; P from the capped scores and dS times ``1 - tanh^2`` (:meth:`FlashAttnBwdSm90.probs`)
    softcap: bool = False
    #: deterministic adds (see the module doc): the entries take a trailing int32 ``dq_semaphore`` (B,
    #: Hq, Sq_pad / 64) and, without ``direct_kv``, ``dkv_semaphore`` (B, Hkv, KV tiles), both zeroed
    deterministic: bool = False
    #: packed sequences (:mod:`.backward` doc): the entries take ``cu_seqlens_q``, ``cu_seqlens_k`` (B + 1,)
    #: int32 and ``max_seqlen_q``, ``max_seqlen_k`` first among the trailing arguments; the tensors hold one
    #: batch (the packed rows), the grid's z is the sequence
    varlen: bool = False
    #: the CTAs taken longest first, in sections of heads (causal, dense, not deterministic): the grid's
    #: linear index numbers sections of as many (batch, head) pairs as have their Q, dO and fp32 dQ fit
    #: in L2 together, and within a section the KV tile is the slow index from tile 0 (the most query
    #: tiles) up (:func:`~.forward_softmax.tile_coords`' order, as the forward's causal schedule), so
    #: the last CTAs to start are short ones; otherwise the grid's (KV tile, head, batch) order, in
    #: which each head's longest tile starts with it, the last head's near the end
    lpt: bool = False
    #: with GQA (not ``direct_kv``), not deterministic: each consumer warpgroup's fp32 dK and dV tiles staged
    #: in shared memory (the K and V buffers, free once the last wgmma read them) and added into the
    #: accumulators by one TMA reduce-add per tile (FlashAttention-3 / 4's form), instead of 2 x 64 per-thread
    #: atomic adds and their address arithmetic (~780 instructions a thread at D 128); rows past the keys:
    #: clipped (dense) or zeros (packed: the tile holding a sequence's last key is masked at every step)
    kv_reduce: bool = False

    def __post_init__(self):
        check_attention_config(self)
        if self.mma_only and self.softcap:
            raise ValueError("FlashBwdConfig: the MMA bound (mma_only) has no softmax to softcap")
        if self.lpt and not (self.causal and not self.deterministic and not self.varlen):
            raise ValueError("FlashBwdConfig: lpt orders causal, dense, non-deterministic grids only")
        if self.kv_reduce and not self.kv_reduce_applies:
            raise ValueError("FlashBwdConfig: kv_reduce is for GQA (not direct_kv), non-deterministic, 128-key tiles "
                             "without kv_split_d (two warpgroups' fp32 tiles in the K and V buffers)")

    @property
    def kv_reduce_applies(self) -> bool:
        """Whether :attr:`kv_reduce` may be set: GQA's fp32 accumulators (not ``direct_kv``) without the
        deterministic turns, on 128-key tiles without ``kv_split_d`` (two warpgroups' fp32 tiles in the K
        and V buffers)."""
        return not (self.direct_kv or self.deterministic or self.tile.kv_split_d
                    or self.tile.tile_n != 2 * LB.BWD_WG_KEYS)

    @property
    def variant_args(self) -> tuple:
        """The entries' trailing run-time arguments after the stream (:meth:`FlashAttnBwdSm90.__call__`):
        the packed sequences' bounds and the grid's numbering (``gapped``: 1 for
        :func:`.forward_seqlen.gapped_tile_coords`, 0 for a max_seqlen_k-sized row of CTAs per sequence;
        :func:`.forward_seqlen.gapped_pays`), ``softcap_scale`` (a float) with softcapping, then the
        deterministic mode's semaphores."""
        return (("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "gapped") * self.varlen
                + ("softcap_scale",) * self.softcap + ("dq_semaphore",) * self.deterministic
                + ("dkv_semaphore",) * (self.deterministic and not self.direct_kv))


def bwd_config(dtype: str, head_dim: int, causal: bool, window: bool = False, direct_kv: bool = False,
               softcap: bool = False, deterministic: bool = False, varlen: bool = False) -> FlashBwdConfig:
    """The configuration the backward compiles for these facts (tile from :func:`layouts.attention_backward.bwd_tile`)."""
    return FlashBwdConfig(dtype=dtype, head_dim=head_dim, causal=bool(causal),
                          tile=LB.bwd_tile(dtype, head_dim, bool(window), softcap=bool(softcap)), window=bool(window),
                          direct_kv=bool(direct_kv), softcap=bool(softcap), deterministic=bool(deterministic),
                          varlen=bool(varlen))


@dataclass(frozen=True)
class BwdPrepostConfig:
    """A pre-pass (``kind="prepass"``, ``has_dlse``: an LSE gradient is subtracted) or post-pass
    (``kind="convert"``) configuration (the compile-cache key)."""

    kind: str  # "prepass" | "convert"
    dtype: str
    head_dim: int
    has_dlse: bool = False
    #: packed sequences (the module doc): the entries take ``cu_seqlens_q`` and ``max_seqlen_q`` after the stream
    varlen: bool = False
    #: convert: the source holds this many accumulators (batches ``g * B ..`` of a (G B, ...) tensor,
    #: ``BwdTile.dq_groups``), summed in order before the scale
    groups: int = 1

    def __post_init__(self):
        if self.kind not in ("prepass", "convert"):
            raise ValueError(f"BwdPrepostConfig: kind {self.kind!r} must be 'prepass' or 'convert'")
        if self.dtype not in HALF_NAMES:
            raise ValueError(f"BwdPrepostConfig: dtype {self.dtype!r} must be one of {HALF_NAMES}")
        if self.head_dim not in LB.BWD_HEAD_DIMS:
            raise ValueError(f"BwdPrepostConfig: head_dim {self.head_dim} must be one of {LB.BWD_HEAD_DIMS}")
        if self.groups not in (1, 2) or (self.groups > 1 and self.kind != "convert"):
            raise ValueError(f"BwdPrepostConfig: groups {self.groups} must be 1, or 2 for a convert")


#: a query token's bytes per head dim in an lpt section's L2 budget (:attr:`FlashBwdConfig.lpt`; the
#: forward's ``L2_KV_BYTES``): Q and dO in 16 bits, the fp32 dQ accumulator
LPT_TOKEN_BYTES_PER_D = 2 + 2 + 4


def lpt_tile_coords_py(lin: int, num_n: int, num_heads: int, num_batch: int, seqlen_q: int, head_dim: int):
    """``(n_block, head, batch)`` of the grid's linear CTA index ``lin`` under :attr:`FlashBwdConfig.lpt`
    (plain Python, for tests; the kernel's is :meth:`.backward_mask.BwdTileOrder.tile_coords`)."""
    m, head, batch = tile_coords_py(lin, num_n, num_heads, num_batch, seqlen_q, 1, LPT_TOKEN_BYTES_PER_D * head_dim,
                                    True)
    return num_n - 1 - m, head, batch


def det_wait_span(num_n: int, num_m: int, causal: bool, window, tile_m: int, tile_n: int) -> int:
    """How many KV tiles of one (sequence, head) the deterministic turns can make wait on one another:
    a tile waits at a query tile for the contributors before it in turn order, which (from the top,
    :func:`n_block_last`; rotated, :func:`dense_turn`) are launched after it.  Causal, a window unbounded
    on a side, or a dense range walked rotated (N <= M): all N tiles; a bounded window: the tiles one
    query tile sees; dense with N > M: 1 (launch order: a tile waits only for tiles launched before it).
    More than the GPU holds at once (one CTA per SM) and no resident tile can finish (host ints)."""
    if window is not None:
        wl, wr = window
        if wl < 0 or wr < 0:
            return num_n
        return min(num_n, -(-(wl + wr + tile_m) // tile_n) + 1)
    if causal or num_n <= num_m:
        return num_n
    return 1


def padded_first_row(first_row, batch):
    """Packed sequence ``batch``'s first row in the backward's padded row buffers (LSE_log2, Delta, the dQ
    accumulator), given its first packed row: ``first_row + batch * pad`` rounded down to ``pad`` =
    :data:`layouts.attention_backward.BWD_ROW_PAD`, so each sequence's padded tiles there are its own and
    ``total_q + B * pad`` rows hold them all.  The one definition of that layout, for the kernels' Int32
    values and the host's tensors alike."""
    pad = LB.BWD_ROW_PAD
    return (first_row + batch * pad) // pad * pad
