"""What the job store holds, as frozen records, and their row <-> value conversions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from xaudit.contract.tensors import DATATYPES, encode_tensor

__all__ = [
    "ACTIVE_STATES",
    "CANCELLED",
    "FAILED",
    "QUEUED",
    "RUNNING",
    "SUCCEEDED",
    "TERMINAL_STATES",
    "JobRecord",
    "Lease",
    "ModelRecord",
    "NewJob",
    "array_from_row",
    "job_from_row",
    "tensor_rows",
]

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"
ACTIVE_STATES = (QUEUED, RUNNING)
TERMINAL_STATES = (SUCCEEDED, FAILED, CANCELLED)


@dataclass(frozen=True)
class ModelRecord:
    tenant: str
    sha256: str
    format: str
    size: int
    name: str
    created_at: float


@dataclass(frozen=True)
class JobRecord:
    id: str
    tenant: str
    kind: str
    state: str
    progress: float
    message: str
    error_code: str
    error_message: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    model_sha256: str
    model_format: str
    model_name: str
    inputs_sha256: str
    spec_json: str
    queue: str
    idempotency_key: str
    dispatched_at: float | None
    lease_owner: str | None
    lease_expires_at: float | None
    attempts: int
    cancel_requested: bool
    compute_seconds: float
    not_applicable: dict[str, str]
    report_available: bool

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class Lease:
    """Who holds a running job: the worker id it claimed with, and the secret the claim handed it."""

    owner: str
    secret: str


_JOB_FIELDS = tuple(f.name for f in fields(JobRecord))


@dataclass(frozen=True)
class NewJob:
    tenant: str
    kind: str
    model: ModelRecord
    inputs_sha256: str
    spec_json: str
    queue: str
    idempotency_key: str
    tensors: Mapping[str, np.ndarray]


def job_from_row(row: Any) -> JobRecord:
    data = {name: getattr(row, name) for name in _JOB_FIELDS}
    data["not_applicable"] = dict(data["not_applicable"] or {})
    data["cancel_requested"] = bool(data["cancel_requested"])
    data["report_available"] = bool(data["report_available"])
    return JobRecord(**data)


def tensor_rows(job_id: str, tensors: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    rows = []
    for name, array in tensors.items():
        t = encode_tensor(name, array)
        rows.append(
            {
                "job_id": job_id,
                "name": name,
                "datatype": t.datatype,
                "shape": list(t.shape),
                "data": t.raw_contents,
            }
        )
    return rows


def array_from_row(row: Any) -> np.ndarray:
    dtype = DATATYPES[row.datatype]
    return np.frombuffer(row.data, dtype=dtype).reshape(row.shape).astype(dtype.newbyteorder("="))
