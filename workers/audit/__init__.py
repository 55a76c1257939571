"""The criterion audit: does each method hand out the model's effects correctly?

Imported lazily: the service plans audits (workers.audit.plan) without loading the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.audit.dataset import audit as run_audit
    from workers.audit.runner import AuditResult

__all__ = ["AuditResult", "run_audit"]


def __getattr__(name: str) -> Any:
    if name == "run_audit":
        from workers.audit.dataset import audit

        return audit
    if name == "AuditResult":
        from workers.audit.runner import AuditResult

        return AuditResult
    raise AttributeError(name)
