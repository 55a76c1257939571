"""A scripted AuditService on a real loopback gRPC server: the client is tested over a real channel,
without the job store or workers (those are integration tests)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import pytest

from xaudit.v1 import audit_pb2, audit_pb2_grpc


@dataclass
class Recorded:
    chunks: list[audit_pb2.ModelChunk] = field(default_factory=list)
    submits: list[tuple[str, audit_pb2.SubmitRequest]] = field(default_factory=list)
    metadata: list[tuple[tuple[str, str], ...]] = field(default_factory=list)
    list_tokens: list[str] = field(default_factory=list)


class ScriptedService(audit_pb2_grpc.AuditServiceServicer):
    """GetJob aborts with the status named by a job id "status:CODE:message"; other calls answer
    from fixed data so the client's translation can be checked field by field."""

    def __init__(self) -> None:
        self.recorded = Recorded()
        self.jobs = [audit_pb2.Job(id=f"job-{i}", state=audit_pb2.JOB_STATE_SUCCEEDED) for i in range(7)]
        self.watch_script: list[audit_pb2.Job] = []
        # (jobs sent, then "END" for a clean end of stream or a status name to abort with)
        self.interrupted_watches: list[tuple[list[audit_pb2.Job], str]] = []
        self.report = b'{"payloadType":"application/vnd.in-toto+json"}\n'

    def _meta(self, context: grpc.ServicerContext) -> None:
        self.recorded.metadata.append(tuple((m.key, m.value) for m in context.invocation_metadata()))

    def UploadModel(self, request_iterator, context):  # type: ignore[no-untyped-def]
        self._meta(context)
        h = hashlib.sha256()
        size = 0
        first = None
        for chunk in request_iterator:
            self.recorded.chunks.append(chunk)
            if first is None:
                first = chunk
                continue
            h.update(chunk.data)
            size += len(chunk.data)
        assert first is not None and first.HasField("metadata")
        return audit_pb2.ModelRef(
            sha256=h.hexdigest(), format=first.metadata.format, size=size, name=first.metadata.name
        )

    def _submit(
        self, kind: str, request: audit_pb2.SubmitRequest, context: grpc.ServicerContext
    ) -> audit_pb2.Job:
        self._meta(context)
        self.recorded.submits.append((kind, request))
        job_kind = audit_pb2.JOB_KIND_AUDIT if kind == "audit" else audit_pb2.JOB_KIND_ATTRIBUTION
        return audit_pb2.Job(
            id="job-new", kind=job_kind, state=audit_pb2.JOB_STATE_QUEUED, model_sha256=request.model_sha256
        )

    def SubmitAudit(self, request, context):  # type: ignore[no-untyped-def]
        return self._submit("audit", request, context)

    def SubmitAttribution(self, request, context):  # type: ignore[no-untyped-def]
        return self._submit("attribution", request, context)

    def GetJob(self, request, context):  # type: ignore[no-untyped-def]
        self._meta(context)
        if request.job_id.startswith("sleep:"):
            time.sleep(float(request.job_id.split(":", 1)[1]))
        if request.job_id.startswith("status:"):
            _, code, message = request.job_id.split(":", 2)
            context.abort(getattr(grpc.StatusCode, code), message)
        job = audit_pb2.Job(
            id=request.job_id, state=audit_pb2.JOB_STATE_FAILED, error_code="INVALID_ARGUMENT"
        )
        job.error_message = "inputs contain NaN"
        job.created_at.FromSeconds(1_700_000_000)
        return job

    def ListJobs(self, request, context):  # type: ignore[no-untyped-def]
        self.recorded.list_tokens.append(request.page_token)
        start = int(request.page_token or 0)
        end = start + request.page_size
        token = str(end) if end < len(self.jobs) else ""
        return audit_pb2.ListJobsResponse(jobs=self.jobs[start:end], next_page_token=token)

    def WatchJob(self, request, context):  # type: ignore[no-untyped-def]
        # Each call plays the next interrupted script (a server going away mid-stream), then the full one.
        if self.interrupted_watches:
            script, ending = self.interrupted_watches.pop(0)
            yield from script
            if ending != "END":
                context.abort(getattr(grpc.StatusCode, ending), "server shutting down")
            return
        yield from self.watch_script

    def CancelJob(self, request, context):  # type: ignore[no-untyped-def]
        return audit_pb2.Job(id=request.job_id, state=audit_pb2.JOB_STATE_CANCELLED)

    def GetReport(self, request, context):  # type: ignore[no-untyped-def]
        return audit_pb2.Report(report=self.report, content_type="application/vnd.dsse.envelope.v1+json")

    def GetSigningKeys(self, request, context):  # type: ignore[no-untyped-def]
        return audit_pb2.SigningKeys(keys=[audit_pb2.SigningKey(key_id="k1", public_key_pem="PEM")])


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedService, str]]:
    service = ScriptedService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    audit_pb2_grpc.add_AuditServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield service, f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


@pytest.fixture
def dead_address() -> str:
    """A loopback port with nothing listening (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"
