"""Hands recorded jobs to the broker, and keeps handing them until a worker holds them.

One background thread: it sends jobs as they are submitted, and every ``sweep_seconds`` it expires
the leases of workers that went silent and (re-)sends queued jobs that were never sent (broker down)
or were sent long ago and are still unclaimed. Several front-end replicas may each send a job: the
claim in the job store makes duplicates harmless (a duplicate task finds the job taken and stops).

Prompt recovery: every queued job is sent again when this process starts (a crash between recording
a job as sent and sending it loses nothing), and whenever the broker's epoch changes: a marker the
dispatcher keeps in the broker, gone when the broker restarted empty or was flushed, i.e. when the
messages of queued jobs were lost. Both cost at most one duplicate message per queued job.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable

from service.config import ServerConfig
from service.store import JobStore

__all__ = ["EPOCH_KEY", "Dispatcher", "Epoch", "Sender", "broker_epoch", "celery_sender"]

logger = logging.getLogger(__name__)

Sender = Callable[[str, str], None]  # (job id, queue) -> None; raises when the broker is unreachable
# () -> the broker's current epoch (a marker it loses with its messages); raises when unreachable.
Epoch = Callable[[], str]
EPOCH_KEY = "xaudit:broker-epoch"


def broker_epoch(broker_url: str) -> Epoch | None:
    """The epoch probe of a Redis broker; None for brokers that keep their messages on disk (the
    embedded filesystem transport)."""
    if not broker_url.startswith(("redis://", "rediss://")):
        return None
    import redis

    client = redis.Redis.from_url(broker_url, socket_timeout=2.0, socket_connect_timeout=2.0)

    def epoch() -> str:
        value = client.get(EPOCH_KEY)
        if value is None:  # a new or emptied broker: mark it (the first replica to notice wins)
            client.set(EPOCH_KEY, uuid.uuid4().hex, nx=True)
            value = client.get(EPOCH_KEY)
        return value.decode() if isinstance(value, bytes) else str(value)

    return epoch


def celery_sender(broker_url: str, server_address: str) -> tuple[Sender, Callable[[], None]]:
    """A sender over Celery (task args: job id, service address) and a function that closes it."""
    from xaudit.contract.broker import make_app
    from xaudit.contract.names import TASK_NAME

    app = make_app(broker_url)

    def send(job_id: str, queue_name: str) -> None:
        # Few, fast retries: the dispatcher itself retries later, and the submit path never waits on it.
        app.send_task(
            TASK_NAME,
            args=[job_id, server_address],
            queue=queue_name,
            retry=True,
            retry_policy={"max_retries": 1, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0},
        )

    return send, app.close


class Dispatcher:
    def __init__(
        self, store: JobStore, send: Sender, config: ServerConfig, epoch: Epoch | None = None
    ) -> None:
        self._store = store
        self._send = send
        self._config = config
        self._epoch = epoch
        self._epoch_seen: str | None = None
        self._pending: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xaudit-dispatcher", daemon=True)
        self.broker_ok = True
        self._workers_lost = threading.Event()

    def start(self) -> None:
        # A previous process may have marked jobs as sent and died before sending them.
        n = self._store.redispatch_queued()
        if n:
            logger.info("%d queued job(s) found at start: sending them (again)", n)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._pending.put(None)
        self._thread.join(timeout=10)

    def workers_lost(self) -> None:
        """The service's own worker died. A message it had taken from the broker and not yet claimed
        died with it (the filesystem broker has no redelivery), and its job would wait for the
        re-dispatch after ``requeue_after_seconds``; every queued job is sent again at the next sweep
        instead. A job whose message still waits in the broker gets a second one, which finds it
        claimed and does nothing (``JobStore.claim``)."""
        self._workers_lost.set()

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

    def _broker_lost_messages(self) -> bool | None:
        """True when the broker's epoch changed since the last sweep; None: the broker is down."""
        if self._epoch is None:
            return False
        try:
            current = self._epoch()
        except Exception as exc:
            if self.broker_ok:
                logger.warning("broker unreachable (%s: %s): queued jobs wait", type(exc).__name__, exc)
            self.broker_ok = False
            return None
        lost = self._epoch_seen is not None and current != self._epoch_seen
        if lost:
            logger.warning(
                "the broker lost its messages (restarted empty or flushed): sending queued jobs again"
            )
        self._epoch_seen = current
        return lost

    def sweep(self) -> None:
        """Expire silent workers' leases and (re-)send due jobs; stops at the first broker failure."""
        self._store.expire_leases(self._config.max_attempts)
        lost = self._broker_lost_messages()
        if lost is None:
            return
        if self._workers_lost.is_set():
            self._workers_lost.clear()
            logger.warning("the local worker died: sending queued jobs again")
            lost = True
        if lost:
            n = self._store.redispatch_queued()
            if n:
                logger.info("%d queued job(s) due for sending again", n)
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
