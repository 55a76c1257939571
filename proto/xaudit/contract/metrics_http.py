"""The /metrics endpoint, shared by the service (``xaudit serve --metrics-port``) and the workers
(``xaudit worker --metrics-port``): one place that turns a refused address into one line."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from xaudit.contract.errors import Unavailable

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry

__all__ = ["serve_metrics"]

logger = logging.getLogger(__name__)


def serve_metrics(port: int, registry: CollectorRegistry, addr: str = "0.0.0.0") -> tuple[WSGIServer, int]:
    """Serve ``registry`` on ``http://addr:port/metrics`` from a daemon thread; returns the server and
    the bound port (``port=0`` picks a free one). Unavailable, in one line, where the address is
    refused (a port in use, an address not the host's)."""
    from prometheus_client import start_http_server

    try:
        server, _thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise Unavailable(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from None
    bound = int(server.server_port)
    logger.info("metrics on http://%s:%d/metrics", addr, bound)
    return server, bound
