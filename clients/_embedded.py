"""Run ``xaudit serve`` as a child process on a free loopback port, for the demo and for tests."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clients.client import XauditClient
from workers.errors import Unavailable

__all__ = ["embedded_service", "free_port"]

logger = logging.getLogger(__name__)


def free_port() -> int:
    # Bound then released: another process could take it in between, which the start-up check reports.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def embedded_service(home: Path | None = None, startup_timeout: float = 120.0) -> Iterator[str]:
    """Start ``xaudit serve`` (server + local worker + serverless broker + SQLite) with ``home`` as
    its data directory (a temporary one when None); yield its address; stop it on exit."""
    with tempfile.TemporaryDirectory(prefix="xaudit-demo-") as tmp:
        data_dir = Path(home) if home is not None else Path(tmp)
        data_dir.mkdir(parents=True, exist_ok=True)
        address = f"127.0.0.1:{free_port()}"
        log_path = data_dir / "serve.log"
        env = dict(os.environ, XAUDIT_HOME=str(data_dir))
        cmd = [sys.executable, "-m", "clients.cli.main", "serve", "--listen", address]
        with log_path.open("ab") as log:
            # Own process group: stopping it also stops the worker processes serve started.
            child = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            _wait_ready(child, address, startup_timeout, log_path)
            yield address
        finally:
            _stop(child)


def _wait_ready(child: subprocess.Popen[bytes], address: str, timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    with XauditClient(address, timeout=2.0) as client:
        while True:
            status = child.poll()
            if status is not None:
                raise Unavailable(
                    f"the embedded service exited with status {status} at start-up; see {log_path}"
                )
            try:
                client.wait_until_ready(timeout=1.0)
                return
            except Unavailable:
                if time.monotonic() > deadline:
                    raise Unavailable(
                        f"the embedded service is not up on {address} after {timeout:g} s; see {log_path}"
                    ) from None


def _stop(child: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    if child.poll() is not None:
        return
    try:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        logger.warning("the embedded service did not stop within %.0f s; killing it", grace)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    except ProcessLookupError:
        pass
