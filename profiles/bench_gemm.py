"""GEMM benchmark: cute-kernels vs cuBLAS vs quack -- ``cute-kernels bench gemm`` with this folder's
``results/`` as the default output (the code: :mod:`cute_kernels.tools.bench.gemm`).

    python3 profiles/bench_gemm.py [--quick] [--quack-untuned] [--tune] [--out DIR] [--shapes MxNxK,...]
        [--preset issue|llm|decode] [--splitk-variants] [--configs 256x128:1x2:8m,...]

``explicit_config`` (our GEMM at an explicit tile / cluster / raster) is re-exported for ab_gemm.py.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from cute_kernels.tools.bench import gemm
from cute_kernels.tools.bench.gemm import DECODE, LARGE, LLM, SHAPES, explicit_config  # noqa: F401

if __name__ == "__main__":
    sys.exit(gemm.main(["--out", os.path.join(HERE, "results"), *sys.argv[1:]], prog="bench_gemm.py"))
