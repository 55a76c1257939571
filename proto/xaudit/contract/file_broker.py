"""The embedded mode's serverless broker: kombu's filesystem transport, with whole messages only.

kombu's own ``_put`` creates the message file under its final name, then writes it. A worker
polling in between moves the still-empty file away, fails to decode it, and the job is lost until
the service re-dispatches it (``requeue_after_seconds``, five minutes). Here a message is written
under a name no consumer matches and renamed into place (atomic within one directory), so a
consumer sees a message whole or not at all. The same holds for an exchange's table of bound
queues (in the control folder), which the worker creates as it starts while the service may already
be reading it to route a message.

kombu also names a file by the millisecond, unpadded, and consumes in name order: two sends within
one millisecond, or either side of a power of ten, could be consumed out of order. Here the name
starts with a zero-padded nanosecond clock that never repeats within a process.

Imported only where a Celery app is built (:func:`xaudit.contract.broker.make_app`): it needs kombu.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

__all__ = ["Transport", "message_name"]

_clock_lock = threading.Lock()
_last_ns = [0]
_temp_names = itertools.count()


def _next_ns() -> int:
    # CLOCK_MONOTONIC is system-wide on Linux, so names from the service and the worker interleave
    # in send order; within a process, strictly increasing.
    with _clock_lock:
        _last_ns[0] = max(time.monotonic_ns(), _last_ns[0] + 1)
        return _last_ns[0]


def message_name(queue: str) -> str:
    """A message file's final name: sorts by send time; kombu matches ``<anything>.<queue>.msg``."""
    return f"{_next_ns():020d}_{uuid.uuid4().hex}.{queue}.msg"


def _encoded(value: Any) -> bytes:
    return str_to_bytes(dumps(value))  # type: ignore[no-untyped-call]  # kombu's own JSON, as it reads


def _written(folder: str, data: bytes) -> str:
    """A new file in ``folder`` holding ``data``, under a name no consumer or exchange matches (a dot
    first: kombu reads what follows a name's first dot as ``<queue>.msg`` or ``exchange``)."""
    temp = os.path.join(folder, f".{os.getpid()}-{next(_temp_names)}.partial")
    try:
        with open(temp, "wb") as f:
            f.write(data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return temp


class Channel(filesystem.Channel):
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> Any:  # type: ignore[override]  # as kombu.filesystem
        final = os.path.join(self.data_folder_out, message_name(queue))
        try:
            temp = _written(self.data_folder_out, _encoded(payload))
            try:
                os.rename(temp, final)
            except BaseException:
                os.unlink(temp)
                raise
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        table = self._exchange_file(exchange)  # type: ignore[no-untyped-call]
        if not table.exists():
            # A new table appears whole (a hard link never replaces a file); one that appeared
            # meanwhile gets this binding added under its lock, as kombu does.
            self.control_folder.mkdir(exist_ok=True)
            entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
            temp = _written(str(self.control_folder), _encoded([entry]))
            try:
                os.link(temp, table)
                return
            except FileExistsError:
                pass
            finally:
                os.unlink(temp)
        super()._queue_bind(exchange, routing_key, pattern, queue)  # type: ignore[no-untyped-call]


class Transport(filesystem.Transport):
    Channel = Channel
