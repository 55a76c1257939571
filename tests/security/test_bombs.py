"""Hostile models against a real service (`xaudit serve`: server, local Celery worker, sandboxes).

The 278-byte-class ONNX memory bomb (Expand to [2^28, 1, 6], then ReduceSum) and Loop bomb (2^62
iterations) each end as a FAILED job with a clear reason in bounded time; cancelling a spinning
model kills its process at once; a TorchScript model reading the server's own signing key is
refused naming the operator; and the same worker then runs an honest job. Without the sandbox the
memory bomb takes the worker to the kernel's OOM killer and the Loop ignores cancellation (it runs
inside the worker process until the worker is killed).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Service, start_serve, stop_process
from tests.integration.service._helpers import (
    chunks,
    inputs,
    mlp_onnx,
    request,
    stub,
    wait_done,
    wait_state,
)
from tests.security._attacks import file_reader_torchscript, onnx_loop_bomb, onnx_memory_bomb
from xaudit.v1 import audit_pb2

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUICK = {"gradient_x_input": {}}
WALL_SECONDS = 15


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("bombs") / "home"
    saved = dict(os.environ)
    # Inherited by serve's local worker, which reads them for its sandboxes.
    os.environ.update(
        XAUDIT_SANDBOX_MEMORY_MB="1024", XAUDIT_SANDBOX_WALL_SECONDS=str(WALL_SECONDS),
        XAUDIT_SANDBOX_CPU_SECONDS="120",
    )  # fmt: skip
    try:
        svc = start_serve(home, "--concurrency", "1", "--lease-seconds", "30")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        yield svc
    finally:
        stop_process(svc.proc, signal.SIGKILL)


def _submit(svc: Service, model: bytes, fmt: int = audit_pb2.MODEL_FORMAT_ONNX, seed: int = 1) -> str:
    api = stub(svc.address)
    sha = api.UploadModel(chunks(model, fmt=fmt), timeout=60).sha256
    return str(api.SubmitAttribution(request(sha, inputs(seed=seed), QUICK), timeout=30).id)


def _confined_sandboxes(service: Service) -> set[int]:
    """This service's model processes that run a model now (a spare one, waiting for its job, is not
    confined yet). Only its descendants: the suite runs other files' services beside it, and their
    short jobs' sandboxes would be taken for this one's (ci on 2026-12-05 failed so)."""
    parents: dict[int, int] = {}
    confined = set()
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
            pid = int(entry.name)
            parents[pid] = int(status.split("PPid:\t", 1)[1].split("\n", 1)[0])
            if b"child_main" in (entry / "cmdline").read_bytes() and "NoNewPrivs:\t1" in status:
                confined.add(pid)
        except (OSError, ValueError, IndexError):
            continue
    return {pid for pid in confined if _descends_from(pid, service.proc.pid, parents)}


def _descends_from(pid: int, root: int, parents: dict[int, int]) -> bool:
    while pid > 1:
        pid = parents.get(pid, 0)
        if pid == root:
            return True
    return False


def test_the_onnx_memory_bomb_fails_its_job_with_the_memory_limit(service: Service) -> None:
    bomb = onnx_memory_bomb()
    assert len(bomb) < 400
    started = time.monotonic()
    job = wait_done(stub(service.address), _submit(service, bomb), timeout=180)
    assert job.state == audit_pb2.JOB_STATE_FAILED
    assert job.error_code == "RESOURCE_EXHAUSTED", (job.error_code, job.error_message)
    assert "memory limit of 1024 MiB" in job.error_message
    assert time.monotonic() - started < 180


def test_the_onnx_loop_bomb_fails_at_the_wall_clock_limit(service: Service) -> None:
    job = wait_done(stub(service.address), _submit(service, onnx_loop_bomb()), timeout=180)
    assert job.state == audit_pb2.JOB_STATE_FAILED
    assert job.error_code == "DEADLINE_EXCEEDED", (job.error_code, job.error_message)
    assert f"wall-clock limit of {WALL_SECONDS} s" in job.error_message


def test_cancelling_a_loop_bomb_kills_its_process_at_once(service: Service) -> None:
    api = stub(service.address)
    known = _confined_sandboxes(service)
    job_id = _submit(service, onnx_loop_bomb(), seed=2)  # other inputs: not the job above again
    running = wait_state(api, job_id, lambda j: j.state != audit_pb2.JOB_STATE_QUEUED, timeout=120)
    assert running.state == audit_pb2.JOB_STATE_RUNNING, (running.error_code, running.error_message)
    deadline = time.monotonic() + 60
    while not _confined_sandboxes(service) - known:  # the worker handed the job to its sandbox
        assert time.monotonic() < deadline, "no sandbox took the job"
        time.sleep(0.1)
    (pid,) = _confined_sandboxes(service) - known
    time.sleep(1.0)
    assert Path(f"/proc/{pid}").exists()
    cancelled_at = time.monotonic()
    api.CancelJob(audit_pb2.CancelJobRequest(job_id=job_id), timeout=10)
    done = wait_done(api, job_id, timeout=60)
    assert done.state == audit_pb2.JOB_STATE_CANCELLED
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() - cancelled_at < WALL_SECONDS - 3, "cancel did not kill the model's process"
        time.sleep(0.1)


def test_a_model_reading_the_servers_signing_key_is_refused(service: Service) -> None:
    key = service.home / "keys" / "signing_key.pem"
    assert key.is_file() and (key.stat().st_mode & 0o077) == 0
    model = file_reader_torchscript(str(key), 16)
    job = wait_done(
        stub(service.address), _submit(service, model, audit_pb2.MODEL_FORMAT_TORCHSCRIPT), timeout=180
    )
    assert job.state == audit_pb2.JOB_STATE_FAILED
    assert "aten::from_file" in job.error_message


def test_the_worker_survived_and_runs_an_honest_job(service: Service) -> None:
    job = wait_done(stub(service.address), _submit(service, mlp_onnx(seed=2)), timeout=180)
    assert job.state == audit_pb2.JOB_STATE_SUCCEEDED, (job.error_code, job.error_message)
    assert "local worker exited" not in service.log_text()
