"""``import cute_kernels`` imports no DSL (``cutlass`` takes seconds) and no optional peer
(``transformers``); the public names load their modules when first read and stay what they were:
``cute_kernels.gemm`` is the function even after its subpackage's modules are imported."""

import subprocess
import sys

import pytest


def run(code: str) -> list[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.split()


def test_import_imports_no_dsl():
    got = run("import cute_kernels, layouts, sys; "
              "print('cutlass' in sys.modules, 'transformers' in sys.modules, "
              "any(m.startswith('cutlass') for m in sys.modules))")
    assert got == ["False", "False", "False"]


def test_first_read_loads_the_op_and_its_custom_ops():
    """Reading an op loads its host module and registers its custom ops, still without the DSL (a
    compile imports it: tests/common/test_warm_hit_no_dsl.py)."""
    got = run("import cute_kernels, sys, torch\n"
              "f = cute_kernels.flash_attn\n"
              "print('cutlass' in sys.modules, f.__module__, hasattr(torch.ops.cute_kernels, 'flash_attn_'))")
    assert got == ["False", "cute_kernels.attention.forward", "True"]


@pytest.mark.parametrize("first", ["import cute_kernels.gemm.plan", "from cute_kernels.gemm import plan",
                                   "import cute_kernels.integrations.hf", "import cute_kernels.gemm"])
def test_gemm_stays_the_function(first):
    got = run(f"import cute_kernels\n{first}\nimport cute_kernels\n"
              "from cute_kernels.gemm import host\n"
              "print(cute_kernels.gemm is host.gemm, callable(cute_kernels.gemm))")
    assert got == ["True", "True"]


def test_every_public_name_resolves_and_warmup_knows_every_op():
    """``cute_kernels.warmup`` imports every op module first: each registers its warm-up there."""
    got = run("import cute_kernels\n"
              "from cute_kernels.common import jit\n"
              "before = sorted(jit._warmers)\n"
              "cute_kernels.warmup\n"
              "print(before, sorted(jit._warmers), all(callable(getattr(cute_kernels, n)) for n in cute_kernels.__all__))")
    assert got == ["[]", "['decode_attn',", "'flash_attn',", "'flash_attn_backward',", "'gemm',", "'merge_states']",
                   "True"]
    assert set(dir(__import__("cute_kernels"))) >= {"gemm", "flash_attn", "decode_attn", "sdpa", "warmup"}


def test_unknown_name_is_an_attribute_error():
    import cute_kernels

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cute_kernels.nope
