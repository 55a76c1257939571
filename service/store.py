"""The job store: the source of truth for models, jobs, leases, reports and results.

SQLite by default (WAL, one file under the data dir); PostgreSQL through a
``postgresql+psycopg://`` URL for several front-end replicas. Every state change is one conditional
UPDATE, so concurrent replicas and redelivered tasks cannot produce two results for one job.
Every lookup a client can cause is scoped by tenant. The worker-facing calls are keyed by job id and
bound to the lease: a claim hands its worker a fresh secret (only its hash is stored), and
heartbeats, completions and failures change the job only for that worker with that secret.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import time
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from service.events import JobEvents
from service.records import (
    ACTIVE_STATES,
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL_STATES,
    JobRecord,
    Lease,
    ModelRecord,
    NewJob,
    array_from_row,
    job_from_row,
    tensor_rows,
)
from service.schema import ADDED_COLUMNS, job_tensors, jobs, metadata, models, reports, results
from service.text import clean, shown
from xaudit.contract.errors import FailedPrecondition, InvalidInput, NotFound, Unavailable

# Records are re-exported: callers import them from the store.
__all__ = [
    "ACTIVE_STATES",
    "QUEUED",
    "RUNNING",
    "TERMINAL_STATES",
    "JobRecord",
    "JobStore",
    "Lease",
    "ModelRecord",
    "NewJob",
]

logger = logging.getLogger(__name__)


def _make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return sa.create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def _without_password(url: str) -> str:
    return str(sa.engine.make_url(url).render_as_string(hide_password=True))


def _secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _add_columns(engine: Engine) -> None:
    """Columns added since a store was created (service.schema.ADDED_COLUMNS), added in place."""
    inspector = sa.inspect(engine)
    for table, column, sql_type in ADDED_COLUMNS:
        if column not in {c["name"] for c in inspector.get_columns(table)}:
            with engine.begin() as conn:
                conn.execute(sa.text(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}"))
            logger.info("job store: added column %s.%s", table, column)


class JobStore:
    def __init__(self, url: str) -> None:
        self.url = url
        try:
            self.engine = _make_engine(url)
        except sa.exc.NoSuchModuleError:
            dialect = url.split("://", 1)[0]
            raise InvalidInput(
                f"the job store URL's dialect {shown(dialect, 40)!r} is not one SQLAlchemy knows: "
                "use postgresql+psycopg:// or sqlite://"
            ) from None
        except sa.exc.ArgumentError:  # unparseable
            raise InvalidInput(
                "not a job store URL: expected e.g. postgresql+psycopg://USER@HOST/DB or sqlite:///PATH"
            ) from None
        except ImportError as exc:  # a dialect whose driver is not installed
            raise InvalidInput(f"the job store {_without_password(url)} needs {exc.name or exc}") from None
        try:
            metadata.create_all(self.engine)
            _add_columns(self.engine)
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            self.engine.dispose()
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else type(exc).__name__
            raise Unavailable(
                f"cannot open the job store {_without_password(url)}: {shown(reason, 200)}"
            ) from None
        # Every change made through this store is published here (WatchJob waits on it).
        self.events = JobEvents()

    def close(self) -> None:
        self.engine.dispose()

    # -- models ---------------------------------------------------------------------------------
    def record_model(
        self, tenant: str, sha256: str, fmt: str, size: int, name: str
    ) -> tuple[ModelRecord, bool]:
        """The tenant's record of this model, and whether this call created it."""
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    models.insert().values(
                        tenant=tenant, sha256=sha256, format=fmt, size=size, name=name, created_at=time.time()
                    )
                )
            created = True
        except sa.exc.IntegrityError:
            created = False  # uploaded before (or concurrently): same bytes, same record
        return self.get_model(tenant, sha256), created

    def forget_model(self, tenant: str, sha256: str) -> None:
        """Remove a model record whose blob could not be stored (the upload failed after recording)."""
        with self.engine.begin() as conn:
            conn.execute(models.delete().where(models.c.tenant == tenant, models.c.sha256 == sha256))

    def model_tenants(self, sha256: str) -> set[str]:
        """The tenants that uploaded this model."""
        with self.engine.connect() as conn:
            return {r[0] for r in conn.execute(sa.select(models.c.tenant).where(models.c.sha256 == sha256))}

    def model_digests(self) -> set[str]:
        """Every stored model's digest, all tenants: the blobs that must be kept."""
        with self.engine.connect() as conn:
            return {r[0] for r in conn.execute(sa.select(models.c.sha256).distinct())}

    def get_model(self, tenant: str, sha256: str) -> ModelRecord:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(models).where(models.c.tenant == tenant, models.c.sha256 == sha256)
            ).first()
        if row is None:
            raise NotFound(
                f"unknown model {shown(sha256) or '(empty digest)'}: upload it first (UploadModel)"
            )
        return ModelRecord(**row._asdict())

    # -- jobs, client side ----------------------------------------------------------------------
    def create_job(self, new: NewJob) -> tuple[JobRecord, bool]:
        """Record a job (QUEUED, not yet dispatched). Returns (job, created); an existing job with the
        same tenant and idempotency key is returned with created False."""
        existing = self._by_key(new.tenant, new.idempotency_key)
        if existing is not None:
            return existing, False
        job_id = uuid.uuid4().hex
        values = {
            "id": job_id,
            "tenant": new.tenant,
            "kind": new.kind,
            "state": QUEUED,
            "progress": 0.0,
            "message": "queued",
            "error_code": "",
            "error_message": "",
            "created_at": time.time(),
            "model_sha256": new.model.sha256,
            "model_format": new.model.format,
            "model_name": new.model.name,
            "inputs_sha256": new.inputs_sha256,
            "spec_json": new.spec_json,
            "queue": new.queue,
            "idempotency_key": new.idempotency_key,
            "attempts": 0,
            "cancel_requested": False,
            "compute_seconds": 0.0,
            "not_applicable": {},
            "report_available": False,
        }
        try:
            with self.engine.begin() as conn:
                conn.execute(jobs.insert().values(**values))
                rows = tensor_rows(job_id, new.tensors)
                if rows:
                    conn.execute(job_tensors.insert(), rows)
        except sa.exc.IntegrityError:
            # A concurrent submission with the same key committed first.
            again = self._by_key(new.tenant, new.idempotency_key)
            if again is None:
                raise
            return again, False
        return self.get_job(new.tenant, job_id), True

    def _by_key(self, tenant: str, key: str) -> JobRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(jobs).where(jobs.c.tenant == tenant, jobs.c.idempotency_key == key)
            ).first()
        return None if row is None else job_from_row(row)

    def get_job(self, tenant: str, job_id: str) -> JobRecord:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(jobs).where(jobs.c.tenant == tenant, jobs.c.id == job_id)).first()
        if row is None:
            raise NotFound(f"unknown job '{shown(job_id)}'")
        return job_from_row(row)

    def list_jobs(self, tenant: str, limit: int, after: tuple[float, str] | None = None) -> list[JobRecord]:
        """Newest first; ``after`` is the (created_at, id) of the last job of the previous page."""
        query = sa.select(jobs).where(jobs.c.tenant == tenant)
        if after is not None:
            created, job_id = after
            query = query.where(
                sa.or_(jobs.c.created_at < created, sa.and_(jobs.c.created_at == created, jobs.c.id < job_id))
            )
        query = query.order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit)
        with self.engine.connect() as conn:
            return [job_from_row(r) for r in conn.execute(query)]

    def cancel(self, tenant: str, job_id: str) -> JobRecord:
        """Queued: cancelled now. Running: flagged; the worker stops at its next heartbeat."""
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(
                jobs.update()
                .where(jobs.c.tenant == tenant, jobs.c.id == job_id, jobs.c.state == QUEUED)
                .values(state=CANCELLED, finished_at=now, message="cancelled", cancel_requested=True)
            )
            conn.execute(
                jobs.update()
                .where(jobs.c.tenant == tenant, jobs.c.id == job_id, jobs.c.state == RUNNING)
                .values(cancel_requested=True, message="cancelling")
            )
        self.events.publish([job_id])
        return self.get_job(tenant, job_id)

    def get_report(self, tenant: str, job_id: str) -> tuple[bytes, str]:
        job = self.get_job(tenant, job_id)
        if job.kind != "audit":
            raise FailedPrecondition(f"job {job_id} is an attribution job: it has attributions, not a report")
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(reports).where(reports.c.job_id == job_id)).first()
        if row is None:
            raise FailedPrecondition(_not_ready(job))
        return bytes(row.data), row.content_type

    def get_results(self, tenant: str, job_id: str) -> tuple[JobRecord, dict[str, np.ndarray]]:
        job = self.get_job(tenant, job_id)
        if job.state != SUCCEEDED:
            raise FailedPrecondition(_not_ready(job))
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(results).where(results.c.job_id == job_id).order_by(results.c.name))
            return job, {r.name: array_from_row(r) for r in rows}

    def count_results(self, job_id: str) -> tuple[int, int]:
        """(reports, result tensors) stored for a job: tests check that there is exactly one report."""
        with self.engine.connect() as conn:
            n_reports = conn.execute(
                sa.select(sa.func.count()).select_from(reports).where(reports.c.job_id == job_id)
            ).scalar_one()
            n_results = conn.execute(
                sa.select(sa.func.count()).select_from(results).where(results.c.job_id == job_id)
            ).scalar_one()
        return int(n_reports), int(n_results)

    # -- accounting (quotas and metrics ask these; nothing outside the store writes SQL) -----------
    def has_idempotency_key(self, tenant: str, key: str) -> bool:
        return self._by_key(tenant, key) is not None

    def active_jobs(self, tenant: str) -> int:
        """The tenant's queued and running jobs."""
        query = (
            sa.select(sa.func.count())
            .select_from(jobs)
            .where(jobs.c.tenant == tenant, jobs.c.state.in_(ACTIVE_STATES))
        )
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def stored_bytes(self, tenant: str) -> int:
        """Bytes a tenant keeps on the service: its models, job inputs, reports and result tensors."""
        job_ids = sa.select(jobs.c.id).where(jobs.c.tenant == tenant).scalar_subquery()
        queries = [
            sa.select(sa.func.coalesce(sa.func.sum(models.c.size), 0)).where(models.c.tenant == tenant),
            *(
                sa.select(sa.func.coalesce(sa.func.sum(sa.func.length(t.c.data)), 0)).where(
                    t.c.job_id.in_(job_ids)
                )
                for t in (job_tensors, reports, results)
            ),
        ]
        with self.engine.connect() as conn:
            return sum(int(conn.execute(q).scalar_one()) for q in queries)

    def active_counts(self) -> dict[str, dict[str, int]]:
        """Queued and running jobs of all tenants: state -> kind -> count."""
        query = (
            sa.select(jobs.c.state, jobs.c.kind, sa.func.count())
            .where(jobs.c.state.in_(ACTIVE_STATES))
            .group_by(jobs.c.state, jobs.c.kind)
        )
        counts: dict[str, dict[str, int]] = {state: {} for state in ACTIVE_STATES}
        with self.engine.connect() as conn:
            for state, kind, n in conn.execute(query):
                counts[str(state)][str(kind)] = int(n)
        return counts

    # -- jobs, worker side ----------------------------------------------------------------------
    def job_by_id(self, job_id: str) -> JobRecord:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).first()
        if row is None:
            raise NotFound(f"unknown job '{shown(job_id)}'")
        return job_from_row(row)

    def claim(self, job_id: str, worker_id: str, lease_seconds: float) -> tuple[JobRecord, str]:
        """Give the job to ``worker_id`` if it is queued, or running on a lease that expired. Returns the
        job and the lease's secret ("" when not claimed): only its holder can finish the job."""
        now = time.time()
        secret = secrets.token_urlsafe(24)
        with self.engine.begin() as conn:
            claimable = sa.or_(
                jobs.c.state == QUEUED, sa.and_(jobs.c.state == RUNNING, jobs.c.lease_expires_at < now)
            )
            done = conn.execute(
                jobs.update()
                .where(jobs.c.id == job_id, claimable, sa.not_(jobs.c.cancel_requested))
                .values(
                    state=RUNNING,
                    lease_owner=worker_id,
                    lease_secret=_secret_hash(secret),
                    lease_expires_at=now + lease_seconds,
                    attempts=jobs.c.attempts + 1,
                    started_at=sa.func.coalesce(jobs.c.started_at, now),
                    message="started",
                )
            ).rowcount
        if done == 1:
            self.events.publish([job_id])
        return self.job_by_id(job_id), secret if done == 1 else ""

    def claimed_by(self, job_id: str, lease: Lease) -> bool:
        """Whether ``lease`` is the job's claim: the live one of a running job, or the one that
        finished it (kept after completion, so that only its holder learns that it is finished)."""
        with self.engine.connect() as conn:
            claim = sa.select(jobs.c.id).where(jobs.c.id == job_id, _held(lease))
            return conn.execute(claim).first() is not None

    def job_tensors(self, job_id: str) -> dict[str, np.ndarray]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(job_tensors).where(job_tensors.c.job_id == job_id))
            return {r.name: array_from_row(r) for r in rows}

    def heartbeat(
        self, job_id: str, lease: Lease, progress: float, message: str, lease_seconds: float
    ) -> bool:
        """Renew the lease and record progress; True means stop (cancelled, or the lease was lost)."""
        now = time.time()
        with self.engine.begin() as conn:
            owned = conn.execute(
                jobs.update()
                .where(jobs.c.id == job_id, jobs.c.state == RUNNING, _held(lease))
                .values(
                    progress=min(max(progress, 0.0), 1.0) if math.isfinite(progress) else 0.0,
                    message=clean(message, 500),
                    lease_expires_at=now + lease_seconds,
                )
            ).rowcount
            if owned != 1:
                return True
            flag = conn.execute(sa.select(jobs.c.cancel_requested).where(jobs.c.id == job_id)).scalar_one()
        self.events.publish([job_id])
        return bool(flag)

    def complete(
        self,
        job_id: str,
        lease: Lease,
        report: tuple[bytes, str] | None,
        tensors: Mapping[str, np.ndarray],
        not_applicable: Mapping[str, str],
        compute_seconds: float,
    ) -> bool:
        """Store the result once, from the lease holder: False (and nothing written) when the job is
        terminal already or ``lease`` is not its live claim."""
        now = time.time()
        with self.engine.begin() as conn:
            done = conn.execute(
                jobs.update()
                .where(jobs.c.id == job_id, jobs.c.state == RUNNING, _held(lease))
                .values(
                    state=SUCCEEDED,
                    progress=1.0,
                    message="done",
                    finished_at=now,
                    compute_seconds=compute_seconds,
                    not_applicable={clean(k, 64): clean(v, 2000) for k, v in not_applicable.items()},
                    report_available=True,
                    lease_expires_at=None,  # owner and secret stay: the claim that finished it
                )
            ).rowcount
            if done != 1:
                return False
            if report is not None:
                conn.execute(
                    reports.insert().values(
                        job_id=job_id, data=report[0], content_type=report[1], created_at=now
                    )
                )
            rows = tensor_rows(job_id, tensors)
            if rows:
                conn.execute(results.insert(), rows)
        self.events.publish([job_id])
        return True

    def fail(self, job_id: str, lease: Lease, code: str, message: str) -> bool:
        """Record a worker's failure; ignored unless ``lease`` is the job's live claim (a worker that lost
        its lease must not fail the job another worker now runs)."""
        state = CANCELLED if code == "CANCELLED" else FAILED
        with self.engine.begin() as conn:
            done = conn.execute(
                jobs.update()
                .where(jobs.c.id == job_id, jobs.c.state == RUNNING, _held(lease))
                .values(
                    state=state,
                    error_code="" if state == CANCELLED else clean(code, 32),
                    error_message="" if state == CANCELLED else clean(message, 2000),
                    message="cancelled" if state == CANCELLED else "failed",
                    finished_at=time.time(),
                    lease_expires_at=None,  # owner and secret stay: the claim that finished it
                )
            ).rowcount
        if done == 1:
            self.events.publish([job_id])
        return done == 1

    # -- dispatch bookkeeping -------------------------------------------------------------------
    def reserve_dispatch(self, job_id: str, requeue_after: float) -> bool:
        """Mark a queued job as sent, if it is due (never sent, or sent ``requeue_after`` ago and still
        unclaimed). Only the caller that gets True sends it: no double sends between the submit path
        and the sweep, or between replicas."""
        now = time.time()
        with self.engine.begin() as conn:
            done = conn.execute(
                jobs.update()
                .where(jobs.c.id == job_id, jobs.c.state == QUEUED, _due(now - requeue_after))
                .values(dispatched_at=now)
            ).rowcount
        return done == 1

    def redispatch_queued(self) -> int:
        """Every queued job is due to be sent again (the broker may have lost its message)."""
        with self.engine.begin() as conn:
            n = conn.execute(
                jobs.update()
                .where(jobs.c.state == QUEUED, jobs.c.dispatched_at.is_not(None))
                .values(dispatched_at=None)
            ).rowcount
        return int(n)

    def release_dispatch(self, job_id: str) -> None:
        """The send failed: the job is due again."""
        with self.engine.begin() as conn:
            conn.execute(jobs.update().where(jobs.c.id == job_id).values(dispatched_at=None))

    def due_for_dispatch(self, requeue_after: float, limit: int = 100) -> list[tuple[str, str]]:
        """(job id, queue) of queued jobs never dispatched, or dispatched long ago and still unclaimed."""
        query = (
            sa.select(jobs.c.id, jobs.c.queue)
            .where(jobs.c.state == QUEUED, _due(time.time() - requeue_after))
            .order_by(jobs.c.created_at)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [(r.id, r.queue) for r in conn.execute(query)]

    def expire_leases(self, max_attempts: int) -> int:
        """Running jobs whose lease expired: back to the queue (or cancelled / failed). Returns the count."""
        now = time.time()
        expired = sa.and_(jobs.c.state == RUNNING, jobs.c.lease_expires_at < now)
        cleared = {"lease_owner": None, "lease_secret": None, "lease_expires_at": None}
        with self.engine.begin() as conn:
            n = conn.execute(
                jobs.update()
                .where(expired, jobs.c.cancel_requested)
                .values(state=CANCELLED, finished_at=now, message="cancelled", **cleared)
            ).rowcount
            n += conn.execute(
                jobs.update()
                .where(expired, jobs.c.attempts >= max_attempts)
                .values(
                    state=FAILED,
                    finished_at=now,
                    message="failed",
                    error_code="UNAVAILABLE",
                    error_message=f"the worker was lost {max_attempts} times while running this job",
                    **cleared,
                )
            ).rowcount
            requeued = conn.execute(
                jobs.update()
                .where(expired)
                .values(state=QUEUED, dispatched_at=None, message="worker lost: queued again", **cleared)
            ).rowcount
        if n or requeued:
            self.events.publish_all()
        if requeued:
            logger.warning("%d running job(s) lost their worker's lease: queued again", requeued)
        return int(n + requeued)


def _held(lease: Lease) -> sa.ColumnElement[bool]:
    return sa.and_(jobs.c.lease_owner == lease.owner, jobs.c.lease_secret == _secret_hash(lease.secret))


def _due(cutoff: float) -> sa.ColumnElement[bool]:
    return sa.or_(jobs.c.dispatched_at.is_(None), jobs.c.dispatched_at < cutoff)


def _not_ready(job: JobRecord) -> str:
    if job.state == FAILED:
        return f"job {job.id} failed ({job.error_code}): {job.error_message}"
    return f"job {job.id} has no result: it is {job.state}"
