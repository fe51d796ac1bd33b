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
