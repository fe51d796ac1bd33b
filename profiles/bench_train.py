"""Issue 33's training step: forward + loss + backward + AdamW of a Llama-3-8B-shaped Transformers
model (4 layers, random weights, bf16, lengths 4096 and 8192) on the kernels (with and without
``patch_linear``) against HF's sdpa on each of torch's SDPA backends, paired timer, attention / GEMM /
rest split -- ``cute-kernels bench train`` with this folder's ``results/`` as the default output (the
code: :mod:`cute_kernels.tools.bench.train`).

    python3 profiles/bench_train.py [--quick] [--layers N] [--seqs 4k,8k] [--batch B] [--repeats N]
                                    [--sides LIST] [--tag T] [--out-dir DIR]
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from cute_kernels.tools.bench import train

if __name__ == "__main__":
    sys.exit(train.main(["--out", os.path.join(HERE, "results"), *sys.argv[1:]], prog="bench_train.py"))
