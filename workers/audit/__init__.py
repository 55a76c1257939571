"""The criterion audit: does each method hand out the model's effects correctly?"""

from workers.audit.runner import AuditResult, run_audit

__all__ = ["AuditResult", "run_audit"]
