"""cute-kernels: Hopper (sm_90a) kernels in the CuTe Python DSL, JIT-compiled and cached.

Public API: :func:`gemm`, :func:`decode_attn`, :func:`merge_states`, :func:`merge_state`,
:func:`warmup`.  Kernels compile at first use for their configuration and are cached in memory and on
disk (``CUTE_KERNELS_CACHE_DIR``).
"""

from .arch import set_dsl_arch_env

set_dsl_arch_env()  # before anything imports cutlass

from .decode_attn import decode_attn  # noqa: E402
from .gemm_host import gemm  # noqa: E402
from .jit import warmup  # noqa: E402
from .merge import merge_state, merge_states  # noqa: E402

__version__ = "0.1.0"
__all__ = ["gemm", "decode_attn", "merge_states", "merge_state", "warmup"]
