"""Domain records -> protobuf messages, and the opaque page tokens of ListJobs."""

from __future__ import annotations

import base64
import json
import math

from google.protobuf.timestamp_pb2 import Timestamp

from service.store import JobRecord
from xaudit.contract.errors import InvalidInput
from xaudit.v1 import audit_pb2

__all__ = ["decode_page_token", "encode_page_token", "job_to_proto"]

_STATES = {
    "QUEUED": audit_pb2.JOB_STATE_QUEUED,
    "RUNNING": audit_pb2.JOB_STATE_RUNNING,
    "SUCCEEDED": audit_pb2.JOB_STATE_SUCCEEDED,
    "FAILED": audit_pb2.JOB_STATE_FAILED,
    "CANCELLED": audit_pb2.JOB_STATE_CANCELLED,
}
_KINDS = {"audit": audit_pb2.JOB_KIND_AUDIT, "attribution": audit_pb2.JOB_KIND_ATTRIBUTION}


def state_to_proto(state: str) -> int:
    return int(_STATES.get(state, audit_pb2.JOB_STATE_UNSPECIFIED))


def _stamp(target: Timestamp, seconds: float | None) -> None:
    if seconds is not None:
        target.FromNanoseconds(int(seconds * 1e9))


def job_to_proto(job: JobRecord) -> audit_pb2.Job:
    msg = audit_pb2.Job(
        id=job.id,
        kind=_KINDS.get(job.kind, audit_pb2.JOB_KIND_UNSPECIFIED),
        state=state_to_proto(job.state),
        progress=job.progress,
        message=job.message,
        error_code=job.error_code,
        error_message=job.error_message,
        model_sha256=job.model_sha256,
        report_available=job.report_available,
        idempotency_key=job.idempotency_key,
        attempts=job.attempts,
        compute_seconds=job.compute_seconds,
    )
    _stamp(msg.created_at, job.created_at)
    _stamp(msg.started_at, job.started_at)
    _stamp(msg.finished_at, job.finished_at)
    return msg


def encode_page_token(job: JobRecord) -> str:
    return base64.urlsafe_b64encode(json.dumps([job.created_at, job.id]).encode()).decode()


def decode_page_token(token: str) -> tuple[float, str] | None:
    if not token:
        return None
    try:
        if len(token) > 256:  # a real token is under 100 characters
            raise ValueError(token)
        created, job_id = json.loads(base64.urlsafe_b64decode(token.encode()))
        created, job_id = float(created), str(job_id)
        if not math.isfinite(created) or len(job_id) > 32 or not job_id.isalnum():
            raise ValueError(token)
        return created, job_id
    except (ValueError, TypeError, RecursionError):
        raise InvalidInput("page_token is not a token returned by ListJobs") from None
