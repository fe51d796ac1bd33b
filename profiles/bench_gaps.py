"""Issue 36's gaps: its nine rows (decode, GEMM, forward), each of ours against the figure its target
names under the paired timer, met or not -- ``cute-kernels bench gaps`` with this folder's
``results/`` as the default output (the code: :mod:`cute_kernels.tools.bench.gaps`).

    python3 profiles/bench_gaps.py [--repeats N] [--only SUBSTR] [--quick] [--tag T] [--out-dir DIR]
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from cute_kernels.tools.bench import gaps

if __name__ == "__main__":
    sys.exit(gaps.main(["--out", os.path.join(HERE, "results"), *sys.argv[1:]], prog="bench_gaps.py"))
