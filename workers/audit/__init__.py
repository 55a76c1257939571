"""The criterion audit: does each method hand out the model's effects correctly?"""

from workers.audit.dataset import audit as run_audit
from workers.audit.runner import AuditResult

__all__ = ["AuditResult", "run_audit"]
