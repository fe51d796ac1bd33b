"""Host-side pieces of the DSL blocks, in a module that imports no DSL: the host paths (validation,
planning, keys, launches) use them on every call, and a warm disk-cache hit must not import the DSL
compiler for them (:mod:`.jit`).  The DSL modules re-export them where kernels read them."""

from __future__ import annotations

import math

import torch

from . import jit

#: log2(e) and ln(2): the softmax works in base 2 (``exp2(s * scale * LOG2_E - lse_log2)``)
LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)

#: a window side given as -1 (unbounded) reaches this far: beyond any length, and p + WINDOW_UNBOUNDED
#: stays far from the int32 limit
WINDOW_UNBOUNDED = 1 << 30

# ---- split-K's shared finish (:mod:`.fixup`) ------------------------------------------------------
#: fp32 per partial-tile chunk: one 16-byte store / load per thread and chunk
PARTIAL_VEC = 4
#: most K slices one tile's finish takes (the claim bits of its counter)
MAX_PARTS = 16

# ---- the dynamic tile scheduler's counter buffers (:mod:`.scheduler`) ------------------------------
_COUNTERS: dict = {}  # the dynamic schedule's, per (device, stream)
_STATIC: dict = {}  # a placeholder per device for static schedules (never touched)


def tile_counter(device: torch.device, dynamic: bool) -> torch.Tensor:
    """The dynamic schedule's two-int32 global tile counter (zero before each launch; the kernel's
    last CTA zeroes it again).  One per (device, stream), since two kernels running at once must not
    share one; a fresh zeroed one per call while a CUDA graph is being captured (the graph then
    zeroes it on every replay, and graphs replayed side by side do not share it):
    :func:`~cute_kernels.common.jit.stream_buffers`.  Static schedules never touch it: they get one
    per device."""
    if not dynamic:
        c = _STATIC.get(device)
        if c is None:
            c = _STATIC[device] = torch.zeros(2, dtype=torch.int32, device=device)
        return c
    return jit.stream_buffers(_COUNTERS, device, lambda: torch.zeros(2, dtype=torch.int32, device=device))
