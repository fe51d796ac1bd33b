"""One place for the element types the kernels accept: torch dtype <-> name <-> cutlass type.

Kernel configurations carry dtypes as names (strings hash and print well in compile-cache keys);
the host side maps torch tensors to names, the DSL side maps names to cutlass types.
No DSL import here: the host side reads this module on every call, the DSL types are looked up at a
compile's first :func:`to_cutlass`.
"""
import torch

TORCH_TO_NAME = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
#: dtype name -> the cutlass numeric type's name
NAME_TO_CUTLASS = {"float16": "Float16", "bfloat16": "BFloat16", "float32": "Float32"}

# 16-bit operand types the tensor-core kernels take as inputs.
HALF_NAMES = ("float16", "bfloat16")
HALF_TORCH = (torch.float16, torch.bfloat16)


def to_cutlass(name: str):
    """cutlass numeric type for a dtype name ("float16" | "bfloat16" | "float32")."""
    try:
        type_name = NAME_TO_CUTLASS[name]
    except KeyError:
        raise ValueError(f"unsupported dtype name {name!r}; expected one of {sorted(NAME_TO_CUTLASS)}") from None
    import cutlass

    return getattr(cutlass, type_name)


def name_of(dtype) -> str:
    """dtype name for a torch dtype (raises ValueError for an unsupported one)."""
    try:
        return TORCH_TO_NAME[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype}; expected one of {list(TORCH_TO_NAME)}") from None
