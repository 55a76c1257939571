"""The criterion audit: does each method hand out the model's effects correctly?

The runner (and with it torch) loads on first use, so that the report's schema and typed objects
can be read without the compute stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.audit.runner import AuditResult, run_audit

__all__ = ["AuditResult", "run_audit"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from workers.audit import runner

        return getattr(runner, name)
    raise AttributeError(name)
