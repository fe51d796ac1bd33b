import os

import pytest
import torch

# Every test gets its own compile cache directory unless one is given: tests must not depend on
# (or pollute) the user's cache.
os.environ.setdefault("CUTE_KERNELS_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "cute_kernels"))

HAS_CUDA = torch.cuda.is_available()


RUN_SLOW = os.environ.get("CUTE_KERNELS_SLOW_TESTS", "") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_slow = pytest.mark.skip(reason="slow (exhaustive compile sweep): set CUTE_KERNELS_SLOW_TESTS=1")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not RUN_SLOW:
            item.add_marker(skip_slow)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN/Inf in out -> inf."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


def make_c(kind: str, m: int, n: int) -> torch.Tensor:
    """A fresh random (m, n) C operand: 'row' bf16, 'transposed' bf16 (column-major view), 'fp32'."""
    if kind == "row":
        return torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    if kind == "transposed":
        return torch.randn(n, m, device="cuda", dtype=torch.bfloat16).t()
    return torch.randn(m, n, device="cuda", dtype=torch.float32)


def gemm_operand(shape, major, dtype, batch=None):
    """A (rows, cols) GEMM operand stored row- or column-major, fresh random values."""
    rows, cols = shape
    full = (batch, rows, cols) if batch else (rows, cols)
    if major == "row":
        return torch.randn(full, device="cuda", dtype=dtype)
    t = torch.randn((*full[:-2], cols, rows), device="cuda", dtype=dtype)
    return t.transpose(-1, -2)


def gemm_ref(a, b, alpha=1.0, beta=0.0, c=None):
    """alpha * a @ b + beta * c in float64."""
    r = alpha * (a.double() @ b.double())
    if c is not None:
        r = r + beta * c.double()
    return r


def gemm_tol(dtype):
    return 2e-2 if dtype == torch.bfloat16 else 5e-3


def spy_compiled_gemm(monkeypatch) -> list:
    """Record every GemmConfig the host compiles or looks up (``gemm_host.compiled_gemm``)."""
    from cute_kernels import gemm_host as G

    seen = []
    real = G.compiled_gemm

    def spy(cfg, *rest):
        seen.append(cfg)
        return real(cfg, *rest)

    monkeypatch.setattr(G, "compiled_gemm", spy)
    return seen


def capture_graph(fn):
    """Warm ``fn`` up on a side stream and capture one call of it in a CUDA graph (returned)."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    return g
