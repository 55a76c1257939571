"""The dispatcher: a job is recorded first; a broker that is down only delays it."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from service.config import ServerConfig
from service.dispatch import Dispatcher
from service.store import JobStore, NewJob


def _job(store: JobStore, key: str) -> str:
    model, _ = store.record_model("default", "a" * 64, "onnx", 1, "m")
    new = NewJob(
        "default", "audit", model, "b" * 64, "{}", "xaudit.gpu", key, {"inputs": np.ones(2, np.float32)}
    )
    return store.create_job(new)[0].id


def test_broker_down_keeps_job_queued_and_sends_it_when_back(tmp_path: Path) -> None:
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    sent: list[tuple[str, str]] = []
    broker_up = False

    def send(job_id: str, queue: str) -> None:
        if not broker_up:
            raise ConnectionRefusedError("broker down")
        sent.append((job_id, queue))

    dispatcher = Dispatcher(store, send, ServerConfig(home=tmp_path, sweep_seconds=0.05))
    dispatcher.start()
    try:
        job_id = _job(store, "k")
        dispatcher.notify(job_id, "xaudit.gpu")
        time.sleep(0.3)
        job = store.get_job("default", job_id)
        assert job.state == "QUEUED" and job.dispatched_at is None and not dispatcher.broker_ok
        broker_up = True
        deadline = time.monotonic() + 5
        while not sent and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sent[0] == (job_id, "xaudit.gpu")
        time.sleep(0.2)
        assert len(sent) == 1  # dispatched once: the sweep does not resend a fresh dispatch
        assert store.get_job("default", job_id).dispatched_at is not None
    finally:
        dispatcher.stop()
        store.close()


def test_sweep_requeues_jobs_of_lost_workers(tmp_path: Path) -> None:
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    sent: list[str] = []
    dispatcher = Dispatcher(store, lambda j, q: sent.append(j), ServerConfig(home=tmp_path))
    job_id = _job(store, "k")
    store.claim(job_id, "dead-worker", lease_seconds=-1)
    dispatcher.sweep()
    assert sent == [job_id]
    assert store.get_job("default", job_id).state == "QUEUED"
    store.close()


def test_filesystem_broker_keeps_submission_order(tmp_path: Path) -> None:
    from service.dispatch import celery_sender

    send, close = celery_sender(f"filesystem://{tmp_path / 'broker'}", "127.0.0.1:1")
    ids = [f"job-{i:02d}" for i in range(30)]
    try:
        for job_id in ids:
            send(job_id, "xaudit.cpu")
    finally:
        close()
    files = sorted((tmp_path / "broker" / "queue").iterdir())  # the order the transport consumes them
    import json

    bodies = [json.loads(f.read_text())["body"] for f in files]
    import base64

    order = [json.loads(base64.b64decode(b))[0][0] for b in bodies]
    assert order == ids


def test_each_submitted_job_is_sent_once(tmp_path: Path) -> None:
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    sent: list[str] = []
    dispatcher = Dispatcher(
        store, lambda j, q: sent.append(j), ServerConfig(home=tmp_path, sweep_seconds=0.01)
    )
    dispatcher.start()
    try:
        ids = [_job(store, f"k{i}") for i in range(20)]
        for job_id in ids:
            dispatcher.notify(job_id, "xaudit.gpu")
        deadline = time.monotonic() + 5
        while len(sent) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # sweeps run meanwhile
    finally:
        dispatcher.stop()
        store.close()
    assert sent == ids


def test_queued_jobs_are_sent_again_at_start_and_when_the_broker_loses_its_messages(tmp_path: Path) -> None:
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    sent: list[str] = []
    config = ServerConfig(home=tmp_path, requeue_after_seconds=300)
    first = Dispatcher(store, lambda j, q: sent.append(j), config)
    job_id = _job(store, "k")
    first.sweep()
    assert sent == [job_id]
    first.sweep()
    assert sent == [job_id]  # sent, not yet claimed: not due again for requeue_after
    # A new process (the old one may have died between marking and sending): sent again at once.
    epoch = ["e1"]
    second = Dispatcher(store, lambda j, q: sent.append(j), config, lambda: epoch[0])
    second.start()
    try:
        deadline = time.monotonic() + 5
        while len(sent) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sent == [job_id, job_id]
        second.sweep()
        assert sent == [job_id, job_id]  # same epoch: nothing lost
        epoch[0] = "e2"  # the broker restarted empty, or was flushed
        second.sweep()
        assert sent == [job_id, job_id, job_id]
    finally:
        second.stop()
        store.close()


def test_queued_jobs_are_sent_again_when_the_local_worker_dies(tmp_path: Path) -> None:
    """The filesystem broker has no redelivery: a message the dying worker had taken, before it claimed
    the job, is gone. The job is sent again at the next sweep, not after requeue_after_seconds."""
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    sent: list[str] = []
    dispatcher = Dispatcher(
        store, lambda j, q: sent.append(j), ServerConfig(home=tmp_path, requeue_after_seconds=300)
    )
    job_id, claimed = _job(store, "k"), _job(store, "k2")
    dispatcher.sweep()
    store.claim(claimed, "live-worker", lease_seconds=60)
    dispatcher.sweep()
    assert sent == [job_id, claimed]  # the first message was taken by the worker that then died
    dispatcher.workers_lost()
    dispatcher.sweep()
    assert sent == [job_id, claimed, job_id]  # the claimed job keeps its lease
    dispatcher.sweep()
    assert sent == [job_id, claimed, job_id]
    store.close()


def test_the_local_worker_reports_its_death(tmp_path: Path) -> None:
    import sys

    from service.run import LocalWorker, ServeOptions

    deaths: list[float] = []
    worker = LocalWorker(
        "filesystem:///nowhere",
        "127.0.0.1:1",
        ServeOptions(),
        str(tmp_path),
        on_exit=lambda: deaths.append(1),
    )
    worker._argv = [sys.executable, "-c", "raise SystemExit(3)"]  # a worker that dies at once
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while not deaths and time.monotonic() < deadline:
            time.sleep(0.05)
        assert deaths, "the death was not reported"
    finally:
        worker.stop()
