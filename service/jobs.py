"""The service's operations on jobs, between the servicers (protobuf) and the store (SQL).

Submitting records the job first and dispatches it after; completion seals the report (the one
call site of the signer) and stores it exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

import numpy as np

from service.config import ServerConfig
from service.metrics import (
    ServiceMetrics,
    record_failed,
    record_finished,
    record_started,
    record_submitted,
)
from service.quotas import Quotas
from service.store import JobRecord, JobStore, Lease, NewJob
from service.tokens import Identity
from service.validation import Submission
from xaudit.contract.errors import PermissionDenied
from xaudit.contract.names import queue_for
from xaudit.contract.spec import config_digest, tensor_digest

__all__ = ["SIGNED_CONTENT_TYPE", "UNSIGNED_CONTENT_TYPE", "JobService", "ReportSealer"]

logger = logging.getLogger(__name__)

UNSIGNED_CONTENT_TYPE = "application/json"
SIGNED_CONTENT_TYPE = "application/vnd.dsse.envelope.v1+json"


class ReportSealer(Protocol):
    """What the service needs of service.signing.ReportSigner."""

    def sign(self, report_bytes: bytes, model_sha256: str, model_name: str, inputs_sha256: str) -> bytes: ...

    def public_keys(self) -> list[tuple[str, str]]: ...


class Notifier(Protocol):
    def notify(self, job_id: str, queue: str) -> None: ...


class JobService:
    def __init__(
        self,
        config: ServerConfig,
        store: JobStore,
        dispatcher: Notifier,
        signer: ReportSealer | None = None,
        quotas: Quotas | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.quotas = quotas
        self.metrics = metrics
        self.config = config
        self.store = store
        self.dispatcher = dispatcher
        self.signer = signer

    def submit_job(self, tenant: str, model_sha256: str, submission: Submission) -> JobRecord:
        model = self.store.get_model(tenant, model_sha256)
        spec = submission.spec
        key = submission.idempotency_key or config_digest(model.sha256, spec, submission.tensors)
        if self.quotas is not None:  # a resubmission of an existing job is never refused
            self.quotas.check_submit(tenant, sum(a.nbytes for a in submission.tensors.values()), key)
        new = NewJob(
            tenant=tenant,
            kind=spec.kind,
            model=model,
            inputs_sha256=tensor_digest(submission.tensors["inputs"]),
            spec_json=spec.to_json(),
            queue=queue_for(spec.device),
            idempotency_key=key,
            tensors=submission.tensors,
        )
        job, created = self.store.create_job(new)
        record_submitted(self.metrics, job, created)
        if created:
            logger.info("job %s recorded (%s, queue %s)", job.id, job.kind, job.queue)
            # Recorded first; a broker that is down only delays the job (the dispatcher retries).
            self.dispatcher.notify(job.id, job.queue)
        else:
            logger.info("job %s: same request again (idempotency key), returning the existing job", job.id)
        return job

    def claim(self, job_id: str, worker_id: str, worker: Identity | None) -> tuple[JobRecord, str]:
        """FetchJob: the job and its lease secret ("" when not claimed), for a worker credential
        allowed to take it (its queues and tenants, when the token is limited)."""
        if worker is not None and (worker.queues is not None or worker.job_tenants is not None):
            job = self.store.job_by_id(job_id)
            if not worker.may_run(job.queue, job.tenant):
                raise PermissionDenied(f"this worker token may not take job {job_id} (queue {job.queue})")
        job, secret = self.store.claim(job_id, worker_id, self.config.lease_seconds)
        record_started(self.metrics, job, bool(secret))
        return job, secret

    def check_blob(self, sha256: str, worker: Identity | None) -> None:
        """FetchBlob: a worker token limited to some tenants reads only those tenants' models."""
        limited = worker is not None and worker.job_tenants is not None
        if limited and not self.store.model_tenants(sha256) & worker.job_tenants:  # type: ignore[union-attr,operator]
            raise PermissionDenied("this worker token may not read that model")

    def complete(
        self,
        job_id: str,
        lease: Lease,
        report: bytes | None,
        tensors: Mapping[str, np.ndarray],
        not_applicable: Mapping[str, str],
        compute_seconds: float,
    ) -> bool:
        job = self.store.job_by_id(job_id)
        # The claim first, before anything is signed: a caller without it learns nothing of the job,
        # not even that it is finished.
        if not self.store.claimed_by(job_id, lease):
            logger.warning(
                "job %s: result from %s, which does not hold its lease, refused", job_id, lease.owner
            )
            raise PermissionDenied(f"job {job_id}: this worker does not hold the job's lease")
        if job.terminal:
            logger.info("job %s already %s: result dropped", job_id, job.state)
            return False
        sealed = self._seal(job, report) if report else None
        accepted = self.store.complete(job_id, lease, sealed, tensors, not_applicable, compute_seconds)
        record_finished(self.metrics, job, "succeeded", accepted)
        logger.info("job %s: %s", job_id, "succeeded" if accepted else "already finished, result dropped")
        return accepted

    def fail(self, job_id: str, lease: Lease, code: str, message: str) -> bool:
        """A worker's failure (or its cancellation), from the lease holder only."""
        accepted = self.store.fail(job_id, lease, code, message)
        if accepted and self.metrics is not None:
            record_failed(self.metrics, self.store.job_by_id(job_id), code, accepted)
        return accepted

    def _seal(self, job: JobRecord, report: bytes) -> tuple[bytes, str]:
        # THE signing call site: the exact bytes stored here are what GetReport returns.
        if self.signer is None:
            return report, UNSIGNED_CONTENT_TYPE
        envelope = self.signer.sign(report, job.model_sha256, job.model_name, job.inputs_sha256)
        return envelope, SIGNED_CONTENT_TYPE

    def public_keys(self) -> list[tuple[str, str]]:
        return [] if self.signer is None else self.signer.public_keys()
