"""Torch-ordered GEMM operands as the kernels' (rows, cols, batch) views, and the host-side setup
every GEMM kernel starts with.  Inside a DSL context."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from layouts import tiles as T


def as_mkl(t: cute.Tensor, order: tuple[int, ...]) -> cute.Tensor:
    """View a torch-ordered tensor as the kernel's (rows, cols, batch): ``order`` lists which torch
    modes become (rows, cols[, batch]); rank 2 gets a batch mode of size 1, stride 0.  Done inside the
    compiled function, it keeps host-side ``permute`` calls off the hot path."""
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


@cute.jit  # traced inside a host entry, so the struct's (string) annotations get evaluated
def shared_storage(ab_dtype, d_dtype, stages: int, sA_layout, sB_layout, sD_layout=None):
    """Shared memory of the TMA-fed GEMM kernels, 1024-byte aligned (the 128-byte swizzle repeats every
    1024 bytes): the A/B ring's barriers, the split-K counter value broadcast to the consumers (unused
    without split; sA's alignment absorbs its 16 bytes), the A/B stages and the epilogue buffers (none
    without ``sD_layout``: the split-K kernels, whose DSMEM reduction tile may span the adjacent sA and
    sB instead)."""
    d_elems = 0 if sD_layout is None else cute.cosize(sD_layout)

    @cute.struct
    class SharedStorage:
        ab_barriers: cute.struct.MemRange[cutlass.Int64, stages * 2]
        flag: cute.struct.MemRange[cutlass.Int32, 4]
        sA: cute.struct.Align[cute.struct.MemRange[ab_dtype, cute.cosize(sA_layout)], 1024]
        sB: cute.struct.Align[cute.struct.MemRange[ab_dtype, cute.cosize(sB_layout)], 1024]
        sD: cute.struct.Align[cute.struct.MemRange[d_dtype, d_elems], 1024]

    return SharedStorage
