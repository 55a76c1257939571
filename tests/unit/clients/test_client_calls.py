"""XauditClient over a real loopback channel against a scripted service: what goes on the wire and
what callers get back (dataclasses and project errors, never protobuf or grpc)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clients.client import Job, ModelRef, XauditClient, default_server
from xaudit.contract import errors
from xaudit.contract.units import MiB
from xaudit.v1 import audit_pb2

# The scripted service of conftest.py and its address.
Scripted = tuple[Any, str]


def test_upload_streams_metadata_then_1mib_chunks(scripted: Scripted, tmp_path: Path) -> None:
    service, address = scripted
    data = bytes(range(256)) * (10 * 1024)  # 2.5 MiB
    path = tmp_path / "net.onnx"
    path.write_bytes(data)
    with XauditClient(address) as client:
        ref = client.upload_model(path)
    assert ref == ModelRef(hashlib.sha256(data).hexdigest(), "onnx", len(data), "net.onnx")
    first, *rest = service.recorded.chunks
    assert first.metadata.declared_size == len(data)
    assert first.metadata.format == audit_pb2.MODEL_FORMAT_ONNX
    assert [len(c.data) for c in rest] == [MiB, MiB, MiB // 2]


def test_upload_of_bytes_guesses_torchscript_from_the_zip_magic(scripted: Scripted) -> None:
    _, address = scripted
    with XauditClient(address) as client:
        ref = client.upload_model(b"PK\x03\x04rest-of-a-zip")
    assert ref.format == "torchscript" and ref.size == 17


def test_missing_model_file_is_invalid_input(scripted: Scripted, tmp_path: Path) -> None:
    _, address = scripted
    with XauditClient(address) as client, pytest.raises(errors.InvalidInput, match="not found"):
        client.upload_model(tmp_path / "nope.onnx")


def test_submit_sends_the_right_rpc_and_token(scripted: Scripted) -> None:
    service, address = scripted
    x = np.zeros((2, 1, 8, 8), dtype=np.float32)
    with XauditClient(address, token="s3cret") as client:
        audit = client.submit_audit("ab" * 32, inputs=x, players="grid:2x4", methods="integrated_gradients")
        attr = client.submit_attribution(ModelRef("cd" * 32, "onnx", 1), inputs=x)
    assert isinstance(audit, Job) and audit.kind == "audit" and audit.state == "queued"
    assert attr.kind == "attribution" and attr.model_sha256 == "cd" * 32
    (kind1, req1), (kind2, _) = service.recorded.submits
    assert (kind1, kind2) == ("audit", "attribution")
    assert req1.players == "grid:2x4" and [m.name for m in req1.methods] == ["integrated_gradients"]
    assert ("authorization", "Bearer s3cret") in service.recorded.metadata[0]


def test_get_job_translates_fields_and_failure(scripted: Scripted) -> None:
    _, address = scripted
    with XauditClient(address) as client:
        job = client.get_job("j1")
    assert job.state == "failed" and job.terminal
    assert job.created_at is not None and job.created_at.year == 2023 and job.started_at is None
    err = job.error()
    assert isinstance(err, errors.InvalidInput) and str(err) == "inputs contain NaN"


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        ("INVALID_ARGUMENT", errors.InvalidInput),
        ("NOT_FOUND", errors.NotFound),
        ("RESOURCE_EXHAUSTED", errors.ResourceExhausted),
        ("FAILED_PRECONDITION", errors.FailedPrecondition),
        ("UNAUTHENTICATED", errors.Unauthenticated),
        ("PERMISSION_DENIED", errors.PermissionDenied),
        ("UNAVAILABLE", errors.Unavailable),
        ("INTERNAL", errors.XauditError),
    ],
)
def test_status_codes_become_project_errors(scripted: Scripted, code: str, cls: type) -> None:
    _, address = scripted
    with XauditClient(address) as client, pytest.raises(errors.XauditError) as info:
        client.get_job(f"status:{code}:job 42 went wrong")
    assert type(info.value) is cls
    assert info.value.code == (code if cls is not errors.XauditError else "INTERNAL")
    assert str(info.value) == "job 42 went wrong"


def test_unreachable_server_is_unavailable_naming_the_address(dead_address: str) -> None:
    with XauditClient(dead_address, timeout=5) as client, pytest.raises(errors.Unavailable) as info:
        client.get_job("any")
    message = str(info.value)
    assert message.startswith(f"cannot reach the xaudit server at {dead_address}")
    assert "\n" not in message and "refused" in message.lower()


def test_a_call_past_its_deadline_says_which_server(scripted: Scripted) -> None:
    _, address = scripted
    with XauditClient(address, timeout=0.2) as client, pytest.raises(errors.DeadlineExceeded) as info:
        client.get_job("sleep:1")
    assert str(info.value) == f"the xaudit server at {address} did not answer in time"


def test_list_jobs_follows_pages(scripted: Scripted) -> None:
    service, address = scripted
    with XauditClient(address) as client:
        ids = [job.id for job in client.list_jobs(page_size=3)]
        first_two = [job.id for job in client.list_jobs(page_size=3, limit=2)]
    assert ids == [f"job-{i}" for i in range(7)]
    assert service.recorded.list_tokens[:3] == ["", "3", "6"]
    assert first_two == ["job-0", "job-1"]


def test_watch_yields_changes_until_terminal(scripted: Scripted) -> None:
    service, address = scripted
    running = audit_pb2.Job(id="j", state=audit_pb2.JOB_STATE_RUNNING, progress=0.5, message="half")
    service.watch_script = [
        audit_pb2.Job(id="j", state=audit_pb2.JOB_STATE_QUEUED),
        running,
        running,  # unchanged: not yielded twice
        audit_pb2.Job(id="j", state=audit_pb2.JOB_STATE_SUCCEEDED, progress=1.0, report_available=True),
        audit_pb2.Job(id="j", state=audit_pb2.JOB_STATE_SUCCEEDED, progress=1.0),  # after terminal: ignored
    ]
    with XauditClient(address) as client:
        seen = [(j.state, j.progress) for j in client.watch("j")]
        final = client.wait("j")
    assert seen == [("queued", 0.0), ("running", 0.5), ("succeeded", 1.0)]
    assert final.report_available


def test_watch_resumes_after_the_stream_breaks(scripted: Scripted) -> None:
    service, address = scripted
    queued = audit_pb2.Job(id="j", state=audit_pb2.JOB_STATE_QUEUED)
    running = audit_pb2.Job(id="j", state=audit_pb2.JOB_STATE_RUNNING, progress=0.25)
    done = audit_pb2.Job(id="j", state=audit_pb2.JOB_STATE_SUCCEEDED, progress=1.0)
    service.interrupted_watches = [([queued], "UNAVAILABLE"), ([queued, running], "END")]
    service.watch_script = [running, done]
    with XauditClient(address) as client:
        seen = [j.state for j in client.watch("j")]
    # Each state once, in order, although the server sent some again after each reconnection.
    assert seen == ["queued", "running", "succeeded"]
    assert not service.interrupted_watches


def test_watch_gives_up_on_other_errors_at_once(scripted: Scripted) -> None:
    service, address = scripted
    service.interrupted_watches = [([], "NOT_FOUND")]
    with XauditClient(address) as client, pytest.raises(errors.NotFound):
        list(client.watch("nope"))


def test_report_cancel_and_keys(scripted: Scripted) -> None:
    service, address = scripted
    with XauditClient(address) as client:
        assert client.get_report("j") == service.report
        assert client.cancel("j").state == "cancelled"
        keys = client.signing_keys()
    assert [(k.key_id, k.public_key_pem) for k in keys] == [("k1", "PEM")]


def test_default_server_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XAUDIT_SERVER", raising=False)
    assert default_server() == "127.0.0.1:50051"
    monkeypatch.setenv("XAUDIT_SERVER", "audit.internal:443")
    assert default_server() == "audit.internal:443"
    assert XauditClient().address == "audit.internal:443"


def test_importing_the_client_does_not_import_torch() -> None:
    code = (
        "import sys, clients.client; assert 'torch' not in sys.modules and 'onnxruntime' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_port_where_something_else_answers_is_named_as_such() -> None:
    import http.server
    import threading

    httpd = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{httpd.server_port}"
    try:
        with XauditClient(address, timeout=5) as client, pytest.raises(errors.Unavailable) as info:
            client.get_job("any")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert (
        str(info.value)
        == f"cannot reach the xaudit server at {address}: what answers there is not a gRPC server"
    )
