"""Undecodable request bytes, and text the store cannot keep, become INVALID_ARGUMENT.

grpc answers a request whose bytes do not parse as its message type with INTERNAL ("Exception
deserializing request!") before any interceptor's behaviour runs. This interceptor wraps each
method's deserializer so a parse failure yields a marker, and raises
:class:`~xaudit.contract.errors.InvalidInput` when the handler would see it (the errors interceptor, further
out, turns it into the status). Then every string of a client request is checked
(service.text.check_message_text: no NUL or control characters, bounded lengths); worker requests
have their ids checked, and their free text is cleaned by the store instead (a failure caused by a
model's odd names must still be recordable). Place it innermost: after authentication, so strangers
learn nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from service.handlers import WORKER_PREFIX, rewrap
from service.text import check_message_text, check_text
from xaudit.contract.errors import InvalidInput

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


_WORKER_IDS = ("job_id", "worker_id", "sha256", "lease_secret")
MAX_ID = 256  # jobs.lease_owner (service.schema); job ids and digests are shorter still


def _check(request: Any, method: str) -> Any:
    if isinstance(request, _Undecodable):
        logger.info("%s: undecodable request (%s)", method, request.reason)
        raise InvalidInput(f"the request to {method.rsplit('/', 1)[-1]} is not a valid protobuf message")
    if method.startswith(WORKER_PREFIX):
        for name in _WORKER_IDS:
            value = getattr(request, name, None)
            if isinstance(value, str):
                check_text(value, name, MAX_ID)
    elif hasattr(request, "ListFields"):
        check_message_text(request)
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

        def guarded(behaviour: Callable[..., Any], kind: str) -> Callable[..., Any]:
            if kind.startswith("stream_"):
                return lambda requests, context: behaviour(_checked_stream(requests, method), context)
            if kind == "unary_stream":

                def responses(request: Any, context: Any) -> Iterator[Any]:
                    yield from behaviour(_check(request, method), context)

                return responses
            return lambda request, context: behaviour(_check(request, method), context)

        return rewrap(handler, guarded, _safe(handler.request_deserializer))
