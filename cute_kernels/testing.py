"""Public testing hook: how many calls of each op got past argument validation, and down which path.

Every public op bumps one counter at the point where it stops checking and starts computing:

==========================  =====================================================================
key                         counted where
==========================  =====================================================================
``"gemm"``                  right before the compiled GEMM kernel is called (:func:`.gemm.plan.run`)
``"gemm:fake"``             fake tensors (``FakeTensorMode``): a fake result, nothing compiled or launched
``"flash_attn"``            right before the compiled forward kernel is called
``"decode_attn"``           right before the compiled decode kernel (+ its merge) is called
``"decode_attn:cpu"``       CPU tensors: the float32 torch reference runs instead
``"merge_states"``          right before the compiled merge kernel is called
``"merge_states:torch"``    CPU tensors (or rows no 16-byte vector fits): torch ops run instead
==========================  =====================================================================

A kernel count moves even when the call then fails (no GPU, a driver error): it counts attempts,
after every argument check.  So "a bad argument never reaches a launch" reads, on any machine::

    with cute_kernels.testing.count_launches() as n:
        with pytest.raises(ValueError):
            cute_kernels.gemm(a, bad_b)
    assert n.total() == 0

The counters are plain ints in a dict (one increment per call: no lock, no function call); they
are process-wide and not thread-safe, which is enough for tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["KEYS", "LAUNCHES", "LaunchCounter", "count_launches", "launch_count"]

#: every key the ops count under (``op`` or ``op:path``)
KEYS = ("gemm", "gemm:fake", "flash_attn", "flash_attn_backward", "decode_attn", "decode_attn:cpu", "merge_states",
        "merge_states:torch")

#: the live counters, incremented in place by the ops (``LAUNCHES["gemm"] += 1``); read them
#: through :func:`launch_count` / :func:`count_launches`
LAUNCHES: dict[str, int] = dict.fromkeys(KEYS, 0)


def _matching(op: str | None) -> list[str]:
    if op is None:
        return list(LAUNCHES)
    keys = [k for k in LAUNCHES if k == op or k.startswith(op + ":")]
    if not keys:
        raise ValueError(f"launch_count: unknown op {op!r}; known keys: {list(LAUNCHES)}")
    return keys


def launch_count(op: str | None = None) -> int:
    """Calls counted since import: for one key (``"gemm:fake"``), for every path of one op
    (``"gemm"`` sums ``"gemm"`` and ``"gemm:fake"``: use :meth:`LaunchCounter.__getitem__` for the
    kernel alone), or for everything (None)."""
    return sum(LAUNCHES[k] for k in _matching(op))


class LaunchCounter:
    """The counts accumulated since this object was made (see :func:`count_launches`)."""

    def __init__(self):
        self._start, self._end = dict(LAUNCHES), None  # _end: frozen when the block exits

    def __getitem__(self, key: str) -> int:
        """The count of exactly ``key`` (``"gemm"``: kernel launches only)."""
        if key not in LAUNCHES:
            raise KeyError(f"unknown launch key {key!r}; known: {list(LAUNCHES)}")
        now = LAUNCHES if self._end is None else self._end
        return now[key] - self._start.get(key, 0)

    def total(self, op: str | None = None) -> int:
        """Every path of ``op`` (all ops for None)."""
        return sum(self[k] for k in _matching(op))

    def as_dict(self) -> dict[str, int]:
        """The keys that moved, with their counts."""
        return {k: self[k] for k in LAUNCHES if self[k]}

    def __repr__(self) -> str:
        return f"LaunchCounter({self.as_dict()})"


@contextmanager
def count_launches() -> Iterator[LaunchCounter]:
    """``with count_launches() as n: ...`` -- ``n["gemm"]``, ``n.total("decode_attn")``, ``n.total()``
    give what ran inside the block (frozen when it exits)."""
    counter = LaunchCounter()
    try:
        yield counter
    finally:
        counter._end = dict(LAUNCHES)
