"""Named barriers (``bar.sync`` / ``bar.arrive`` ids 1..15) and the warpgroup-ordering helpers.

Hardware barrier 0 is ``__syncthreads``; every other id a kernel uses comes from
:class:`NamedBarrierId`, so two helpers in one kernel never pick the same id by accident.
"""

from __future__ import annotations

import enum

import cutlass
import cutlass.cute as cute

THREADS_PER_WARPGROUP = 128


class NamedBarrierId(enum.IntEnum):
    """Ids of the named barriers the kernels use (0 is ``__syncthreads``)."""

    #: the consumer warpgroups that share one tile: epilogue sub-tile hand-offs, split-K handshakes
    EPILOGUE = 1
    #: first of the ids that order warpgroups (:func:`wait_turn` / :func:`pass_turn`): warpgroup w
    #: waits on ``WG_ORDER + w``; ids WG_ORDER .. WG_ORDER + 3 are reserved for up to four warpgroups
    WG_ORDER = 2
    #: first id free for a kernel's own use
    FIRST_FREE = 6


# ---------------------------------------------------------------------------- warpgroup ordering
# Turn-taking of ``count`` warpgroups over a shared resource (the tensor cores), in the order
# 0, 1, ..., count-1, 0, 1, ...  Warpgroup ``w`` calls :func:`wait_turn` before its turn (except the
# very first turn of warpgroup 0) and :func:`pass_turn` as soon as it is done with the resource (e.g.
# right after issuing its last wgmma of a tile, so the next warpgroup issues while the tensor cores
# drain these).  Each hand-over is one named barrier of two warpgroups: the passer arrives (does not
# block), the next one syncs.  This is how CUTLASS's / quack's ping-pong consumers keep one warpgroup's
# epilogue under the other's mainloop, and how an attention forward orders its two softmax
# warpgroups' GEMMs.  Balance: at most one arrival per barrier may be left when the CTA exits, and
# no warpgroup may wait for a turn whose predecessor does not exist.
# Plain functions, not an object: a DSL loop would try to carry an object whose methods it calls.
WG_ORDER_MAX = 4  # warpgroups that can be ordered: ids WG_ORDER .. WG_ORDER + 3


@cute.jit
def wait_turn(wg, base: cutlass.Constexpr[int] = int(NamedBarrierId.WG_ORDER)):
    """Block warpgroup ``wg`` (0-based among the ordered ones) until its predecessor passed the turn on."""
    cute.arch.barrier(barrier_id=base + wg, number_of_threads=2 * THREADS_PER_WARPGROUP)


@cute.jit
def pass_turn(wg, count: cutlass.Constexpr[int] = 2, base: cutlass.Constexpr[int] = int(NamedBarrierId.WG_ORDER)):
    """Warpgroup ``wg`` hands the turn to warpgroup ``(wg + 1) % count`` without waiting."""
    if cutlass.const_expr(not 2 <= count <= WG_ORDER_MAX):
        raise ValueError(f"pass_turn: 2..{WG_ORDER_MAX} ordered warpgroups, got {count}")
    nxt = (wg + 1) % count
    cute.arch.barrier_arrive(barrier_id=base + nxt, number_of_threads=2 * THREADS_PER_WARPGROUP)


# ---------------------------------------------------------------------------- grid-wide turns
# CTAs that add into the same global buffer in a fixed order (a deterministic reduction) take turns on
# an int32 semaphore in global memory, zeroed before the launch: the CTA whose turn is ``t`` waits until
# the semaphore reads ``t``, adds, makes its adds complete, then counts the semaphore up.  One thread of
# each side calls these; the caller orders its other threads around them (a warp or named barrier).
# Progress needs every earlier turn's CTA to be resident or done: the turns follow the launch order
# (a lower block index takes an earlier turn), which the hardware dispatches in order.
@cute.jit
def wait_count(ptr: cute.Pointer, value):
    """Spin until the int32 at ``ptr`` (global) reads ``value`` (``ld.acquire.gpu``: what the CTA that
    counted it up made visible before is visible to this thread after)."""
    seen = cute.arch.load(ptr, cutlass.Int32, sem="acquire", scope="gpu")
    while seen != value:
        seen = cute.arch.load(ptr, cutlass.Int32, sem="acquire", scope="gpu")


@cute.jit
def count_up(ptr: cute.Pointer):
    """Add 1 to the int32 at ``ptr`` (global) after a ``fence.acq_rel.gpu``, with release semantics: the
    writes this thread saw complete, and those a barrier ordered before this call, are visible to the
    :func:`wait_count` that reads the new value."""
    cute.arch.fence_acq_rel_gpu()
    cute.arch.atomic_add(ptr, cutlass.Int32(1), sem="release", scope="gpu")
