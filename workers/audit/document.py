"""The report, schema xaudit.report/v2, as typed objects (docs/report-schema.md).

Every object is a frozen dataclass; :func:`to_json` turns a tree of them into the plain JSON value
that is validated (:mod:`workers.audit.schema`), signed and stored (:func:`canonical_bytes`). Fields
that are None are left out. Parts whose shape belongs to one producer (noise floors, per-order rows,
evidence, the environment) stay mappings, validated by the schema.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from workers.audit.report import SCHEMA, canonical_bytes, jsonable
from workers.audit.verdict import VerdictName

__all__ = [
    "SCHEMA_V2",
    "CriterionResult",
    "CriterionStatus",
    "GameSection",
    "MethodEntry",
    "Report",
    "canonical_bytes",
    "to_json",
]

SCHEMA_V2 = SCHEMA

CriterionStatus = Literal["holds", "fails", "undecided"]


@dataclass(frozen=True)
class CriterionResult:
    """One criterion of one method: the score with its interval, against the tolerance."""

    score: float
    lower: float
    upper: float
    level: float
    tolerance: float
    status: CriterionStatus  # holds: upper <= tolerance; fails: lower > tolerance
    passed: bool  # the point estimate alone: score <= tolerance (as in v1)
    mean: float  # unweighted mean of the per-sample scores
    worst: float  # the largest per-sample score
    fraction_failing: float  # share of samples whose own score exceeds the tolerance
    spread: float  # standard deviation over seeds (0 for deterministic methods)
    interval: Mapping[str, Any]  # samples, and the sources: bootstrap, seed_sd, set_sampling_se


@dataclass(frozen=True)
class MethodEntry:
    name: str
    verdict: VerdictName
    reason: str
    among_fourteen: bool
    capabilities: Mapping[str, Any]
    paper_context: Mapping[str, str]
    seconds: float
    failing_criteria: Sequence[str] | None = None
    undecided_criteria: Sequence[str] | None = None
    criteria: Mapping[str, CriterionResult] | None = None
    completeness_residual: float | None = None
    completeness: Mapping[str, Any] | None = None  # per-sub-input residuals: the check that can fail
    out_of_set_share: float | None = None
    absent_unit_share: float | None = None
    noise_floor: Mapping[str, Any] | None = None
    by_order: Sequence[Mapping[str, Any]] | None = None
    # The effect mass this method's game leaves above the audit order: the audit's, never in coverage.
    unaudited: Mapping[str, Any] | None = None
    evidence: Sequence[Mapping[str, Any]] | None = None
    all_orders: Mapping[str, Any] | None = None
    evaluations: Mapping[str, Any] | None = None
    references: Mapping[str, Any] | None = None  # distribution methods: background samples given and used
    # Which implementation ran where that depends on the graph (a library's in place of xaudit's own
    # pass): what the verdict judges.
    implementation: str | None = None


@dataclass(frozen=True)
class GameSection:
    players: Sequence[Mapping[str, Any]]
    n: int
    layout: Sequence[int]
    exact: bool
    enumerated_order: int
    audit_order: int
    classes: Sequence[int]
    target_values: Sequence[float]
    reference_values: Sequence[float]
    checks: Sequence[Mapping[str, Any]]  # v(N), v(empty) and f(b) nudged against plain evaluations
    unaudited: Mapping[str, Any]
    mass_by_order: Sequence[Mapping[str, Any]]
    top_interactions: Sequence[Mapping[str, Any]]
    audited_sets: Mapping[str, Any] | None = None  # how the sets were chosen (enumerated or sampled)
    plan: Mapping[str, Any] | None = None  # the audit's cost plan (workers.audit.plan)


@dataclass(frozen=True)
class Report:
    created: str
    model: Mapping[str, Any]
    inputs: Mapping[str, Any]
    config: Mapping[str, Any]
    environment: Mapping[str, Any]
    game: GameSection
    methods: Sequence[MethodEntry]
    summary: Mapping[str, Sequence[str]]
    seconds: float
    schema: str = SCHEMA_V2

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = to_json(self)
        return out

    def canonical_bytes(self) -> bytes:
        return canonical_bytes(self.to_json())


def to_json(value: Any) -> Any:
    """Dataclasses to dicts (None fields left out), then numpy values to plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_json(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if getattr(value, f.name) is not None
        }
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return jsonable(value)
