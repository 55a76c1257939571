"""Fixtures for the metrics tests: fresh registries and the names the code really exports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from service.metrics import JobCounts, ServiceMetrics
from workers import metrics as wm

# Series names a family of each type exposes in the Prometheus text format.
_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}


def exported_series(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


@pytest.fixture
def service_metrics() -> ServiceMetrics:
    return ServiceMetrics(CollectorRegistry())


@pytest.fixture
def worker_metrics() -> Iterator[wm.WorkerMetrics]:
    metrics = wm.WorkerMetrics(CollectorRegistry())
    previous = wm.activate(metrics)
    yield metrics
    wm.activate(previous)


@pytest.fixture
def exported_names() -> set[str]:
    """Every series name the server and the worker export, read from their registries."""
    service = ServiceMetrics(CollectorRegistry())
    service.watch_jobs(lambda: JobCounts())
    worker = wm.WorkerMetrics(CollectorRegistry())
    return exported_series(service.registry) | exported_series(worker.registry)
