"""Attention forward (prefill) benchmark: flash_attn vs cuDNN SDPA / FA2 SDPA / FA4, with its MMA bound
(softmax compiled out) and a cuBLAS matmul of the same FLOPs -- ``cute-kernels bench attention`` with
this folder's ``results/`` as the default output (the code: :mod:`cute_kernels.tools.bench.attention`).

    python profiles/bench_attention.py [--quick] [--only SUBSTR] [--shapes NAMES] [--tag T] [--out-dir DIR]
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from cute_kernels.tools.bench import attention
from cute_kernels.tools.bench.attention import SHAPES, build_impls, flops_bytes  # noqa: F401

if __name__ == "__main__":
    sys.exit(attention.main(["--out", os.path.join(HERE, "results"), *sys.argv[1:]], prog="bench_attention.py"))
