"""Report schema v2: built from the criterion registry and the verdicts; v1 reports still validate."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from workers.audit.document import CriterionResult, to_json
from workers.audit.schema import report_schema, v2_schema, validate_report
from workers.audit.verdict import VERDICTS
from xaudit.contract.criteria import CRITERIA, DEFAULT_TOLERANCES, REGISTRY

ROOT = Path(__file__).resolve().parents[3]


def test_committed_schema_is_the_generated_one() -> None:
    committed = json.loads((ROOT / "workers" / "audit" / "report-v2.schema.json").read_text())
    assert committed == v2_schema(), "run: python -m workers.audit.schema"


def test_enums_come_from_the_registries() -> None:
    schema = report_schema()
    entry = schema["$defs"]["method_entry"]["properties"]
    assert entry["verdict"]["enum"] == list(VERDICTS)
    assert entry["failing_criteria"]["items"]["enum"] == list(CRITERIA)
    assert sorted(entry["criteria"]["properties"]) == sorted(CRITERIA)
    assert sorted(schema["$defs"]["tolerances"]["properties"]) == sorted(CRITERIA)
    assert tuple(c.name for c in REGISTRY) == CRITERIA
    assert {c.name: c.default_tolerance for c in REGISTRY} == DEFAULT_TOLERANCES


def test_v1_golden_report_still_validates_and_v2_refuses_it() -> None:
    v1 = json.loads((ROOT / "tests" / "assets" / "signing" / "report.json").read_text())
    validate_report(v1)
    with pytest.raises(jsonschema.ValidationError):
        validate_report(dict(v1, schema="xaudit.report/v2"))
    with pytest.raises(jsonschema.ValidationError, match="unknown report schema"):
        validate_report(dict(v1, schema="xaudit.report/v9"))


def test_typed_objects_serialise_without_none_fields() -> None:
    result = CriterionResult(
        score=np.float64(0.1), lower=0.05, upper=0.2, level=0.95, tolerance=0.05, status="undecided",
        passed=False, mean=0.1, worst=0.3, fraction_failing=0.5, spread=0.0,
        interval={"samples": 4, "sources": {"bootstrap": (0.05, 0.2), "seed_sd": 0.0, "set_sampling_se": 0.0}},
    )  # fmt: skip
    out = to_json(result)
    assert out["score"] == 0.1 and type(out["score"]) is float
    assert out["interval"]["sources"]["bootstrap"] == [0.05, 0.2]
    jsonschema.Draft202012Validator(
        {**report_schema()["$defs"]["criterion"], "$defs": report_schema()["$defs"]}
    ).validate(out)
