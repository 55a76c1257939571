"""A real `xaudit serve` for the service's security tests: bearer tokens, a private Redis broker
and a fresh PostgreSQL store; no worker unless a test starts one (jobs stay queued until then)."""

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

from tests.integration.conftest import (
    ROOT,
    Service,
    fresh_postgres,
    service_missing,
    start_serve,
    stop_process,
)
from tests.integration.security._infra import RedisServer
from xaudit.contract.channel import BearerInterceptor
from xaudit.v1 import audit_pb2_grpc, worker_pb2_grpc

__all__ = ["SecureService", "create_token", "secure_service"]


def create_token(tokens: Path, tenant: str, scopes: str, *limits: str) -> str:
    argv = ["token", "create", "--tenant", tenant, "--scopes", scopes, "--tokens", str(tokens), *limits]
    done = subprocess.run(
        [sys.executable, "-m", "clients.cli.main", *argv],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@dataclass
class SecureService:
    service: Service
    redis: RedisServer
    store_url: str
    submitter: str  # tenant team-a: submit, read
    reader: str  # tenant team-a: read only
    worker: str  # a worker token
    other_worker: str  # a second worker token (another machine)
    team_b_worker: str  # a worker token limited to team-b's jobs on the CPU queue

    def channel(self, token: str | None) -> grpc.Channel:
        channel = grpc.insecure_channel(self.service.address)
        return channel if token is None else grpc.intercept_channel(channel, BearerInterceptor(token))

    def api(self, token: str) -> audit_pb2_grpc.AuditServiceStub:
        return audit_pb2_grpc.AuditServiceStub(self.channel(token))

    def workers(self, token: str) -> worker_pb2_grpc.WorkerServiceStub:
        return worker_pb2_grpc.WorkerServiceStub(self.channel(token))


@pytest.fixture(scope="module")
def secure_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureService]:
    psycopg = pytest.importorskip("psycopg")
    try:
        redis = RedisServer.start_new()
    except (RuntimeError, FileNotFoundError, subprocess.CalledProcessError) as exc:
        service_missing(f"cannot start a private redis-server: {exc}")
    home = tmp_path_factory.mktemp("secure") / "home"
    tokens = home.parent / "tokens.yaml"
    names = [
        ("team-a", "submit,read"),
        ("team-a", "read"),
        ("workers", "worker"),
        ("workers-2", "worker"),
        ("workers-b", "worker", "--queues", "xaudit.cpu", "--job-tenants", "team-b"),
    ]
    issued = [create_token(tokens, *entry) for entry in names]
    database = fresh_postgres()
    try:
        url = database.__enter__()
    except psycopg.OperationalError as exc:
        redis.close()
        service_missing(f"PostgreSQL not reachable: {exc}")
    service = start_serve(
        home, "--tokens", str(tokens), "--broker", redis.url, "--store", url, "--lease-seconds", "30"
    )
    try:
        yield SecureService(service, redis, url, *issued)
    finally:
        stop_process(service.proc, signal.SIGKILL)
        database.__exit__(None, None, None)
        redis.close()
