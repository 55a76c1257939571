"""Server metrics move as the functions are called; label values stay in their small sets."""

from __future__ import annotations

import pytest

from service.metrics import JobCounts, ServiceMetrics


def value(m: ServiceMetrics, name: str, **labels: str) -> float:
    got = m.registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def test_jobs_submitted_and_finished(service_metrics: ServiceMetrics) -> None:
    m = service_metrics
    assert m.registry.get_sample_value("xaudit_jobs_submitted_total", {"kind": "audit"}) == 0.0  # pre-created
    m.job_submitted("audit")
    m.job_submitted("audit")
    m.job_submitted("attribution")
    m.job_finished("audit", "failed", 12.0)
    m.job_finished("audit", "succeeded", 3.0)
    assert value(m, "xaudit_jobs_submitted_total", kind="audit") == 2
    assert value(m, "xaudit_jobs_submitted_total", kind="attribution") == 1
    assert value(m, "xaudit_jobs_finished_total", kind="audit", outcome="failed") == 1
    assert value(m, "xaudit_jobs_finished_total", kind="audit", outcome="succeeded") == 1
    assert value(m, "xaudit_job_duration_seconds_count", kind="audit") == 2
    assert value(m, "xaudit_job_duration_seconds_sum", kind="audit") == pytest.approx(15.0)
    assert value(m, "xaudit_job_duration_seconds_bucket", kind="audit", le="5.0") == 1


def test_unexpected_label_values_are_clamped(service_metrics: ServiceMetrics) -> None:
    m = service_metrics
    m.job_submitted("model-1234")  # never a new series per client-supplied string
    m.job_finished("audit", "exploded", 1.0)
    assert value(m, "xaudit_jobs_submitted_total", kind="unknown") == 1
    assert value(m, "xaudit_jobs_finished_total", kind="audit", outcome="unknown") == 1
    assert m.registry.get_sample_value("xaudit_jobs_submitted_total", {"kind": "model-1234"}) is None


def test_queue_wait_uploads_signing(service_metrics: ServiceMetrics) -> None:
    m = service_metrics
    m.job_started("attribution", 4.0)
    m.upload_received(1 << 20)
    m.upload_received(10)
    m.signing_failed()
    assert value(m, "xaudit_job_queue_wait_seconds_sum", kind="attribution") == 4.0
    assert value(m, "xaudit_upload_bytes_total") == (1 << 20) + 10
    assert value(m, "xaudit_signing_failures_total") == 1


def test_queue_depth_and_running_come_from_the_store_at_scrape_time(service_metrics: ServiceMetrics) -> None:
    m = service_metrics
    assert m.registry.get_sample_value("xaudit_queue_depth", {"kind": "audit"}) is None  # no source yet
    counts = {"queued": 3}
    m.watch_jobs(lambda: JobCounts(queued={"audit": counts["queued"]}, running={"attribution": 2}))
    assert value(m, "xaudit_queue_depth", kind="audit") == 3
    assert value(m, "xaudit_jobs_running", kind="attribution") == 2
    assert m.registry.get_sample_value("xaudit_jobs_running", {"kind": "audit"}) == 0.0
    counts["queued"] = 0
    assert value(m, "xaudit_queue_depth", kind="audit") == 0


def test_a_failing_store_does_not_break_the_scrape(service_metrics: ServiceMetrics) -> None:
    from prometheus_client import generate_latest

    def broken() -> JobCounts:
        raise RuntimeError("database is down")

    service_metrics.watch_jobs(broken)
    service_metrics.job_submitted("audit")
    text = generate_latest(service_metrics.registry).decode()
    assert 'xaudit_jobs_submitted_total{kind="audit"} 1.0' in text
    assert "xaudit_queue_depth{" not in text


def test_rpc_handled(service_metrics: ServiceMetrics) -> None:
    m = service_metrics
    m.rpc_handled("xaudit.v1.AuditService", "GetJob", "unary", "NOT_FOUND", 0.003)
    labels = {"service": "xaudit.v1.AuditService", "method": "GetJob", "type": "unary"}
    assert value(m, "xaudit_grpc_server_handled_total", code="NOT_FOUND", **labels) == 1
    assert value(m, "xaudit_grpc_server_handling_seconds_bucket", le="0.005", **labels) == 1
    assert value(m, "xaudit_grpc_server_handling_seconds_bucket", le="0.0025", **labels) == 0
