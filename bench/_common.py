"""Shared helpers for the benchmarks: median of repeats, models built here."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

__all__ = ["median_seconds", "paired_medians"]


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def paired_medians(
    first: Callable[[], object], second: Callable[[], object], repeats: int = 9
) -> tuple[float, float]:
    """Median seconds of two workloads timed alternately, so that drifting machine load hits both."""
    first()
    second()
    a, b = [], []
    for _ in range(repeats):
        for fn, out in ((first, a), (second, b)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(a), statistics.median(b)
