"""The attention benchmarks' shapes (issue 16's forward set, which the backward benchmark of issue 32
reuses): names ``b{B}_h{H}_s{S}_d{D}_{full|causal}`` / ``b{B}_hq{Hq}_hkv{Hkv}_s{S}_d{D}_{full|causal}``,
``--shapes`` / ``--only`` / ``--quick`` selection, and the forward's FLOP and byte counts.  Shared by
:mod:`.attention` (forward) and :mod:`.attention_backward`; no torch.
"""

from __future__ import annotations

import re

#: name, B, Hq, Hkv, S (= Sq = Sk), D, causal
SHAPES = [
    ("b4_h32_s4096_d128_full", 4, 32, 32, 4096, 128, False),
    ("b4_h32_s4096_d128_causal", 4, 32, 32, 4096, 128, True),
    ("b8_h32_s2048_d64_full", 8, 32, 32, 2048, 64, False),
    ("b1_h32_s16384_d128_causal", 1, 32, 32, 16384, 128, True),
    ("b2_hq32_hkv8_s8192_d128_causal", 2, 32, 8, 8192, 128, True),
    ("b16_h16_s1024_d128_causal", 16, 16, 16, 1024, 128, True),
    ("b4_h16_s4096_d256_full", 4, 16, 16, 4096, 256, False),
    ("b4_h32_s4096_d96_causal", 4, 32, 32, 4096, 96, True),
]
#: ``--quick``: two small shapes
QUICK = [("b2_h16_s2048_d128_full", 2, 16, 16, 2048, 128, False),
         ("b2_h16_s2048_d128_causal", 2, 16, 16, 2048, 128, True)]
_NAME = re.compile(r"^b(\d+)_(?:h(\d+)|hq(\d+)_hkv(\d+))_s(\d+)_d(\d+)_(full|causal)$")


def parse_shape(name: str) -> tuple:
    """``b{B}_h{H}_s{S}_d{D}_{full|causal}`` or ``b{B}_hq{Hq}_hkv{Hkv}_s{S}_d{D}_{full|causal}`` ->
    (name, B, Hq, Hkv, S, D, causal)."""
    m = _NAME.match(name.strip())
    if not m:
        raise ValueError(f"--shapes: expected b<B>_h<H>_s<S>_d<D>_(full|causal) or "
                         f"b<B>_hq<Hq>_hkv<Hkv>_s<S>_d<D>_(full|causal), got {name!r}")
    b, h, hq, hkv, s, d, mode = m.groups()
    hq, hkv = (int(h), int(h)) if h else (int(hq), int(hkv))
    b, s, d = int(b), int(s), int(d)
    if min(b, hq, hkv, s, d) < 1 or hq % hkv:
        raise ValueError(f"--shapes: {name!r}: sizes must be >= 1 and hq a multiple of hkv")
    return (name.strip(), b, hq, hkv, s, d, mode == "causal")


def select(shapes_arg: str = "", only: str = "", quick: bool = False) -> list[tuple]:
    shapes = [parse_shape(s) for s in shapes_arg.split(",") if s.strip()] if shapes_arg else \
        (QUICK if quick else SHAPES)
    return [s for s in shapes if not only or only in s[0]]


def flops_bytes(B, Hq, Hkv, S, D, causal) -> tuple[float, float]:
    """Unmasked FLOPs; bf16 bytes of Q, K, V read once and O written once."""
    f = 4.0 * B * Hq * S * S * D
    return (f / 2 if causal else f), 2.0 * B * S * D * (2 * Hq + 2 * Hkv)
