"""The embedded broker hands a worker whole messages, in the order they were sent.

kombu's own filesystem transport creates a message file under its final name and then writes it:
a worker polling in between took the empty file, failed to decode it, and the job waited for the
service's five-minute re-dispatch (a CI run's attribution job did). Both tests go through
``make_app``'s connections, as the service and the worker do.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from queue import Empty

from xaudit.contract.broker import make_app


def queue_name() -> str:
    # kombu keeps declared bindings in a process-wide state: a queue name another test bound to its
    # own folder would not be bound to this one.
    return f"xaudit.test-{uuid.uuid4().hex}"


def test_a_worker_polling_while_messages_are_written_gets_every_one_whole(tmp_path: Path) -> None:
    app, name = make_app(f"filesystem://{tmp_path / 'broker'}"), queue_name()
    received: list[int] = []
    failures: list[str] = []
    ready, sent = threading.Event(), threading.Event()

    def poll() -> None:  # a worker that lists the folder as fast as it can
        with app.connection_for_read() as conn:
            queue = conn.SimpleQueue(name)
            while True:
                last_look = sent.is_set()  # everything was sent before this look began
                try:
                    message = queue.get(block=False)  # the first call declares and binds the queue
                    ready.set()
                except Empty:
                    ready.set()
                    if last_look:
                        return
                    continue
                except Exception as exc:  # a partial file: kombu cannot decode it
                    failures.append(type(exc).__name__)
                    continue
                received.append(message.payload["n"])
                message.ack()

    worker = threading.Thread(target=poll)
    worker.start()
    # A worker runs before the service sends (in one process the two connections share kombu's record
    # of declared bindings, so the sender would not bind the queue itself).
    ready.wait(timeout=30)
    try:
        with app.connection_for_write() as conn:
            queue = conn.SimpleQueue(name)
            # Large messages keep each write open long enough for the poller to look at it.
            for n in range(40):
                queue.put({"n": n, "pad": "x" * 262_144})
    finally:
        sent.set()
        worker.join(timeout=60)
    assert failures == []
    assert received == list(range(40))


def test_messages_sent_within_one_millisecond_are_consumed_in_send_order(tmp_path: Path) -> None:
    app, name = make_app(f"filesystem://{tmp_path / 'broker'}"), queue_name()
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue(name)
        for n in range(50):
            queue.put({"n": n})
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(name)
        order = []
        for _ in range(50):
            message = queue.get(timeout=5)
            order.append(message.payload["n"])
            message.ack()
    assert order == list(range(50))
    assert not any(p.name.endswith(".partial") for p in (tmp_path / "broker" / "queue").iterdir())


def test_queues_bound_at_once_are_all_in_the_exchange_table(tmp_path: Path) -> None:
    # The worker creates an exchange's table as it starts while the service may bind or read it: a
    # table seen half-written failed to decode, and two bindings made at once kept only one.
    from kombu import Exchange, Queue

    app = make_app(f"filesystem://{tmp_path / 'broker'}")
    exchange = Exchange(f"xaudit.test-{uuid.uuid4().hex}", type="direct")
    names = [queue_name() for _ in range(8)]
    start, failures = threading.Barrier(len(names)), []

    def bind(name: str) -> None:
        with app.connection_for_write() as conn:
            channel = conn.channel()
            exchange(channel).declare()
            start.wait(timeout=30)
            try:
                Queue(name, exchange, routing_key=name)(channel).declare()
            except Exception as exc:
                failures.append(type(exc).__name__)

    threads = [threading.Thread(target=bind, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    with app.connection_for_read() as conn:
        table = conn.default_channel.get_table(exchange.name)
    assert failures == []
    assert sorted(entry.queue for entry in table) == sorted(names)
