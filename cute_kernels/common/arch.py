"""Target architecture (set by :mod:`layouts.target`, re-exported here) and the device facts a compile
needs (SM count, shared memory per CTA): from the live device when there is one, else ``ARCH_TABLE``;
they are part of every compile-cache key.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from layouts.target import DEFAULT_ARCH, cuda_capability, detect_arch_name, set_dsl_arch_env  # noqa: F401


@dataclass(frozen=True)
class ArchInfo:
    """Facts about one GPU target that change generated code or launch shapes."""

    name: str  # e.g. "sm_90a"
    sm_count: int  # persistent grids are sized from this
    smem_per_cta: int  # bytes of dynamic shared memory one CTA may use
    l2_bytes: int = 50 * 1024 * 1024

    def key(self) -> tuple:
        return (self.name, self.sm_count, self.smem_per_cta)


#: Facts for CPU compiles. H100 SXM and H200 both have 132 SMs and 227 KB of shared memory per CTA.
ARCH_TABLE: dict[str, ArchInfo] = {
    "sm_90a": ArchInfo("sm_90a", sm_count=132, smem_per_cta=227 * 1024),
}


def has_gpu() -> bool:
    return cuda_capability() is not None


@functools.lru_cache(maxsize=None)
def current_arch() -> ArchInfo:
    """ArchInfo for the compile target; live SM count when a GPU is present (H100 PCIe has 114)."""
    name = detect_arch_name()
    base = ARCH_TABLE.get(name)
    if base is None:
        raise RuntimeError(
            f"cute-kernels targets Hopper (sm_90a); this device is {name}. "
            "Set CUTE_KERNELS_ARCH=sm_90a to compile (not run) for Hopper."
        )
    if has_gpu() and not os.environ.get("CUTE_KERNELS_ARCH"):
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return ArchInfo(
            name,
            sm_count=props.multi_processor_count,
            smem_per_cta=base.smem_per_cta,
            l2_bytes=getattr(props, "L2_cache_size", base.l2_bytes),
        )
    return base
