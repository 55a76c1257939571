"""A leaked token is revoked with `xaudit token revoke`, and a running server refuses it from its next
call, with no restart; the tenant's other tokens keep working. Without revocation the leaked token
would keep reading the tenant's jobs. A token created with `--expires-in` is refused once it expires,
with a message that says so, by a server that loaded it while it was valid."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

import service.tokens
from clients.cli.main import main
from service.config import ServerConfig
from service.tokens import create_token
from tests.integration.service._helpers import serving
from xaudit.contract.channel import BearerInterceptor
from xaudit.v1 import audit_pb2, audit_pb2_grpc

pytestmark = pytest.mark.integration


def _list_jobs(address: str, token: str) -> grpc.StatusCode:
    return _answer(address, token)[0]


def _answer(address: str, token: str) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(address) as channel:
        api = audit_pb2_grpc.AuditServiceStub(grpc.intercept_channel(channel, BearerInterceptor(token)))
        try:
            api.ListJobs(audit_pb2.ListJobsRequest(page_size=1), timeout=10)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def test_a_revoked_token_is_refused_by_the_running_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = tmp_path / "tokens.yaml"
    leaked = create_token(tokens, "team-a", "read")
    kept = create_token(tokens, "team-a", "read")
    config = ServerConfig(listen="127.0.0.1:0", home=tmp_path / "home", tokens_file=tokens)
    with serving(config) as server:
        assert _list_jobs(server.address, leaked) == grpc.StatusCode.OK
        assert main(["token", "revoke", "--tokens", str(tokens), leaked]) == 0
        assert "removed from" in capsys.readouterr().err
        assert _list_jobs(server.address, leaked) == grpc.StatusCode.UNAUTHENTICATED
        assert _list_jobs(server.address, kept) == grpc.StatusCode.OK
    assert leaked not in tokens.read_text() and kept not in tokens.read_text()


def test_an_expired_token_is_refused_and_the_cli_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = tmp_path / "tokens.yaml"
    assert main(["token", "create", "--tenant", "team-a", "--tokens", str(tokens), "--expires-in", "1h"]) == 0
    brief = capsys.readouterr().out.strip()
    lasting = create_token(tokens, "team-a", "read")
    config = ServerConfig(listen="127.0.0.1:0", home=tmp_path / "home", tokens_file=tokens)
    with serving(config) as server:
        assert _list_jobs(server.address, brief) == grpc.StatusCode.OK
        # Two hours on for the server's token check (it runs in this process): a token with a
        # lifetime of seconds could expire while a loaded machine starts the server.
        monkeypatch.setattr(service.tokens, "time", _Ahead(7200.0))
        code, details = _answer(server.address, brief)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "expired at" in details, details
        assert _list_jobs(server.address, lasting) == grpc.StatusCode.OK
        monkeypatch.setenv("XAUDIT_TOKEN", brief)
        assert main(["jobs", "--server", server.address]) != 0
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "expired at" in err and "xaudit token create" in err, err
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 7200.0)  # for the listing's own clock
    assert main(["token", "list", "--tokens", str(tokens)]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert "EXPIRES (UTC)" in listed[0] and " expired" in listed[1] and "never" in listed[2], listed


class _Ahead:
    """The time module with ``time()`` moved ``seconds`` ahead."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def time(self) -> float:
        return time.time() + self.seconds

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def test_a_worker_with_an_expired_token_leaves_the_job_queued_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.integration.service._helpers import chunks, inputs, mlp_onnx, request
    from workers.runtime import RuntimeConfig, execute

    tokens = tmp_path / "tokens.yaml"
    client = create_token(tokens, "team-a", "submit,read")
    expired = create_token(tokens, "pool", "worker", expires_in=1.0)
    config = ServerConfig(listen="127.0.0.1:0", home=tmp_path / "home", tokens_file=tokens)
    with serving(config) as server, grpc.insecure_channel(server.address) as channel:
        api = audit_pb2_grpc.AuditServiceStub(grpc.intercept_channel(channel, BearerInterceptor(client)))
        sha = api.UploadModel(chunks(mlp_onnx()), timeout=60).sha256
        job = api.SubmitAttribution(request(sha, inputs(), {"gradient_x_input": {}}), timeout=10)
        time.sleep(1.1)
        runtime = RuntimeConfig(server=server.address, cache_dir=tmp_path / "cache", retry_seconds=1.0)
        monkeypatch.setenv("XAUDIT_WORKER_TOKEN", expired)
        with caplog.at_level("ERROR", logger="workers.runtime"):
            assert execute(job.id, runtime) == "refused"
        assert (
            "refused this worker's credentials (UNAUTHENTICATED" in caplog.text
            and "expired at" in caplog.text
        )
        queued = api.GetJob(audit_pb2.GetJobRequest(job_id=job.id), timeout=5)
        assert queued.state == audit_pb2.JOB_STATE_QUEUED
        monkeypatch.setenv("XAUDIT_WORKER_TOKEN", create_token(tokens, "pool", "worker"))  # a new one
        assert execute(job.id, runtime) == "succeeded"
