"""The compile target the DSL is pointed at, set before ``cutlass`` is first imported: the DSL reads
``CUTE_DSL_ARCH`` once, and without a GPU assumes Blackwell.  Whichever of :mod:`layouts` or
:mod:`cute_kernels` is imported first sets it to ``sm_90a`` (or the device's arch, or
``CUTE_KERNELS_ARCH``), so a CPU-only machine builds real ``sm_90a`` cubins.  Pure Python.
"""

from __future__ import annotations

import os

DEFAULT_ARCH = "sm_90a"


def cuda_capability() -> tuple[int, int] | None:
    """The current CUDA device's compute capability, or None without a usable GPU."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_capability()
    except Exception:  # torch missing or broken CUDA: treat as no GPU
        pass
    return None


def detect_arch_name() -> str:
    """The arch to compile for: ``CUTE_KERNELS_ARCH`` if set, else the device's, else sm_90a."""
    forced = os.environ.get("CUTE_KERNELS_ARCH")
    if forced:
        return forced
    cap = cuda_capability()
    if cap is None:
        return DEFAULT_ARCH
    major, minor = cap
    return f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"


def set_dsl_arch_env() -> None:
    """Point the DSL at our target before it is imported (it reads the variable only once)."""
    os.environ.setdefault("CUTE_DSL_ARCH", detect_arch_name())
