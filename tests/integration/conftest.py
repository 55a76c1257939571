"""Real processes for integration tests: `xaudit serve`, `xaudit worker`, Redis and PostgreSQL.

Fixtures (reusable by every integration test):
- ``embedded_service``: `xaudit serve` with no broker/store options (local worker, filesystem broker,
  SQLite) in a fresh data dir; yields a :class:`Service` (``.address``, ``.home``, ``.log``).
- ``redis_service``: `xaudit serve --broker redis://...` plus one separate `xaudit worker`; yields
  a :class:`Service` whose ``.workers`` can be killed and restarted.
- ``postgres_url``: a fresh PostgreSQL database for the test, dropped afterwards.
Helpers: :func:`start_serve`, :func:`start_worker`, :func:`stop_process`.
Every process runs in its own process group with a log file, and is killed at teardown.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("XAUDIT_TEST_REDIS", "redis://127.0.0.1:6379/11")
PG_ADMIN = os.environ.get("XAUDIT_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
START_TIMEOUT = 90.0
_SERVING = re.compile(r"xaudit: serving on (\S+)")


@dataclass
class Service:
    address: str
    home: Path
    proc: subprocess.Popen[bytes]
    log: Path
    broker: str | None = None
    store: str | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _spawn(argv: Sequence[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "clients.cli.main", *argv],
            cwd=ROOT,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
    """Signal the process (SIGKILL: its whole group), wait, and kill the group if it lingers."""
    if proc.poll() is None:
        try:
            if sig == signal.SIGKILL:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
            proc.wait(timeout)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers (prefork children, a local worker)
    proc.wait()


def start_serve(home: Path, *extra: str, log_name: str = "serve.log") -> Service:
    """`xaudit serve --listen 127.0.0.1:0 ...`; waits until it prints its address and answers health."""
    home.mkdir(parents=True, exist_ok=True)
    log = home / log_name
    log.write_bytes(b"")
    env = dict(os.environ, XAUDIT_HOME=str(home), XAUDIT_WORKER_CACHE=str(home / "worker-cache"))
    proc = _spawn(["-v", "serve", "--listen", "127.0.0.1:0", *extra], log, env)
    deadline = time.monotonic() + START_TIMEOUT
    address = None
    while address is None:
        if proc.poll() is not None:
            raise RuntimeError(f"xaudit serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            stop_process(proc, signal.SIGKILL)
            raise RuntimeError(f"xaudit serve did not start:\n{log.read_text()[-3000:]}")
        found = _SERVING.search(log.read_text(errors="replace"))
        address = found.group(1) if found else None
        time.sleep(0.05)
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
    return Service(address, home, proc, log)


def start_worker(
    broker: str, server: str, home: Path, *, name: str = "worker", concurrency: int = 1
) -> subprocess.Popen[bytes]:
    env = dict(os.environ, XAUDIT_WORKER_CACHE=str(home / f"{name}-cache"))
    log = home / f"{name}.log"
    return _spawn(
        [
            "-v",
            "worker",
            "--broker",
            broker,
            "--server",
            server,
            "--queues",
            "xaudit.cpu,xaudit.gpu",
            "--concurrency",
            str(concurrency),
        ],
        log,
        env,
    )


def service_missing(message: str) -> None:
    """Skip on a developer machine without the service; fail in CI, where it must be there."""
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI must provide it: see .ci/run)")
    pytest.skip(message)


def _redis_available() -> bool:
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
        client.ping()
        client.flushdb()  # a database of its own (see REDIS_URL): leftovers of earlier runs only
        client.close()
        return True
    except Exception:
        return False


@pytest.fixture
def embedded_service(tmp_path: Path) -> Iterator[Service]:
    service = start_serve(tmp_path / "home", "--upload-cap-mb", "1", "--lease-seconds", "4")
    try:
        yield service
    finally:
        # SIGKILL: a graceful stop takes ~8 s (billiard's pool shutdown); the restart test covers it.
        stop_process(service.proc, signal.SIGKILL)


@contextlib.contextmanager
def fresh_postgres(prefix: str = "xaudit_test") -> Iterator[str]:
    """A new PostgreSQL database (SQLAlchemy URL), dropped afterwards."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    host = PG_ADMIN.split("://", 1)[1].rsplit("/", 1)[0]
    try:
        yield f"postgresql+psycopg://{host}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_url() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg")
    database = fresh_postgres()
    try:
        url = database.__enter__()
    except psycopg.OperationalError as exc:
        service_missing(f"PostgreSQL not reachable at {PG_ADMIN}: {exc}")
    try:
        yield url
    finally:
        database.__exit__(None, None, None)


@pytest.fixture
def redis_service(tmp_path: Path, postgres_url: str) -> Iterator[Service]:
    """Redis broker, PostgreSQL job store, a short lease, and one separate worker process."""
    if not _redis_available():
        service_missing(f"Redis not reachable at {REDIS_URL}")
    home = tmp_path / "home"
    service = start_serve(home, "--broker", REDIS_URL, "--store", postgres_url, "--lease-seconds", "3")
    service.broker, service.store = REDIS_URL, postgres_url
    service.workers.append(start_worker(REDIS_URL, service.address, home))
    try:
        yield service
    finally:
        for worker in service.workers:
            stop_process(worker, signal.SIGKILL)
        stop_process(service.proc)
