"""Job store state machine on SQLite: claims, leases, exactly-once completion, tenancy."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from service.store import JobStore, Lease, NewJob
from xaudit.contract.errors import FailedPrecondition, NotFound


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    s = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield s
    s.close()


def _new(store: JobStore, key: str = "k1", tenant: str = "default", kind: str = "audit") -> NewJob:
    model, _ = store.record_model(tenant, "a" * 64, "onnx", 10, "m")
    return NewJob(
        tenant, kind, model, "b" * 64, "{}", "xaudit.cpu", key, {"inputs": np.ones((2, 3), np.float32)}
    )


def test_idempotency_key_returns_the_same_job_per_tenant(store: JobStore) -> None:
    job, created = store.create_job(_new(store))
    again, created_again = store.create_job(_new(store))
    other, created_other = store.create_job(_new(store, tenant="acme"))
    assert created and not created_again and created_other
    assert again.id == job.id != other.id
    with pytest.raises(NotFound):
        store.get_job("acme", job.id)  # another tenant's job does not exist for you
    assert [j.id for j in store.list_jobs("acme", 10)] == [other.id]


def test_claim_heartbeat_complete_exactly_once(store: JobStore) -> None:
    job, _ = store.create_job(_new(store))
    _, secret = store.claim(job.id, "w1", lease_seconds=30)
    _, claimed_again = store.claim(job.id, "w2", lease_seconds=30)
    assert secret and not claimed_again  # a live lease is not taken over
    w1 = Lease("w1", secret)
    assert store.heartbeat(job.id, w1, 0.5, "half way", 30) is False
    assert store.heartbeat(job.id, Lease("w2", secret), 0.5, "not mine", 30) is True  # w2 holds nothing
    assert store.heartbeat(job.id, Lease("w1", "guessed"), 0.5, "no secret", 30) is True
    tensors = {"saliency": np.zeros((2, 3), np.float32)}
    # Neither another worker id with the secret, nor the owner's id without it, finishes the job.
    assert not store.complete(job.id, Lease("w2", secret), (b"forged", "application/json"), tensors, {}, 1.0)
    assert not store.complete(job.id, Lease("w1", ""), (b"forged", "application/json"), tensors, {}, 1.0)
    assert not store.fail(job.id, Lease("w1", "guessed"), "INTERNAL", "forged")
    assert store.claimed_by(job.id, w1) and not store.claimed_by(job.id, Lease("w1", "x"))
    assert store.complete(job.id, w1, (b"report-1", "application/json"), tensors, {}, 1.0)
    assert not store.complete(job.id, w1, (b"report-2", "application/json"), tensors, {}, 1.0)
    # The claim that finished the job stays its claim; no other becomes one.
    assert store.claimed_by(job.id, w1)
    assert not store.claimed_by(job.id, Lease("w2", secret)) and not store.claimed_by(job.id, Lease("w1", ""))
    assert store.count_results(job.id) == (1, 1)
    assert store.get_report("default", job.id) == (b"report-1", "application/json")
    final = store.get_job("default", job.id)
    assert final.state == "SUCCEEDED" and final.progress == 1.0 and final.report_available


def test_expired_lease_requeues_then_fails_after_max_attempts(store: JobStore) -> None:
    job, _ = store.create_job(_new(store))
    assert store.reserve_dispatch(job.id, requeue_after=300)
    assert not store.reserve_dispatch(job.id, requeue_after=300)  # sent once
    assert store.due_for_dispatch(requeue_after=300) == []
    for attempt in (1, 2):
        _, claimed = store.claim(job.id, f"w{attempt}", lease_seconds=-1)  # expired at once
        assert claimed
        assert store.expire_leases(max_attempts=3) == 1
        assert store.get_job("default", job.id).state == "QUEUED"
        assert store.due_for_dispatch(requeue_after=300) == [(job.id, "xaudit.cpu")]
    _, last = store.claim(job.id, "w3", lease_seconds=-1)
    store.expire_leases(max_attempts=3)
    assert not store.claimed_by(job.id, Lease("w3", last))  # lost, not finished by w3
    failed = store.get_job("default", job.id)
    assert failed.state == "FAILED" and failed.error_code == "UNAVAILABLE" and failed.attempts == 3


def test_expired_lease_of_an_old_worker_can_be_claimed_directly(store: JobStore) -> None:
    job, _ = store.create_job(_new(store))
    _, old = store.claim(job.id, "w1", lease_seconds=-1)
    _, new = store.claim(job.id, "w2", lease_seconds=30)
    assert new
    # The old worker's failure must not fail the job the new worker runs.
    assert not store.fail(job.id, Lease("w1", old), "INTERNAL", "boom")
    assert store.get_job("default", job.id).state == "RUNNING"
    assert store.fail(job.id, Lease("w2", new), "INVALID_ARGUMENT", "bad players")
    assert store.claimed_by(job.id, Lease("w2", new)) and not store.claimed_by(job.id, Lease("w1", old))
    failed = store.get_job("default", job.id)
    assert (failed.state, failed.error_code, failed.error_message) == (
        "FAILED",
        "INVALID_ARGUMENT",
        "bad players",
    )
    with pytest.raises(FailedPrecondition, match="bad players"):
        store.get_report("default", job.id)


def test_cancel_queued_and_running(store: JobStore) -> None:
    queued, _ = store.create_job(_new(store, key="q"))
    assert store.cancel("default", queued.id).state == "CANCELLED"
    _, claimed = store.claim(queued.id, "w", 30)
    assert not claimed  # a cancelled job is never started
    running, _ = store.create_job(_new(store, key="r"))
    _, secret = store.claim(running.id, "w", 30)
    assert store.cancel("default", running.id).state == "RUNNING"
    assert store.heartbeat(running.id, Lease("w", secret), 0.1, "x", 30) is True
    assert store.fail(running.id, Lease("w", secret), "CANCELLED", "cancelled")
    assert store.get_job("default", running.id).state == "CANCELLED"


def test_list_jobs_is_newest_first_with_keyset_pages(store: JobStore) -> None:
    ids = []
    for i in range(5):
        ids.append(store.create_job(_new(store, key=f"k{i}"))[0].id)
        time.sleep(0.002)
    page1 = store.list_jobs("default", 3)
    page2 = store.list_jobs("default", 3, after=(page1[-1].created_at, page1[-1].id))
    assert [j.id for j in page1 + page2] == ids[::-1]


def test_tensors_round_trip(store: JobStore) -> None:
    model, _ = store.record_model("default", "c" * 64, "onnx", 10, "m")
    arrays = {
        "inputs": np.arange(6, dtype=np.float64).reshape(2, 3),
        "player_groups": np.array([0, 1, 1], np.int64),
    }
    job, _ = store.create_job(NewJob("default", "audit", model, "d" * 64, "{}", "xaudit.cpu", "t", arrays))
    back = store.job_tensors(job.id)
    for name, array in arrays.items():
        assert back[name].dtype == array.dtype
        np.testing.assert_array_equal(back[name], array)


def test_worker_text_with_nul_is_cleaned_not_refused(store: JobStore) -> None:
    job, _ = store.create_job(_new(store))
    _, secret = store.claim(job.id, "w", 30)
    assert store.heartbeat(job.id, Lease("w", secret), float("nan"), "step\x00one", 30) is False
    assert store.fail(job.id, Lease("w", secret), "INVALID_ARGUMENT", "node 'a\x00b' is odd")
    failed = store.get_job("default", job.id)
    assert "\x00" not in failed.error_message and failed.error_message.startswith("node 'a")


def test_an_unknown_id_is_echoed_clipped(store: JobStore) -> None:
    with pytest.raises(NotFound) as info:
        store.get_job("default", "x" * 5000)
    assert len(str(info.value)) < 200
