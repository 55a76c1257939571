"""Per-tenant quotas and model rules: active jobs, stored bytes, TorchScript allowed or not.

Policies come from the tokens file's ``tenants`` / ``defaults`` sections (service/tokens.py).
Checks run before a job or model is recorded; they count what the store holds at that moment, so
two requests racing at the very limit may both pass (a quota is a guard rail, not an invoice).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import sqlalchemy as sa

from service.schema import job_tensors, jobs, models, reports, results
from service.store import ACTIVE_STATES, JobStore
from service.tokens import TenantPolicy
from xaudit.contract.errors import PermissionDenied, ResourceExhausted

__all__ = ["Quotas", "stored_bytes"]

logger = logging.getLogger(__name__)


def stored_bytes(store: JobStore, tenant: str) -> int:
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
    with store.engine.connect() as conn:
        return sum(int(conn.execute(q).scalar_one()) for q in queries)


def active_jobs(store: JobStore, tenant: str) -> int:
    query = (
        sa.select(sa.func.count())
        .select_from(jobs)
        .where(jobs.c.tenant == tenant, jobs.c.state.in_(ACTIVE_STATES))
    )
    with store.engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


class Quotas:
    def __init__(self, store: JobStore, policy: Callable[[str], TenantPolicy]) -> None:
        self._store = store
        self._policy = policy

    def check_submit(self, tenant: str, new_bytes: int = 0, idempotency_key: str | None = None) -> None:
        """Before recording a job: RESOURCE_EXHAUSTED when the tenant is at a limit, unless the request
        is a resubmission (same idempotency key) of a job the tenant already has."""
        policy = self._policy(tenant)
        if policy.max_active_jobs is None and policy.max_stored_bytes is None:
            return
        if idempotency_key and self._exists(tenant, idempotency_key):
            return
        if policy.max_active_jobs is not None:
            active = active_jobs(self._store, tenant)
            if active >= policy.max_active_jobs:
                raise ResourceExhausted(
                    f"tenant '{tenant}' has {active} queued or running jobs, its quota is "
                    f"{policy.max_active_jobs}: wait for some to finish or cancel them"
                )
        self._check_bytes(tenant, policy, new_bytes)

    def _exists(self, tenant: str, key: str) -> bool:
        query = sa.select(jobs.c.id).where(jobs.c.tenant == tenant, jobs.c.idempotency_key == key)
        with self._store.engine.connect() as conn:
            return conn.execute(query).first() is not None

    def check_model(self, tenant: str, fmt: str, size: int) -> None:
        """Before storing a model: PERMISSION_DENIED for a refused format, RESOURCE_EXHAUSTED over quota."""
        policy = self._policy(tenant)
        if fmt == "torchscript" and not policy.torchscript:
            raise PermissionDenied(f"tenant '{tenant}' may not upload TorchScript models (use ONNX)")
        self._check_bytes(tenant, policy, size)

    def _check_bytes(self, tenant: str, policy: TenantPolicy, new_bytes: int) -> None:
        if policy.max_stored_bytes is None:
            return
        used = stored_bytes(self._store, tenant)
        if used + new_bytes > policy.max_stored_bytes:
            raise ResourceExhausted(
                f"tenant '{tenant}' stores {used} bytes; {new_bytes} more would pass its quota of "
                f"{policy.max_stored_bytes} bytes"
            )
