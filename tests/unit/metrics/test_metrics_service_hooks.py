"""The one-line hooks the service calls with the metrics it was handed: no-ops for None."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from service import metrics as sm
from service.metrics_interceptor import MetricsInterceptor, metrics_interceptors


@dataclass(frozen=True)
class FakeJob:
    kind: str
    created_at: float
    started_at: float | None = None
    attempts: int = 0


@pytest.fixture
def activated() -> Iterator[sm.ServiceMetrics]:
    yield sm.ServiceMetrics(CollectorRegistry())


def value(m: sm.ServiceMetrics, series: str, **labels: str) -> float:
    return m.registry.get_sample_value(series, labels) or 0.0


def test_no_metrics_hooks_do_nothing_and_add_no_interceptor() -> None:
    assert metrics_interceptors(None) == []
    sm.record_submitted(None, FakeJob("audit", time.time()), created=True)  # no error, nowhere to count
    assert list(sm.counted_chunks(None, [1, 2])) == [1, 2]
    signer = object()
    assert sm.counted_signer(None, signer) is signer


def test_job_lifecycle_hooks(activated: sm.ServiceMetrics) -> None:
    m = activated
    [interceptor] = metrics_interceptors(m)
    assert isinstance(interceptor, MetricsInterceptor)
    now = time.time()
    job = FakeJob("attribution", now - 10.0)
    sm.record_submitted(m, job, created=True)
    sm.record_submitted(m, job, created=False)  # the same request again: not a new job
    sm.record_started(m, FakeJob("attribution", now - 10.0, now - 4.0, attempts=1), claimed=True)
    sm.record_started(m, FakeJob("attribution", now - 10.0, now - 4.0, attempts=2), claimed=True)  # re-run
    sm.record_started(m, FakeJob("attribution", now - 10.0, now - 4.0, attempts=1), claimed=False)
    sm.record_finished(m, job, "succeeded", accepted=True)
    sm.record_finished(m, job, "succeeded", accepted=False)  # a duplicate result, dropped by the store
    assert value(m, "xaudit_jobs_submitted_total", kind="attribution") == 1
    assert value(m, "xaudit_job_queue_wait_seconds_count", kind="attribution") == 1
    assert value(m, "xaudit_job_queue_wait_seconds_sum", kind="attribution") == pytest.approx(6.0)
    assert value(m, "xaudit_jobs_finished_total", kind="attribution", outcome="succeeded") == 1
    assert value(m, "xaudit_job_duration_seconds_sum", kind="attribution") == pytest.approx(10.0, abs=1.0)


def test_failed_and_cancelled(activated: sm.ServiceMetrics) -> None:
    job = FakeJob("audit", time.time() - 1.0)
    sm.record_failed(activated, job, "INVALID_ARGUMENT", accepted=True)
    sm.record_failed(activated, job, "CANCELLED", accepted=True)
    sm.record_failed(activated, job, "INTERNAL", accepted=False)
    assert value(activated, "xaudit_jobs_finished_total", kind="audit", outcome="failed") == 1
    assert value(activated, "xaudit_jobs_finished_total", kind="audit", outcome="cancelled") == 1


def test_counted_chunks_count_model_bytes_only(activated: sm.ServiceMetrics) -> None:
    @dataclass
    class Chunk:
        data: bytes = b""

    chunks = [Chunk(), Chunk(b"x" * 1000), Chunk(b"y" * 24)]  # metadata first: no data
    assert list(sm.counted_chunks(activated, chunks)) == chunks
    assert value(activated, "xaudit_upload_bytes_total") == 1024


def test_counted_signer(activated: sm.ServiceMetrics) -> None:
    class Signer:
        def __init__(self) -> None:
            self.fail = False

        def sign(self, report: bytes, model_sha256: str, model_name: str, inputs_sha256: str) -> bytes:
            if self.fail:
                raise OSError("key file unreadable")
            return b"signed:" + report

        def public_keys(self) -> list[tuple[str, str]]:
            return [("k1", "PEM")]

    inner = Signer()
    signer = sm.counted_signer(activated, inner)
    assert signer.sign(b"r", "m", "n", "i") == b"signed:r"
    assert signer.public_keys() == [("k1", "PEM")]
    inner.fail = True
    with pytest.raises(OSError):
        signer.sign(b"r", "m", "n", "i")
    assert value(activated, "xaudit_signing_failures_total") == 1


def test_queue_depth_and_running_read_from_a_real_job_store(
    activated: sm.ServiceMetrics, tmp_path: Path
) -> None:
    from service.store import JobStore, NewJob

    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        model, _ = store.record_model("t", "a" * 64, "onnx", 10, "m")

        def new(key: str, kind: str) -> str:
            job, created = store.create_job(
                NewJob(
                    "t",
                    kind,
                    model,
                    "b" * 64,
                    "{}",
                    "xaudit.cpu",
                    key,
                    {"inputs": np.zeros((1, 2), np.float32)},
                )
            )
            assert created
            return job.id

        first = new("k1", "audit")
        new("k2", "audit")
        new("k3", "attribution")
        store.claim(first, "worker-1", lease_seconds=60)
        sm.watch_store(activated, store)
        m = activated
        assert value(m, "xaudit_queue_depth", kind="audit") == 1
        assert value(m, "xaudit_queue_depth", kind="attribution") == 1
        assert value(m, "xaudit_jobs_running", kind="audit") == 1
        assert value(m, "xaudit_jobs_running", kind="attribution") == 0
    finally:
        store.close()
