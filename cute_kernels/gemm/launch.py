"""Compiled GEMM kernels and how a plan calls them: the compile-cache getter (its builder, every
compile's fake arguments, in :mod:`.entries`: the DSL is imported by a compile, not by a cache hit), and
the launchers that add a workspace or transpose operands.

A skinny problem runs transposed (out^T = b^T a^T).  Compiled with ``swapped=True`` the kernel's host
entry takes the problem's torch-ordered (a, b, d, c) and makes the transposes layout views inside the
compiled function (:class:`~.entries.SwappedEntry`): no ``.mT`` views on the host, ~1 us each per call."""

from __future__ import annotations

import torch

from ..common import jit
from .config import GemmConfig, SplitKClusterConfig, SplitKFixupConfig


def __getattr__(name: str):
    """The DSL side (``fake_args``, ``SwappedEntry``, ``SwappedFixupEntry``), from :mod:`.entries`."""
    if name in ("fake_args", "SwappedEntry", "SwappedFixupEntry"):
        from . import entries

        return getattr(entries, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: compile-cache family (the kernel's name in ``explain``) of each config type
FAMILY = {GemmConfig: "gemm_sm90", SplitKClusterConfig: "gemm_sm90_splitk_cluster",
          SplitKFixupConfig: "gemm_sm90_splitk_fixup"}


def compiled(cfg, ab_dtype: str, d_dtype: str, c_dtype: str, swapped: bool = False):
    """The compiled kernel for ``cfg`` (memory / disk cache, else compile): a TVM-FFI function taking
    torch tensors, ``fn(a, b, d, c[, ws, cnt], alpha, beta)``; ``swapped``: the :class:`~.entries.SwappedEntry`
    (same arguments, the problem's torch-ordered operands of a transposed-problem config)."""
    key = (cfg, ab_dtype, d_dtype, c_dtype, "swapped") if swapped else (cfg, ab_dtype, d_dtype, c_dtype)
    return jit.get_compiled(FAMILY[type(cfg)], key, jit.lazy_builder(f"{__package__}.entries", "builder", cfg, ab_dtype,
                                                                       d_dtype, c_dtype, swapped))


class WorkspaceLauncher:
    """Calls a last-CTA-fixup kernel like the others, adding its workspace (fp32 partials + int32
    counters), cached per (device, stream): the kernel leaves the counters at 0 and launches on one
    stream are ordered.  During CUDA-graph capture a fresh pair is allocated (zeroing captured)."""

    def __init__(self, fn, ws_numel: int, n_counters: int):
        self.fn, self.ws_numel, self.n_counters, self.cache = fn, ws_numel, n_counters, {}

    def workspace(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        return jit.stream_buffers(self.cache, device, lambda: (
            torch.empty(self.ws_numel, dtype=torch.float32, device=device),
            torch.zeros(self.n_counters, dtype=torch.int32, device=device)))

    def __call__(self, a, b, d, c, alpha, beta):
        ws, cnt = self.workspace(a.device)
        self.fn(a, b, d, c, ws, cnt, alpha, beta)


class SwappedLauncher:
    """Calls a kernel compiled for the transposed problem.  ``torch_order``: ``fn`` is a swapped entry
    (:func:`compiled` with ``swapped=True``) and takes (a, b, d, c) as they are; else (b^T, a^T, d^T,
    c^T) are made here, as ``.mT`` views."""

    def __init__(self, fn, torch_order: bool = False):
        self.fn, self.torch_order = fn, torch_order

    def __call__(self, a, b, d, c, alpha, beta):
        if self.torch_order:
            self.fn(a, b, d, c, alpha, beta)
        else:
            self.fn(b.mT, a.mT, d.mT, c.mT, alpha, beta)
