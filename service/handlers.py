"""Rebuilding a gRPC method handler around a wrapped behaviour: what every interceptor here needs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from xaudit.v1 import worker_pb2

__all__ = ["KINDS", "WORKER_PREFIX", "rewrap"]

# Every WorkerService method's full name starts with this (read from the generated descriptor).
WORKER_PREFIX = f"/{worker_pb2.DESCRIPTOR.services_by_name['WorkerService'].full_name}/"

# RPC shapes, in the order grpc's handler attributes are checked.
KINDS: dict[str, Callable[..., grpc.RpcMethodHandler]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


def rewrap(
    handler: grpc.RpcMethodHandler,
    wrap: Callable[[Callable[..., Any], str], Callable[..., Any]],
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> grpc.RpcMethodHandler:
    """``handler`` with its behaviour replaced by ``wrap(behaviour, kind)``.

    ``kind`` is one of :data:`KINDS`; a kind ending in ``_stream`` returns an iterator of responses.
    """
    for kind, make in KINDS.items():
        behaviour = getattr(handler, kind)
        if behaviour:
            return make(
                wrap(behaviour, kind),
                request_deserializer or handler.request_deserializer,
                handler.response_serializer,
            )
    return handler
