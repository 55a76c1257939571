"""Untrusted TorchScript runs in a limited child process of the worker (workers/sandbox.py).

The hostile models are real scripted modules (tests/integration/security/_models.py): one loops
forever (RLIMIT_CPU: the kernel's SIGXCPU kills its process), one allocates 32 GiB (RLIMIT_AS: the
allocation fails inside the model). Nothing in the product has a test hook; the crash path is the
real process boundary. Both fail their jobs with a reason and the same worker runs the next jobs.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.integration.conftest import Service, start_serve, stop_process
from tests.integration.security._models import hog_memory_torchscript, spin_forever_torchscript
from tests.integration.service._helpers import chunks, inputs, mlp_onnx, request, stub, wait_done
from tests.models import MLP_FEATURES, relu_mlp, to_torchscript
from workers.sandbox import SandboxLimits, run_sandboxed
from xaudit.contract.errors import Cancelled
from xaudit.contract.spec import JobSpec
from xaudit.v1 import audit_pb2

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUICK = {"gradient_x_input": {}}


@pytest.fixture
def sandboxed_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Service]:
    # Inherited by serve's local worker, and by the sandboxes it starts.
    monkeypatch.setenv("XAUDIT_SANDBOX_CPU_SECONDS", "3")
    monkeypatch.setenv("XAUDIT_SANDBOX_MEMORY_MB", "1024")
    service = start_serve(tmp_path / "home", "--concurrency", "2", "--lease-seconds", "10")
    try:
        yield service
    finally:
        stop_process(service.proc, signal.SIGKILL)


def _upload_ts(api, data: bytes) -> str:  # type: ignore[no-untyped-def]
    ref = api.UploadModel(chunks(data, fmt=audit_pb2.MODEL_FORMAT_TORCHSCRIPT), timeout=120)
    return str(ref.sha256)


def test_hostile_torchscript_fails_its_job_and_the_worker_carries_on(sandboxed_service: Service) -> None:
    api = stub(sandboxed_service.address)
    spin = _upload_ts(api, spin_forever_torchscript())
    hog = _upload_ts(api, hog_memory_torchscript())
    x = inputs(seed=40)
    spin_job = api.SubmitAttribution(request(spin, x, QUICK), timeout=30)
    hog_job = api.SubmitAttribution(request(hog, x, QUICK), timeout=30)

    spun = wait_done(api, spin_job.id, timeout=240)
    assert spun.state == audit_pb2.JOB_STATE_FAILED
    assert spun.error_code == "RESOURCE_EXHAUSTED"
    assert "CPU time limit of 3 s" in spun.error_message and "SIGXCPU" in spun.error_message
    hogged = wait_done(api, hog_job.id, timeout=240)
    assert hogged.state == audit_pb2.JOB_STATE_FAILED
    assert hogged.error_code in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"), hogged.error_code
    assert "internal error" not in hogged.error_message

    # The same worker runs the next jobs: a well-behaved TorchScript model (sandboxed) and an ONNX one.
    good = _upload_ts(api, to_torchscript(relu_mlp(3), torch.zeros(2, MLP_FEATURES)))
    good_job = api.SubmitAttribution(request(good, x, QUICK), timeout=30)
    onnx_sha = api.UploadModel(chunks(mlp_onnx(seed=3)), timeout=60).sha256
    onnx_job = api.SubmitAttribution(request(onnx_sha, x, QUICK), timeout=30)
    for job in (good_job, onnx_job):
        done = wait_done(api, job.id, timeout=240)
        assert done.state == audit_pb2.JOB_STATE_SUCCEEDED, (done.error_code, done.error_message)
    log = sandboxed_service.log_text()
    assert "ended without a result (status -24)" in log  # SIGXCPU, seen by the worker
    assert "local worker exited" not in log  # the worker itself never died


def test_cancelling_kills_the_sandbox_at_once() -> None:
    spec = JobSpec(kind="attribution", players="features", methods=("gradient_x_input",), device="cpu")
    x = np.zeros((1, MLP_FEATURES), np.float32)
    started: list[float] = []

    def progress(fraction: float, message: str) -> None:
        started.append(time.monotonic())

    def should_stop() -> bool:  # cancel once the model is loading (the child is up and spinning)
        return bool(started) and time.monotonic() - started[0] > 1.0

    begin = time.monotonic()
    with pytest.raises(Cancelled):
        run_sandboxed(
            spec, spin_forever_torchscript(), "torchscript", {"inputs": x}, progress, should_stop,
            SandboxLimits(memory_bytes=1 << 30, cpu_seconds=600),
        )  # fmt: skip
    assert started, "the sandbox never reported progress"
    assert time.monotonic() - started[0] < 30, "cancellation did not stop the spinning model"
    assert time.monotonic() - begin < 120
