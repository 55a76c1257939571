"""AuditService and WorkerService: translate protobuf to domain calls and back. No logic here."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import grpc

from service.auth import current_identity
from service.auth import tenant_of as authenticated_tenant
from service.blobs import BlobStore
from service.convert import decode_page_token, encode_page_token, job_to_proto, state_to_proto
from service.jobs import JobService
from service.metrics import counted_chunks
from service.plans import Planner
from service.store import Lease
from service.uploads import receive_model
from service.validation import (
    Submission,
    check_input_names,
    format_to_proto,
    page_size,
    submission_from_request,
)
from xaudit.contract.tensors import decode_tensor, encode_tensor
from xaudit.v1 import audit_pb2, audit_pb2_grpc, worker_pb2, worker_pb2_grpc

__all__ = ["AuditServicer", "WorkerServicer", "tenant_of"]

logger = logging.getLogger(__name__)

MAX_PAGE = 500


def tenant_of(context: grpc.ServicerContext) -> str:
    """The caller's tenant, as service.auth's interceptor established it for this call."""
    return authenticated_tenant(context)


def _lease(request: Any) -> Lease:
    return Lease(request.worker_id, request.lease_secret)


class AuditServicer(audit_pb2_grpc.AuditServiceServicer):  # type: ignore[misc]
    def __init__(self, jobs: JobService, blobs: BlobStore, planner: Planner) -> None:
        self._jobs = jobs
        self._store = jobs.store
        self._blobs = blobs
        self._config = jobs.config
        self._planner = planner

    def UploadModel(
        self, request_iterator: Iterator[audit_pb2.ModelChunk], context: Any
    ) -> audit_pb2.ModelRef:
        model = receive_model(
            counted_chunks(self._jobs.metrics, request_iterator),
            self._blobs,
            self._store,
            tenant_of(context),
            self._config.upload_cap_bytes,
            self._jobs.quotas,
        )
        return audit_pb2.ModelRef(
            sha256=model.sha256, format=format_to_proto(model.format), size=model.size, name=model.name
        )

    def _submission(self, request: audit_pb2.SubmitRequest, kind: str) -> Submission:
        return submission_from_request(
            request,
            kind,
            max_elements=self._config.max_tensor_elements,
            max_dims=self._config.max_tensor_dims,
        )

    def _submit(self, request: audit_pb2.SubmitRequest, context: Any, kind: str) -> audit_pb2.Job:
        submission = self._submission(request, kind)
        if submission.spec.explain:  # named inputs: check them against the model's own names
            self._store.get_model(tenant_of(context), request.model_sha256)  # NOT_FOUND first
            check_input_names(submission, self._blobs.read(request.model_sha256))
        return job_to_proto(self._jobs.submit_job(tenant_of(context), request.model_sha256, submission))

    def SubmitAudit(self, request: audit_pb2.SubmitRequest, context: Any) -> audit_pb2.Job:
        return self._submit(request, context, "audit")

    def SubmitAttribution(self, request: audit_pb2.SubmitRequest, context: Any) -> audit_pb2.Job:
        return self._submit(request, context, "attribution")

    def PlanAudit(self, request: audit_pb2.SubmitRequest, context: Any) -> audit_pb2.AuditPlan:
        submission = self._submission(request, "audit")
        return self._planner(submission.spec, submission.tensors)

    def GetJob(self, request: audit_pb2.GetJobRequest, context: Any) -> audit_pb2.Job:
        return job_to_proto(self._store.get_job(tenant_of(context), request.job_id))

    def ListJobs(self, request: audit_pb2.ListJobsRequest, context: Any) -> audit_pb2.ListJobsResponse:
        size = page_size(request.page_size, 50, MAX_PAGE)
        page = self._store.list_jobs(tenant_of(context), size + 1, decode_page_token(request.page_token))
        token = encode_page_token(page[size - 1]) if len(page) > size else ""
        return audit_pb2.ListJobsResponse(jobs=[job_to_proto(j) for j in page[:size]], next_page_token=token)

    def WatchJob(self, request: audit_pb2.WatchJobRequest, context: Any) -> Iterator[audit_pb2.Job]:
        tenant = tenant_of(context)
        last: audit_pb2.Job | None = None
        with self._store.events.subscribe(request.job_id) as changes:
            context.add_callback(changes.wake)  # the client left: stop waiting at once
            while context.is_active():
                job = self._store.get_job(tenant, request.job_id)
                msg = job_to_proto(job)
                if msg != last:
                    yield msg
                    last = msg
                if job.terminal:
                    return
                changes.wait(self._config.watch_poll_seconds)

    def CancelJob(self, request: audit_pb2.CancelJobRequest, context: Any) -> audit_pb2.Job:
        return job_to_proto(self._store.cancel(tenant_of(context), request.job_id))

    def GetReport(self, request: audit_pb2.GetReportRequest, context: Any) -> audit_pb2.Report:
        data, content_type = self._store.get_report(tenant_of(context), request.job_id)
        return audit_pb2.Report(report=data, content_type=content_type)

    def GetAttributions(
        self, request: audit_pb2.GetAttributionsRequest, context: Any
    ) -> audit_pb2.Attributions:
        job, arrays = self._store.get_results(tenant_of(context), request.job_id)
        reply = audit_pb2.Attributions(not_applicable=job.not_applicable)
        for name, array in arrays.items():
            if name in ("target_values", "target_classes"):
                getattr(reply, name).CopyFrom(encode_tensor(name, array))
            else:
                reply.attributions.append(encode_tensor(name, array))
        return reply

    def GetSigningKeys(self, request: audit_pb2.GetSigningKeysRequest, context: Any) -> audit_pb2.SigningKeys:
        keys = [audit_pb2.SigningKey(key_id=k, public_key_pem=pem) for k, pem in self._jobs.public_keys()]
        return audit_pb2.SigningKeys(keys=keys)


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):  # type: ignore[misc]
    def __init__(self, jobs: JobService, blobs: BlobStore) -> None:
        self._jobs = jobs
        self._store = jobs.store
        self._blobs = blobs
        self._config = jobs.config

    def FetchJob(self, request: worker_pb2.FetchJobRequest, context: Any) -> worker_pb2.JobPayload:
        job, secret = self._jobs.claim(request.job_id, request.worker_id, current_identity())
        reply = worker_pb2.JobPayload(job_id=job.id, claimed=bool(secret), state=state_to_proto(job.state))
        if not secret:
            return reply
        reply.lease_secret = secret
        reply.spec_json = job.spec_json
        reply.model_sha256 = job.model_sha256
        reply.model_format = format_to_proto(job.model_format)
        reply.model_size = self._blobs.size(job.model_sha256)
        reply.tensors.extend(encode_tensor(n, a) for n, a in self._store.job_tensors(job.id).items())
        reply.attempt = job.attempts
        reply.heartbeat_interval_seconds = self._config.lease_seconds / 4
        return reply

    def FetchBlob(self, request: worker_pb2.FetchBlobRequest, context: Any) -> Iterator[worker_pb2.BlobChunk]:
        self._jobs.check_blob(request.sha256, current_identity())
        total = self._blobs.size(request.sha256)
        first = True
        for chunk in self._blobs.chunks(request.sha256):
            yield worker_pb2.BlobChunk(data=chunk, total_size=total if first else 0)
            first = False

    def Heartbeat(self, request: worker_pb2.HeartbeatRequest, context: Any) -> worker_pb2.HeartbeatResponse:
        stop = self._store.heartbeat(
            request.job_id, _lease(request), request.progress, request.message, self._config.lease_seconds
        )
        return worker_pb2.HeartbeatResponse(cancel=stop)

    def CompleteJob(
        self, request: worker_pb2.CompleteJobRequest, context: Any
    ) -> worker_pb2.CompleteJobResponse:
        tensors = {t.name: decode_tensor(t, finite=False) for t in request.attributions}
        for name in ("target_values", "target_classes"):
            if request.HasField(name):
                tensors[name] = decode_tensor(getattr(request, name), finite=False)
        accepted = self._jobs.complete(
            request.job_id,
            _lease(request),
            request.report or None,
            tensors,
            dict(request.not_applicable),
            request.compute_seconds,
        )
        return worker_pb2.CompleteJobResponse(accepted=accepted)

    def FailJob(self, request: worker_pb2.FailJobRequest, context: Any) -> worker_pb2.FailJobResponse:
        accepted = self._jobs.fail(request.job_id, _lease(request), request.code, request.message)
        return worker_pb2.FailJobResponse(accepted=accepted)
