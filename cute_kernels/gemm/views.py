"""Torch-ordered GEMM operands as the kernels' (rows, cols, batch) views, and the host-side setup
every GEMM kernel starts with.  Inside a DSL context."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from layouts import tiles as T


def as_mkl(t: cute.Tensor, order: tuple[int, ...]) -> cute.Tensor:
    """View a torch-ordered tensor as the kernel's (rows, cols, batch) without moving data.

    ``order`` lists which torch modes become (rows, cols[, batch]); a rank-2 input gets a batch mode
    of size 1 and stride 0.  Doing this inside the compiled function keeps ``permute`` calls (each a
    host-side tensor op) off the hot path.
    """
    lay = cute.select(t.layout, mode=list(order))
    if cutlass.const_expr(len(order) == 2):
        lay = cute.append(lay, cute.make_layout(1, stride=0))
    return cute.make_tensor(t.iterator, lay)


def gemm_views(a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor, rank: int):
    """Torch-ordered GEMM operands as the kernels' (M,K,L), (N,K,L), (M,N,L), (M,N,L) views."""
    if rank == 3:
        return as_mkl(a, (1, 2, 0)), as_mkl(b, (2, 1, 0)), as_mkl(d, (1, 2, 0)), as_mkl(c, (1, 2, 0))
    return as_mkl(a, (0, 1)), as_mkl(b, (1, 0)), as_mkl(d, (0, 1)), as_mkl(c, (0, 1))


def gemm_host_setup(tiles, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor, rank: int):
    """What every GEMM kernel's host entry starts with: operand views, the tiled MMA and the staged
    shared-memory layouts of A, B and the epilogue, all from :mod:`layouts.tiles`."""
    mA, mB, mD, mC = gemm_views(a, b, d, c, rank)
    return (mA, mB, mD, mC, T.make_tiled_mma(tiles.mma), T.make_smem_layout_a(tiles),
            T.make_smem_layout_b(tiles), T.make_smem_layout_epi(tiles))
