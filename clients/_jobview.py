"""Jobs as the command line shows them: one table row, or a block of ``key: value`` lines."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from clients._columns import aligned
from clients._types import Job

__all__ = ["job_details", "job_summary", "job_table"]


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


def job_table(jobs: Iterable[Job]) -> str:
    rows = [("JOB", "KIND", "STATE", "PROGRESS", "CREATED (UTC)", "MODEL")]
    for job in jobs:
        rows.append(
            (
                job.id,
                job.kind,
                job.state,
                f"{job.progress * 100:.0f}%",
                _when(job.created_at),
                job.model_sha256[:12],
            )
        )
    return "\n".join(aligned(rows))


def job_details(job: Job) -> str:
    lines = [
        ("job", job.id),
        ("kind", job.kind),
        ("state", job.state),
        ("progress", f"{job.progress * 100:.0f}%" + (f" ({job.message})" if job.message else "")),
        ("model", job.model_sha256),
        ("created", _when(job.created_at)),
        ("started", _when(job.started_at)),
        ("finished", _when(job.finished_at)),
        ("attempts", str(job.attempts)),
    ]
    if job.compute_seconds:
        lines.append(("compute", f"{job.compute_seconds:.1f} s"))
    if job.state == "failed":
        lines.append(("error", f"{job.error_code}: {job.error_message}"))
    if job.report_available:
        lines.append(("result", "available"))
    elif job.state == "cancelled":
        lines.append(("result", "none: the job was cancelled"))
    elif job.state == "failed":
        lines.append(("result", "none: the job failed"))
    return "\n".join(f"{key + ':':10} {value}" for key, value in lines)


def job_summary(job: Job) -> dict[str, object]:
    """The job as ``--json`` prints it."""
    return {
        "id": job.id,
        "kind": job.kind,
        "state": job.state,
        "progress": job.progress,
        "message": job.message,
        "model_sha256": job.model_sha256,
        "created": _when(job.created_at),
        "started": _when(job.started_at),
        "finished": _when(job.finished_at),
        "attempts": job.attempts,
        "error": f"{job.error_code}: {job.error_message}" if job.state == "failed" else "",
        "result_available": job.report_available,
    }
