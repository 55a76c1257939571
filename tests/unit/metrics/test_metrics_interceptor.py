"""The metrics interceptor on a real gRPC server on loopback, with raw-bytes handlers."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from prometheus_client import CollectorRegistry

from service.metrics import ServiceMetrics
from service.metrics_interceptor import MetricsInterceptor

SERVICE = "test.v1.Echo"


def _ok(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


def _abort(request: bytes, context: grpc.ServicerContext) -> bytes:
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad shape")
    raise AssertionError("unreachable")


def _crash(request: bytes, context: grpc.ServicerContext) -> bytes:
    raise RuntimeError("a bug")


def _stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    yield b"a"
    yield b"b"


def _upload(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
    return b"".join(requests)


@pytest.fixture
def served() -> Iterator[tuple[grpc.Channel, ServiceMetrics]]:
    metrics = ServiceMetrics(CollectorRegistry())
    server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[MetricsInterceptor(metrics)])
    handlers = {
        "Ok": grpc.unary_unary_rpc_method_handler(_ok),
        "Abort": grpc.unary_unary_rpc_method_handler(_abort),
        "Crash": grpc.unary_unary_rpc_method_handler(_crash),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream),
        "Upload": grpc.stream_unary_rpc_method_handler(_upload),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield channel, metrics
    channel.close()
    server.stop(None)


def handled(metrics: ServiceMetrics, method: str, rpc_type: str, code: str) -> float:
    labels = {"service": SERVICE, "method": method, "type": rpc_type, "code": code}
    return metrics.registry.get_sample_value("xaudit_grpc_server_handled_total", labels) or 0.0


def test_codes_and_latency(served: tuple[grpc.Channel, ServiceMetrics]) -> None:
    channel, metrics = served
    assert channel.unary_unary(f"/{SERVICE}/Ok")(b"x", timeout=5) == b"x"
    with pytest.raises(grpc.RpcError) as aborted:
        channel.unary_unary(f"/{SERVICE}/Abort")(b"x", timeout=5)
    assert aborted.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as crashed:
        channel.unary_unary(f"/{SERVICE}/Crash")(b"x", timeout=5)
    assert crashed.value.code() == grpc.StatusCode.UNKNOWN
    assert list(channel.unary_stream(f"/{SERVICE}/Stream")(b"x", timeout=5)) == [b"a", b"b"]
    assert channel.stream_unary(f"/{SERVICE}/Upload")(iter([b"1", b"2"]), timeout=5) == b"12"

    assert handled(metrics, "Ok", "unary", "OK") == 1
    assert handled(metrics, "Abort", "unary", "INVALID_ARGUMENT") == 1
    assert handled(metrics, "Crash", "unary", "UNKNOWN") == 1
    assert handled(metrics, "Stream", "server_stream", "OK") == 1
    assert handled(metrics, "Upload", "client_stream", "OK") == 1
    count = metrics.registry.get_sample_value(
        "xaudit_grpc_server_handling_seconds_count", {"service": SERVICE, "method": "Ok", "type": "unary"}
    )
    assert count == 1


def test_unknown_methods_do_not_create_series(served: tuple[grpc.Channel, ServiceMetrics]) -> None:
    channel, metrics = served
    for name in ("Nope1", "Nope2"):
        with pytest.raises(grpc.RpcError) as err:
            channel.unary_unary(f"/{SERVICE}/{name}")(b"x", timeout=5)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    labels = {"service": "unknown", "method": "unknown", "type": "unknown", "code": "UNIMPLEMENTED"}
    assert metrics.registry.get_sample_value("xaudit_grpc_server_handled_total", labels) == 2
    text = b"".join(
        s.name.encode() + str(s.labels).encode() for f in metrics.registry.collect() for s in f.samples
    )
    assert b"Nope" not in text
