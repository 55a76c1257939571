"""The worker runtime against a real in-process server, without Celery: claim, heartbeat, complete,
redelivery, blob cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.config import ServerConfig
from service.server import Server
from tests.integration.service._helpers import inputs, mlp_onnx, request, serving, stub, upload
from workers.runtime import RuntimeConfig, execute
from xaudit.v1 import audit_pb2

pytestmark = pytest.mark.integration


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with serving(ServerConfig(listen="127.0.0.1:0", home=tmp_path / "home", lease_seconds=2.0)) as srv:
        yield srv


def test_redelivered_task_does_nothing_and_one_result_exists(server: Server, tmp_path: Path) -> None:
    api = stub(server.address)
    sha = upload(api, mlp_onnx())
    job = api.SubmitAudit(request(sha, inputs(), {"shapley_value": {}}), timeout=10)
    config = RuntimeConfig(server=server.address, cache_dir=tmp_path / "cache")
    assert execute(job.id, config) == "succeeded"
    assert execute(job.id, config) == "skipped"  # a redelivered task finds the job finished
    assert server.store.count_results(job.id)[0] == 1
    done = api.GetJob(audit_pb2.GetJobRequest(job_id=job.id), timeout=5)
    assert done.state == audit_pb2.JOB_STATE_SUCCEEDED and done.attempts == 1
    # The blob cache is verified: a corrupt cached model is fetched again.
    cached = tmp_path / "cache" / sha[:2] / sha
    cached.write_bytes(b"corrupt")
    again = api.SubmitAttribution(request(sha, inputs(), {"gradient_x_input": {}}), timeout=10)
    assert execute(again.id, config) == "succeeded"
    assert cached.read_bytes() == mlp_onnx()


def test_job_errors_fail_the_job_with_their_status(server: Server, tmp_path: Path) -> None:
    api = stub(server.address)
    sha = upload(api, mlp_onnx())
    bad = request(sha, inputs(), {"gradient_x_input": {}}, players="grid:2x2")  # no grid on a vector
    job = api.SubmitAttribution(bad, timeout=10)
    assert execute(job.id, RuntimeConfig(server=server.address, cache_dir=tmp_path / "c")) == "failed"
    failed = api.GetJob(audit_pb2.GetJobRequest(job_id=job.id), timeout=5)
    assert failed.state == audit_pb2.JOB_STATE_FAILED
    assert failed.error_code == "INVALID_ARGUMENT" and failed.error_message


def test_cancelled_before_start_is_skipped(server: Server, tmp_path: Path) -> None:
    api = stub(server.address)
    sha = upload(api, mlp_onnx())
    job = api.SubmitAttribution(request(sha, inputs(seed=9), {"saliency": {}}), timeout=10)
    api.CancelJob(audit_pb2.CancelJobRequest(job_id=job.id), timeout=5)
    assert execute(job.id, RuntimeConfig(server=server.address, cache_dir=tmp_path / "c")) == "skipped"


def test_torchscript_is_checked_not_loaded_by_the_server_and_runs_on_the_worker(
    server: Server, tmp_path: Path
) -> None:
    import torch

    from tests.integration.service._helpers import chunks
    from tests.models import MLP_FEATURES, relu_mlp, to_torchscript

    api = stub(server.address)
    data = to_torchscript(relu_mlp(), torch.zeros(2, MLP_FEATURES))
    ref = api.UploadModel(chunks(data, fmt=audit_pb2.MODEL_FORMAT_TORCHSCRIPT), timeout=30)
    assert ref.format == audit_pb2.MODEL_FORMAT_TORCHSCRIPT and ref.size == len(data)
    job = api.SubmitAttribution(request(ref.sha256, inputs(), {"gradient_x_input": {}}), timeout=10)
    assert execute(job.id, RuntimeConfig(server=server.address, cache_dir=tmp_path / "c")) == "succeeded"
    result = api.GetAttributions(audit_pb2.GetAttributionsRequest(job_id=job.id), timeout=10)
    assert [t.name for t in result.attributions] == ["gradient_x_input"]
