"""Tables of the job store (SQLAlchemy Core). Times are float epoch seconds: portable across SQLite
and PostgreSQL, no time-zone surprises."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

__all__ = ["ADDED_COLUMNS", "job_tensors", "jobs", "metadata", "models", "reports", "results"]

metadata = MetaData()

models = Table(
    "models",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("sha256", String(64), primary_key=True),
    Column("format", String(16), nullable=False),
    Column("size", Integer, nullable=False),
    Column("name", Text, nullable=False, default=""),
    Column("created_at", Float, nullable=False),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("state", String(16), nullable=False),
    Column("progress", Float, nullable=False, default=0.0),
    Column("message", Text, nullable=False, default=""),
    Column("error_code", String(32), nullable=False, default=""),
    Column("error_message", Text, nullable=False, default=""),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("model_sha256", String(64), nullable=False),
    Column("model_format", String(16), nullable=False),
    Column("model_name", Text, nullable=False, default=""),
    Column("inputs_sha256", String(64), nullable=False),
    Column("spec_json", Text, nullable=False),
    Column("queue", String(64), nullable=False),
    Column("idempotency_key", String(128), nullable=False),
    # Set when the job was handed to the broker; NULL: (re-)dispatch pending.
    Column("dispatched_at", Float),
    Column("lease_owner", String(256)),
    # sha256 of the secret handed to the lease owner with the claim (never the secret itself).
    Column("lease_secret", String(64)),
    Column("lease_expires_at", Float),
    Column("attempts", Integer, nullable=False, default=0),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("compute_seconds", Float, nullable=False, default=0.0),
    Column("not_applicable", JSON, nullable=False, default=dict),
    Column("report_available", Boolean, nullable=False, default=False),
    UniqueConstraint("tenant", "idempotency_key", name="uq_jobs_tenant_idempotency_key"),
    Index("ix_jobs_tenant_created", "tenant", "created_at", "id"),
    Index("ix_jobs_state", "state"),
)


def _tensor_table(name: str) -> Table:
    """Named tensors of a job: (job_id, name) -> datatype, shape, raw little-endian bytes."""
    return Table(
        name,
        metadata,
        Column("job_id", String(32), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        Column("name", String(64), primary_key=True),
        Column("datatype", String(8), nullable=False),
        Column("shape", JSON, nullable=False),
        Column("data", LargeBinary, nullable=False),
    )


# Tensors that travel with a job (xaudit.contract.spec.ATTACHMENTS names).
job_tensors = _tensor_table("job_tensors")

# Exactly one report per job: the primary key makes a second insert fail.
reports = Table(
    "reports",
    metadata,
    Column("job_id", String(32), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("content_type", String(128), nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
)

# Result tensors: attribution maps by method name, plus target_values / target_classes.
results = _tensor_table("results")

# Columns added after a release: (table, column, SQL type), added to an existing store at start.
ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (("jobs", "lease_secret", "VARCHAR(64)"),)
