"""A leaked token is revoked with `xaudit token revoke`, and a running server refuses it from its next
call, with no restart; the tenant's other tokens keep working. Without revocation the leaked token
would keep reading the tenant's jobs."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from clients.cli.main import main
from service.config import ServerConfig
from service.tokens import create_token
from tests.integration.service._helpers import serving
from xaudit.contract.channel import BearerInterceptor
from xaudit.v1 import audit_pb2, audit_pb2_grpc

pytestmark = pytest.mark.integration


def _list_jobs(address: str, token: str) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as channel:
        api = audit_pb2_grpc.AuditServiceStub(grpc.intercept_channel(channel, BearerInterceptor(token)))
        try:
            api.ListJobs(audit_pb2.ListJobsRequest(page_size=1), timeout=10)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


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
