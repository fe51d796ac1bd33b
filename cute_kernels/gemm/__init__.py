"""The Hopper GEMM: ``gemm``, ``explain``, ``warmup_gemm`` (:mod:`.host`); planning in :mod:`.plan`
(:class:`~.plan.PlanChoice` forces decisions, :func:`~.plan.plan` shows the plan a call runs), the
pure-Python choices in :mod:`.heuristics`, the autotuner in :mod:`.tune`, the kernels in
:mod:`.kernel` / :mod:`.epilogue`, :mod:`.splitk_kernel` and :mod:`.cpasync_kernel`."""

from layouts.lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, globals(), dict.fromkeys(["gemm", "explain", "warmup_gemm"], ".host"))

__all__ = ["gemm", "explain", "warmup_gemm"]
