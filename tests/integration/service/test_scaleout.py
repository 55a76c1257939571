"""Scale-out mode: Redis broker, PostgreSQL job store, separate `xaudit worker` processes."""

from __future__ import annotations

import signal

import pytest

from service.store import JobStore
from tests.integration.conftest import Service, start_worker, stop_process
from tests.integration.service._helpers import inputs, mlp_onnx, request, stub, upload, wait_done, wait_state
from xaudit.v1 import audit_pb2

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_redis_worker_postgres_store_end_to_end(redis_service: Service) -> None:
    api = stub(redis_service.address)
    sha = upload(api, mlp_onnx())
    req = request(sha, inputs(), {"gradient_x_input": {}, "shapley_value": {}})
    job = api.SubmitAudit(req, timeout=30)
    assert api.SubmitAudit(req, timeout=30).id == job.id
    done = wait_done(api, job.id)
    assert done.state == audit_pb2.JOB_STATE_SUCCEEDED, (done.error_code, done.error_message)
    report = api.GetReport(audit_pb2.GetReportRequest(job_id=job.id), timeout=30)
    assert report.report.startswith(b"{") and b"payload" in report.report
    attributions = api.GetAttributions(audit_pb2.GetAttributionsRequest(job_id=job.id), timeout=30)
    assert sorted(t.name for t in attributions.attributions) == ["gradient_x_input", "shapley_value"]
    store = JobStore(redis_service.store or "")
    try:
        assert store.count_results(job.id)[0] == 1
        assert store.get_job("default", job.id).lease_owner  # the worker that finished it
    finally:
        store.close()


def test_worker_sigkilled_mid_job_still_completes_once(redis_service: Service) -> None:
    api = stub(redis_service.address)
    sha = upload(api, mlp_onnx(seed=2))
    # Long enough that the worker is killed mid-job: with 6 samples at 384 steps the job ran 0.1 s
    # past the progress polled below, and once finished before the kill landed (CI, 2026-12-05).
    slow = request(sha, inputs(seed=2, batch=96), {"integrated_gradients": {"steps": "1024"}})
    job = api.SubmitAudit(slow, timeout=30)
    running = wait_state(api, job.id, lambda j: j.state == audit_pb2.JOB_STATE_RUNNING and j.progress > 0.1)
    assert running.attempts == 1
    first = redis_service.workers[0]
    stop_process(first, signal.SIGKILL)  # the whole worker: main process and prefork child
    redis_service.workers.append(
        start_worker(redis_service.broker or "", redis_service.address, redis_service.home, name="worker-2")
    )
    done = wait_done(api, job.id, timeout=240)
    assert done.state == audit_pb2.JOB_STATE_SUCCEEDED, (done.error_code, done.error_message)
    assert done.attempts >= 2
    store = JobStore(redis_service.store or "")
    try:
        reports, results = store.count_results(job.id)
    finally:
        store.close()
    assert reports == 1
    assert results == 3  # integrated_gradients, target_values, target_classes
    report = api.GetReport(audit_pb2.GetReportRequest(job_id=job.id), timeout=30)
    assert report.content_type == "application/vnd.dsse.envelope.v1+json"


def test_cancel_a_running_job(redis_service: Service) -> None:
    api = stub(redis_service.address)
    sha = upload(api, mlp_onnx(seed=3))
    slow = request(sha, inputs(seed=3, batch=6), {"integrated_gradients": {"steps": "384"}})
    job = api.SubmitAudit(slow, timeout=30)
    wait_state(api, job.id, lambda j: j.state == audit_pb2.JOB_STATE_RUNNING)
    api.CancelJob(audit_pb2.CancelJobRequest(job_id=job.id), timeout=10)
    done = wait_done(api, job.id, timeout=60)
    assert done.state == audit_pb2.JOB_STATE_CANCELLED
    # The worker is free again: the next job runs.
    quick = api.SubmitAttribution(request(sha, inputs(seed=4), {"gradient_x_input": {}}), timeout=30)
    assert wait_done(api, quick.id).state == audit_pb2.JOB_STATE_SUCCEEDED
