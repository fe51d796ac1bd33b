"""Decode-attention benchmark: decode_attn (contiguous and paged) vs cuDNN SDPA / FA2 SDPA / FA4, with
a bare read of the KV bytes -- ``cute-kernels bench decode`` with this folder's ``results/`` as the
default output (the code: :mod:`cute_kernels.tools.bench.decode`).

    python profiles/bench_decode.py [--quick] [--only SUBSTR] [--shapes NAMES] [--size-sweep] [--tag T] [--out-dir DIR]

``SHAPES``, ``build_impls`` and ``to_paged`` are re-exported for read_ceiling.py.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from cute_kernels.tools.bench import decode
from cute_kernels.tools.bench.decode import (  # noqa: F401
    SHAPES,
    SIZE_SWEEP_SHAPES,
    D,
    build_impls,
    to_paged,
)

if __name__ == "__main__":
    sys.exit(decode.main(["--out", os.path.join(HERE, "results"), *sys.argv[1:]], prog="bench_decode.py"))
