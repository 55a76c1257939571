"""What the client returns: plain frozen dataclasses, so callers never touch protobuf."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

import numpy as np
from google.protobuf import timestamp_pb2

from xaudit.contract.errors import XauditError, error_for_code
from xaudit.contract.tensors import decode_tensor
from xaudit.v1 import audit_pb2

__all__ = [
    "TERMINAL_STATES",
    "AttributionResult",
    "Job",
    "JobState",
    "ModelFormat",
    "ModelRef",
    "SigningKey",
]

ModelFormat = Literal["onnx", "torchscript", "unspecified"]
JobState = Literal["queued", "running", "succeeded", "failed", "cancelled", "unspecified"]
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})

_FORMATS: dict[int, ModelFormat] = {
    audit_pb2.MODEL_FORMAT_ONNX: "onnx",
    audit_pb2.MODEL_FORMAT_TORCHSCRIPT: "torchscript",
}
_STATES: dict[int, JobState] = {
    audit_pb2.JOB_STATE_QUEUED: "queued",
    audit_pb2.JOB_STATE_RUNNING: "running",
    audit_pb2.JOB_STATE_SUCCEEDED: "succeeded",
    audit_pb2.JOB_STATE_FAILED: "failed",
    audit_pb2.JOB_STATE_CANCELLED: "cancelled",
}
_KINDS: dict[int, str] = {audit_pb2.JOB_KIND_AUDIT: "audit", audit_pb2.JOB_KIND_ATTRIBUTION: "attribution"}


def _time(msg: audit_pb2.Job, name: str) -> datetime | None:
    if not msg.HasField(name):
        return None
    ts: timestamp_pb2.Timestamp = getattr(msg, name)
    when: datetime = ts.ToDatetime(tzinfo=UTC)
    return when


@dataclass(frozen=True)
class ModelRef:
    """A stored model: its sha256 is its identity (same bytes, same ref)."""

    sha256: str
    format: ModelFormat
    size: int
    name: str = ""

    @classmethod
    def from_proto(cls, msg: audit_pb2.ModelRef) -> ModelRef:
        return cls(msg.sha256, _FORMATS.get(msg.format, "unspecified"), int(msg.size), msg.name)


@dataclass(frozen=True)
class Job:
    id: str
    kind: str
    state: JobState
    progress: float
    message: str
    model_sha256: str
    report_available: bool
    idempotency_key: str
    attempts: int
    compute_seconds: float
    error_code: str = ""
    error_message: str = ""
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def error(self) -> XauditError | None:
        """The project error a failed job ended with (None unless the state is failed)."""
        if self.state != "failed":
            return None
        return error_for_code(self.error_code or "INTERNAL", self.error_message or "the job failed")

    @classmethod
    def from_proto(cls, msg: audit_pb2.Job) -> Job:
        return cls(
            id=msg.id,
            kind=_KINDS.get(msg.kind, "unspecified"),
            state=_STATES.get(msg.state, "unspecified"),
            progress=float(msg.progress),
            message=msg.message,
            model_sha256=msg.model_sha256,
            report_available=bool(msg.report_available),
            idempotency_key=msg.idempotency_key,
            attempts=int(msg.attempts),
            compute_seconds=float(msg.compute_seconds),
            error_code=msg.error_code,
            error_message=msg.error_message,
            created_at=_time(msg, "created_at"),
            started_at=_time(msg, "started_at"),
            finished_at=_time(msg, "finished_at"),
        )


@dataclass(frozen=True)
class AttributionResult:
    """The result of an attribution job: one (batch, *sample_shape) map per method that ran."""

    attributions: Mapping[str, np.ndarray]
    not_applicable: Mapping[str, str] = field(default_factory=dict)
    target_values: np.ndarray | None = None
    target_classes: np.ndarray | None = None

    @classmethod
    def from_proto(cls, msg: audit_pb2.Attributions) -> AttributionResult:
        # Results are read as sent: a NaN in a method's output is a finding, not a transport error.
        maps = {t.name: decode_tensor(t, finite=False) for t in msg.attributions}
        values = decode_tensor(msg.target_values, finite=False) if msg.HasField("target_values") else None
        classes = decode_tensor(msg.target_classes, finite=False) if msg.HasField("target_classes") else None
        return cls(maps, dict(msg.not_applicable), values, classes)


@dataclass(frozen=True)
class SigningKey:
    key_id: str
    public_key_pem: str
