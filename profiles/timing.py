"""The benchmarks' timers now live in the package, :mod:`cute_kernels.tools.bench.timing`; this module
re-exports them for the scripts here (``from timing import bench_clean, rotated``)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from cute_kernels.tools.bench.timing import (
    LEAD_CYCLES,
    bench_clean,
    bench_events,
    bench_graph,
    make_bench,
    precompile_and_report,
    read_only_flush,
    rotated,
    time_rounds,
)

__all__ = ["LEAD_CYCLES", "bench_clean", "bench_events", "bench_graph", "make_bench", "precompile_and_report",
           "read_only_flush", "rotated", "time_rounds"]
