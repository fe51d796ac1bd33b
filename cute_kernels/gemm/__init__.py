"""The Hopper GEMM: ``gemm``, ``explain``, ``warmup_gemm`` (:mod:`.host`); planning in :mod:`.plan`
(:class:`~.plan.PlanChoice` forces decisions, :func:`~.plan.plan` shows the plan a call runs), the
pure-Python choices in :mod:`.heuristics`, the autotuner in :mod:`.tune`, the kernels in
:mod:`.kernel` / :mod:`.epilogue`, :mod:`.splitk_kernel` and :mod:`.cpasync_kernel`."""

from .host import explain, gemm, warmup_gemm

__all__ = ["gemm", "explain", "warmup_gemm"]
