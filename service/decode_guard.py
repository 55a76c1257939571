"""Undecodable request bytes become INVALID_ARGUMENT instead of grpc's own INTERNAL.

grpc answers a request whose bytes do not parse as its message type with INTERNAL ("Exception
deserializing request!") before any interceptor's behaviour runs. This interceptor wraps each
method's deserializer so a parse failure yields a marker, and raises
:class:`~workers.errors.InvalidInput` when the handler would see it (the errors interceptor, further
out, turns it into the status). Place it innermost: after authentication, so strangers learn nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from workers.errors import InvalidInput

__all__ = ["DecodeGuardInterceptor"]

logger = logging.getLogger(__name__)


class _Undecodable:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _safe(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:
            return _Undecodable(type(exc).__name__)

    return parse


def _check(request: Any, method: str) -> Any:
    if isinstance(request, _Undecodable):
        logger.info("%s: undecodable request (%s)", method, request.reason)
        raise InvalidInput(f"the request to {method.rsplit('/', 1)[-1]} is not a valid protobuf message")
    return request


def _checked_stream(requests: Iterator[Any], method: str) -> Iterator[Any]:
    for request in requests:
        yield _check(request, method)


class DecodeGuardInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = continuation(details)
        if handler is None:
            return handler
        method = details.method
        deserializer = _safe(handler.request_deserializer)
        serializer = handler.response_serializer
        if handler.unary_unary:
            inner_uu = handler.unary_unary
            return grpc.unary_unary_rpc_method_handler(
                lambda request, context: inner_uu(_check(request, method), context), deserializer, serializer
            )
        if handler.unary_stream:
            inner_us = handler.unary_stream

            def unary_stream(request: Any, context: Any) -> Iterator[Any]:
                yield from inner_us(_check(request, method), context)

            return grpc.unary_stream_rpc_method_handler(unary_stream, deserializer, serializer)
        if handler.stream_unary:
            inner_su = handler.stream_unary
            return grpc.stream_unary_rpc_method_handler(
                lambda requests, context: inner_su(_checked_stream(requests, method), context),
                deserializer,
                serializer,
            )
        if handler.stream_stream:
            inner_ss = handler.stream_stream
            return grpc.stream_stream_rpc_method_handler(
                lambda requests, context: inner_ss(_checked_stream(requests, method), context),
                deserializer,
                serializer,
            )
        return handler
