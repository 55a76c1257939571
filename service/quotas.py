"""Per-tenant quotas and model rules: active jobs, stored bytes, TorchScript allowed or not.

Policies come from the tokens file's ``tenants`` / ``defaults`` sections (service/tokens.py).
Checks run before a job or model is recorded; they ask the store what it holds at that moment, so
two requests racing at the very limit may both pass (a quota is a guard rail, not an invoice).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from service.store import JobStore
from service.tokens import TenantPolicy
from xaudit.contract.errors import PermissionDenied, ResourceExhausted

__all__ = ["Quotas"]

logger = logging.getLogger(__name__)


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
        if idempotency_key and self._store.has_idempotency_key(tenant, idempotency_key):
            return
        if policy.max_active_jobs is not None:
            active = self._store.active_jobs(tenant)
            if active >= policy.max_active_jobs:
                raise ResourceExhausted(
                    f"tenant '{tenant}' has {active} queued or running jobs, its quota is "
                    f"{policy.max_active_jobs}: wait for some to finish or cancel them"
                )
        self._check_bytes(tenant, policy, new_bytes)

    def check_model(self, tenant: str, fmt: str, size: int) -> None:
        """Before storing a model: PERMISSION_DENIED for a refused format, RESOURCE_EXHAUSTED over quota."""
        policy = self._policy(tenant)
        if fmt == "torchscript" and not policy.torchscript:
            raise PermissionDenied(f"tenant '{tenant}' may not upload TorchScript models (use ONNX)")
        self._check_bytes(tenant, policy, size)

    def _check_bytes(self, tenant: str, policy: TenantPolicy, new_bytes: int) -> None:
        if policy.max_stored_bytes is None:
            return
        used = self._store.stored_bytes(tenant)
        if used + new_bytes > policy.max_stored_bytes:
            raise ResourceExhausted(
                f"tenant '{tenant}' stores {used} bytes; {new_bytes} more would pass its quota of "
                f"{policy.max_stored_bytes} bytes"
            )
