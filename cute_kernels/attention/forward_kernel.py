"""The dense attention forward kernel on Hopper (FlashAttention-2 work partitioning on wgmma):
O = softmax(Q K^T * scale) V and the natural-log LSE, never materializing S or P.

One CTA per (query tile of ``tile_m`` = 128 rows, query head, batch); 3 warpgroups:

* warpgroup 0, the producer (24 registers after ``setmaxnreg``): warp 0 loads the Q tile once by TMA
  (its own mbarrier, :class:`~cute_kernels.common.ring.TxRing`), then streams K and V tiles of the
  query head's KV head (GQA: ``h // (Hq // Hkv)``) into two ``stages``-deep TMA rings
  (:func:`~cute_kernels.common.ring.make_tma_pipeline`, :func:`~cute_kernels.common.tma.tma_produce_tiles`),
  from the last visited KV tile down to tile 0, each K one tile ahead of its V.
* warpgroups 1 and 2, the consumers (240 registers): warpgroup w owns query rows 64w .. 64w+63 of the
  tile and computes whole rows of S, so the softmax statistics never leave a warpgroup.  Per KV tile:
  S = Q K^T (wgmma, both operands from shared memory; the K slot is released as soon as it retires),
  mask (only the tail / diagonal tiles), online softmax in registers (:class:`OnlineSoftmax`: exp2
  with the scale folded into one FMA, O rescaled when the row max grows, normalization deferred),
  P converted to 16 bits in registers and used as the register A operand of O += P V (V from shared
  memory through a transposed, MN-major view).

Why two rings (K and V in slots of their own) rather than one slot holding both: S = Q K^T of a tile
starts as soon as its K has landed, not its V, and K's slot is handed back right after the QK wgmma
retires, so the producer refills it while the softmax and the PV wgmma of the same tile run.

KV tiles are walked from the last one down, so the masked ones (key-length tail, causal diagonal) come
first and the unmasked loop needs no mask code; fully masked tiles are never visited (loop bounds,
:func:`~cute_kernels.attention.forward_softmax.kv_tile_range`).  Rows that see no key end with
m = -inf, l = 0: O = 0 and LSE = -inf.

Epilogue: O / l in the input dtype -> shared memory (stmatrix into the Q buffer: the same layout, and
each warpgroup only overwrites its own Q rows, which no one reads any more) -> one TMA store of the
(tile_m, D) tile, which clips rows >= Sq.  LSE: each row's quad leader stores it, rows < Sq only.
K/V rows >= Sk and Q rows >= Sq are zero-filled by the TMA unit: no out-of-bounds access for any length.

Packed sequences (``FlashFwdConfig.varlen``) and sliding windows (``FlashFwdConfig.window``) are
compile-time flags (the dense configurations compile to the same code): see
:mod:`~cute_kernels.attention.forward_seqlen` (per-sequence rows, the packed tile order, the partial
last tile's predicated store) and :func:`~.forward_softmax.kv_tile_range_window` (KV walk bounded on both sides).  Paged K/V
(``FlashFwdConfig.page_size``, with dense or packed q) changes only the producer's K / V addressing
and the key lengths (:mod:`~cute_kernels.attention.forward_paged`); the epilogue is
:mod:`~cute_kernels.attention.forward_epilogue`.

Schedule (:mod:`~cute_kernels.attention.forward_softmax` ``tile_coords``): causal and windowed tiles
are ordered longest-first within L2 sections of heads, the others head-major; packed sequences
number only their real tiles (``forward_seqlen.varlen_tile_coords``).  One CTA per tile, or
persistent CTAs (``FwdTile.persistent``) that walk the order with a fixed stride or, for causal and
windows (``FwdTile.dynamic``), take their next tile from a global counter
(:func:`~cute_kernels.common.scheduler.next_dynamic_tile`).  The consumers' KV loop with its
intra-warpgroup overlap and ping-pong is :mod:`~cute_kernels.attention.forward_mainloop`.
"""

from __future__ import annotations


import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync

from layouts import attention as LA

from ..common import ring, tma
from ..common import scheduler as sched
from ..common.dtypes import to_cutlass
from ..common.softmax import OnlineSoftmax
from . import forward_paged as fpg
from . import forward_seqlen as fsl
from . import forward_softmax as fs
from .forward_config import SOFTCAP_TILE_N_3WG, FlashFwdConfig, fwd_config  # noqa: F401  (re-exported)
from .forward_epilogue import FwdEpilogue
from .forward_mainloop import OverlappedKVLoop
from .forward_producer import FwdProducer


def _shared_storage(dtype, stages: int, q_elems: int, kv_elems: int, o_elems: int, p_elems: int):
    """The forward's shared-memory struct: barriers, Q, the K / V rings, O (1 element unless the tile is
    persistent) and P (``p_smem`` only: no field otherwise, so the other configurations' layout stays
    as it was)."""
    def buf(n):
        return cute.struct.Align[cute.struct.MemRange[dtype, n], 1024]

    fields = {
        "q_bar": cute.struct.MemRange[cutlass.Int64, 1],
        "q_empty_bar": cute.struct.MemRange[cutlass.Int64, 1],
        # dynamic schedule: the producer's next tile, and (dense) its (m_block, head, batch)
        "tile_slot": cute.struct.MemRange[cutlass.Int32, 4],
        "k_bars": cute.struct.MemRange[cutlass.Int64, 2 * stages],
        "v_bars": cute.struct.MemRange[cutlass.Int64, 2 * stages],
        "sQ": buf(q_elems), "sK": buf(kv_elems), "sV": buf(kv_elems), "sO": buf(o_elems),
    }
    if p_elems:
        fields["sP"] = buf(p_elems)
    return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))


class FlashAttnFwdSm90(FwdProducer, OverlappedKVLoop, FwdEpilogue):
    """The kernel for one :class:`FlashFwdConfig`; ``__call__`` is the ``@cute.jit`` host entry."""

    def __init__(self, cfg: FlashFwdConfig):
        self.cfg = cfg
        t = cfg.tile
        self.dtype = to_cutlass(cfg.dtype)
        self.D = t.head_dim
        self.tile_m = t.tile_m
        self.tile_n = t.tile_n
        self.stages = t.stages
        self.causal = cfg.causal
        self.num_wg = t.consumer_warpgroups
        self.num_mma_threads = 128 * self.num_wg
        self.threads = t.threads
        self.pingpong = t.pingpong
        self.rescale_before_pv = t.rescale_before_pv
        self.varlen = cfg.varlen
        self.window = cfg.window
        self.paged = cfg.paged
        self.page_size = cfg.page_size
        self.box_rows = fpg.box_rows(cfg.page_size, t.tile_n) if cfg.paged else 0
        # tiles of causal and windowed problems differ in work: walk them last (longest) to first
        self.longest_first = cfg.causal or cfg.window

    # ---------------------------------------------------------------- host entries (traced once)
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 mSched: cute.Tensor, scale_log2: Float32, stream, *variant):
        """Dense (B, S, H, D) tensors, no window.  Every entry ends with the configuration's
        :attr:`~FlashFwdConfig.variant_args` (none for the plain configurations)."""
        self.setup_and_launch(mQ, mK, mV, mO, mLSE, mSched, scale_log2, stream, variant=variant)

    @cute.jit
    def call_window(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                    mSched: cute.Tensor, scale_log2: Float32, window_left: Int32, window_right: Int32, stream,
                    *variant):
        """Dense tensors, a sliding window (:data:`~.forward_softmax.WINDOW_UNBOUNDED`: an unbounded side;
        a negative side ends the window before the diagonal or starts it after)."""
        self.setup_and_launch(mQ, mK, mV, mO, mLSE, mSched, scale_log2, stream, window_left=window_left,
                              window_right=window_right, variant=variant)

    @cute.jit
    def call_varlen(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                    mSched: cute.Tensor, mCuSeqlensQ: cute.Tensor, mCuSeqlensK: cute.Tensor, max_seqlen_q: Int32,
                    max_seqlen_k: Int32, scale_log2: Float32, window_left: Int32, window_right: Int32, stream,
                    *variant):
        """Packed q / out (total_q, Hq, D), k / v (total_k, Hkv, D), LSE (Hq, total_q), cu_seqlens (B + 1,)
        int32; the window sides are read only by a window config."""
        self.setup_and_launch(mQ, mK, mV, mO, mLSE, mSched, scale_log2, stream, mCuSeqlensQ, mCuSeqlensK,
                              max_seqlen_q, max_seqlen_k, window_left, window_right, variant=variant)

    @cute.jit
    def call_paged(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                   mSched: cute.Tensor, mBlockTable: cute.Tensor, mSeqUsedK: cute.Tensor, scale_log2: Float32,
                   window_left: Int32, window_right: Int32, stream, *variant):
        """Paged k / v (num_pages, page_size, Hkv, D) with block_table (B, max_pages) and seqused_k (B,)
        int32, dense q / out / LSE; the window sides are read only by a window config."""
        self.setup_and_launch(mQ, mK, mV, mO, mLSE, mSched, scale_log2, stream, None, None, None, None,
                              window_left, window_right, mBlockTable, mSeqUsedK, variant=variant)

    @cute.jit
    def call_paged_varlen(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                          mLSE: cute.Tensor, mSched: cute.Tensor, mCuSeqlensQ: cute.Tensor, max_seqlen_q: Int32,
                          mBlockTable: cute.Tensor, mSeqUsedK: cute.Tensor, scale_log2: Float32, window_left: Int32,
                          window_right: Int32, stream, *variant):
        """:meth:`call_paged` with packed q / out (total_q, Hq, D), LSE (Hq, total_q), cu_seqlens_q."""
        self.setup_and_launch(mQ, mK, mV, mO, mLSE, mSched, scale_log2, stream, mCuSeqlensQ, None, max_seqlen_q,
                              None, window_left, window_right, mBlockTable, mSeqUsedK, variant=variant)

    @cute.jit
    def setup_and_launch(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                         mLSE: cute.Tensor, mSched: cute.Tensor, scale_log2: Float32, stream, mCuSeqlensQ=None,
                         mCuSeqlensK=None, max_seqlen_q=None, max_seqlen_k=None, window_left=None,
                         window_right=None, mBlockTable=None, mSeqUsedK=None, variant=()):
        """The entries' common body: TMA atoms, shared storage, grid, launch (unused arguments: None)."""
        t = self.cfg.tile
        softcap_scale, mSink = self.variant(variant)
        if const_expr(mQ.element_type != self.dtype or mK.element_type != self.dtype
                      or mV.element_type != self.dtype or mO.element_type != self.dtype):
            raise TypeError(f"FlashAttnFwdSm90: q, k, v, out must all be {self.dtype}")
        # q / out dense (B, Sq, Hq, D) or packed (total_q, Hq, D); k / v dense, packed, or page pools
        # (num_pages, page_size, Hkv, D): the heads are dim -2 of all of them
        seqlen_q, num_heads, batch, mQ, mO, mO_rows = fsl.q_views(mQ, mO, mCuSeqlensQ, self.varlen)
        qhead_per_kvhead = num_heads // mK.shape[-2]
        if const_expr(self.paged):
            seqlen_k = mBlockTable.shape[1] * self.page_size  # the block table's capacity (the length clamp)
        else:
            seqlen_k = mK.shape[-3]  # (varlen: the packed total, the clamp bound)
        kv_view = fsl.thd_to_sdhb if const_expr(self.varlen and not self.paged) else fsl.bshd_to_sdhb
        mK, mV = kv_view(mK), kv_view(mV)

        sQ_layout = LA.make_fwd_smem_layout_q(t)
        sKV_layout = LA.make_fwd_smem_layout_kv(t)
        tiled_mma_qk = LA.make_fwd_tiled_mma_qk(t)
        tiled_mma_pv = LA.make_fwd_tiled_mma_pv(t)

        tma_q, tma_mQ = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mQ, sQ_layout,
                                                    (self.tile_m, self.D))
        if const_expr(self.paged):
            tma_k, tma_mK = fpg.make_paged_tma_load(mK, sKV_layout, self.tile_n, self.D, self.box_rows)
            tma_v, tma_mV = fpg.make_paged_tma_load(mV, sKV_layout, self.tile_n, self.D, self.box_rows)
        else:
            tma_k, tma_mK = tma.make_tma_load(mK, sKV_layout, (self.tile_n, self.D))
            tma_v, tma_mV = tma.make_tma_load(mV, sKV_layout, (self.tile_n, self.D))
        tma_o, tma_mO = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mO, sQ_layout,
                                                    (self.tile_m, self.D))

        stages = self.stages

        o_elems = cute.cosize(sQ_layout) if const_expr(t.persistent) else 1  # persistent: O has its own buffer
        p_elems = cute.cosize(LA.make_fwd_smem_layout_p(t)) if const_expr(t.p_smem) else 0
        self.shared_storage = _shared_storage(self.dtype, stages, cute.cosize(sQ_layout), cute.cosize(sKV_layout),
                                              o_elems, p_elems)
        rows_q = max_seqlen_q if const_expr(self.varlen) else seqlen_q
        num_m_blocks = (rows_q + self.tile_m - 1) // self.tile_m
        num_tiles = num_m_blocks * num_heads * batch
        if const_expr(self.varlen):  # the real count is the kernel's (fsl.varlen_num_tiles); this bounds it
            num_tiles = cutlass.min(num_tiles, fsl.varlen_grid_bound(seqlen_q, batch, num_heads, self.tile_m))
        grid = num_tiles
        if const_expr(t.persistent):
            grid = cutlass.min(num_tiles, self.cfg.num_sms)
        self.kernel(
            tma_q, tma_mQ, tma_k, tma_mK, tma_v, tma_mV, tma_o, tma_mO, mLSE, mSched, scale_log2,
            Int32(seqlen_q), Int32(seqlen_k), Int32(qhead_per_kvhead), Int32(num_m_blocks), Int32(num_heads),
            Int32(batch), tiled_mma_qk, tiled_mma_pv, sQ_layout, sKV_layout, mO_rows, mCuSeqlensQ, mCuSeqlensK,
            max_seqlen_q, max_seqlen_k, window_left, window_right, mBlockTable, mSeqUsedK, softcap_scale, mSink,
        ).launch(
            grid=[grid, 1, 1],
            block=[self.threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=1,
        )

    # ---------------------------------------------------------------- device code
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, mQ: cute.Tensor, tma_k: cute.CopyAtom, mK: cute.Tensor,
               tma_v: cute.CopyAtom, mV: cute.Tensor, tma_o: cute.CopyAtom, mO: cute.Tensor, mLSE: cute.Tensor,
               mSched: cute.Tensor, scale_log2: Float32, seqlen_q: Int32, seqlen_k: Int32, qhead_per_kvhead: Int32,
               num_m_blocks: Int32, num_heads: Int32, num_batch: Int32,
               tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma,
               sQ_layout: cute.ComposedLayout, sKV_layout: cute.ComposedLayout, mO_rows, mCuSeqlensQ,
               mCuSeqlensK, max_seqlen_q, max_seqlen_k, window_left, window_right, mBlockTable, mSeqUsedK,
               softcap_scale, mSink):
        t = self.cfg.tile
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)

        if warp_idx == 0:
            for atom in (tma_q, tma_k, tma_v, tma_o):
                cpasync.prefetch_descriptor(atom)

        # ---- shared memory, barriers
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        q_ring = ring.TxRing(storage.q_bar.data_ptr(), 1)
        q_empty = storage.q_empty_bar.data_ptr()  # consumers done with the Q buffer (persistent CTAs)
        if tidx == 0:
            q_ring.init()
            cute.arch.mbarrier_init(q_empty, self.num_mma_threads)
        single_cta = cute.make_layout((1, 1, 1))
        pipe_k = ring.make_tma_pipeline(storage.k_bars.data_ptr(), self.stages, t.kv_tile_bytes,
                                        4 * self.num_wg, single_cta, 1)
        pipe_v = ring.make_tma_pipeline(storage.v_bars.data_ptr(), self.stages, t.kv_tile_bytes,
                                        4 * self.num_wg, single_cta, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
        sV = storage.sV.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
        sO = sQ  # one tile per CTA: O is staged in the Q buffer, which no one reads any more
        if const_expr(t.persistent):
            sO = storage.sO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sP = None
        if const_expr(t.p_smem):
            sP_layout = LA.make_fwd_smem_layout_p(t)
            sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)

        # The CTA's tiles: bid, bid + grid, ... of the tile order (one per CTA unless persistent), or,
        # with the dynamic schedule, bid and then whatever the global counter hands the producer, which
        # passes each tile index to the consumers through sTile (written before the Q barrier is armed,
        # read after it completes) -- dense, with its coordinates, which the consumers then need not derive
        # (three dependent integer divisions at the head of each tile).  Work is computed after setmaxnreg
        # in each branch: values live across the register release would spill at the producer's 24
        # registers.  Varlen: each warp counts the real tiles (tiles past them end the loops; the grid is
        # only a bound).
        sTile = storage.tile_slot.get_tensor(cute.make_layout(4))
        coords_in_smem = const_expr(t.dynamic and not self.varlen)
        dynamic = const_expr(t.dynamic)
        if wg_idx == 0:
            # ================= producer: warp 0 issues every TMA load, the other warps exit
            cute.arch.setmaxregister_decrease(t.producer_regs)
            if warp_idx == 0:
                k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                lane = cute.arch.lane_idx()
                num_tiles = self.num_tiles(num_m_blocks, num_heads, num_batch, mCuSeqlensQ, seqlen_q, max_seqlen_q)
                tile = self.tile_of(0)
                j = Int32(0)
                scan_b0, scan_base = Int32(0), Int32(0)  # varlen: where the last tile's sequence was found
                while tile < num_tiles:
                    m_block, head, batch, off_q, len_q, off_k, len_k, n_min, n_max, _, _, scan_b0, scan_base = (
                        self.tile_work(tile, seqlen_q, seqlen_k, qhead_per_kvhead, num_m_blocks, num_heads, num_batch,
                                       mCuSeqlensQ, mCuSeqlensK, max_seqlen_q, max_seqlen_k, window_left, window_right,
                                       scan_b0, scan_base, mSeqUsedK))
                    if j > 0:
                        cute.arch.mbarrier_wait(q_empty, (j - 1) % 2)  # the previous tile's QK wgmmas are done
                    if const_expr(dynamic):
                        if lane == 0:
                            sTile[0] = tile  # released to the consumers by the Q barrier's arrive
                            if const_expr(coords_in_smem):
                                sTile[1], sTile[2], sTile[3] = m_block, head, batch
                    nxt = tile
                    if const_expr(t.prefetch_tile):  # claimed now: the atomic's round trip runs under the loads
                        nxt = sched.next_dynamic_tile(mSched, lane)
                    k_state, v_state = self.produce(tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, q_ring, pipe_k,
                                                    pipe_v, k_state, v_state, m_block, head,
                                                    head // qhead_per_kvhead, batch, n_max, off_q, off_k, n_min,
                                                    len_k, mBlockTable)
                    j += 1
                    if const_expr(t.prefetch_tile):
                        tile = nxt
                    elif const_expr(dynamic):
                        tile = sched.next_dynamic_tile(mSched, lane)
                    else:
                        tile = self.tile_of(j)
                if const_expr(dynamic):  # no work left: tell the consumers (a Q barrier phase without bytes)
                    if j > 0:
                        cute.arch.mbarrier_wait(q_empty, (j - 1) % 2)
                    if lane == 0:
                        sTile[0] = num_tiles
                        cute.arch.mbarrier_arrive(q_ring.barrier(0))
                    sched.retire_dynamic_counter(mSched, lane)
        else:
            # ================= consumers: warpgroup w owns query rows 64(w-1) ..
            cute.arch.setmaxregister_increase(t.consumer_regs)
            read_k = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            read_v = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            j = Int32(0)
            num_tiles = self.num_tiles(num_m_blocks, num_heads, num_batch, mCuSeqlensQ, seqlen_q, max_seqlen_q)
            if const_expr(dynamic):
                q_ring.wait(0, j)
                tile = sTile[0]
            else:
                tile = self.tile_of(0)
            scan_b0, scan_base = Int32(0), Int32(0)
            while tile < num_tiles:
                coords = None
                if const_expr(coords_in_smem):
                    coords = (sTile[1], sTile[2], sTile[3])
                m_block, head, batch, off_q, len_q, _, len_k, n_min, n_max, n_lo, n_mask, scan_b0, scan_base = (
                    self.tile_work(tile, seqlen_q, seqlen_k, qhead_per_kvhead, num_m_blocks, num_heads, num_batch,
                                   mCuSeqlensQ, mCuSeqlensK, max_seqlen_q, max_seqlen_k, window_left, window_right,
                                   scan_b0, scan_base, mSeqUsedK, coords))
                read_k, read_v = self.consume(tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, sO, sP, q_ring, q_empty, pipe_k,
                                              pipe_v, read_k, read_v, tma_o, mO, mLSE, scale_log2, len_q, len_k,
                                              m_block, head, batch, n_max, n_mask, j, tidx - 128, warp_idx,
                                              off_q, n_min, n_lo, window_left, window_right, mO_rows,
                                              softcap_scale, mSink)
                j += 1
                if const_expr(dynamic):
                    q_ring.wait(0, j)
                    tile = sTile[0]
                else:
                    tile = self.tile_of(j)
            if warp_idx == 4:
                cute.arch.cp_async_bulk_wait_group(0, read=True)  # smem stays valid until the last store read it

    def variant(self, args: tuple):
        """``(softcap_scale, mSink)`` of an entry's trailing arguments (the configuration's
        :attr:`~FlashFwdConfig.variant_args`), None for a variant that is off."""
        names = self.cfg.variant_args
        if len(args) != len(names):
            raise TypeError(f"FlashAttnFwdSm90: this configuration's entries end with {names}, got {len(args)} "
                            "trailing arguments")
        named = dict(zip(names, args))
        return named.get("softcap_scale"), named.get("learnable_sink")

    @cute.jit
    def tile_of(self, j):
        """The CTA's ``j``-th tile of the static schedule: ``j * grid + bid``."""
        return j * cute.arch.grid_dim()[0] + cute.arch.block_idx()[0]

    @cute.jit
    def num_tiles(self, num_m_blocks, num_heads, num_batch, mCuSeqlensQ, seqlen_q, max_seqlen_q):
        """The tiles of the launch: the grid's (dense), the sequences' real ones (varlen; warp-wide)."""
        if const_expr(self.varlen):
            return fsl.varlen_num_tiles(mCuSeqlensQ, num_batch, num_heads, seqlen_q, max_seqlen_q, self.tile_m)
        return num_m_blocks * num_heads * num_batch

    @cute.jit
    def tile_work(self, tile, seqlen_q, seqlen_k, qhead_per_kvhead, num_m_blocks, num_heads, num_batch,
                  mCuSeqlensQ, mCuSeqlensK, max_seqlen_q, max_seqlen_k, window_left, window_right, scan_b0, scan_base,
                  mSeqUsedK=None, coords=None):
        """Everything the producer and the consumers derive from tile index ``tile`` (both call this with
        the same arguments, so they agree on the KV tile count): ``(m_block, head, batch, offset_q,
        len_q, offset_k, len_k, n_min, n_max, n_lo, n_mask, scan_b0, scan_base)`` -- the sequence's rows
        (:func:`~.forward_seqlen.sequence_bounds`) and its KV tiles: ``n_min .. n_max - 1`` visited,
        ``n_lo .. n_mask - 1`` without a mask (``n_min = n_lo = 0`` without a window); varlen: where
        the sequence lookup resumes for the CTA's next (larger) tile (passed through otherwise).
        ``coords``: the tile's ``(m_block, head, batch)`` when known (dense: the producer's, through
        shared memory), else derived from ``tile``."""
        if const_expr(self.varlen):  # warp-wide (every lane of the calling warps)
            m_block, head, batch, scan_b0, scan_base = fsl.varlen_tile_coords(
                tile, mCuSeqlensQ, num_batch, num_heads, seqlen_q, max_seqlen_q, self.tile_m, self.longest_first,
                scan_b0, scan_base)
        elif const_expr(coords is not None):
            m_block, head, batch = coords
        else:
            m_block, head, batch = fs.tile_coords(tile, num_m_blocks, num_heads, num_batch, seqlen_k,
                                                  qhead_per_kvhead, 2 * self.D * self.cfg.tile.elem_bytes,
                                                  self.longest_first)
        off_q, len_q, off_k, len_k = fsl.sequence_bounds(batch, seqlen_q, seqlen_k, mCuSeqlensQ, mCuSeqlensK,
                                                         max_seqlen_q, max_seqlen_k, self.varlen, mSeqUsedK)
        n_min, n_lo = 0, 0
        if const_expr(self.window):
            n_min, n_max, n_lo, n_mask = fs.kv_tile_range_window(m_block, len_q, len_k, self.tile_m, self.tile_n,
                                                                 window_left, window_right)
        else:
            n_max, n_mask = fs.kv_tile_range(m_block, len_q, len_k, self.tile_m, self.tile_n, self.causal)
        return m_block, head, batch, off_q, len_q, off_k, len_k, n_min, n_max, n_lo, n_mask, scan_b0, scan_base

    @cute.jit
    def consume(self, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma, sQ: cute.Tensor, sK: cute.Tensor,
                sV: cute.Tensor, sO: cute.Tensor, sP, q_ring: ring.TxRing, q_empty, pipe_k, pipe_v, read_k, read_v,
                tma_o: cute.CopyAtom, mO: cute.Tensor, mLSE: cute.Tensor, scale_log2: Float32, seqlen_q: Int32,
                seqlen_k: Int32, m_block, head, batch, n_max, n_mask, j, mma_tidx, warp_idx, off_q, n_min, n_lo,
                window_left, window_right, mO_rows, softcap_scale, mSink):
        """Consumer warpgroups, the CTA's ``j``-th tile: the KV loop (masked tiles first, then
        unmasked, then a window's left-edge tiles), then the epilogue.  ``sP``: the P buffer (``p_smem``;
        else None).  ``seqlen_q`` / ``seqlen_k``: the
        sequence's lengths; ``softcap_scale`` / ``mSink``: the variants' values (None: off).  Returns the
        advanced ring states."""
        wg = cute.arch.make_warp_uniform(mma_tidx // 128)
        wg_first = wg * 128  # the warpgroup's slice of the tiled MMAs (operand fragments / descriptors)
        thr_qk = tiled_mma_qk.get_slice(mma_tidx)
        thr_pv = tiled_mma_pv.get_slice(mma_tidx)
        wg_qk = tiled_mma_qk.get_slice(wg_first)
        wg_pv = tiled_mma_pv.get_slice(wg_first)

        # operands: Q (MMA, 1, D/16), K (MMA, 1, D/16, stages), V^T (MMA, 1, tile_n/16, stages)
        tSrQ = tiled_mma_qk.make_fragment_A(wg_qk.partition_A(sQ))
        tSrK = tiled_mma_qk.make_fragment_B(wg_qk.partition_B(sK))
        # V as the (D, tile_n) B operand: the same bytes, D contiguous (MN-major)
        sVt = cute.composition(sV, cute.make_ordered_layout((self.D, self.tile_n, self.stages), order=(1, 0, 2)))
        tOrVt = tiled_mma_pv.make_fragment_B(wg_pv.partition_B(sVt))

        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((self.tile_m, self.D)), Float32)
        acc_O.fill(0.0)
        acc_O_mn = fs.acc_mn_view(acc_O)
        softmax = OnlineSoftmax.create(scale_log2, cute.size(acc_O_mn, mode=[0]), softcap_scale)

        # (row, col) of this thread's / thread 0's S elements within the (tile_m, tile_n) tile
        cS = cute.make_identity_tensor((self.tile_m, self.tile_n))
        tScS_mn = fs.acc_mn_view(thr_qk.partition_C(cS))
        t0ScS_mn = fs.acc_mn_view(tiled_mma_qk.get_slice(0).partition_C(cS))
        if const_expr(self.window):
            mask = fs.WindowTileMask(tScS_mn, t0ScS_mn, m_block, seqlen_q, seqlen_k, self.tile_m, self.tile_n, False,
                                     window_left, window_right)
        else:
            mask = fs.TileMask(tScS_mn, t0ScS_mn, m_block, seqlen_q, seqlen_k, self.tile_m, self.tile_n, self.causal)

        if const_expr(not self.cfg.tile.dynamic):  # (dynamic: waited by the caller, to read the tile index)
            q_ring.wait(0, j)  # always: the epilogue may reuse the Q buffer, so the Q load must have landed

        read_k, read_v = self.overlapped_kv_loop(tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, acc_O, acc_O_mn,
                                                 softmax, pipe_k, pipe_v, read_k, read_v, mask, n_max, n_mask, wg,
                                                 n_min, n_lo, sP, mma_tidx)

        cute.arch.mbarrier_arrive(q_empty)  # every QK wgmma of this tile has retired: Q may be replaced
        self.epilogue(tiled_mma_pv, thr_pv, acc_O, acc_O_mn, softmax, sO, tma_o, mO, mLSE, tScS_mn, scale_log2,
                      seqlen_q, m_block, head, batch, j, mma_tidx, warp_idx, off_q, mO_rows, mSink)
        return read_k, read_v


# ---- compile entry ------------------------------------------------------------------------------


def forward_builder(cfg: FlashFwdConfig):
    """``() -> (kernel, fake_args)`` for :func:`cute_kernels.common.jit.get_compiled` /
    :func:`~cute_kernels.common.jit.compile_now`: symbolic B, Sq, Sk, Hq, Hkv (varlen: total_q,
    total_k and the cu_seqlens length) and a fresh symbolic stride for every stride of every tensor
    (stride(-1) = 1; shared symbols would make the compiled function demand equal strides).  The
    entry and its arguments per configuration:

    * dense: ``(q, k, v, out, lse, counter, scale_log2)``;
    * dense + window: ``(..., scale_log2, window_left, window_right)``;
    * varlen: ``(q, k, v, out, lse, counter, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      scale_log2, window_left, window_right)`` (the window read only by a window config);
    * paged: :func:`~.forward_paged.paged_fake_args`;

    then the configuration's :attr:`~FlashFwdConfig.variant_args`: ``softcap_scale`` (a float),
    ``learnable_sink`` (a float32 vector of any stride, its length not tied to Hq: the host checks it)."""

    def build():
        from cutlass.cute.runtime import make_fake_tensor

        entry, args = _plain_fake_args(cfg)
        extra = {"softcap_scale": Float32(1.0),
                 "learnable_sink": make_fake_tensor(cutlass.Float32, (cute.sym_int(),), (cute.sym_int64(),),
                                                    assumed_align=4)}
        return entry, args + tuple(extra[name] for name in cfg.variant_args)

    return build


def _plain_fake_args(cfg: FlashFwdConfig):
    """:func:`forward_builder`'s entry and fake arguments without the variants' (see there)."""
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    dt = to_cutlass(cfg.dtype)
    D = cfg.head_dim
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    mSched = make_fake_compact_tensor(cutlass.Int32, (2,), assumed_align=4)
    k = FlashAttnFwdSm90(cfg)
    if cfg.paged:
        return fpg.paged_fake_args(k, cfg, dt, mSched, stream)
    if cfg.varlen:
        Tq, Tk, Hq, Hkv, B1 = (cute.sym_int() for _ in range(5))
        mQ, mK, mV, mO = (fsl.fake_rows(dt, s) for s in ((Tq, Hq, D), (Tk, Hkv, D), (Tk, Hkv, D), (Tq, Hq, D)))
        mLSE = make_fake_compact_tensor(cutlass.Float32, (Hq, Tq), stride_order=(1, 0), assumed_align=4)
        mCuQ = make_fake_compact_tensor(cutlass.Int32, (B1,), assumed_align=4)
        mCuK = make_fake_compact_tensor(cutlass.Int32, (B1,), assumed_align=4)
        return k.call_varlen, (mQ, mK, mV, mO, mLSE, mSched, mCuQ, mCuK, Int32(1), Int32(1), Float32(1.0),
                               Int32(0), Int32(0), stream)
    B, Sq, Sk, Hq, Hkv = (cute.sym_int() for _ in range(5))
    mQ, mK, mV, mO = (fsl.fake_rows(dt, s) for s in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D), (B, Sq, Hq, D)))
    mLSE = make_fake_compact_tensor(cutlass.Float32, (B, Hq, Sq), stride_order=(2, 1, 0), assumed_align=4)
    if cfg.window:
        return k.call_window, (mQ, mK, mV, mO, mLSE, mSched, Float32(1.0), Int32(0), Int32(0), stream)
    return k, (mQ, mK, mV, mO, mLSE, mSched, Float32(1.0), stream)
