"""cute-kernels: Hopper (sm_90a) kernels in the CuTe Python DSL, JIT-compiled and cached.

Public API: :func:`gemm`, :func:`flash_attn`, :func:`decode_attn`, :func:`merge_states`, :func:`merge_state`,
:func:`warmup`, :func:`sdpa` (torch's ``scaled_dot_product_attention`` on the kernels).  Kernels compile at
first use for their configuration and are cached in memory and on disk (``CUTE_KERNELS_CACHE_DIR``).

Packages: :mod:`cute_kernels.common` (blocks every kernel is built from), :mod:`cute_kernels.gemm`,
:mod:`cute_kernels.attention` (forward, decode, merge), :mod:`cute_kernels.tools` (CLI, inspection, report).
"""

from layouts.target import set_dsl_arch_env

set_dsl_arch_env()  # before anything imports cutlass

from .attention import decode_attn, flash_attn, merge_state, merge_states  # noqa: E402
from .common.jit import warmup  # noqa: E402
from .gemm import gemm  # noqa: E402
from .integrations.sdpa import sdpa  # noqa: E402

__version__ = "0.1.0"
__all__ = ["gemm", "flash_attn", "decode_attn", "merge_states", "merge_state", "warmup", "sdpa"]
