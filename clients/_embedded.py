"""Run ``xaudit serve`` as a child process on a free loopback port, for the demo and for tests."""

from __future__ import annotations

import logging
import os
import re
import shutil
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
from xaudit.contract.errors import Unavailable

__all__ = ["embedded_service", "free_port"]

logger = logging.getLogger(__name__)

# What `xaudit serve` prints once it listens (service/run.py).
_SERVING = re.compile(r"xaudit: serving on (\S+)")


def free_port() -> int:
    """A loopback port that was free a moment ago (bound, then released: another process may take it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def embedded_service(home: Path | None = None, startup_timeout: float = 120.0) -> Iterator[str]:
    """Start ``xaudit serve`` (server + local worker + serverless broker + SQLite) with ``home`` as
    its data directory (a temporary one when None); yield its address; stop it on exit.

    A temporary directory is removed afterwards unless something failed: then it is kept, and named
    on stderr, because its serve.log (server and worker) is what explains the failure."""
    data_dir = Path(home) if home is not None else Path(tempfile.mkdtemp(prefix="xaudit-demo-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "serve.log"
    log_path.write_bytes(b"")
    env = dict(os.environ, XAUDIT_HOME=str(data_dir))
    # Port 0: the server binds a free port itself and prints it, so no other process can take it first.
    cmd = [sys.executable, "-m", "clients.cli.main", "serve"]
    cmd += ["--listen", "127.0.0.1:0", "--home", str(data_dir)]
    with log_path.open("ab") as log:
        # Own session: a Ctrl-C reaches only the demo, which then stops serve in order (serve stops its
        # worker); the fallback SIGKILL goes to the whole group.
        child = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    failed = True
    try:
        yield _wait_ready(child, startup_timeout, log_path)
        failed = False
    finally:
        _stop(child)
        if failed:
            print(f"xaudit: the service's log is in {log_path}", file=sys.stderr)
        elif home is None:
            shutil.rmtree(data_dir, ignore_errors=True)


def _wait_ready(child: subprocess.Popen[bytes], timeout: float, log_path: Path) -> str:
    deadline = time.monotonic() + timeout
    address = None
    while address is None:
        if child.poll() is not None:
            raise Unavailable(
                f"the embedded service exited with status {child.returncode} at start-up; see {log_path}"
            )
        if time.monotonic() > deadline:
            raise Unavailable(f"the embedded service did not start within {timeout:g} s; see {log_path}")
        found = _SERVING.search(log_path.read_text(errors="replace"))
        address = found.group(1) if found else None
        time.sleep(0.05)
    with XauditClient(address) as client:
        client.wait_until_ready(timeout=max(1.0, deadline - time.monotonic()))
    return address


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
