"""Fixtures the bench tests share."""

import pytest
import torch

from cute_kernels.tools.bench import ceiling, timing


@pytest.fixture
def fake_gpu(monkeypatch):
    """A bench run's orchestration on the CPU: CUDA calls stubbed, fixed roofs, and a timer that runs the
    call and returns a fixed time per implementation name (``fn.name``; set them in the returned dict,
    10 us by default)."""
    monkeypatch.setenv("CK_COMMIT", "test123")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(ceiling, "measure_roofs", lambda bench, quick=False: {"read_TBps": 4.0, "matmul_TFLOPs": 700.0})
    speeds = {}

    def bench(fn):
        fn()
        return speeds.get(getattr(fn, "name", None), 10.0)

    monkeypatch.setattr(timing, "make_bench", lambda quick: (bench, "stand-in timer"))
    return speeds
