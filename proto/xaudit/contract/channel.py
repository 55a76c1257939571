"""The channel a worker (or the CLI) opens to the service: its token, and TLS when configured.

Environment (set on ``xaudit worker``; the embedded local worker gets an in-memory token from serve):
- ``XAUDIT_WORKER_TOKEN``: a token with the ``worker`` scope (``xaudit token create --scopes worker``).
- ``XAUDIT_TLS_CA``: CA file that signed the server's certificate (turns TLS on);
  ``XAUDIT_TLS_CERT`` / ``XAUDIT_TLS_KEY``: this worker's client certificate for an mTLS server.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

__all__ = ["TOKEN_ENV", "BearerInterceptor", "open_worker_channel", "tls_credentials_from_env"]

TOKEN_ENV = "XAUDIT_WORKER_TOKEN"


class _Details(
    collections.namedtuple(
        "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,  # type: ignore[misc]
):
    pass


class BearerInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """Adds ``authorization: Bearer <token>`` to every call on a channel."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: Any) -> _Details:
        metadata = [*(details.metadata or ()), self._header]
        return _Details(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def tls_credentials_from_env() -> grpc.ChannelCredentials | None:
    """TLS channel credentials from $XAUDIT_TLS_CA (and $XAUDIT_TLS_CERT / $XAUDIT_TLS_KEY for mTLS);
    None when $XAUDIT_TLS_CA is not set (plaintext). Used by workers and by the CLI."""
    ca = os.environ.get("XAUDIT_TLS_CA")
    if not ca:
        return None
    cert, key = os.environ.get("XAUDIT_TLS_CERT"), os.environ.get("XAUDIT_TLS_KEY")
    return grpc.ssl_channel_credentials(
        Path(ca).read_bytes(),
        Path(key).read_bytes() if key else None,
        Path(cert).read_bytes() if cert else None,
    )


def open_worker_channel(address: str, options: Sequence[tuple[str, Any]]) -> grpc.Channel:
    credentials = tls_credentials_from_env()
    if credentials is not None:
        channel = grpc.secure_channel(address, credentials, options=list(options))
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    token = os.environ.get(TOKEN_ENV)
    return grpc.intercept_channel(channel, BearerInterceptor(token)) if token else channel
