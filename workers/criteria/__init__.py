"""The audit's criteria, one module each, in one registry (docs/science.md, section 4).

Everything that lists criteria reads :data:`REGISTRY`: the job spec's tolerances, the audit's
scores and confidence intervals, the report schema's enums (:mod:`workers.audit.schema`), the CLI
table and the HTML report. Adding a criterion is adding one module here and one line below.

This package imports numpy only: clients read it without loading the compute stack.
"""

from __future__ import annotations

from collections.abc import Mapping

from workers.criteria._base import Criterion, Parts
from workers.criteria.complete_allocation import COMPLETE_ALLOCATION
from workers.criteria.coverage import COVERAGE
from workers.criteria.unrelated_allocation import UNRELATED_ALLOCATION

__all__ = ["CRITERIA", "DEFAULT_TOLERANCES", "REGISTRY", "Criterion", "Parts", "criterion"]

REGISTRY: tuple[Criterion, ...] = (COVERAGE, UNRELATED_ALLOCATION, COMPLETE_ALLOCATION)

CRITERIA: tuple[str, ...] = tuple(c.name for c in REGISTRY)
DEFAULT_TOLERANCES: Mapping[str, float] = {c.name: c.default_tolerance for c in REGISTRY}


def criterion(name: str) -> Criterion:
    for c in REGISTRY:
        if c.name == name:
            return c
    raise KeyError(name)
