"""Prometheus metrics of the gRPC front end.

Every metric lives on the :class:`~prometheus_client.CollectorRegistry` given to
:class:`ServiceMetrics`; tests build one on a fresh registry. Label values are clamped to small
known sets (job kinds, outcomes, gRPC codes, the methods the server really serves), so no client
input can create new series. Queue depth and running jobs are read from the job store at scrape
time (the store, not the broker, is the source of truth), through :meth:`ServiceMetrics.watch_jobs`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from xaudit.contract.metrics_http import serve_metrics

__all__ = [
    "JOB_BUCKETS",
    "JOB_KINDS",
    "JOB_OUTCOMES",
    "RPC_BUCKETS",
    "JobCounts",
    "ServiceMetrics",
    "activate",
    "active",
    "counted_chunks",
    "counted_signer",
    "record_failed",
    "record_finished",
    "record_started",
    "record_submitted",
    "start_service_metrics",
    "store_job_counts",
    "watch_store",
]

logger = logging.getLogger(__name__)

JOB_KINDS: tuple[str, ...] = ("audit", "attribution")
JOB_OUTCOMES: tuple[str, ...] = ("succeeded", "failed", "cancelled")
_UNKNOWN = "unknown"

# Seconds. Unary RPCs take milliseconds; streams (UploadModel, WatchJob) can last minutes.
RPC_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
)
# Seconds. Jobs take from a second (one cheap method) to hours (the fourteen methods on a large image).
JOB_BUCKETS: tuple[float, ...] = (
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1200.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
)


def _kind(kind: str) -> str:
    return kind if kind in JOB_KINDS else _UNKNOWN


@dataclass(frozen=True)
class JobCounts:
    """Jobs per state and kind, as the job store counts them now."""

    queued: Mapping[str, int] = field(default_factory=dict)  # kind -> jobs recorded and not yet started
    running: Mapping[str, int] = field(default_factory=dict)  # kind -> jobs a worker holds


class _JobStateCollector(Collector):
    """``xaudit_queue_depth`` and ``xaudit_jobs_running``, computed from the store at each scrape."""

    def __init__(self) -> None:
        self.source: Callable[[], JobCounts] | None = None

    def describe(self) -> Iterable[Metric]:
        return self._families(JobCounts())

    def collect(self) -> Iterable[Metric]:
        source = self.source
        if source is None:
            return []
        try:
            counts = source()
        except Exception:  # a failing store must not fail the whole scrape
            logger.warning("cannot count jobs for the metrics scrape", exc_info=True)
            return []
        return self._families(counts)

    @staticmethod
    def _families(counts: JobCounts) -> list[Metric]:
        queued = GaugeMetricFamily(
            "xaudit_queue_depth",
            "Jobs recorded in the job store and waiting for a worker (queued), by kind.",
            labels=["kind"],
        )
        running = GaugeMetricFamily(
            "xaudit_jobs_running", "Jobs a worker is computing now, by kind.", labels=["kind"]
        )
        for family, values in ((queued, counts.queued), (running, counts.running)):
            for kind in JOB_KINDS:
                family.add_metric([kind], float(values.get(kind, 0)))
        return [queued, running]


class ServiceMetrics:
    """The server's metrics, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.rpcs_handled = Counter(
            "xaudit_grpc_server_handled",
            "RPCs completed by the server, by service, method, type and gRPC status code.",
            ["service", "method", "type", "code"],
            registry=registry,
        )
        self.rpc_seconds = Histogram(
            "xaudit_grpc_server_handling_seconds",
            "Time from receiving an RPC to its last response message, by service, method and type.",
            ["service", "method", "type"],
            buckets=RPC_BUCKETS,
            registry=registry,
        )
        self.jobs_submitted = Counter(
            "xaudit_jobs_submitted",
            "New jobs recorded by the Submit RPCs (idempotent resubmissions not counted), by kind.",
            ["kind"],
            registry=registry,
        )
        self.jobs_finished = Counter(
            "xaudit_jobs_finished",
            "Jobs that reached a final state, by kind and outcome (succeeded, failed, cancelled).",
            ["kind", "outcome"],
            registry=registry,
        )
        self.job_seconds = Histogram(
            "xaudit_job_duration_seconds",
            "Wall time of finished jobs from submission to the final state, by kind.",
            ["kind"],
            buckets=JOB_BUCKETS,
            registry=registry,
        )
        self.job_queue_seconds = Histogram(
            "xaudit_job_queue_wait_seconds",
            "Time jobs waited between submission and a worker starting them, by kind.",
            ["kind"],
            buckets=JOB_BUCKETS,
            registry=registry,
        )
        self.upload_bytes = Counter(
            "xaudit_upload_bytes",
            "Model bytes received by UploadModel (rejected uploads included).",
            registry=registry,
        )
        self.signing_failures = Counter(
            "xaudit_signing_failures", "Reports the service could not sign.", registry=registry
        )
        self._job_states = _JobStateCollector()
        registry.register(self._job_states)
        for kind in JOB_KINDS:  # series exist at 0 from the start, so rate() and alerts see them
            self.jobs_submitted.labels(kind)
            for outcome in JOB_OUTCOMES:
                self.jobs_finished.labels(kind, outcome)

    # --- jobs -------------------------------------------------------------------------------
    def watch_jobs(self, source: Callable[[], JobCounts] | None) -> None:
        """Read queue depth and running jobs from ``source`` (the job store) at each scrape."""
        self._job_states.source = source

    def job_submitted(self, kind: str) -> None:
        self.jobs_submitted.labels(_kind(kind)).inc()

    def job_started(self, kind: str, queued_seconds: float) -> None:
        self.job_queue_seconds.labels(_kind(kind)).observe(max(0.0, queued_seconds))

    def job_finished(self, kind: str, outcome: str, seconds: float) -> None:
        outcome = outcome if outcome in JOB_OUTCOMES else _UNKNOWN
        self.jobs_finished.labels(_kind(kind), outcome).inc()
        self.job_seconds.labels(_kind(kind)).observe(max(0.0, seconds))

    # --- uploads and signing ----------------------------------------------------------------
    def upload_received(self, nbytes: int) -> None:
        self.upload_bytes.inc(max(0, nbytes))

    def signing_failed(self) -> None:
        self.signing_failures.inc()

    # --- RPCs (called by the interceptor) ---------------------------------------------------
    def rpc_handled(self, service: str, method: str, rpc_type: str, code: str, seconds: float) -> None:
        self.rpcs_handled.labels(service, method, rpc_type, code).inc()
        self.rpc_seconds.labels(service, method, rpc_type).observe(seconds)


# --- the entry point's metrics, and one-line helpers for the call sites that are handed them ---------
# ``xaudit serve --metrics-port`` (or a test) activates one ServiceMetrics; create_server reads it once
# and passes it to everything that records (the job service, the servicers, the interceptor). Deeper
# code never reads this module's state: None (no metrics) is passed like any recorder.
_active: ServiceMetrics | None = None
_active_lock = threading.Lock()
T = TypeVar("T")


class _Job(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def created_at(self) -> float: ...
    @property
    def started_at(self) -> float | None: ...
    @property
    def attempts(self) -> int: ...


def activate(metrics: ServiceMetrics | None) -> ServiceMetrics | None:
    """Make ``metrics`` the instance the next server built records to (None: none); return the previous."""
    global _active
    with _active_lock:
        previous, _active = _active, metrics
    return previous


def active() -> ServiceMetrics | None:
    return _active


def record_submitted(m: ServiceMetrics | None, job: _Job, created: bool) -> None:
    """After the store recorded a submission; resubmissions (``created`` False) are not counted."""
    if m is not None and created:
        m.job_submitted(job.kind)


def record_started(m: ServiceMetrics | None, job: _Job, claimed: bool) -> None:
    """After a worker claimed the job: the queue wait of its first attempt."""
    if m is not None and claimed and job.attempts == 1 and job.started_at is not None:
        m.job_started(job.kind, job.started_at - job.created_at)


def record_finished(m: ServiceMetrics | None, job: _Job, outcome: str, accepted: bool) -> None:
    """After the store moved the job to a final state (``accepted``); duration from submission to now."""
    if m is not None and accepted:
        m.job_finished(job.kind, outcome, time.time() - job.created_at)


def record_failed(m: ServiceMetrics | None, job: _Job, code: str, accepted: bool) -> None:
    """After a worker's FailJob was accepted: ``CANCELLED`` counts as cancelled, any other code as failed."""
    record_finished(m, job, "cancelled" if code == "CANCELLED" else "failed", accepted)


def counted_chunks(m: ServiceMetrics | None, chunks: Iterable[T]) -> Iterator[T]:
    """Pass UploadModel's messages through, counting the model bytes they carry."""
    for chunk in chunks:
        data = getattr(chunk, "data", b"")
        if m is not None and data:
            m.upload_received(len(data))
        yield chunk


class _CountedSigner:
    """A report signer whose failures are counted; everything else is the wrapped signer's."""

    def __init__(self, m: ServiceMetrics, signer: Any) -> None:
        self._metrics = m
        self._signer = signer

    def sign(self, report_bytes: bytes, model_sha256: str, model_name: str, inputs_sha256: str) -> bytes:
        try:
            envelope: bytes = self._signer.sign(report_bytes, model_sha256, model_name, inputs_sha256)
        except Exception:
            self._metrics.signing_failed()
            raise
        return envelope

    def __getattr__(self, name: str) -> Any:
        return getattr(self._signer, name)


def counted_signer(m: ServiceMetrics | None, signer: T) -> T:
    """Wrap the service's report signer so that signing failures are counted."""
    return signer if m is None else _CountedSigner(m, signer)  # type: ignore[return-value]


class _CountingStore(Protocol):
    def active_counts(self) -> dict[str, dict[str, int]]: ...


def store_job_counts(store: _CountingStore) -> JobCounts:
    """Queued and running jobs by kind, as the job store counts them (all tenants)."""
    counts = store.active_counts()
    return JobCounts(queued=counts.get("QUEUED", {}), running=counts.get("RUNNING", {}))


def watch_store(m: ServiceMetrics | None, store: _CountingStore) -> None:
    """Have ``m`` read queue depth and running jobs from ``store`` at each scrape."""
    if m is not None:
        m.watch_jobs(lambda: store_job_counts(store))


def start_service_metrics(port: int | None, addr: str = "0.0.0.0") -> int | None:
    """For ``xaudit serve --metrics-port``: activate metrics on the default registry (with the process
    and platform collectors) and serve them on ``http://addr:port/metrics``; None: do nothing."""
    if port is None:
        return None
    from prometheus_client import REGISTRY

    _server, bound = serve_metrics(port, REGISTRY, addr)
    if _active is None:  # once it serves: a refused port leaves nothing activated
        activate(ServiceMetrics(REGISTRY))
    return bound
