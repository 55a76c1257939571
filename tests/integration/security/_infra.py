"""Throwaway infrastructure for fault and load tests: a private redis-server, a fresh PostgreSQL
database, the resident memory of a process. Everything on loopback; everything removed afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from clients._embedded import free_port

__all__ = ["RedisServer", "fresh_postgres", "rss_bytes"]

PG_ADMIN = os.environ.get("XAUDIT_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


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


@contextlib.contextmanager
def fresh_postgres() -> Iterator[str]:
    """A new PostgreSQL database (SQLAlchemy URL), dropped afterwards."""
    import psycopg

    name = f"xaudit_sec_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    host = PG_ADMIN.split("://", 1)[1].rsplit("/", 1)[0]
    try:
        yield f"postgresql+psycopg://{host}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def rss_bytes(pid: int) -> int:
    """Resident memory of one process (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0
