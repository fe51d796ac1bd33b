"""The GEMM epilogue, as a mixin of :class:`~cute_kernels.gemm.kernel.GemmSm90`: per-thread views of
the accumulators, alpha / beta * C in registers, and the registers -> smem (stmatrix) -> TMA store of
each sub-tile (or predicated direct stores when D's strides are not TMA-compatible)."""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils

from layouts import tiles as T

from ..common import fixup


@cute.jit
def add_beta_c(v, beta, c_elem):
    """``v + beta * C`` for one output element: the C term of every GEMM epilogue (C in its own type,
    added in fp32 after ``v`` was scaled by alpha)."""
    return v + beta * c_elem.to(cutlass.Float32)


class ConsumerViews(NamedTuple):
    """A consumer thread's views of one tile (:meth:`GemmEpilogue.consumer_views`)."""

    thr_mma_c: object  # the thread's slice of the tiled MMA, for C / D fragments
    tCrA: cute.Tensor  # A / B operand fragments of the thread's warpgroup, all stages
    tCrB: cute.Tensor
    gD: cute.Tensor  # D, C and coordinate tiles: (m_t, n_t, tm, tn, l)
    gC: cute.Tensor
    cD: cute.Tensor
    acc: cute.Tensor  # fp32 accumulators


class EpilogueViews(NamedTuple):
    """Per-thread views of the registers -> smem -> TMA store epilogue (:meth:`GemmEpilogue.make_epilogue`)."""

    tiled_r2s: cute.TiledCopy
    tRS_sD: cute.Tensor  # the smem epilogue buffers, as this thread writes them
    tRS_acc: cute.Tensor  # the accumulators, retiled for the copy
    tRS_rD: cute.Tensor  # one sub-tile in fp32
    tRS_rD_out: cute.Tensor  # one sub-tile in D's type
    store_pipe: object  # PipelineTmaStore over the epilogue buffers


class GemmEpilogue:
    """Epilogue steps shared by the persistent GEMM's consumers.  Needs ``self.cfg``, ``self.tile_mnk``,
    ``self.n_epi``, ``self.acc_dtype``, ``self.c_dtype``, ``self.num_mma_threads`` and ``self.epi_store_warp``."""

    @cute.jit
    def consumer_views(self, tiled_mma: cute.TiledMma, thr_mma, c_idx, sA: cute.Tensor, sB: cute.Tensor,
                       mD: cute.Tensor, mC: cute.Tensor):
        """A consumer's operand fragments (from ``thr_mma``, its warpgroup's A/B slice), its C slice
        (``c_idx``: the thread's index within the MMA), the D/C/coordinate tiles and a zeroed-shape
        accumulator."""
        m_t, n_t, _ = self.tile_mnk
        thr_mma_c = tiled_mma.get_slice(c_idx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        gD = cute.local_tile(mD, (m_t, n_t), (None, None, None))  # (m_t, n_t, tm, tn, l)
        gC = cute.local_tile(mC, (m_t, n_t), (None, None, None))
        cD = cute.local_tile(cute.make_identity_tensor(mD.shape), (m_t, n_t), (None, None, None))
        acc = cute.make_rmem_tensor(thr_mma.partition_C(gD[(None, None, 0, 0, 0)]).shape, self.acc_dtype)
        return ConsumerViews(thr_mma_c, tCrA, tCrB, gD, gC, cD, acc)

    def make_epilogue(self, tiled_mma: cute.TiledMma, sD: cute.Tensor, acc: cute.Tensor, thr_idx):
        """Per-thread views of the epilogue: registers -> smem (stmatrix for 16-bit D) -> TMA store.

        Returns :class:`EpilogueViews`; ``thr_idx`` is the
        thread's index among the threads that share one tile's accumulators."""
        t = self.cfg.tiles
        c_layout = T.c_layout_enum(t)
        # The thread->element map of the copy comes from a 16-bit stmatrix atom over the MMA's C layout
        # (for any D width); the store op itself is stmatrix for 16-bit D, plain stores for fp32.
        c_atom = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(c_layout.is_m_major_c(), 4), cutlass.Float16
        )
        r2s_atom = sm90_utils.get_smem_store_op(c_layout, self.c_dtype, self.acc_dtype)
        tiled_r2s = cute.make_tiled_copy_S(r2s_atom, cute.make_tiled_copy_C_atom(c_atom, tiled_mma))
        thr_r2s = tiled_r2s.get_slice(thr_idx)
        tRS_sD = thr_r2s.partition_D(sD)
        tRS_acc = tiled_r2s.retile(acc)
        rD_shape = cute.shape(thr_r2s.partition_S(sD))[:3]
        tRS_rD = cute.make_rmem_tensor(rD_shape, self.acc_dtype)
        tRS_rD_out = cute.make_rmem_tensor(rD_shape, self.c_dtype)
        store_pipe = pipeline.PipelineTmaStore.create(
            num_stages=t.epi_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_threads),
        )
        return EpilogueViews(tiled_r2s, tRS_sD, tRS_acc, tRS_rD, tRS_rD_out, store_pipe)

    @cute.jit
    def scale_acc(self, acc: cute.Tensor, tile_mnl, thr_mma_c, gC: cute.Tensor, cD: cute.Tensor, mD: cute.Tensor,
                  alpha: cutlass.Float32, beta: cutlass.Float32):
        """acc = alpha * acc (+ beta * C, read with predicates: any strides, ragged tiles), in registers."""
        cfg = self.cfg
        if cutlass.const_expr(cfg.has_c):
            tCcD = thr_mma_c.partition_C(cD[(None, None, *tile_mnl)])
            tCgC = thr_mma_c.partition_C(gC[(None, None, *tile_mnl)])
            for i in cutlass.range_constexpr(cute.size(acc)):
                v = acc[i] * alpha
                if cute.elem_less(tCcD[i], mD.shape):
                    v = add_beta_c(v, beta, tCgC[i])
                acc[i] = v
        elif cutlass.const_expr(cfg.lean_tile):
            if alpha != cutlass.Float32(1.0):
                for i in cutlass.range_constexpr(cute.size(acc)):
                    acc[i] = acc[i] * alpha
        else:
            for i in cutlass.range_constexpr(cute.size(acc)):
                acc[i] = acc[i] * alpha

    @cute.jit
    def convert_subtile(self, epi, e: cutlass.Constexpr[int], rD_out: cute.Tensor):
        """Sub-tile ``e`` of the (scaled) accumulators, converted to D's type, into ``rD_out``."""
        tiled_r2s, tRS_sD, tRS_acc, tRS_rD, tRS_rD_out, store_pipe = epi
        n_rD = cute.size(tRS_rD)
        for v in cutlass.range_constexpr(n_rD):
            tRS_rD[v] = tRS_acc[e * n_rD + v]
        rD_out.store(tRS_rD.load().to(self.c_dtype))

    @cute.jit
    def store_subtile(self, e: cutlass.Constexpr[int], rD_out: cute.Tensor, tile_mnl, tiles_done, sD: cute.Tensor,
                      epi, epi_barrier, tma_d: cute.CopyAtom, mD_tma: cute.Tensor, warp_idx,
                      drain: cutlass.Constexpr[bool] = False):
        """Sub-tile ``e`` of tile ``tile_mnl`` (converted registers ``rD_out``) -> smem buffer
        ``(tiles_done * n_epi + e) % epi_stages`` (stmatrix for 16-bit D) -> TMA store issued by
        ``self.epi_store_warp``, which then waits until the buffer written next is no longer read --
        the next in the rotation: a caller that skips sub-tiles (split-K's shared finish stores only its
        parts, so two stores in a row can use one buffer) passes ``drain``, and the warp waits until
        every store issued has read its buffer."""
        t = self.cfg.tiles
        m_t, n_t, _ = self.tile_mnk
        tiled_r2s, tRS_sD, tRS_acc, tRS_rD, tRS_rD_out, store_pipe = epi
        gD_tile = cute.local_tile(mD_tma, (m_t, n_t), (None, None, None))[(None, None, *tile_mnl)]
        gD_epi = cute.zipped_divide(gD_tile, t.epi_tile_mn)
        bSG_sD, bSG_gD = cute.nvgpu.cpasync.tma_partition(
            tma_d, 0, cute.make_layout(1), cute.group_modes(sD, 0, 2), gD_epi,
        )
        epi_shape = gD_epi.shape[1]
        epi_order = cute.make_layout(epi_shape, stride=(epi_shape[1], 1))
        n_epi = cute.size(gD_epi, mode=[1])
        buf = (tiles_done * n_epi + e) % t.epi_stages
        cute.copy(tiled_r2s, rD_out, tRS_sD[(None, None, None, buf)])
        cute.arch.fence_proxy("async.shared", space="cta")
        epi_barrier.arrive_and_wait()
        if warp_idx == self.epi_store_warp:
            cute.copy(tma_d, bSG_sD[(None, buf)], bSG_gD[(None, epi_order.get_hier_coord(e))])
            store_pipe.producer_commit()
            store_pipe.producer_acquire()
            if cutlass.const_expr(drain):
                cute.arch.cp_async_bulk_wait_group(0, read=True)
        epi_barrier.arrive_and_wait()

    @cute.jit
    def epilogue(self, acc: cute.Tensor, tile_mnl, thr_mma_c, gD: cute.Tensor, gC: cute.Tensor, cD: cute.Tensor,
                 sD: cute.Tensor, epi, epi_barrier, tiles_done, tma_d: cute.CopyAtom, mD_tma: cute.Tensor, mD: cute.Tensor,
                 alpha: cutlass.Float32, beta: cutlass.Float32, warp_idx, parts=None):
        """One tile's epilogue by the threads that hold its accumulators: alpha/beta in registers, then
        sub-tile by sub-tile registers -> smem buffer -> TMA store (:meth:`store_subtile`); or predicated
        direct stores when D's strides are not TMA-compatible.  ``tiles_done`` counts this storer's
        earlier tiles (it only has to grow by one per tile).  ``parts`` (split-K's shared finish, TMA
        store only): a bit mask of the parts of the tile to store (``fixup.part_of`` each sub-tile)."""
        cfg = self.cfg
        m_t, n_t, _ = self.tile_mnk
        self.scale_acc(acc, tile_mnl, thr_mma_c, gC, cD, mD, alpha, beta)
        if cutlass.const_expr(cfg.tma_store):
            tRS_rD_out = epi.tRS_rD_out
            for e in cutlass.range_constexpr(self.n_epi):
                if cutlass.const_expr(parts is None):
                    self.convert_subtile(epi, e, tRS_rD_out)
                    self.store_subtile(e, tRS_rD_out, tile_mnl, tiles_done, sD, epi, epi_barrier, tma_d, mD_tma,
                                       warp_idx)
                elif (parts >> fixup.part_of(e, self.n_epi, self.splits)) & 1 != 0:
                    self.convert_subtile(epi, e, tRS_rD_out)
                    self.store_subtile(e, tRS_rD_out, tile_mnl, tiles_done, sD, epi, epi_barrier, tma_d, mD_tma,
                                       warp_idx, drain=True)
        else:
            tCcD = thr_mma_c.partition_C(cD[(None, None, *tile_mnl)])
            tCgD = thr_mma_c.partition_C(gD[(None, None, *tile_mnl)])
            for i in cutlass.range_constexpr(cute.size(acc)):
                if cute.elem_less(tCcD[i], mD.shape):
                    tCgD[i] = acc[i].to(self.c_dtype)
