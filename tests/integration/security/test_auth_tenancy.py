"""Authentication and tenant isolation against a real `xaudit serve --tokens` (local worker, SQLite).

Tokens come from the real `xaudit token create` command; the local worker authenticates with the
server's in-memory worker token (a job completes, so it did)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.integration.conftest import ROOT, Service, start_serve, stop_process
from tests.integration.service._helpers import chunks, inputs, mlp_onnx, request, wait_done
from xaudit.contract.channel import BearerInterceptor
from xaudit.v1 import audit_pb2, audit_pb2_grpc, worker_pb2, worker_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def xaudit(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clients.cli.main", *argv],
        cwd=ROOT,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=180,
    )


def create_token(tokens: Path, tenant: str, scopes: str) -> str:
    done = xaudit("token", "create", "--tenant", tenant, "--scopes", scopes, "--tokens", str(tokens))
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert token.startswith("xat_") and len(token) > 40
    return token


@dataclass
class AuthService:
    service: Service
    tokens: Path
    a: str
    b: str
    a_read: str
    worker: str

    def api(self, token: str | None) -> audit_pb2_grpc.AuditServiceStub:
        channel = grpc.insecure_channel(self.service.address)
        if token is not None:
            channel = grpc.intercept_channel(channel, BearerInterceptor(token))
        return audit_pb2_grpc.AuditServiceStub(channel)


@pytest.fixture(scope="module")
def auth_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthService]:
    home = tmp_path_factory.mktemp("auth") / "home"
    tokens = home.parent / "tokens.yaml"
    a = create_token(tokens, "team-a", "submit,read")
    b = create_token(tokens, "team-b", "submit,read")
    a_read = create_token(tokens, "team-a", "read")
    worker = create_token(tokens, "workers", "worker")
    service = start_serve(home, "--tokens", str(tokens), "--lease-seconds", "5")
    try:
        yield AuthService(service, tokens, a, b, a_read, worker)
    finally:
        stop_process(service.proc, signal.SIGKILL)


def code_of(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        result = call()
        if hasattr(result, "__next__"):
            list(result)
    return info.value.code()


def test_tokens_file_keeps_hashes_only(auth_service: AuthService) -> None:
    import hashlib

    text = auth_service.tokens.read_text()
    for token in (auth_service.a, auth_service.b, auth_service.a_read, auth_service.worker):
        assert token not in text
        assert token[4:20] not in text
        assert hashlib.sha256(token.encode()).hexdigest() in text
    assert oct(auth_service.tokens.stat().st_mode & 0o777) == "0o600"


def test_missing_or_bad_credentials_are_unauthenticated(auth_service: AuthService) -> None:
    list_jobs = audit_pb2.ListJobsRequest()
    assert (
        code_of(lambda: auth_service.api(None).ListJobs(list_jobs, timeout=10))
        == grpc.StatusCode.UNAUTHENTICATED
    )
    bad = auth_service.api("xat_" + "x" * 43)
    assert code_of(lambda: bad.ListJobs(list_jobs, timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: bad.UploadModel(chunks(mlp_onnx()), timeout=30)) == grpc.StatusCode.UNAUTHENTICATED
    # A malformed header is the same answer, and the server keeps serving.
    channel = grpc.insecure_channel(auth_service.service.address)
    raw = audit_pb2_grpc.AuditServiceStub(channel)
    err = code_of(lambda: raw.ListJobs(list_jobs, timeout=10, metadata=[("authorization", "Basic abc")]))
    assert err == grpc.StatusCode.UNAUTHENTICATED
    assert auth_service.api(auth_service.a).ListJobs(list_jobs, timeout=10) is not None


def test_missing_scope_is_permission_denied(auth_service: AuthService) -> None:
    reader = auth_service.api(auth_service.a_read)
    assert (
        code_of(lambda: reader.UploadModel(chunks(mlp_onnx()), timeout=30))
        == grpc.StatusCode.PERMISSION_DENIED
    )
    reader.ListJobs(audit_pb2.ListJobsRequest(), timeout=10)  # read is allowed
    # A tenant token cannot act as a worker; a worker token cannot use the public API.
    channel = grpc.intercept_channel(
        grpc.insecure_channel(auth_service.service.address),
        BearerInterceptor(auth_service.a),
    )
    fetch = worker_pb2.FetchJobRequest(job_id="x", worker_id="intruder")
    assert code_of(lambda: worker_pb2_grpc.WorkerServiceStub(channel).FetchJob(fetch, timeout=10)) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    worker_api = auth_service.api(auth_service.worker)
    assert code_of(lambda: worker_api.ListJobs(audit_pb2.ListJobsRequest(), timeout=10)) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    anonymous = worker_pb2_grpc.WorkerServiceStub(grpc.insecure_channel(auth_service.service.address))
    assert code_of(lambda: anonymous.FetchJob(fetch, timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
    # A worker token from the tokens file (what `xaudit worker` sends as $XAUDIT_WORKER_TOKEN) gets in.
    os.environ["XAUDIT_WORKER_TOKEN"] = auth_service.worker
    try:
        from xaudit.contract.channel import open_worker_channel

        with open_worker_channel(auth_service.service.address, []) as worker_channel:
            as_worker = worker_pb2_grpc.WorkerServiceStub(worker_channel)
            assert code_of(lambda: as_worker.FetchJob(fetch, timeout=10)) == grpc.StatusCode.NOT_FOUND
    finally:
        del os.environ["XAUDIT_WORKER_TOKEN"]


def test_health_is_exempt_and_reflection_needs_a_token(auth_service: AuthService) -> None:
    with grpc.insecure_channel(auth_service.service.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        ask = [reflection_pb2.ServerReflectionRequest(list_services="")]
        assert (
            code_of(lambda: refl.ServerReflectionInfo(iter(ask), timeout=10))
            == grpc.StatusCode.UNAUTHENTICATED
        )
        replies = list(
            refl.ServerReflectionInfo(
                iter(ask), timeout=10, metadata=[("authorization", f"Bearer {auth_service.a_read}")]
            )
        )
        names = {s.name for s in replies[0].list_services_response.service}
        assert "xaudit.v1.AuditService" in names


def test_tenant_b_cannot_see_or_touch_tenant_a(auth_service: AuthService) -> None:
    a, b = auth_service.api(auth_service.a), auth_service.api(auth_service.b)
    sha = a.UploadModel(chunks(mlp_onnx(seed=5)), timeout=120).sha256
    job = a.SubmitAudit(request(sha, inputs(seed=5), {"gradient_x_input": {}}), timeout=60)
    done = wait_done(a, job.id, timeout=240)  # the local worker got its in-memory worker token
    assert done.state == audit_pb2.JOB_STATE_SUCCEEDED, (done.error_code, done.error_message)
    assert a.GetReport(audit_pb2.GetReportRequest(job_id=job.id), timeout=30).report

    not_found = grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: b.GetJob(audit_pb2.GetJobRequest(job_id=job.id), timeout=10)) == not_found
    assert code_of(lambda: b.WatchJob(audit_pb2.WatchJobRequest(job_id=job.id), timeout=10)) == not_found
    assert code_of(lambda: b.CancelJob(audit_pb2.CancelJobRequest(job_id=job.id), timeout=10)) == not_found
    assert code_of(lambda: b.GetReport(audit_pb2.GetReportRequest(job_id=job.id), timeout=10)) == not_found
    assert (
        code_of(lambda: b.GetAttributions(audit_pb2.GetAttributionsRequest(job_id=job.id), timeout=10))
        == not_found
    )
    # A's model digest is not B's model: submitting against it is NOT_FOUND too (not "exists").
    assert (
        code_of(lambda: b.SubmitAudit(request(sha, inputs(seed=5), {"gradient_x_input": {}}), timeout=30))
        == not_found
    )
    assert list(b.ListJobs(audit_pb2.ListJobsRequest(), timeout=10).jobs) == []
    # An unknown id gives the same answer and the same kind of message as a foreign one.
    unknown = code_of(lambda: b.GetJob(audit_pb2.GetJobRequest(job_id="0" * 32), timeout=10))
    assert unknown == not_found
    assert [j.id for j in a.ListJobs(audit_pb2.ListJobsRequest(), timeout=10).jobs] == [job.id]
    assert a.GetJob(audit_pb2.GetJobRequest(job_id=job.id), timeout=10).state == audit_pb2.JOB_STATE_SUCCEEDED


def test_cli_reads_the_token_from_the_environment(auth_service: AuthService) -> None:
    address = auth_service.service.address
    env = dict(os.environ, XAUDIT_TOKEN=auth_service.a_read)
    ok = xaudit("jobs", "--server", address, env=env)
    assert ok.returncode == 0, ok.stderr
    env.pop("XAUDIT_TOKEN")
    refused = xaudit("jobs", "--server", address, env=env)
    assert refused.returncode == 2
    assert "missing credentials" in refused.stderr and "Traceback" not in refused.stderr


def test_unauthenticated_on_a_public_address_refuses_to_start(tmp_path: Path) -> None:
    done = xaudit("serve", "--listen", "0.0.0.0:0", "--home", str(tmp_path / "home"))
    assert done.returncode == 2
    assert "refusing to listen on 0.0.0.0:0 without authentication" in done.stderr
    assert not (tmp_path / "home" / "jobs.db").exists()


def test_embedded_default_says_authentication_is_off(tmp_path: Path) -> None:
    service = start_serve(tmp_path / "home", "--upload-cap-mb", "1")
    try:
        assert "authentication is OFF" in service.log_text()
    finally:
        stop_process(service.proc, signal.SIGKILL)
