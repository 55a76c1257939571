"""The one place where exceptions become gRPC statuses.

XauditError -> the status its ``.code`` names, with its one-line message and its ``.reason_code``
as the ``xaudit-reason`` trailing metadata. Anything else is a bug:
INTERNAL with a generic message, and the traceback goes to the server log only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import sqlalchemy.exc

from service.handlers import rewrap
from xaudit.contract.errors import REASON_METADATA_KEY, XauditError

__all__ = ["INTERNAL_MESSAGE", "STORE_DOWN_MESSAGE", "ErrorsInterceptor"]

logger = logging.getLogger(__name__)

INTERNAL_MESSAGE = "internal server error (details are in the server log)"
STORE_DOWN_MESSAGE = "the job store is unreachable right now; nothing was recorded: retry later"


def _abort(exc: Exception, context: grpc.ServicerContext, method: str) -> None:
    if isinstance(exc, XauditError):
        code = getattr(grpc.StatusCode, exc.code, grpc.StatusCode.INTERNAL)
        logger.info("%s -> %s: %s", method, exc.code, exc)
        # The reason lets the client rebuild the very class (e.g. VerificationError, not InvalidInput).
        context.set_trailing_metadata(((REASON_METADATA_KEY, exc.reason_code),))
        context.abort(code, str(exc))
    if isinstance(exc, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
        # The job store cannot be reached: nothing was recorded; the caller may retry.
        logger.warning("%s -> UNAVAILABLE: job store unreachable (%s)", method, type(exc.orig).__name__)
        context.abort(grpc.StatusCode.UNAVAILABLE, STORE_DOWN_MESSAGE)
    logger.error("%s: unexpected %s", method, type(exc).__name__, exc_info=exc)
    context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)


def _wrap_unary(behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
    def handler(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return behaviour(request, context)
        except Exception as exc:
            if context.code() is not None:  # already aborted on purpose
                raise
            _abort(exc, context, method)

    return handler


def _wrap_stream(behaviour: Callable[..., Iterator[Any]], method: str) -> Callable[..., Iterator[Any]]:
    def handler(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from behaviour(request, context)
        except Exception as exc:
            if context.code() is not None:
                raise
            _abort(exc, context, method)

    return handler


class ErrorsInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = continuation(details)
        if handler is None:
            return handler
        method = details.method
        return rewrap(
            handler,
            lambda behaviour, kind: (_wrap_stream if kind.endswith("_stream") else _wrap_unary)(
                behaviour, method
            ),
        )
