"""Run the service until a signal: the gRPC server, and in the embedded mode a local worker process.

The local worker is an ordinary ``xaudit worker`` child (its own process group, so stopping it also
stops its prefork children); it is restarted if it dies while the server runs, and the queued jobs
are sent again (a message it had taken died with it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from service.config import ServerConfig
from service.plans import Planner, no_planner
from service.server import create_server
from xaudit.contract.names import QUEUES
from xaudit.contract.process import die_with_parent

__all__ = ["LocalWorker", "ServeOptions", "serve"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeOptions:
    local_worker: bool = True
    worker_concurrency: int = 1
    worker_queues: tuple[str, ...] = QUEUES
    # Seconds a local worker gets to finish at shutdown before it is killed (its job is re-dispatched).
    worker_stop_seconds: float = 10.0


class LocalWorker:
    def __init__(
        self,
        broker_url: str,
        server: str,
        options: ServeOptions,
        home: str,
        token: str | None = None,
        on_exit: Callable[[], None] = lambda: None,
    ) -> None:
        self._argv = [
            sys.executable,
            "-m",
            "clients.cli.main",
            "worker",
            "--broker",
            broker_url,
            "--server",
            server,
            "--queues",
            ",".join(options.worker_queues),
            "--concurrency",
            str(options.worker_concurrency),
        ]
        self._env = dict(os.environ, XAUDIT_WORKER_CACHE=os.path.join(home, "worker-cache"))
        if token:  # authentication on: the server's in-memory worker token (service/auth.py)
            self._env["XAUDIT_WORKER_TOKEN"] = token
        self._options = options
        self._on_exit = on_exit  # called when the worker dies while the server runs
        self._proc: subprocess.Popen[bytes] | None = None
        self._started = 0.0
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="xaudit-local-worker", daemon=True)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> None:
        self._spawn()
        self._watcher.start()

    def _spawn(self) -> None:
        # Own process group (stopping it reaches the prefork children); dies with this process.
        self._proc = subprocess.Popen(
            self._argv, env=self._env, start_new_session=True, preexec_fn=die_with_parent
        )
        self._started = time.monotonic()
        logger.info("local worker started (pid %d)", self._proc.pid)

    def _watch(self) -> None:
        failures = 0
        while not self._stopping.wait(1.0):
            if self._proc is None or self._proc.poll() is None:
                continue
            # Back off when it dies right after starting (a configuration error, not bad luck).
            failures = failures + 1 if time.monotonic() - self._started < 30 else 0
            delay = min(2.0**failures, 60.0)
            logger.error(
                "local worker exited with status %s: restarting in %.0fs", self._proc.returncode, delay
            )
            self._on_exit()
            if self._stopping.wait(delay):
                return
            self._spawn()

    def stop(self) -> None:
        self._stopping.set()
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.send_signal(signal.SIGTERM)  # Celery warm shutdown: the main process stops its pool
            proc.wait(self._options.worker_stop_seconds)
        except subprocess.TimeoutExpired:
            logger.warning(
                "local worker did not stop in %.0fs: killing it", self._options.worker_stop_seconds
            )
        except ProcessLookupError:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def serve(config: ServerConfig, options: ServeOptions | None = None, planner: Planner = no_planner) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit status. ``planner`` prices PlanAudit requests."""
    options = options or ServeOptions()
    server, _port = create_server(config, planner=planner)
    server.start()
    worker = None
    if options.local_worker:
        worker = LocalWorker(
            config.resolved_broker_url,
            server.address,
            options,
            str(config.home),
            server.worker_token,
            on_exit=server.dispatcher.workers_lost,
        )
        worker.start()
    print(f"xaudit: serving on {server.address} (data in {config.home})", file=sys.stderr, flush=True)
    done = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("signal %d: shutting down", signum)
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    done.wait()
    started = time.monotonic()
    if worker is not None:
        worker.stop()
        logger.info("local worker stopped in %.1fs", time.monotonic() - started)
    server.stop()
    logger.info("stopped in %.1fs", time.monotonic() - started)
    return 0
