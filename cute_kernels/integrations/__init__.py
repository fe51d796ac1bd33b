"""Integrations of the kernels into PyTorch-level interfaces: :mod:`.sdpa` (``cute_kernels.sdpa``, a
drop-in for ``torch.nn.functional.scaled_dot_product_attention``).  Nothing here imports an optional peer
(transformers) at ``import cute_kernels``; the package re-exports no function, so
``cute_kernels.integrations.sdpa`` stays the module."""

__all__: list = []
