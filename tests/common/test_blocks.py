"""CPU compile tests of the shared attention-forward blocks: the one-tensor TMA producer
(``tma.tma_produce_tiles``), the single-tile wgmma step (``wgmma.wgmma_tile``, A from shared memory
and from registers) and the warpgroup-ordering named barriers (``barriers.wait_turn`` / ``pass_turn``).

The probe kernel is the skeleton of a FlashAttention forward: a producer warp loads Q once (a
one-stage ring) and K tiles through a ring of their own; two consumer warpgroups take turns on the
tensor cores: S = Q K^T (A from shared memory), then O += P K^T (P from registers)."""

import pytest

import cute_kernels  # noqa: F401  (sets the DSL arch before cutlass is imported)
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream
from cutlass.tensor_utils import LayoutEnum

from cute_kernels.common import ring, tma, wgmma
from cute_kernels.common.barriers import NamedBarrierId, WG_ORDER_MAX, pass_turn, wait_turn
from cute_kernels.tools import inspect as ins

TILE = 64  # rows of Q per warpgroup, K rows per tile, head dim
K_STAGES = 2


class BlocksProbe:
    """Q: (rows, TILE) with rows = 64 x 2 warpgroups; K: (L, TILE), L a multiple of TILE."""

    def __init__(self, a_source_rmem: bool):
        self.rmem = a_source_rmem
        self.dtype = cutlass.BFloat16

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, o: cute.Tensor, stream):
        dt = self.dtype
        kmaj = OperandMajorMode.K
        # S = Q K^T: 64 x TILE per warpgroup, both operands K-major in shared memory
        mma_s = sm90_utils.make_trivial_tiled_mma(dt, dt, kmaj, kmaj, cutlass.Float32, (1, 1, 1), (64, TILE))
        # O = P K^T: P (64 x TILE) from registers, the K tile as the (K-major) B operand again
        mma_o = sm90_utils.make_trivial_tiled_mma(dt, dt, kmaj, kmaj, cutlass.Float32, (1, 1, 1),
                                                  (64, TILE), warpgroup.OperandSource.RMEM)
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (128, TILE, TILE), dt, 1)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (128, TILE, TILE), dt, K_STAGES)
        tma_q, mQ = tma.make_tma_load(q, sQ_layout, (128, TILE))
        tma_k, mK = tma.make_tma_load(k, sK_layout, (TILE, TILE))

        @cute.struct
        class Storage:
            q_bar: cute.struct.MemRange[cutlass.Int64, 2]
            k_bar: cute.struct.MemRange[cutlass.Int64, K_STAGES * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]

        self.storage = Storage
        self.kernel(tma_q, mQ, tma_k, mK, o, mma_s, mma_o, sQ_layout, sK_layout).launch(
            grid=(1, 1, 1), block=(384, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, mQ: cute.Tensor, tma_k: cute.CopyAtom, mK: cute.Tensor, mO: cute.Tensor,
               mma_s: cute.TiledMma, mma_o: cute.TiledMma, sQ_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)
        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        one = cute.make_layout((1, 1, 1))
        q_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sQ_layout, (None, None, 0)))
        k_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sK_layout, (None, None, 0)))
        q_pipe = ring.make_tma_pipeline(storage.q_bar.data_ptr(), 1, q_bytes, 8, one, 1)
        k_pipe = ring.make_tma_pipeline(storage.k_bar.data_ptr(), K_STAGES, k_bytes, 8, one, 1)
        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)
        gQ = cute.local_tile(mQ, (128, TILE), (None, None))  # (128, TILE, 1, 1)
        gK = cute.local_tile(mK, (TILE, TILE), (None, None))  # (TILE, TILE, n, 1)
        tQsQ, tQgQ = cute.nvgpu.cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                                      cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cute.nvgpu.cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                                      cute.group_modes(gK, 0, 2))
        n_tiles = cute.size(gK, mode=[2])
        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1))
        if wg == 0:
            if warp_idx == 0:  # Q once, then every K tile through its own ring
                q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
                q_state = tma.tma_produce_tiles(q_pipe, q_state, tma_q, tQgQ[(None, 0, None)], tQsQ, 0, 1)
                k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, K_STAGES)
                k_state = tma.tma_produce_tiles(k_pipe, k_state, tma_k, tKgK[(None, None, 0)], tKsK, 0, n_tiles,
                                                policy=tma.L2_EVICT_FIRST)
                k_pipe.producer_tail(k_state)
        else:
            c = wg - 1  # consumer 0 / 1: rows 64c.. of Q
            thr_s = mma_s.get_slice(tidx % 128)
            tSrQ = mma_s.make_fragment_A(thr_s.partition_A(cute.local_tile(sQ, (64, TILE, 1), (c, 0, 0))))
            tSrK = mma_s.make_fragment_B(thr_s.partition_B(sK))
            acc_s = cute.make_rmem_tensor(thr_s.partition_shape_C((64, TILE)), cutlass.Float32)
            thr_o = mma_o.get_slice(tidx % 128)
            tOrK = mma_o.make_fragment_B(thr_o.partition_B(sK))
            acc_o = cute.make_rmem_tensor(thr_o.partition_shape_C((64, TILE)), cutlass.Float32)
            acc_o.fill(0.0)
            tOrP = cute.make_rmem_tensor(thr_o.partition_shape_A((64, TILE)), self.dtype)
            q_read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            q_pipe.consumer_wait(q_read)
            read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, K_STAGES)
            for t in cutlass.range(n_tiles, unroll=1):
                k_pipe.consumer_wait(read)
                if c == 1 or t > 0:
                    wait_turn(c)
                warpgroup.fence()
                wgmma.wgmma_tile(mma_s, acc_s, tSrQ, tSrK, 0, read.index, accumulate=cutlass.Boolean(False))
                warpgroup.commit_group()
                pass_turn(c, 2)
                warpgroup.wait_group(0)
                if cutlass.const_expr(self.rmem):
                    tOrP.store(acc_s.load().to(self.dtype))
                    mma_o.set(warpgroup.Field.ACCUMULATE, True)
                    warpgroup.fence()
                    wgmma.wgmma_tile(mma_o, acc_o, tOrP, tOrK, b_stage=read.index)
                    warpgroup.commit_group()
                    warpgroup.wait_group(0)
                k_pipe.consumer_release(read)
                read.advance()
            out = acc_o if cutlass.const_expr(self.rmem) else acc_s
            if tidx % 128 == 0:
                mO[c, 0] = out[0].to(self.dtype)
        pipeline.NamedBarrier(barrier_id=NamedBarrierId.EPILOGUE, num_threads=384).arrive_and_wait()


def _builder(rmem: bool):
    def build():
        bf = cutlass.BFloat16
        q = make_fake_compact_tensor(bf, (128, TILE), stride_order=(1, 0), assumed_align=16)
        k = make_fake_compact_tensor(bf, (cute.sym_int(divisibility=TILE), TILE), stride_order=(1, 0), assumed_align=16)
        o = make_fake_compact_tensor(bf, (2, 1), stride_order=(1, 0), assumed_align=16)
        return BlocksProbe(rmem), (q, k, o, make_fake_stream(use_tvm_ffi_env_stream=True))
    return build


def test_named_barrier_ids():
    assert NamedBarrierId.EPILOGUE == 1 and NamedBarrierId.WG_ORDER + WG_ORDER_MAX <= NamedBarrierId.FIRST_FREE <= 16
    assert len({int(b) for b in NamedBarrierId}) == len(NamedBarrierId)


@pytest.mark.parametrize("rmem", [False, True], ids=["smem-A", "smem-A+rmem-A"])
def test_blocks_compile_for_sm90a(rmem):
    """The probe compiles for sm_90a: TMA loads from the one-tensor producer, wgmma with A from shared
    memory (and from registers), the hand-over barriers (bar.sync / bar.arrive with 256 threads)."""
    rep = ins.inspect_builder(_builder(rmem))
    (k,) = rep.kernels
    assert k.spills == 0
    assert k.instructions["UTMALDG"] >= 2  # Q once + K tiles
    assert k.instructions["HGMMA"] >= (TILE // 16) * (2 if rmem else 1)
    assert "BAR.ARV" in rep.sass and "BAR.SYNC" in rep.sass


def test_precompile_in_processes_collects_errors_serially():
    """The one compile pool returns only the workers' error strings, in job order (one process: in
    this process, no spawn)."""
    from cute_kernels.common import jit

    assert jit.precompile_in_processes(str, [], processes=1) == []
    assert jit.precompile_in_processes(lambda j: None if j % 2 else f"job {j} failed", [0, 1, 2], processes=1) == [
        "job 0 failed", "job 2 failed"]
