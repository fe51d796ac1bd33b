import os

import pytest
import torch

# Every test gets its own compile cache directory unless one is given: tests must not depend on
# (or pollute) the user's cache.
os.environ.setdefault("CUTE_KERNELS_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "cute_kernels"))

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN/Inf in out -> inf."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()
