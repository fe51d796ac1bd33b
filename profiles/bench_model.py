"""End-to-end decode on a Llama-3-8B-shaped Transformers model (4 layers, random weights, KV cache
pre-filled): the kernels (``attn_implementation="cute_kernels"`` + ``patch_linear``) against the same
model on PyTorch sdpa + cuBLAS, eager and in CUDA graphs, batch 1 / 8 / 32 x context 4k / 32k, with
the split between attention, GEMMs and the rest and the step's read bound (issue 20).

A thin wrapper of :mod:`cute_kernels.tools.bench_model` (also ``cute-kernels bench model``):

    python3 profiles/bench_model.py [--quick] [--family llama|mistral] [--layers N] [--batches 1,8,32]
        [--contexts 4k,32k] [--out DIR]

``--family mistral`` (issue 34): the same shapes as a ``MistralForCausalLM`` with a 4096-key sliding
window (:mod:`cute_kernels.tools.bench_model_families`).  Writes ``model-decode-DATE-COMMIT.json``
(mistral: ``model-decode-mistral-DATE-COMMIT.json``) and ``.md`` to ``--out`` (default profiles/results);
``CK_COMMIT`` names the commit where the device copy has no usable .git.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from cute_kernels.tools.bench_model import main

if __name__ == "__main__":
    sys.exit(main())
