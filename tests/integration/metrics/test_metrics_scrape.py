"""Scrape /metrics from a real `xaudit serve` and `xaudit worker` (Redis broker, prefork pool) around a
real audit job, and check that counters and histograms move as the job goes through."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import REDIS_URL, ROOT, Service, _redis_available, start_serve, stop_process
from tests.integration.service._helpers import inputs, mlp_onnx, request, stub, upload, wait_done
from xaudit.v1 import audit_pb2

pytestmark = [pytest.mark.integration, pytest.mark.slow]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> Samples:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def get(samples: Samples, name: str, **labels: str) -> float:
    """The sum over the series of ``name`` that carry ``labels`` (0 when there is none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def wait_scrapable(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            scrape(port)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[Service, int]]:
    if not _redis_available():
        pytest.skip(f"Redis not reachable at {REDIS_URL}")
    port = free_port()
    svc = start_serve(tmp_path / "home", "--broker", REDIS_URL, "--metrics-port", str(port))
    try:
        yield svc, port
    finally:
        stop_process(svc.proc)


def start_worker(svc: Service, port: int) -> tuple[subprocess.Popen[bytes], Path]:
    log = svc.home / "metrics-worker.log"
    env = dict(os.environ, XAUDIT_WORKER_CACHE=str(svc.home / "metrics-worker-cache"))
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the worker makes its own
    with log.open("ab") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "clients.cli.main", "-v", "worker", "--broker", REDIS_URL,
             "--server", svc.address, "--queues", "xaudit.cpu,xaudit.gpu", "--metrics-port", str(port)],
            cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    return proc, log


def test_metrics_move_during_a_real_audit_job(service: tuple[Service, int]) -> None:
    svc, server_port = service
    api = stub(svc.address)
    model = mlp_onnx()
    sha = upload(api, model)
    methods = {"gradient_x_input": {}, "occlusion_1": {}}
    # No worker yet: the job waits in the queue, and the server says so.
    job = api.SubmitAudit(request(sha, inputs(), methods), timeout=30)
    with pytest.raises(grpc.RpcError) as missing:
        api.GetJob(audit_pb2.GetJobRequest(job_id="no-such-job"), timeout=10)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    queued = scrape(server_port)
    assert get(queued, "xaudit_queue_depth", kind="audit") == 1
    assert get(queued, "xaudit_jobs_running", kind="audit") == 0
    assert get(queued, "xaudit_jobs_submitted_total", kind="audit") == 1
    assert get(queued, "xaudit_jobs_finished_total", kind="audit") == 0
    assert get(queued, "xaudit_upload_bytes_total") == len(model)

    worker_port = free_port()
    worker, log = start_worker(svc, worker_port)
    try:
        wait_scrapable(worker_port, worker, log)
        done = wait_done(api, job.id, timeout=180)
        assert done.state == audit_pb2.JOB_STATE_SUCCEEDED, (done.error_code, done.error_message)
        # The child writes its values as it computes; the parent serves them merged.
        worker_samples = scrape(worker_port)
    finally:
        stop_process(worker, timeout=15)

    s = scrape(server_port)
    assert get(s, "xaudit_queue_depth", kind="audit") == 0
    assert get(s, "xaudit_jobs_running", kind="audit") == 0
    assert get(s, "xaudit_jobs_finished_total", kind="audit", outcome="succeeded") == 1
    assert get(s, "xaudit_job_duration_seconds_count", kind="audit") == 1
    assert get(s, "xaudit_job_duration_seconds_sum", kind="audit") >= done.compute_seconds > 0
    assert get(s, "xaudit_job_queue_wait_seconds_count", kind="audit") == 1
    assert get(s, "xaudit_signing_failures_total") == 0
    rpc = "xaudit_grpc_server_handled_total"
    assert get(s, rpc, method="SubmitAudit", type="unary", code="OK") == 1
    assert get(s, rpc, method="UploadModel", type="client_stream", code="OK") == 1
    assert get(s, rpc, method="GetJob", code="NOT_FOUND") == 1
    assert get(s, rpc, method="FetchJob", code="OK") >= 1
    assert get(s, rpc, method="CompleteJob", code="OK") == 1
    assert get(s, "xaudit_grpc_server_handling_seconds_count", method="SubmitAudit") == 1
    assert get(s, "xaudit_grpc_server_handling_seconds_bucket", method="SubmitAudit", le="+Inf") == 1

    w = worker_samples
    for name in methods:
        assert get(w, "xaudit_method_compute_seconds_count", method=name) == 1
        assert get(w, "xaudit_audit_verdicts_total", method=name) == 1  # one verdict, whatever it is
    assert get(w, "xaudit_model_forward_passes_total") > 0
    assert get(w, "xaudit_model_forward_samples_total") >= get(w, "xaudit_model_forward_passes_total")
    assert get(w, "xaudit_model_backward_passes_total") > 0
    assert get(w, "xaudit_onnxruntime_sessions_total", requested="cpu", provider="CPUExecutionProvider") >= 1
    assert get(w, "xaudit_worker_device_info", device="cpu") == 1
