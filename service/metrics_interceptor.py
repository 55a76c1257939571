"""One gRPC server interceptor that counts RPCs by method and status code and times them.

Put it *first* in the server's interceptor list (outermost): the error interceptor inside it has
then already turned the project's exceptions into status codes, which this one reads from the
servicer context. Methods the server does not serve are counted under ``method="unknown"`` so a
client cannot create series with made-up method names.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from service.handlers import rewrap
from service.metrics import ServiceMetrics

__all__ = ["MetricsInterceptor", "metrics_interceptors"]

_UNKNOWN = "unknown"


def _split(full_method: str) -> tuple[str, str]:
    """``/xaudit.v1.AuditService/GetJob`` -> (``xaudit.v1.AuditService``, ``GetJob``)."""
    _, _, rest = full_method.partition("/")
    service, _, method = rest.partition("/")
    if not service or not method:
        return _UNKNOWN, _UNKNOWN
    return service, method


def _code(context: grpc.ServicerContext, failed: bool) -> str:
    code = context.code()  # set by set_code() or abort()
    if code is None:
        return "UNKNOWN" if failed else "OK"
    return str(code.name)


class MetricsInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Records ``xaudit_grpc_server_handled_total`` and ``xaudit_grpc_server_handling_seconds``."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._metrics = metrics

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            # Unimplemented: grpc answers UNIMPLEMENTED itself; count it without the client's method name.
            self._metrics.rpc_handled(_UNKNOWN, _UNKNOWN, _UNKNOWN, "UNIMPLEMENTED", 0.0)
            return None
        service, method = _split(handler_call_details.method)
        rpc_type = {"unary_unary": "unary", "stream_unary": "client_stream"}
        stream_type = {"unary_stream": "server_stream", "stream_stream": "bidi_stream"}

        def measured(behaviour: Callable[..., Any], kind: str) -> Callable[..., Any]:
            if kind in rpc_type:
                return self._unary(behaviour, service, method, rpc_type[kind])
            return self._streaming(behaviour, service, method, stream_type[kind])

        return rewrap(handler, measured)

    def _unary(
        self, behaviour: Callable[[Any, grpc.ServicerContext], Any], service: str, method: str, rpc_type: str
    ) -> Callable[[Any, grpc.ServicerContext], Any]:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
            started = time.perf_counter()
            failed = True
            try:
                response = behaviour(request, context)
                failed = False
                return response
            finally:
                self._metrics.rpc_handled(
                    service, method, rpc_type, _code(context, failed), time.perf_counter() - started
                )

        return wrapped

    def _streaming(
        self,
        behaviour: Callable[[Any, grpc.ServicerContext], Iterator[Any]],
        service: str,
        method: str,
        rpc_type: str,
    ) -> Callable[[Any, grpc.ServicerContext], Iterator[Any]]:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            started = time.perf_counter()
            outcome = "UNKNOWN"
            try:
                yield from behaviour(request, context)
                outcome = _code(context, failed=False)
            except GeneratorExit:  # the client went away (or cancelled) mid-stream
                outcome = "CANCELLED"
                raise
            except BaseException:
                outcome = _code(context, failed=True)
                raise
            finally:
                self._metrics.rpc_handled(service, method, rpc_type, outcome, time.perf_counter() - started)

        return wrapped


def metrics_interceptors(metrics: ServiceMetrics | None) -> list[grpc.ServerInterceptor]:
    """``[MetricsInterceptor]`` recording to ``metrics``, or ``[]`` for None; spread it first into the
    server's interceptor list."""
    return [] if metrics is None else [MetricsInterceptor(metrics)]
