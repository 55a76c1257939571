"""`xaudit serve` owns its port: a second server on a port in use is refused, not let in beside the first
(grpc's default SO_REUSEPORT would have the kernel share the first server's connections between both),
in one line that says why."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.config import ServerConfig
from service.listen import why_not_listening
from service.server import Server, create_server
from tests.integration.service._helpers import serving
from xaudit.contract.errors import Unavailable

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def first(tmp_path: Path) -> Iterator[Server]:
    with serving(ServerConfig(listen="127.0.0.1:0", home=tmp_path / "first")) as srv:
        yield srv


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_second_xaudit_server_on_a_port_in_use_is_refused(first: Server, tmp_path: Path) -> None:
    config = ServerConfig(listen=first.address, home=tmp_path / "second")
    with pytest.raises(Unavailable, match=f"cannot listen on {first.address}"):
        create_server(config, sender=lambda job, queue: None)
    assert _serving(first.address)


def test_another_grpc_server_asking_to_share_the_port_is_refused(first: Server) -> None:
    # A process that sets SO_REUSEPORT itself (grpc's default) must not get a share of the connections.
    intruder = grpc.server(futures.ThreadPoolExecutor(max_workers=1), options=[("grpc.so_reuseport", 1)])
    try:
        with pytest.raises(RuntimeError, match="Failed to bind"):
            intruder.add_insecure_port(first.address)
    finally:
        intruder.stop(0)
    assert _serving(first.address)


def test_the_cli_refuses_a_port_in_use_in_one_line_with_the_os_reason(first: Server, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    done = subprocess.run(
        [sys.executable, "-m", "clients.cli.main", "serve", "--listen", first.address, "--home", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if "authentication is OFF" not in line]
    assert done.returncode == 2
    assert lines == [f"xaudit: error: cannot listen on {first.address}: Address already in use"], done.stderr
    assert _serving(first.address)


def test_why_not_listening_gives_the_os_reason_or_none(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert why_not_listening(f"127.0.0.1:{port}") == "Address already in use"
        assert why_not_listening(f"0.0.0.0:{port}") == "Address already in use"
    assert why_not_listening(f"127.0.0.1:{port}") is None  # free again
    assert why_not_listening("127.0.0.1:0") is None
    assert why_not_listening(f"unix:{tmp_path / 'sock'}") is None  # not TCP: grpc decides
    assert why_not_listening("192.0.2.1:5000") == "Cannot assign requested address"  # TEST-NET-1
    reason = why_not_listening("no-such-host.invalid:5000")
    assert reason is not None and reason.startswith("cannot resolve 'no-such-host.invalid'")
