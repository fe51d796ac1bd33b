"""The Hopper GEMM: ``gemm`` (:mod:`.host`), its kernels (:mod:`.kernel`, :mod:`.splitk_kernel`,
:mod:`.cpasync_kernel`) and the autotuner (:mod:`.tune`)."""

from .host import explain, gemm, warmup_gemm

__all__ = ["gemm", "explain", "warmup_gemm"]
