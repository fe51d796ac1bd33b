"""cute-kernels: Hopper (sm_90a) kernels in the CuTe Python DSL, JIT-compiled and cached."""

from .arch import set_dsl_arch_env

set_dsl_arch_env()  # before anything imports cutlass

__version__ = "0.1.0"
