"""PlanAudit in the service: the planner is the engine's and is handed in by whoever starts the server.

The service stands on the contract alone (docs/architecture.md), so it cannot price an audit itself:
`xaudit serve` passes the engine's planner to `create_server`; a server started without one answers
FAILED_PRECONDITION instead of guessing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from xaudit.contract.errors import FailedPrecondition
from xaudit.contract.spec import JobSpec
from xaudit.v1 import audit_pb2

__all__ = ["Planner", "no_planner"]

Planner = Callable[[JobSpec, Mapping[str, np.ndarray]], audit_pb2.AuditPlan]


def no_planner(spec: JobSpec, tensors: Mapping[str, np.ndarray]) -> audit_pb2.AuditPlan:
    raise FailedPrecondition("this server was started without the audit engine: it cannot plan audits")
