"""Softcapping and sink configurations of the attention kernels, CPU side (compiled for sm_90a, nothing run):
each compiles with no local-memory traffic and no stack, with the plain configuration's tensor-core
bodies, one ``MUFU.TANH`` per score of each softmax body when it softcaps (none otherwise) and one
global load for the sink (the forward's plain kernels load nothing but by TMA).  The plain
configurations keep their entries' arguments (the variants' values are trailing arguments only their
own configurations take), and compile to no variant code.  (That the plain configurations' SASS is
the same as before the variants existed was checked when they were added: the same SASS hashes for
dense, causal, window, packed and paged forwards and for decode, split or not.)  The GPU tests are in
``test_variants.py``."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from layouts import attention as LA

VARIANTS = {"softcap": dict(softcap=True), "sink": dict(sink=True), "both": dict(softcap=True, sink=True)}


def _report(builder, name: str):
    from cute_kernels.tools import inspect as ins

    rep = ins.inspect_builder(builder)
    (k,) = [k for k in rep.kernels if name in k.name]
    assert k.spills == 0 and k.stack_frame == 0, rep.summary()
    return rep, k


def _tanh(rep) -> int:
    return len(re.findall(r"\bMUFU\.TANH\b", rep.sass))


def _forward(cfg, bodies: int):
    """Compile a forward config; check its wgmma bodies, its tanh count (one per score of each softmax
    body: tile_n / 2 per thread) and its global loads (the sink's)."""
    from cute_kernels.attention.forward_kernel import forward_builder

    rep, k = _report(forward_builder(cfg), "FlashAttnFwdSm90")
    t = cfg.tile
    assert k.instructions["HGMMA"] == bodies * (cfg.head_dim // 16 + t.tile_n // 16), rep.summary()
    assert _tanh(rep) == (bodies * t.tile_n // 2 if cfg.softcap else 0), rep.summary()
    return rep, k


PAIRS = [(D, v) for D in LA.FWD_HEAD_DIMS for v in VARIANTS if v == "both" or D in (64, 256)]


@pytest.mark.parametrize("head_dim,variant", PAIRS, ids=[f"D{d}-{v}" for d, v in PAIRS])
def test_forward_variants_compile_without_spills(head_dim, variant):
    from cute_kernels.attention.forward_kernel import fwd_config

    cfg = fwd_config("bfloat16", head_dim, head_dim != 64, **VARIANTS[variant])
    plain = fwd_config("bfloat16", head_dim, head_dim != 64).tile
    if cfg.softcap and head_dim == 64:  # three warpgroups: a narrower KV tile (128 keys spill with tanh)
        assert cfg.tile == dataclasses.replace(plain, tile_n=112)
    else:
        assert cfg.tile == plain  # the same tile and schedule
    rep, k = _forward(cfg, 3)
    print(f"D={head_dim} {variant}: {rep.summary()}")
    assert k.instructions["LDG"] == (1 if cfg.sink else 0), rep.summary()  # the sink (epilogue), else TMA only


MODES = [  # (varlen, window, causal, page_size, head_dim)
    (True, False, True, 0, 128), (False, True, False, 0, 128), (True, True, False, 0, 128),
    (False, False, True, 64, 128), (True, True, False, 16, 64),
]


@pytest.mark.parametrize("varlen,window,causal,page_size,head_dim", MODES,
                         ids=[f"{'varlen' if v else 'dense'}{'-window' if w else ''}{'-causal' if c else ''}"
                              f"{f'-ps{p}' if p else ''}-D{d}" for v, w, c, p, d in MODES])
def test_forward_variant_modes_compile(varlen, window, causal, page_size, head_dim):
    """Packed, windowed and paged configurations with both variants (a window: four softmax bodies)."""
    from cute_kernels.attention.forward_kernel import fwd_config

    cfg = fwd_config("bfloat16", head_dim, causal, varlen=varlen, window=window, page_size=page_size, softcap=True,
                     sink=True)
    rep, _ = _forward(cfg, 4 if window else 3)
    print(f"varlen={varlen} window={window} causal={causal} ps={page_size}: {rep.summary()}")


def test_plain_forward_has_no_variant_code():
    from cute_kernels.attention.forward_kernel import fwd_config

    rep, k = _forward(fwd_config("bfloat16", 128, True), 3)
    assert k.instructions["LDG"] == 0 and _tanh(rep) == 0, rep.summary()


@pytest.mark.parametrize("mode", ["dense", "window", "varlen", "paged", "paged_varlen"])
def test_entries_take_the_variants_as_trailing_arguments(mode):
    """The fake arguments each configuration compiles with: the plain ones unchanged (dense 8 with the
    stream, window 10, varlen 14, paged 12, paged varlen 14), ``softcap_scale`` then the sink after them."""
    from cute_kernels.attention.forward_kernel import forward_builder, fwd_config

    kw = dict(varlen=mode in ("varlen", "paged_varlen"), window=mode == "window",
              page_size=64 if mode.startswith("paged") else 0)
    base = {"dense": 8, "window": 10, "varlen": 14, "paged": 12, "paged_varlen": 14}[mode]
    for extra in ({}, dict(softcap=True), dict(sink=True), dict(softcap=True, sink=True)):
        cfg = fwd_config("bfloat16", 64, False, **kw, **extra)
        entry, args = forward_builder(cfg)()
        assert len(args) == base + len(extra) and len(cfg.variant_args) == len(extra), (mode, extra)


def test_variant_config_rules():
    from cute_kernels.attention.forward_kernel import FlashFwdConfig, fwd_config

    plain = fwd_config("bfloat16", 128, False)
    assert plain.variant_args == () and plain != fwd_config("bfloat16", 128, False, softcap=True)
    assert fwd_config("bfloat16", 128, False, sink=True, softcap=True).variant_args == ("softcap_scale", "learnable_sink")
    with pytest.raises(ValueError, match="mma_only"):
        FlashFwdConfig("bfloat16", 128, False, plain.tile, mma_only=True, softcap=True)


DECODE = [  # (head_dim, split, paged, kv_bytes, variant)
    (64, False, False, 1 << 20, "both"), (64, True, True, 0, "both"), (128, True, False, 1 << 20, "both"),
    (128, False, False, 1 << 30, "both"), (128, True, False, 1 << 30, "softcap"), (128, True, True, 0, "sink"),
    (256, True, False, 1 << 20, "both"), (256, False, True, 0, "both"),
]


@pytest.mark.parametrize("head_dim,split,paged,kv_bytes,variant", DECODE,
                         ids=[f"D{d}-{'split' if s else 'direct'}-{'paged' if p else ('tma' if b < 1 << 28 else 'cpasync')}"
                              f"-{v}" for d, s, p, b, v in DECODE])
def test_decode_variants_compile_without_spills(head_dim, split, paged, kv_bytes, variant):
    """Decode configurations with softcapping / sinks (TMA and cp.async loads, paged, split or not):
    no local-memory traffic, tanh only when softcapping; the plain configuration has none."""
    from cute_kernels.attention.decode import decode_builder
    from cute_kernels.attention.decode_plan import make_config

    flags = VARIANTS[variant]
    cfg = make_config(torch.bfloat16, head_dim, 8, paged, 16 if paged else 0, True, split, kv_bytes, **flags)
    assert cfg.tile == make_config(torch.bfloat16, head_dim, 8, paged, 16 if paged else 0, True, split, kv_bytes).tile
    rep, k = _report(decode_builder(cfg), "DecodeAttnKernel")
    print(f"{cfg}: {rep.summary()}")
    assert (_tanh(rep) > 0) == bool(flags.get("softcap")), rep.summary()
    _, args = decode_builder(cfg)()
    assert len(args) == 11 + len(cfg.variant_args)


def test_plain_decode_has_no_variant_code():
    from cute_kernels.attention.decode import decode_builder
    from cute_kernels.attention.decode_plan import make_config

    cfg = make_config(torch.bfloat16, 128, 8, False, 0, True, True, 1 << 20)
    assert cfg.variant_args == ()
    rep, _ = _report(decode_builder(cfg), "DecodeAttnKernel")
    assert _tanh(rep) == 0
    _, args = decode_builder(cfg)()
    assert len(args) == 11
