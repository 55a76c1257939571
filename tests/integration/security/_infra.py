"""Throwaway infrastructure for fault and load tests: a private redis-server, a fresh PostgreSQL
database, the resident memory of a process. Everything on loopback; everything removed afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from clients._embedded import free_port
from tests.integration.conftest import fresh_postgres

__all__ = ["RedisServer", "TcpProxy", "fresh_postgres", "rss_bytes"]


@dataclass
class RedisServer:
    """A redis-server of our own on a free loopback port, stoppable and restartable on the same port."""

    port: int
    workdir: Path

    @classmethod
    def start_new(cls) -> RedisServer:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed")
        server = cls(free_port(), Path(tempfile.mkdtemp(prefix="xaudit-redis-")))
        server.start()
        return server

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pidfile(self) -> Path:
        return self.workdir / "redis.pid"

    def start(self) -> None:
        subprocess.run(
            [
                "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--daemonize", "yes", "--pidfile", str(self.pidfile),
                "--dir", str(self.workdir), "--logfile", str(self.workdir / "redis.log"),
            ],
            check=True,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not self.alive():
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.05)

    def alive(self) -> bool:
        done = subprocess.run(
            ["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True, timeout=5
        )
        return done.stdout.strip() == "PONG"

    def stop(self) -> None:
        """Stop it hard (SIGKILL to its pid): queued messages are lost, as in a crash."""
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            pid = int(self.pidfile.read_text().strip())
            os.kill(pid, 9)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                os.kill(pid, 0)
                time.sleep(0.05)
        self.pidfile.unlink(missing_ok=True)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def rss_bytes(pid: int) -> int:
    """Resident memory of one process (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


class TcpProxy:
    """A loopback TCP forwarder to ``target`` that can be cut (every connection dropped) and restored
    on the same port: a database outage without touching the database."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):  # wakes the accepting thread (close alone does not)
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
