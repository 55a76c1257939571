"""Bad requests get the status code of their error class (xaudit.contract.errors) and a clear one-line message; the server keeps serving.

A real gRPC server on a loopback port, in process, with a recording sender instead of a broker
(no job runs here: this is the boundary)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from service.config import ServerConfig
from service.server import Server, create_server
from tests.integration.service._helpers import chunks, inputs, mlp_onnx, request, serving, stub, upload
from xaudit.contract.tensors import encode_tensor
from xaudit.v1 import audit_pb2

pytestmark = pytest.mark.integration

CAP = 256 * 1024


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Server, list[tuple[str, str]]]]:
    sent: list[tuple[str, str]] = []
    config = ServerConfig(listen="127.0.0.1:0", home=tmp_path, upload_cap_bytes=CAP, sweep_seconds=0.2)
    with serving(config, sender=lambda job, queue: sent.append((job, queue))) as srv:
        yield srv, sent


def _status(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def _still_serving(api) -> None:  # type: ignore[no-untyped-def]
    listed = api.ListJobs(audit_pb2.ListJobsRequest(), timeout=5)
    assert isinstance(listed, audit_pb2.ListJobsResponse)


def test_garbage_model_bytes_is_invalid_argument(server) -> None:  # type: ignore[no-untyped-def]
    api = stub(server[0].address)
    err = _status(lambda: api.UploadModel(chunks(b"\x00garbage" * 100), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a readable ONNX model" in err.details()
    err = _status(
        lambda: api.UploadModel(
            chunks(b"PK\x03\x04garbage", fmt=audit_pb2.MODEL_FORMAT_TORCHSCRIPT), timeout=10
        )
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "TorchScript" in err.details()
    _still_serving(api)
    assert not list((server[0].config.blob_dir).rglob("*")), "a refused upload left a file behind"


def test_upload_over_the_cap_is_resource_exhausted(server) -> None:  # type: ignore[no-untyped-def]
    api = stub(server[0].address)
    big = b"\x01" * (CAP + 1)
    err = _status(lambda: api.UploadModel(chunks(big), timeout=10))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"cap of {CAP} bytes" in err.details()

    def undeclared() -> Iterator[audit_pb2.ModelChunk]:  # a client that lies about the size
        yield audit_pb2.ModelChunk(metadata=audit_pb2.ModelMetadata(format=audit_pb2.MODEL_FORMAT_ONNX))
        for _ in range(5):
            yield audit_pb2.ModelChunk(data=b"\x01" * (CAP // 4))

    err = _status(lambda: api.UploadModel(undeclared(), timeout=10))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    upload(api, mlp_onnx())  # still serving, and a good model is accepted


def test_tensor_byte_length_must_match_shape(server) -> None:  # type: ignore[no-untyped-def]
    api = stub(server[0].address)
    sha = upload(api, mlp_onnx())
    req = request(sha, inputs(), {"gradient_x_input": {}})
    req.inputs[0].raw_contents = req.inputs[0].raw_contents[:-4]
    err = _status(lambda: api.SubmitAttribution(req, timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "raw_contents has 44 bytes but shape [2, 6] of FP32 needs 48" in err.details()
    bad = request(sha, np.full((2, 6), np.nan, np.float32), {"gradient_x_input": {}})
    assert _status(lambda: api.SubmitAttribution(bad, timeout=10)).code() == grpc.StatusCode.INVALID_ARGUMENT
    odd = request(sha, inputs(), {"gradient_x_input": {}})
    odd.inputs[0].datatype = "FP8"
    err = _status(lambda: api.SubmitAttribution(odd, timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown datatype 'FP8'" in err.details()
    assert server[1] == []  # nothing was recorded or dispatched
    _still_serving(api)


def test_unknown_method_is_invalid_argument(server) -> None:  # type: ignore[no-untyped-def]
    api = stub(server[0].address)
    sha = upload(api, mlp_onnx())
    err = _status(lambda: api.SubmitAudit(request(sha, inputs(), {"magic_attribution": {}}), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown method 'magic_attribution'" in err.details()
    _still_serving(api)


def test_unknown_job_and_model_are_not_found(server) -> None:  # type: ignore[no-untyped-def]
    api = stub(server[0].address)
    for call in (
        lambda: api.GetJob(audit_pb2.GetJobRequest(job_id="nope"), timeout=5),
        lambda: api.CancelJob(audit_pb2.CancelJobRequest(job_id="nope"), timeout=5),
        lambda: api.GetReport(audit_pb2.GetReportRequest(job_id="nope"), timeout=5),
        lambda: list(api.WatchJob(audit_pb2.WatchJobRequest(job_id="nope"), timeout=5)),
    ):
        err = _status(call)
        assert err.code() == grpc.StatusCode.NOT_FOUND and "unknown job 'nope'" in err.details()
    err = _status(lambda: api.SubmitAudit(request("0" * 64, inputs(), {}), timeout=5))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "upload it first" in err.details()
    _still_serving(api)


def test_submit_records_before_dispatch_and_is_idempotent(server) -> None:  # type: ignore[no-untyped-def]
    srv, sent = server
    api = stub(srv.address)
    sha = upload(api, mlp_onnx())
    first = api.SubmitAttribution(request(sha, inputs(), {"saliency": {}}), timeout=10)
    second = api.SubmitAttribution(request(sha, inputs(), {"saliency": {}}), timeout=10)
    other = api.SubmitAudit(request(sha, inputs(), {"saliency": {}}), timeout=10)
    assert first.id == second.id != other.id
    keyed = request(sha, inputs(seed=5), {"saliency": {}}, idempotency_key="client-key-1")
    assert api.SubmitAttribution(keyed, timeout=10).idempotency_key == "client-key-1"
    import time

    deadline = time.monotonic() + 5
    while len(sent) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(j for j, _ in sent) == sorted(
        {first.id, other.id, api.ListJobs(audit_pb2.ListJobsRequest()).jobs[0].id}
    )
    # Not ready yet: a clear FAILED_PRECONDITION, not a crash.
    err = _status(lambda: api.GetAttributions(audit_pb2.GetAttributionsRequest(job_id=first.id), timeout=5))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "QUEUED" in err.details()
    cancelled = api.CancelJob(audit_pb2.CancelJobRequest(job_id=first.id), timeout=5)
    assert cancelled.state == audit_pb2.JOB_STATE_CANCELLED


def test_list_jobs_pages(server) -> None:  # type: ignore[no-untyped-def]
    api = stub(server[0].address)
    sha = upload(api, mlp_onnx())
    ids = {
        api.SubmitAttribution(request(sha, inputs(seed=s), {"saliency": {}}), timeout=10).id for s in range(5)
    }
    seen: list[str] = []
    token = ""
    while True:
        page = api.ListJobs(audit_pb2.ListJobsRequest(page_size=2, page_token=token), timeout=5)
        assert len(page.jobs) <= 2
        seen += [j.id for j in page.jobs]
        token = page.next_page_token
        if not token:
            break
    assert len(seen) == 5 and set(seen) == ids
    err = _status(lambda: api.ListJobs(audit_pb2.ListJobsRequest(page_token="garbage!"), timeout=5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_health_and_reflection(server) -> None:  # type: ignore[no-untyped-def]
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(server[0].address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service="xaudit.v1.AuditService"), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = {s.name for a in answers for s in a.list_services_response.service}
        assert {"xaudit.v1.AuditService", "xaudit.v1.WorkerService"} <= names


def test_internal_errors_are_generic(server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    srv = server[0]

    def boom(*_a, **_k):  # type: ignore[no-untyped-def]
        raise RuntimeError("secret path /etc/shadow in a traceback")

    monkeypatch.setattr(srv.jobs.store, "list_jobs", boom)
    api = stub(srv.address)
    err = _status(lambda: api.ListJobs(audit_pb2.ListJobsRequest(), timeout=5))
    assert err.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in err.details() and "Traceback" not in err.details()
    assert api.GetSigningKeys(audit_pb2.GetSigningKeysRequest(), timeout=5).keys  # still serving


def test_attachment_names_are_checked(server) -> None:  # type: ignore[no-untyped-def]
    api = stub(server[0].address)
    sha = upload(api, mlp_onnx())
    req = request(sha, inputs(), {"saliency": {}})
    req.attachments.append(encode_tensor("weights", np.zeros(3, np.float32)))
    err = _status(lambda: api.SubmitAudit(req, timeout=5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown attachment 'weights'" in err.details()


def test_broker_down_submit_still_answers_and_job_stays_queued(tmp_path: Path) -> None:
    import time

    config = ServerConfig(
        listen="127.0.0.1:0", home=tmp_path, broker_url="redis://127.0.0.1:1/0", sweep_seconds=0.5
    )
    srv, _ = create_server(config)  # the real Celery sender, against a port where nothing listens
    srv.start()
    try:
        api = stub(srv.address)
        sha = upload(api, mlp_onnx())
        started = time.monotonic()
        job = api.SubmitAttribution(request(sha, inputs(), {"saliency": {}}), timeout=10)
        assert time.monotonic() - started < 2.0  # the submit path never waits on the broker
        time.sleep(3.0)
        again = api.GetJob(audit_pb2.GetJobRequest(job_id=job.id), timeout=5)
        assert again.state == audit_pb2.JOB_STATE_QUEUED
        assert srv.store.get_job("default", job.id).dispatched_at is None
        assert not srv.dispatcher.broker_ok
    finally:
        srv.stop(0)
