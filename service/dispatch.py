"""Hands recorded jobs to the broker, and keeps handing them until a worker holds them.

One background thread: it sends jobs as they are submitted, and every ``sweep_seconds`` it expires
the leases of workers that went silent and (re-)sends queued jobs that were never sent (broker down)
or were sent long ago and are still unclaimed (a broker that lost the message). Several front-end
replicas may each send a job: the claim in the job store makes duplicates harmless.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from service.config import ServerConfig
from service.store import JobStore

__all__ = ["Dispatcher", "Sender", "celery_sender"]

logger = logging.getLogger(__name__)

Sender = Callable[[str, str], None]  # (job id, queue) -> None; raises when the broker is unreachable


def celery_sender(broker_url: str, server_address: str) -> tuple[Sender, Callable[[], None]]:
    """A sender over Celery (task args: job id, service address) and a function that closes it."""
    from workers.celery_app import TASK_NAME, make_app

    app = make_app(broker_url)
    # kombu's filesystem transport names message files by the millisecond and sorts them by name, so
    # two sends within one millisecond could be consumed out of order: keep them 2 ms apart.
    spacing = 0.002 if broker_url.startswith("filesystem://") else 0.0
    last = [0.0]

    def send(job_id: str, queue_name: str) -> None:
        wait = last[0] + spacing - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        # Few, fast retries: the dispatcher itself retries later, and the submit path never waits on it.
        app.send_task(
            TASK_NAME,
            args=[job_id, server_address],
            queue=queue_name,
            retry=True,
            retry_policy={"max_retries": 1, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0},
        )
        last[0] = time.monotonic()

    return send, app.close


class Dispatcher:
    def __init__(self, store: JobStore, send: Sender, config: ServerConfig) -> None:
        self._store = store
        self._send = send
        self._config = config
        self._pending: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xaudit-dispatcher", daemon=True)
        self.broker_ok = True

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._pending.put(None)
        self._thread.join(timeout=10)

    def notify(self, job_id: str, queue_name: str) -> None:
        self._pending.put((job_id, queue_name))

    def _dispatch(self, job_id: str, queue_name: str) -> bool:
        if not self._store.reserve_dispatch(job_id, self._config.requeue_after_seconds):
            return True  # sent already (by the other path or another replica), or no longer queued
        try:
            self._send(job_id, queue_name)
        except Exception as exc:  # any transport error: the job stays queued and is retried
            self._store.release_dispatch(job_id)
            if self.broker_ok:
                logger.warning(
                    "broker unreachable (%s: %s): job %s stays queued", type(exc).__name__, exc, job_id
                )
            self.broker_ok = False
            return False
        if not self.broker_ok:
            logger.warning("broker reachable again: dispatching queued jobs")
        self.broker_ok = True
        logger.debug("job %s sent to %s", job_id, queue_name)
        return True

    def sweep(self) -> None:
        """Expire silent workers' leases and (re-)send due jobs; stops at the first broker failure."""
        self._store.expire_leases(self._config.max_attempts)
        for job_id, queue_name in self._store.due_for_dispatch(self._config.requeue_after_seconds):
            if not self._dispatch(job_id, queue_name):
                return

    def _run(self) -> None:
        next_sweep = time.monotonic()  # sweep at once: a restarted server finds queued jobs
        while not self._stop.is_set():
            try:
                item = self._pending.get(timeout=max(0.0, next_sweep - time.monotonic()))
            except queue.Empty:
                item = None
            if self._stop.is_set():
                return
            try:
                while item is not None:  # every submitted job before a sweep: none is sent twice
                    self._dispatch(*item)
                    item = self._pending.get_nowait() if not self._pending.empty() else None
                if self._stop.is_set():
                    return
                if time.monotonic() >= next_sweep:
                    self.sweep()
                    next_sweep = time.monotonic() + self._config.sweep_seconds
            except Exception:
                logger.exception("dispatcher step failed; retrying at the next sweep")
                next_sweep = time.monotonic() + self._config.sweep_seconds
