"""The mbarrier ring between a TMA producer warp and its consumers, and how many stages of it fit."""

from __future__ import annotations

import cutlass.cute as cute
import cutlass.pipeline as pipeline

MBARRIER_BYTES_RESERVED = 1024  # barriers + alignment slack kept out of the stage budget


def stage_count(smem_capacity: int, bytes_per_stage: int, fixed_bytes: int, max_stages: int = 8) -> int:
    """Pure Python: how many operand stages fit next to ``fixed_bytes`` (epilogue buffers etc.)."""
    n = (smem_capacity - MBARRIER_BYTES_RESERVED - fixed_bytes) // bytes_per_stage
    if n < 2:
        raise ValueError(
            f"only {n} pipeline stage(s) of {bytes_per_stage} B fit in {smem_capacity} B of shared memory; "
            "use a smaller tile"
        )
    return min(n, max_stages)


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
