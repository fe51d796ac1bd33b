"""``cute_kernels.warmup`` on the CPU, nothing compiled (:class:`jit.dry_run` records what would be):
a gemm warmup plans on meta tensors (a 10**6 x 10**6 problem allocates nothing); flags must be bools
and sizes ints (``causal='no'`` would compile the causal kernel, ``head_dim=64.9`` head dim 64);
``decode`` names the decode_attn warmup (the CLI's name); every entry is checked before any compiles."""

from __future__ import annotations

import pytest
import torch

import cute_kernels
from cute_kernels.attention import explain as decode_explain
from cute_kernels.common import jit
from cute_kernels.gemm import host


def test_gemm_warmup_plans_on_meta_tensors(monkeypatch):
    """Every tensor the gemm warmup makes (operands, the plan's output probe) is a meta tensor, and a
    problem whose operands would take 2 TB plans the configs ``explain`` reports."""
    devices = []
    real_empty = torch.empty

    def recording_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        devices.append(t.device.type)
        return t

    monkeypatch.setattr(torch, "empty", recording_empty)
    spec = dict(m=10**6, n=8, k=10**6, with_c=True, b_major="col")
    with jit.dry_run() as warm:
        assert cute_kernels.warmup([("gemm", spec)]) == 1
    assert devices and set(devices) == {"meta"}, devices
    # the cache is asked for (kernel, (config, dtype names...)); explain reports (kernel, config)
    assert [(name, key[0]) for name, key in warm.seen] == [(r["kernel"], r["config"]) for r in host.explain(**spec)]


@pytest.mark.parametrize("name,spec,match", [
    ("flash_attn", dict(head_dim=64, causal="no"), "flash_attn: causal must be a bool, got str 'no'"),
    ("flash_attn", dict(head_dim=64, varlen=1), "varlen must be a bool"),
    ("flash_attn", dict(head_dim=64, window=None), "window must be a bool"),
    ("flash_attn", dict(head_dim=64.9), "head_dim must be an int, got float 64.9"),
    ("flash_attn", dict(head_dim=True), "head_dim must be an int"),
    ("flash_attn", dict(head_dim=64, page_size=64.0), "page_size must be an int"),
    ("flash_attn", dict(dtype=3), "dtype must be a torch.dtype or its name"),
    ("gemm", dict(m=64, n=64, k=64, with_c="no"), "gemm: with_c must be a bool, got str 'no'"),
    ("gemm", dict(m=64, n=64, k=64, batch=2.0), "batch must be an int or None"),
    ("gemm", dict(m=64, n=64, k=64, dtype="bfloat16"), "dtype must be a torch.dtype"),
    ("gemm", dict(m=64, n=64, k=64, out_dtype="float32"), "out_dtype must be a torch.dtype or None"),
])
def test_warmup_refuses_values_taken_at_face_value(name, spec, match):
    with jit.dry_run() as dry, pytest.raises(TypeError, match=match):
        cute_kernels.warmup([(name, spec)])
    assert dry.seen == []


def test_warmup_takes_real_bools_and_ints():
    """The kinds checked are the ones a call passes: True / False, ints of any integer type."""
    import numpy as np

    with jit.dry_run() as dry:
        assert cute_kernels.warmup([("flash_attn", dict(head_dim=np.int64(64), causal=True)),
                                    ("gemm", dict(m=64, n=64, k=64, batch=None, with_c=False))]) == 2
    assert [n for n, _ in dry.seen][:1] == ["flash_attn_fwd"] and len(dry.seen) >= 2


def test_decode_names_the_decode_attn_warmup():
    cfg = decode_explain(1, 32, 8, 4096)["config"]
    with jit.dry_run() as dry:
        assert cute_kernels.warmup([("decode", cfg)]) == 1
    with jit.dry_run() as direct:
        cute_kernels.warmup([("decode_attn", cfg)])
    assert dry.seen == direct.seen == [("decode_attn", cfg)]


def test_every_entry_is_checked_before_any_compiles():
    with jit.dry_run() as dry, pytest.raises(TypeError, match="causal"):
        cute_kernels.warmup([("gemm", dict(m=64, n=64, k=64)), ("flash_attn", dict(causal="yes"))])
    assert dry.seen == []
    with pytest.raises(ValueError, match=r"unknown kernel 'decoder'; known: .*'decode'"):
        cute_kernels.warmup([("decoder", {})])
