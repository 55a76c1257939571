"""Prompt recovery with real processes (a private Redis, PostgreSQL, `xaudit serve`, a Celery worker):
jobs whose broker messages are lost - the server killed right after a burst of submits, Redis flushed
with jobs queued - all finish within 30 s of the service returning, with exactly one report each.

The worker is paused (SIGSTOP) while messages are lost, so that they are lost for certain: it cannot
have taken them first. Without the re-send at start and on a new broker epoch (service.dispatch),
those jobs waited for requeue_after (300 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis as redis_client

from service.store import JobStore
from tests.integration.conftest import (
    Service,
    fresh_postgres,
    service_missing,
    start_serve,
    start_worker,
    stop_process,
)
from tests.integration.security._infra import RedisServer
from tests.integration.service._helpers import inputs, mlp_onnx, request, stub, upload, wait_done
from xaudit.v1 import audit_pb2

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUICK = {"gradient_x_input": {}}
BUDGET = 30.0


@dataclass
class Stack:
    service: Service
    redis: RedisServer
    store_url: str
    worker: subprocess.Popen[bytes]


@pytest.fixture
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    psycopg = pytest.importorskip("psycopg")
    try:
        broker = RedisServer.start_new()
    except (RuntimeError, FileNotFoundError, subprocess.CalledProcessError) as exc:
        service_missing(f"cannot start a private redis-server: {exc}")
    database = fresh_postgres()
    try:
        url = database.__enter__()
    except psycopg.OperationalError as exc:
        broker.close()
        service_missing(f"PostgreSQL not reachable: {exc}")
    home = tmp_path_factory.mktemp("recovery") / "home"
    service = start_serve(home, "--broker", broker.url, "--store", url, "--lease-seconds", "10")
    # Recovery of dispatch is measured here, not the model sandbox's start-up: each pool process's
    # sandbox starts a zygote that imports torch (docs/security.md), again in every worker this
    # test restarts, which on a loaded 2-core machine would add to the 30 s budget. The sandbox has
    # its own tests.
    saved = os.environ.get("XAUDIT_SANDBOX_FORMATS")
    os.environ["XAUDIT_SANDBOX_FORMATS"] = "none"
    try:
        worker = start_worker(broker.url, service.address, home, concurrency=2)
    finally:
        if saved is None:
            os.environ.pop("XAUDIT_SANDBOX_FORMATS", None)
        else:
            os.environ["XAUDIT_SANDBOX_FORMATS"] = saved
    built = Stack(service, broker, url, worker)
    try:
        yield built
    finally:
        _resume(built.worker)
        stop_process(built.worker, signal.SIGKILL)
        stop_process(built.service.proc, signal.SIGKILL)
        database.__exit__(None, None, None)
        broker.close()


def _pause(worker: subprocess.Popen[bytes]) -> None:
    os.killpg(worker.pid, signal.SIGSTOP)


def _resume(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGCONT)


def _warm(api, sha: str) -> None:  # type: ignore[no-untyped-def]
    """One job end to end: the worker is up and has the model cached."""
    job = api.SubmitAudit(request(sha, inputs(seed=99), QUICK), timeout=30)
    assert wait_done(api, job.id, timeout=180).state == audit_pb2.JOB_STATE_SUCCEEDED


def _finish_all(api, job_ids: list[str], started: float, store_url: str) -> None:  # type: ignore[no-untyped-def]
    for job_id in job_ids:
        left = max(1.0, BUDGET - (time.monotonic() - started))
        done = wait_done(api, job_id, timeout=left)
        assert done.state == audit_pb2.JOB_STATE_SUCCEEDED, (done.error_code, done.error_message)
    assert time.monotonic() - started < BUDGET
    store = JobStore(store_url)
    try:
        assert [store.count_results(j)[0] for j in job_ids] == [1] * len(job_ids)
    finally:
        store.close()


def _queued_messages(url: str) -> int:
    client = redis_client.Redis.from_url(url)
    try:
        return int(client.llen("xaudit.cpu"))
    finally:
        client.close()


def _flush(url: str) -> None:
    client = redis_client.Redis.from_url(url)
    try:
        client.flushall()
    finally:
        client.close()


def test_server_killed_after_a_burst_and_messages_lost_every_job_finishes_promptly_once(stack: Stack) -> None:
    api = stub(stack.service.address)
    sha = upload(api, mlp_onnx(seed=51))
    _warm(api, sha)
    _pause(stack.worker)
    jobs = [api.SubmitAudit(request(sha, inputs(seed=60 + i), QUICK), timeout=30).id for i in range(6)]
    stop_process(stack.service.proc, signal.SIGKILL)  # right after the burst: some sent, some not
    _flush(stack.redis.url)  # and what was sent is gone with the broker's memory

    port = stack.service.address.rsplit(":", 1)[1]
    again = start_serve(
        stack.service.home, "--broker", stack.redis.url, "--store", stack.store_url,
        "--lease-seconds", "10", "--listen", f"127.0.0.1:{port}", log_name="serve-2.log",
    )  # fmt: skip
    stack.service.proc = again.proc
    started = time.monotonic()
    _resume(stack.worker)
    _finish_all(api, jobs, started, stack.store_url)


def test_redis_flushed_with_jobs_queued_every_job_finishes_promptly_once(stack: Stack) -> None:
    api = stub(stack.service.address)
    sha = upload(api, mlp_onnx(seed=52))
    _warm(api, sha)
    _pause(stack.worker)
    jobs = [api.SubmitAudit(request(sha, inputs(seed=70 + i), QUICK), timeout=30).id for i in range(5)]
    deadline = time.monotonic() + 20
    while _queued_messages(stack.redis.url) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (
        _queued_messages(stack.redis.url) >= 4
    )  # sent and waiting in the broker (a paused worker may hold one)
    _flush(stack.redis.url)
    started = time.monotonic()
    _resume(stack.worker)
    _finish_all(api, jobs, started, stack.store_url)
