"""Argument parsing shared by the ``cute-kernels`` command and its ``layouts`` subcommand: errors in
one line, integer ranges checked where they are parsed."""

from __future__ import annotations

import argparse
from typing import Callable


def one_line(e: BaseException | str) -> str:
    """An exception's message (or any text) on one line."""
    text = " ".join(str(e).split())
    return text or type(e).__name__


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, ``PROG: error: MESSAGE (see PROG --help)`` with exit
    status 2, without the usage block argparse prints first; ``--help`` still shows the usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``lo..hi`` (``hi`` None: no upper bound)."""

    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be {f'>= {lo}' if hi is None else f'in {lo}..{hi}'}, got {v}")
        return v

    parse.__name__ = "integer"
    return parse


# ---- problem bounds ------------------------------------------------------------------------------
#: the largest size of one dimension the command takes: the kernels index with 32-bit signed sizes
MAX_DIM = 2**31 - 1
#: the memory a problem's tensors must fit: an H200's 143,771 MiB, the largest Hopper part
GPU_MEMORY_BYTES = 143_771 * 2**20
BOUNDS_HELP = (f"Bounds: each size at most 2^31 - 1 = {MAX_DIM}, and the tensors of the problem (inputs and output) "
               f"must fit in an H200's memory ({GPU_MEMORY_BYTES / 2**30:.1f} GiB).")


def check_fits(what: str, nbytes: int) -> None:
    """ValueError (one line) when a problem's tensors (``nbytes``) do not fit in :data:`GPU_MEMORY_BYTES`."""
    if nbytes > GPU_MEMORY_BYTES:
        raise ValueError(f"{what} need {nbytes / 2**30:,.1f} GiB, more than an H200's "
                         f"{GPU_MEMORY_BYTES / 2**30:.1f} GiB")


def gemm_bytes(m: int, n: int, k: int, batch: int | None, in_bytes: int, out_bytes: int, with_c: bool) -> int:
    """Bytes of a, b, the output and (``with_c``) c of one GEMM problem."""
    return (batch or 1) * ((m * k + k * n) * in_bytes + m * n * out_bytes * (2 if with_c else 1))
