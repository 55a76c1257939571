"""The audit's criteria, one module each, in one registry (docs/science.md, section 4).

Everything that lists criteria reads :data:`REGISTRY`: the contract's names and default tolerances,
the audit's scores and confidence intervals, the report schema's enums (workers.audit.schema), the
CLI table and the HTML report. Adding a criterion is adding one module here and one line below.

Standard library only, like the rest of the contract.
"""

from __future__ import annotations

from collections.abc import Mapping

from xaudit.contract.criteria._base import Criterion, Masses, Parts
from xaudit.contract.criteria.complete_allocation import COMPLETE_ALLOCATION
from xaudit.contract.criteria.coverage import COVERAGE
from xaudit.contract.criteria.unrelated_allocation import UNRELATED_ALLOCATION

__all__ = ["CRITERIA", "DEFAULT_TOLERANCES", "REGISTRY", "Criterion", "Masses", "Parts", "criterion"]

REGISTRY: tuple[Criterion, ...] = (COVERAGE, UNRELATED_ALLOCATION, COMPLETE_ALLOCATION)

CRITERIA: tuple[str, ...] = tuple(c.name for c in REGISTRY)
DEFAULT_TOLERANCES: Mapping[str, float] = {c.name: c.default_tolerance for c in REGISTRY}


def criterion(name: str) -> Criterion:
    for c in REGISTRY:
        if c.name == name:
            return c
    raise KeyError(name)
