"""Server threads shared out so that no class of caller can starve another.

The gRPC server runs every call on one thread pool; a long-lived stream (WatchJob, the health
Watch, reflection) holds its thread while open. Calls are counted in three classes:
- streams: capped in total and per tenant (per peer address without credentials);
- other client calls (AuditService, including uploads): at most ``client_calls`` run at once; up to
  ``client_queue`` more wait for a slot (at most their deadline, or ``MAX_WAIT`` seconds);
- the WorkerService: not capped, and the pool holds ``worker_threads`` beyond the two caps above,
  so heartbeats and completions always find a thread whatever clients do.
A call over its cap (or its queue) is refused with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from service.auth import current_identity
from service.handlers import WORKER_PREFIX, rewrap
from xaudit.contract.errors import ResourceExhausted

__all__ = ["LONG_STREAMS", "Capacity", "CapacityInterceptor", "CapacityLimits"]

logger = logging.getLogger(__name__)

# Server-streaming and bidirectional methods that stay open as long as the client likes.
LONG_STREAMS = frozenset(
    {
        "/xaudit.v1.AuditService/WatchJob",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    }
)
MAX_WAIT = 30.0  # seconds a client call waits for a slot when the caller set no shorter deadline
# Never refused: workers' calls (their reserved threads) and the health check (cheap, and what
# orchestrators use to decide the server is alive).
_UNCAPPED = ("/grpc.health.v1.Health/Check",)


@dataclass(frozen=True)
class CapacityLimits:
    client_calls: int = 16
    client_queue: int = 64
    streams: int = 64
    streams_per_tenant: int = 32
    worker_threads: int = 16

    @property
    def pool_threads(self) -> int:
        """Threads the server's pool needs so that the worker class always has its share."""
        return self.client_calls + self.client_queue + self.streams + self.worker_threads


class Capacity:
    def __init__(self, limits: CapacityLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(limits.client_calls)
        self._waiting = 0
        self._streams: dict[str, int] = {}

    @property
    def open_streams(self) -> int:
        with self._lock:
            return sum(self._streams.values())

    @contextlib.contextmanager
    def call(self, method: str, wait: float = MAX_WAIT) -> Iterator[None]:
        """A slot for one client call: waits (in line, at most ``wait`` seconds) when all are taken."""
        busy = ResourceExhausted(f"the server is busy: retry {method.rsplit('/', 1)[-1]} shortly")
        if not self._slots.acquire(blocking=False):
            with self._lock:
                if self._waiting >= self.limits.client_queue:
                    raise busy
                self._waiting += 1
            try:
                if not self._slots.acquire(timeout=max(0.0, min(wait, MAX_WAIT))):
                    raise busy
            finally:
                with self._lock:
                    self._waiting -= 1
        try:
            yield
        finally:
            self._slots.release()

    @contextlib.contextmanager
    def stream(self, key: str) -> Iterator[None]:
        with self._lock:
            total = sum(self._streams.values())
            mine = self._streams.get(key, 0)
            if mine >= self.limits.streams_per_tenant:
                raise ResourceExhausted(
                    f"{mine} streams already open for {key}: the limit is {self.limits.streams_per_tenant}"
                )
            if total >= self.limits.streams:
                raise ResourceExhausted(f"the server has {total} streams open, its limit: retry later")
            self._streams[key] = mine + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._streams[key] - 1
                if left:
                    self._streams[key] = left
                else:
                    del self._streams[key]


def _stream_key(context: grpc.ServicerContext) -> str:
    identity = current_identity()
    if identity is not None:
        return f"tenant {identity.tenant}"
    peer = context.peer() or "unknown"  # e.g. ipv4:127.0.0.1:53124: the host, not the port
    return f"peer {peer.rsplit(':', 1)[0]}"


def _time_left(context: grpc.ServicerContext) -> float:
    left = context.time_remaining()
    return MAX_WAIT if left is None else float(left)


class CapacityInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Place it inside the auth interceptor (streams are counted per authenticated tenant) and inside
    the errors interceptor (its refusal becomes a status)."""

    def __init__(self, capacity: Capacity) -> None:
        self._capacity = capacity

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = continuation(details)
        method = details.method
        if handler is None or method.startswith(WORKER_PREFIX) or method in _UNCAPPED:
            return handler
        capacity = self._capacity

        def limited(behaviour: Callable[..., Any], kind: str) -> Callable[..., Any]:
            if method in LONG_STREAMS:

                def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                    with capacity.stream(_stream_key(context)):
                        yield from behaviour(request, context)

                return stream
            if kind.endswith("_stream"):

                def streamed_call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                    with capacity.call(method, _time_left(context)):
                        yield from behaviour(request, context)

                return streamed_call

            def call(request: Any, context: grpc.ServicerContext) -> Any:
                with capacity.call(method, _time_left(context)):
                    return behaviour(request, context)

            return call

        return rewrap(handler, limited)
