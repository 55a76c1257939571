"""In-process notice of job changes, so that WatchJob waits instead of polling.

The store publishes the id of every job it changes; a watcher subscribes to one id and sleeps
until that job changes, its client leaves, or a fallback period passes (changes made through
another replica reach this process only through the store, read at that period).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

__all__ = ["JobEvents", "Subscription"]


class Subscription:
    def __init__(self, events: JobEvents, job_id: str) -> None:
        self.job_id = job_id
        self._events = events
        self._flag = threading.Event()

    def wake(self) -> None:
        self._flag.set()

    def wait(self, timeout: float) -> bool:
        """Sleep until a change (True) or ``timeout`` seconds (False); then re-arm."""
        changed = self._flag.wait(timeout)
        self._flag.clear()
        return changed

    def close(self) -> None:
        self._events._drop(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class JobEvents:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[str, set[Subscription]] = {}

    def subscribe(self, job_id: str) -> Subscription:
        sub = Subscription(self, job_id)
        with self._lock:
            self._subs.setdefault(job_id, set()).add(sub)
        return sub

    def _drop(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.job_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[sub.job_id]

    def publish(self, job_ids: Iterable[str]) -> None:
        with self._lock:
            woken = [s for j in job_ids for s in self._subs.get(j, ())]
        for sub in woken:
            sub.wake()

    def publish_all(self) -> None:
        """Many jobs changed at once (leases expired): every watcher re-reads its job."""
        with self._lock:
            woken = [s for subs in self._subs.values() for s in subs]
        for sub in woken:
            sub.wake()
