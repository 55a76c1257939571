"""`xaudit serve` owns its port: a second server on a port in use is refused, not let in beside the first
(grpc's default SO_REUSEPORT would have the kernel share the first server's connections between both)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.config import ServerConfig
from service.server import Server, create_server
from tests.integration.service._helpers import serving
from xaudit.contract.errors import Unavailable

pytestmark = pytest.mark.integration


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
