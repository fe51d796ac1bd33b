"""cute-kernels: Hopper (sm_90a) kernels in the CuTe Python DSL, JIT-compiled and cached.

Public API: :func:`gemm`, :func:`flash_attn` (differentiable), :func:`flash_attn_backward`, :func:`decode_attn`, :func:`merge_states`, :func:`merge_state`,
:func:`warmup`, :func:`sdpa` (torch's ``scaled_dot_product_attention`` on the kernels).  Kernels compile at
first use for their configuration and are cached in memory and on disk (``CUTE_KERNELS_CACHE_DIR``).

Packages: :mod:`cute_kernels.common` (blocks every kernel is built from), :mod:`cute_kernels.gemm`,
:mod:`cute_kernels.attention` (forward, decode, merge), :mod:`cute_kernels.tools` (CLI, inspection, report).
"""

from layouts.lazy import lazy_exports
from layouts.target import set_dsl_arch_env

set_dsl_arch_env()  # before anything imports cutlass

# The public functions load their modules (and the DSL, seconds) when first read: ``import
# cute_kernels`` costs little more than ``import torch``.  The ``gemm`` subpackage is loaded here
# (its __init__ is as lazy) so that its later import never rebinds ``cute_kernels.gemm``, the function.
from . import gemm as _gemm_package  # noqa: E402,F401

del globals()["gemm"]  # the import system's binding of the subpackage: ``cute_kernels.gemm`` reads the function

_OPS = {"gemm": ".gemm.host", "flash_attn": ".attention.forward", "flash_attn_backward": ".attention.backward",
        "decode_attn": ".attention.decode",
        "merge_states": ".attention.merge", "merge_state": ".attention.merge", "sdpa": ".integrations.sdpa"}


def _register_ops(name: str) -> None:
    """``warmup`` compiles any op's configuration: import every op module (each registers its warm-up)."""
    if name == "warmup":
        import importlib

        for module in set(_OPS.values()):
            importlib.import_module(module, __name__)


__getattr__, __dir__ = lazy_exports(__name__, globals(), {**_OPS, "warmup": ".common.jit"}, before=_register_ops)

__version__ = "0.1.0"
__all__ = ["gemm", "flash_attn", "flash_attn_backward", "decode_attn", "merge_states", "merge_state", "warmup", "sdpa"]
