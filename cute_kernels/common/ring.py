"""mbarrier rings: the full/empty ring between a TMA producer warp and its consumer warps
(:func:`make_tma_pipeline`), the full-barrier-only ring of a CTA whose threads all consume every stage
(:class:`TxRing`).  How many stages fit is
:func:`layouts.tiles.stage_count` (tile budgets live with the tiles)."""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

def make_tma_pipeline(barrier_ptr, num_stages: int, tx_bytes: int, consumer_warps: int,
                      cluster_layout_mnk: cute.Layout, mcast_ctas: int, mcast_mode_mn=(1, 1)):
    """The full/empty mbarrier ring between the TMA producer warp and the wgmma consumers.

    Each consumer warp arrives once per stage on the empty barrier of every CTA that multicast into it,
    hence ``consumer_warps * mcast_ctas`` arrivals.  ``mcast_mode_mn``: which cluster modes multicast
    ((1, 0): only the CTAs of one "m" row share loads, as in split-K where mode 0 is the K slice).
    """
    producer = pipeline.CooperativeGroup(pipeline.Agent.Thread)
    consumer = pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_warps * mcast_ctas)
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=barrier_ptr,
        num_stages=num_stages,
        producer_group=producer,
        consumer_group=consumer,
        tx_count=tx_bytes,
        cta_layout_vmnk=cute.make_layout((1, *cluster_layout_mnk.shape)),
        mcast_mode_mn=mcast_mode_mn,
        defer_sync=True,
    )


@dataclass(frozen=True)
class TxRing:
    """A ring of full barriers only, for a CTA whose threads all consume every stage: one mbarrier
    per stage (arrival count 1) completed by the TMA transaction bytes of its loads.

    Why no empty barriers: when the whole CTA reads every slot, the CTA barrier that already orders
    a tile's consumers (``bar.sync`` before the refill) also says the slot is free, so the producer
    needs no per-slot release (the decode kernel's ring; a warp-specialized kernel uses
    :func:`make_tma_pipeline` instead).  Stage ``i`` of the walk uses slot ``i % stages`` in phase
    ``(i // stages) % 2``.  Methods run inside a DSL trace; ``mbar`` points at ``stages`` Int64s in
    shared memory.  Frozen: the DSL treats a frozen dataclass as read-only in dynamic control flow.
    """

    mbar: cute.Pointer
    stages: int

    @cute.jit
    def init(self):
        """One thread: initialize the barriers (then ``mbarrier_init_fence`` + a CTA barrier)."""
        for s in cutlass.range_constexpr(self.stages):
            cute.arch.mbarrier_init(self.mbar + s, 1)

    @cute.jit
    def arm(self, slot, nbytes: cutlass.Constexpr):
        """One warp (all 32 lanes, warp-uniform): an elected lane arrives on ``slot`` expecting
        ``nbytes`` (the full TMA boxes, clipped ones included)."""
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(self.mbar + slot, nbytes)

    def barrier(self, slot):
        """The barrier pointer TMA copies into ``slot`` signal."""
        return self.mbar + slot

    @cute.jit
    def wait(self, slot, i):
        """Wait until stage ``i`` (in ``slot`` = ``i % stages``) has landed."""
        cute.arch.mbarrier_wait(self.mbar + slot, (i // self.stages) % 2)
