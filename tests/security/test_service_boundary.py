"""The service's trust boundary, attacked through a real `xaudit serve` (tokens, Redis, PostgreSQL):
a worker token finishing a job it does not hold, clients starving the server with streams, and
inputs that used to reach the store or the worker as INTERNAL errors or orphan blobs."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.service._helpers import chunks, inputs, mlp_onnx, request, upload
from tests.security._service import SecureService, secure_service
from xaudit.v1 import audit_pb2, worker_pb2

__all__ = ["secure_service"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUICK = {"gradient_x_input": {}}


def _code(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def _queued_job(s: SecureService, seed: int) -> str:
    api = s.api(s.submitter)
    sha = upload(api, mlp_onnx(seed=seed))
    return str(api.SubmitAudit(request(sha, inputs(seed=seed), QUICK), timeout=30).id)


def test_a_completion_by_a_worker_that_does_not_hold_the_lease_is_refused(
    secure_service: SecureService,
) -> None:
    s = secure_service
    job_id = _queued_job(s, 41)
    owner = s.workers(s.worker)
    payload = owner.FetchJob(worker_pb2.FetchJobRequest(job_id=job_id, worker_id="host-a:101"), timeout=10)
    assert payload.claimed and len(payload.lease_secret) >= 32

    # Another worker token, naming the owner (worker ids are guessable: host:pid) with no or a guessed secret.
    attacker = s.workers(s.other_worker)
    # One character off the real secret: a last character other than its own (a fixed "x" was the
    # real secret itself whenever the secret ended in "x", one run in 64).
    near = payload.lease_secret[:-1] + ("y" if payload.lease_secret.endswith("x") else "x")
    for secret in ("", "guess", near):
        forged = worker_pb2.CompleteJobRequest(
            job_id=job_id, worker_id="host-a:101", report=b'{"forged": true}', lease_secret=secret
        )
        assert (
            _code(lambda f=forged: attacker.CompleteJob(f, timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
        )
        fail = worker_pb2.FailJobRequest(
            job_id=job_id, worker_id="host-a:101", code="INTERNAL", message="x", lease_secret=secret
        )
        assert not attacker.FailJob(fail, timeout=10).accepted
        beat = worker_pb2.HeartbeatRequest(job_id=job_id, worker_id="host-a:101", lease_secret=secret)
        assert attacker.Heartbeat(beat, timeout=10).cancel  # "stop": this caller holds nothing
    # The right secret under another worker id is refused too.
    stolen = worker_pb2.CompleteJobRequest(
        job_id=job_id, worker_id="host-b:7", report=b'{"forged": true}', lease_secret=payload.lease_secret
    )
    assert _code(lambda: attacker.CompleteJob(stolen, timeout=10)) == grpc.StatusCode.PERMISSION_DENIED

    reader = s.api(s.reader)
    job = reader.GetJob(audit_pb2.GetJobRequest(job_id=job_id), timeout=10)
    assert job.state == audit_pb2.JOB_STATE_RUNNING
    assert _code(lambda: reader.GetReport(audit_pb2.GetReportRequest(job_id=job_id), timeout=10)) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    # The holder's own result is stored, once.
    mine = worker_pb2.CompleteJobRequest(
        job_id=job_id, worker_id="host-a:101", report=b'{"mine": true}', lease_secret=payload.lease_secret
    )
    assert owner.CompleteJob(mine, timeout=30).accepted
    assert not owner.CompleteJob(mine, timeout=30).accepted  # the holder learns it is finished
    # Nobody else does: a finished job refuses a forged result as a running one does.
    for forged in (
        worker_pb2.CompleteJobRequest(
            job_id=job_id, worker_id="host-a:101", report=b"{}", lease_secret="guess"
        ),
        stolen,
    ):
        assert (
            _code(lambda f=forged: attacker.CompleteJob(f, timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
        )
    report = reader.GetReport(audit_pb2.GetReportRequest(job_id=job_id), timeout=10)
    assert b"forged" not in report.report


def test_a_worker_token_limited_to_another_tenant_takes_none_of_its_jobs_or_models(
    secure_service: SecureService,
) -> None:
    s = secure_service
    api = s.api(s.submitter)
    sha = upload(api, mlp_onnx(seed=45))
    job_id = str(api.SubmitAudit(request(sha, inputs(seed=45), QUICK), timeout=30).id)
    limited = s.workers(s.team_b_worker)
    fetch = worker_pb2.FetchJobRequest(job_id=job_id, worker_id="host-b:1")
    assert _code(lambda: limited.FetchJob(fetch, timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
    blob = worker_pb2.FetchBlobRequest(sha256=sha)
    assert _code(lambda: list(limited.FetchBlob(blob, timeout=10))) == grpc.StatusCode.PERMISSION_DENIED
    reader = s.api(s.reader)
    assert (
        reader.GetJob(audit_pb2.GetJobRequest(job_id=job_id), timeout=10).state == audit_pb2.JOB_STATE_QUEUED
    )
    # An unlimited worker token takes it.
    assert s.workers(s.worker).FetchJob(fetch, timeout=10).claimed


def _watch(
    s: SecureService, job_id: str, opened: list[int], outcome: list[str], stop: threading.Event
) -> None:
    with s.channel(s.reader) as channel:
        api = audit_pb2.DESCRIPTOR.services_by_name["AuditService"]
        call = channel.unary_stream(
            f"/{api.full_name}/WatchJob",
            request_serializer=audit_pb2.WatchJobRequest.SerializeToString,
            response_deserializer=audit_pb2.Job.FromString,
        )(audit_pb2.WatchJobRequest(job_id=job_id), timeout=120)
        try:
            for _ in call:
                opened.append(1)
                break
            stop.wait(120)
            call.cancel()
            outcome.append("served")
        except grpc.RpcError as exc:
            outcome.append(exc.code().name)


def _watch_once_slots_return(s: SecureService, job_id: str, within: float) -> tuple[Any, audit_pb2.Job]:
    """A client's cancel returns before the server has seen it: the slots come back a moment later,
    so the first new watch may still be refused. Retry until they are back, at most ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        watch = s.api(s.reader).WatchJob(audit_pb2.WatchJobRequest(job_id=job_id), timeout=30)
        try:
            return watch, next(watch)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def test_many_open_watches_starve_neither_workers_nor_readers(secure_service: SecureService) -> None:
    s = secure_service
    job_id = _queued_job(s, 42)
    owner = s.workers(s.worker)
    payload = owner.FetchJob(worker_pb2.FetchJobRequest(job_id=job_id, worker_id="host-a:102"), timeout=10)
    assert payload.claimed
    stop = threading.Event()
    opened: list[int] = []
    outcome: list[str] = []
    threads = [
        threading.Thread(target=_watch, args=(s, job_id, opened, outcome, stop), daemon=True)
        for _ in range(24)
    ]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(opened) < 24 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(opened) == 24, f"only {len(opened)} of 24 watches opened"

        beat = worker_pb2.HeartbeatRequest(
            job_id=job_id,
            worker_id="host-a:102",
            progress=0.5,
            message="half",
            lease_secret=payload.lease_secret,
        )
        reader = s.api(s.reader)
        health = health_pb2_grpc.HealthStub(s.channel(None))
        calls = {
            "Heartbeat": lambda: owner.Heartbeat(beat, timeout=5),
            "GetJob": lambda: reader.GetJob(audit_pb2.GetJobRequest(job_id=job_id), timeout=5),
            "ListJobs": lambda: reader.ListJobs(audit_pb2.ListJobsRequest(page_size=5), timeout=5),
            "health": lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=5),
        }
        for _ in range(3):
            for name, call in calls.items():
                started = time.monotonic()
                call()
                assert time.monotonic() - started < 2.0, f"{name} waited behind the watches"

        # More watches than a tenant may hold: refused at once, never queued in front of workers.
        more = [
            threading.Thread(target=_watch, args=(s, job_id, opened, outcome, stop), daemon=True)
            for _ in range(16)
        ]
        for t in more:
            t.start()
        deadline = time.monotonic() + 60
        while outcome.count("RESOURCE_EXHAUSTED") < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert outcome.count("RESOURCE_EXHAUSTED") == 8  # 24 + 16 opened, 32 allowed per tenant
        threads += more
        started = time.monotonic()
        assert not owner.Heartbeat(beat, timeout=5).cancel
        assert time.monotonic() - started < 2.0
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert outcome.count("served") == 32
    # Closed watches give their slots back; a watch wakes on the change, not at its next poll
    # (every second): ten changes each seen within half a second would happen by polling alone
    # about once in a thousand runs.
    watch, first = _watch_once_slots_return(s, job_id, within=10.0)
    assert first.progress == pytest.approx(0.5)
    for step in range(10):
        beat.progress = 0.75 + step / 100
        started = time.monotonic()
        owner.Heartbeat(beat, timeout=5)
        assert next(watch).progress == pytest.approx(beat.progress)
        assert time.monotonic() - started < 0.5, step
    watch.cancel()


def _blob_files(home: Path) -> list[Path]:
    root = home / "blobs"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_nul_nesting_bigint_and_blur_inputs_are_invalid_argument_with_no_orphan_blob(
    secure_service: SecureService,
) -> None:
    s = secure_service
    api = s.api(s.submitter)
    sha = upload(api, mlp_onnx(seed=43))
    x = inputs(seed=43)
    before = _blob_files(s.service.home)

    bad_requests = {
        "NUL in players": request(sha, x, QUICK, players="features\x00"),
        "NUL in a group name": request(sha, x, QUICK, group_names=["a\x00b"]),
        "NUL in an idempotency key": request(sha, x, QUICK, idempotency_key="k\x00"),
        "NUL in a method parameter": request(sha, x, {"integrated_gradients": {"steps": "3\x00"}}),
        "deeply nested parameter": request(
            sha, x, {"integrated_gradients": {"steps": "[" * 200 + "]" * 200}}
        ),
        "5000-digit integer": request(sha, x, {"integrated_gradients": {"steps": "9" * 5000}}),
        "20-digit integer": request(sha, x, {"integrated_gradients": {"steps": "9" * 20}}),
        "blur:1e308": request(sha, x, QUICK, baseline="blur:1e308"),
        "absurdly long text": request(sha, x, QUICK, players="grid:" + "9" * 100_000),
    }
    for what, bad in bad_requests.items():
        with pytest.raises(grpc.RpcError) as info:
            api.SubmitAudit(bad, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (what, info.value.details())
        assert len(info.value.details()) < 400, what

    # An upload whose name the store cannot keep: refused, and its bytes leave nothing on disk.
    def named(name: str):  # type: ignore[no-untyped-def]
        for chunk in chunks(mlp_onnx(seed=44)):
            if chunk.WhichOneof("kind") == "metadata":
                chunk.metadata.name = name
            yield chunk

    for name in ("model\x00.onnx", "m" * 10_000):
        assert _code(lambda n=name: api.UploadModel(named(n), timeout=30)) == grpc.StatusCode.INVALID_ARGUMENT
    assert _blob_files(s.service.home) == before

    # Text that is not UTF-8 (GetJobRequest.job_id = b"\xff\xfe") and an absurd id echoed back clipped.
    with s.channel(s.reader) as channel:
        raw = channel.unary_unary("/xaudit.v1.AuditService/GetJob")
        assert _code(lambda: raw(b"\x0a\x02\xff\xfe", timeout=10)) == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        s.api(s.reader).GetJob(audit_pb2.GetJobRequest(job_id="j" * 4000), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and len(info.value.details()) < 200
    # The service still answers, and the good model is still there.
    assert api.GetJob is not None
    assert upload(api, mlp_onnx(seed=43)) == sha
