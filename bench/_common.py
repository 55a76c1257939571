"""Shared helpers for the benchmarks: median of repeats, models built here."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

__all__ = ["median_seconds", "paired_medians", "peak_resident_mb"]


def peak_resident_mb() -> float:
    """This process's peak resident memory so far (VmHWM), in MB."""
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmHWM")).split()[1]) / 1024


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
    first: Callable[[], object], second: Callable[[], object], repeats: int = 9, sample_seconds: float = 0.02
) -> tuple[float, float]:
    """Median seconds per call of two workloads timed alternately, so that drifting machine load hits
    both. A workload of a few milliseconds is called several times per timed sample (the same number
    for both, at least ``sample_seconds`` in all): one call alone is mostly timer and scheduler noise."""
    t0 = time.perf_counter()
    first()
    t1 = time.perf_counter()
    second()
    slowest = max(t1 - t0, time.perf_counter() - t1, 1e-6)
    loops = max(1, math.ceil(sample_seconds / slowest))
    a, b = [], []
    for _ in range(repeats):
        for fn, out in ((first, a), (second, b)):
            t0 = time.perf_counter()
            for _ in range(loops):
                fn()
            out.append((time.perf_counter() - t0) / loops)
    return statistics.median(a), statistics.median(b)
