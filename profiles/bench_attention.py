"""Attention forward (prefill) benchmark: flash_attn vs cuDNN SDPA / FA2 SDPA / FA4, with its MMA bound
(softmax compiled out) and a cuBLAS matmul of the same FLOPs -- ``cute-kernels bench attention`` with
this folder's ``results/`` as the default output (the code: :mod:`cute_kernels.tools.bench.attention`).

    python profiles/bench_attention.py [--quick] [--only SUBSTR] [--shapes NAMES] [--tag T] [--out-dir DIR]

``--varlen``: issue 18's benchmark instead -- packed variable-length sequences, a paged K/V cache and a
sliding window against FlashAttention-4's ``flash_attn_varlen_func`` / ``flash_attn_func``, with our
dense kernel at the same work (the code: :mod:`cute_kernels.tools.bench.attention_varlen`):

    python profiles/bench_attention.py --varlen [--quick] [--only varlen,window,paged] [--repeats N]
                                       [--tag T] [--out-dir DIR]
                                       [--list | --dry-run]   (these two: no GPU)

``--backward``: issue 32's backward benchmark instead -- each side's ``torch.autograd.grad(out, (q, k, v),
dout)`` (ours, cuDNN SDPA, FA2 SDPA, FA4) on the same shapes, FLOPs 2.5x the forward's, beside the
backward's MMA bound (``mma_only=True``), every side's gradients checked against cuDNN's first, the
ratio to cuDNN against the target (geomean >= 1.0x, none below 0.9x) (the code:
:mod:`cute_kernels.tools.bench.attention_backward`; GPU step ``bench-attention-backward``):

    python profiles/bench_attention.py --backward [--quick] [--only SUBSTR] [--shapes NAMES] [--repeats N]
                                       [--tag T] [--out-dir DIR]

``--backward --varlen``: issue 33's packed backward instead -- ours vs FlashAttention-4's varlen backward
(``torch.autograd.grad`` of one packed forward each) on the ``--varlen`` bench's two packed cases, the
paired timer, gradients checked against FA4's and a float32 reference (the code:
:mod:`cute_kernels.tools.bench.attention_backward_varlen`; GPU step ``bench-attention-backward-varlen``):

    python profiles/bench_attention.py --backward --varlen [--quick] [--only SUBSTR] [--repeats N]
                                       [--tag T] [--out-dir DIR] [--list]
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from cute_kernels.tools.bench import attention, attention_backward, attention_backward_varlen, attention_varlen  # noqa: F401
from cute_kernels.tools.bench.attention import SHAPES, build_impls, flops_bytes  # noqa: F401

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--varlen" in argv and "--backward" in argv:
        argv = [a for a in argv if a not in ("--varlen", "--backward")]
        sys.exit(attention_backward_varlen.main(["--out", os.path.join(HERE, "results"), *argv],
                                                prog="bench_attention.py --backward --varlen"))
    if "--varlen" in argv:
        argv.remove("--varlen")
        sys.exit(attention_varlen.main(["--out", os.path.join(HERE, "results"), *argv],
                                       prog="bench_attention.py --varlen"))
    if "--backward" in argv:  # attention.main hands it to attention_backward; named so in its messages
        argv.remove("--backward")
        sys.exit(attention_backward.main(["--out", os.path.join(HERE, "results"), *argv],
                                         prog="bench_attention.py --backward"))
    sys.exit(attention.main(["--out", os.path.join(HERE, "results"), *argv], prog="bench_attention.py"))
