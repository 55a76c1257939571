"""Limits on a real server over a real channel: hostile ONNX refused, message / tensor / player caps,
deadlines, and the sandbox's wall-clock job limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from service.config import ServerConfig
from service.server import Server
from tests.integration.conftest import ROOT, start_serve, stop_process
from tests.integration.security._infra import RedisServer
from tests.integration.security._models import spin_forever_torchscript
from tests.integration.service._helpers import chunks, request, serving, stub, upload, wait_done
from tests.models import MLP_FEATURES, relu_mlp, to_onnx
from workers.runtime import RuntimeConfig, execute
from workers.sandbox import SandboxLimits, run_sandboxed
from xaudit.contract.errors import DeadlineExceeded
from xaudit.contract.spec import JobSpec
from xaudit.v1 import audit_pb2

pytestmark = pytest.mark.integration

MESSAGE_CAP = 1 << 20
ELEMENT_CAP = 50_000


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    config = ServerConfig(
        listen="127.0.0.1:0",
        home=tmp_path / "home",
        max_message_bytes=MESSAGE_CAP,
        max_tensor_elements=ELEMENT_CAP,
        upload_cap_bytes=4 << 20,
        sweep_seconds=60,
    )
    with serving(config) as srv:
        yield srv


def _error(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def _identity_model(**node_kwargs: object) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    node = helper.make_node("Add", ["x", "w"], ["y"], **node_kwargs)  # type: ignore[arg-type]
    weight = helper.make_tensor("w", TensorProto.FLOAT, [1, 3], [1.0, 2.0, 3.0])
    graph = helper.make_graph([node], "g", [x], [y], initializer=[weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _external(tensor: onnx.TensorProto, location: str = "/etc/passwd") -> None:
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location


def _with_subgraph_external_data() -> onnx.ModelProto:
    """The external initializer hides in an If branch, not in the main graph."""
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    secret = helper.make_tensor("s", TensorProto.FLOAT, [3], [0.0, 0.0, 0.0])
    _external(secret, "weights.bin")  # relative: what the onnx checker alone lets through if it exists
    branch_out = helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [3])
    then_graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["s_out"])], "then", [], [branch_out], initializer=[secret]
    )
    else_graph = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["s_out"], value=helper.make_tensor("k", TensorProto.FLOAT, [3], [1, 1, 1])
            )
        ],
        "else",
        [],
        [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [3])],
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)
    graph = helper.make_graph([node], "g", [cond], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_hostile_onnx_is_refused_before_storage(server: Server) -> None:
    api = stub(server.address)
    external = _identity_model()
    _external(external.graph.initializer[0])
    custom = _identity_model(domain="com.evil")
    for model, expected in (
        (external, "external data"),
        (_with_subgraph_external_data(), "external data"),
        (custom, "custom operator domains"),
    ):
        err = _error(lambda m=model: api.UploadModel(chunks(m.SerializeToString()), timeout=30))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert expected in err.details()
    assert not [p for p in server.config.blob_dir.rglob("*") if p.is_file()], "a refused model was stored"
    assert upload(api, _identity_model().SerializeToString())  # the checker passes a plain one


def test_message_and_tensor_caps(server: Server) -> None:
    api = stub(server.address)
    sha = upload(api, to_onnx(relu_mlp(0), torch.zeros(2, MLP_FEATURES)))
    huge = np.zeros((50_000, MLP_FEATURES), np.float32)  # 1.2 MB: over the 1 MiB message cap
    err = _error(lambda: api.SubmitAudit(request(sha, huge, {"gradient_x_input": {}}), timeout=30))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    many = np.zeros((10_000, MLP_FEATURES), np.float32)  # 60 000 elements in 240 kB: over the element cap
    err = _error(lambda: api.SubmitAudit(request(sha, many, {"gradient_x_input": {}}), timeout=30))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and f"cap of {ELEMENT_CAP}" in err.details()
    deep = audit_pb2.Tensor(name="inputs", datatype="FP32", shape=[1] * 9, raw_contents=b"\0" * 4)
    req = request(sha, np.zeros((1, MLP_FEATURES), np.float32), {})
    req.inputs[0].CopyFrom(deep)
    assert _error(lambda: api.SubmitAudit(req, timeout=30)).code() == grpc.StatusCode.INVALID_ARGUMENT


def test_player_caps(server: Server, tmp_path: Path) -> None:
    """Exact audits enumerate every order up to 10 players; above, the order is limited (at most 16),
    and more than 64 players is refused."""
    api = stub(server.address)
    config = RuntimeConfig(server=server.address, cache_dir=tmp_path / "cache")
    wide = upload(api, to_onnx(relu_mlp(1, features=20), torch.zeros(2, 20)))
    x = np.random.default_rng(0).normal(size=(1, 20)).astype(np.float32)
    err = _error(
        lambda: api.SubmitAudit(request(wide, x, {"gradient_x_input": {}}, audit_order=20), timeout=30)
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "between 1 and 16" in err.details()
    limited = api.SubmitAudit(request(wide, x, {"gradient_x_input": {}}, audit_order=2), timeout=30)
    assert execute(limited.id, config) == "succeeded"
    assert api.GetReport(audit_pb2.GetReportRequest(job_id=limited.id), timeout=30).report
    too_many = upload(api, to_onnx(relu_mlp(2, features=300), torch.zeros(2, 300)))
    x300 = np.random.default_rng(1).normal(size=(1, 300)).astype(np.float32)
    job = api.SubmitAudit(request(too_many, x300, {"gradient_x_input": {}}, audit_order=1), timeout=30)
    assert execute(job.id, config) == "failed"
    failed = api.GetJob(audit_pb2.GetJobRequest(job_id=job.id), timeout=10)
    assert failed.error_code == "RESOURCE_EXHAUSTED" and "at most 256" in failed.error_message


def test_client_deadline_is_honoured_and_the_server_keeps_serving(server: Server) -> None:
    api = stub(server.address)
    sha = upload(api, to_onnx(relu_mlp(0), torch.zeros(2, MLP_FEATURES)))
    x = np.zeros((1, MLP_FEATURES), np.float32) + 0.5
    job = api.SubmitAttribution(request(sha, x, {"gradient_x_input": {}}), timeout=30)  # nobody runs it
    started = time.monotonic()
    err = _error(lambda: list(api.WatchJob(audit_pb2.WatchJobRequest(job_id=job.id), timeout=1.0)))
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 5
    assert api.GetJob(audit_pb2.GetJobRequest(job_id=job.id), timeout=5).state == audit_pb2.JOB_STATE_QUEUED


@pytest.mark.slow
def test_sandbox_wall_clock_limit_stops_a_job() -> None:
    spec = JobSpec(kind="attribution", players="features", methods=("gradient_x_input",), device="cpu")
    x = np.zeros((1, MLP_FEATURES), np.float32)
    limits = SandboxLimits(memory_bytes=1 << 30, cpu_seconds=600, wall_seconds=10)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="wall-clock limit of 10 s"):
        run_sandboxed(spec, spin_forever_torchscript(), "torchscript", {"inputs": x}, limits=limits)
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_worker_time_limit_fails_a_long_job(tmp_path: Path, redis: RedisServer) -> None:
    home = tmp_path / "home"
    service = start_serve(home, "--broker", redis.url, "--lease-seconds", "5")
    log = (home / "worker.log").open("ab")
    worker = subprocess.Popen(
        [sys.executable, "-m", "clients.cli.main", "-v", "worker", "--broker", redis.url,
         "--server", service.address, "--queues", "xaudit.cpu", "--time-limit", "3"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        # The Celery limit alone: models in the worker's process, so no sandbox start-up counts
        # against the 3 s (the sandbox's own limits are tested in tests/security/).
        env=dict(os.environ, XAUDIT_WORKER_CACHE=str(home / "cache"), XAUDIT_SANDBOX_FORMATS="none"),
    )  # fmt: skip
    try:
        api = stub(service.address)
        sha = upload(api, to_onnx(relu_mlp(4), torch.zeros(2, MLP_FEATURES)))
        # Long by size, not by an out-of-bounds parameter (steps are capped at 1024 by the job spec):
        # 64 samples took 2.3 s on a quiet CI machine, under the 3 s limit; 256 take four times that.
        x = np.random.default_rng(4).normal(size=(256, MLP_FEATURES)).astype(np.float32)
        slow = api.SubmitAudit(request(sha, x, {"integrated_gradients": {"steps": "1024"}}), timeout=30)
        done = wait_done(api, slow.id, timeout=180)
        assert done.state == audit_pb2.JOB_STATE_FAILED, done
        assert done.error_code == "DEADLINE_EXCEEDED" and "time limit" in done.error_message
        assert done.finished_at.ToSeconds() - done.started_at.ToSeconds() < 30  # stopped, not finished
        quick = api.SubmitAttribution(request(sha, x[:1], {"gradient_x_input": {}}), timeout=30)
        assert wait_done(api, quick.id, timeout=120).state == audit_pb2.JOB_STATE_SUCCEEDED
    finally:
        stop_process(worker, signal.SIGKILL)
        stop_process(service.proc, signal.SIGKILL)
        log.close()
