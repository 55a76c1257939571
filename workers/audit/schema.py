"""The JSON Schemas of the report (xaudit.report/v1 and /v2) and a validator (used by tests, by
``xaudit render`` and by the signer's callers).

v1 is a frozen file: reports written before v2 still validate. v2 is built here from v1 and from the
registries: the criteria (:mod:`xaudit.contract.criteria`) and the verdicts (:mod:`workers.audit.verdict`);
``report-v2.schema.json`` is its committed copy (``python -m workers.audit.schema`` rewrites it; a
test keeps the two equal).
"""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from workers.audit.verdict import VERDICTS
from xaudit.contract.criteria import CRITERIA

__all__ = ["SCHEMAS", "report_schema", "v2_schema", "validate_report"]

SCHEMAS = ("xaudit.report/v1", "xaudit.report/v2")
_V2_FILE = "report-v2.schema.json"


@cache
def _v1() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(
        resources.files("workers.audit").joinpath("report-v1.schema.json").read_text()
    )
    return schema


def _criterion_names() -> dict[str, Any]:
    return {"enum": list(CRITERIA)}


def v2_schema() -> dict[str, Any]:
    """xaudit.report/v2 from v1, the criterion registry and the verdicts."""
    s = copy.deepcopy(_v1())
    s["$id"] = "https://xaudit.dev/schemas/report-v2.json"
    s["title"] = "xaudit criterion-audit report, schema xaudit.report/v2"
    props, defs = s["properties"], s["$defs"]
    props["schema"] = {"const": "xaudit.report/v2"}
    props["model"]["properties"]["output_name"] = {"type": "string"}  # the output explained
    config = props["config"]["properties"]
    config["background_given"] = {"type": "integer", "minimum": 0}
    config["max_unaudited_share"] = {"type": "number", "minimum": 0, "maximum": 1}
    config["confidence"] = {
        "type": "object",
        "required": ["level"],
        "properties": {
            "level": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "bootstrap_resamples": {"type": "integer", "minimum": 1},
        },
    }
    props["config"]["required"] = [*props["config"]["required"], "confidence"]
    game = props["game"]
    game["required"] = ["players", "n", "exact", "checks", "unaudited", "top_interactions", "mass_by_order"]
    for gone in ("efficiency_error", "unexplained_high_order"):
        del game["properties"][gone]
    game["properties"]["checks"] = {"type": "array", "items": {"$ref": "#/$defs/game_check"}}
    game["properties"]["unaudited"] = {"$ref": "#/$defs/unaudited"}
    game["properties"]["audited_sets"] = {"type": "object"}
    game["properties"]["plan"] = {"type": "object"}
    game["properties"]["layout"]["maxItems"] = 3  # a volume's grid:DxRxC: (depth, rows, cols)
    props["summary"] = {
        "type": "object",
        "required": list(VERDICTS),
        "properties": {v: {"type": "array", "items": {"$ref": "#/$defs/method"}} for v in VERDICTS},
        "additionalProperties": False,
    }
    defs["tolerances"]["required"] = list(CRITERIA)
    defs["tolerances"]["properties"] = {c: {"type": "number", "minimum": 0} for c in CRITERIA}
    criterion = defs["criterion"]
    criterion["required"] = [*criterion["required"], "lower", "upper", "level", "status", "interval"]
    criterion["properties"].update(
        {
            "lower": {"type": "number", "minimum": 0},
            "upper": {"type": "number", "minimum": 0},
            "level": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "status": {"enum": ["holds", "fails", "undecided"]},
            "interval": {
                "type": "object",
                "required": ["samples", "sources"],
                "properties": {
                    "samples": {"type": "integer", "minimum": 0},
                    "sources": {
                        "type": "object",
                        "required": ["bootstrap", "seed_sd", "set_sampling_se"],
                        "properties": {
                            "bootstrap": {
                                "type": "array",
                                "items": {"type": "number"},
                                "minItems": 2,
                                "maxItems": 2,
                            },
                            "seed_sd": {"type": "number", "minimum": 0},
                            "set_sampling_se": {"type": "number", "minimum": 0},
                        },
                    },
                },
            },
        }
    )
    criterion["properties"]["spread"] = {"type": "number", "minimum": 0}
    defs["unaudited"] = {
        "type": "object",
        "required": ["audit_order", "share", "limit", "net_remainder", "audited_mass"],
        "properties": {
            "audit_order": {"type": "integer", "minimum": 1},
            "share": {"type": "number", "minimum": 0, "maximum": 1},
            "limit": {"type": "number", "minimum": 0, "maximum": 1},
            "net_remainder": {"type": "array", "items": {"type": "number"}},
            "audited_mass": {"type": "array", "items": {"type": "number", "minimum": 0}},
            "absolute_mass": {"type": "array", "items": {"type": "number", "minimum": 0}},
            "absolute_share": {"type": "number", "minimum": 0, "maximum": 1},
        },
    }
    defs["game_check"] = {
        "type": "object",
        "required": ["name", "passed", "max_abs_error"],
        "properties": {
            "name": {"enum": ["full", "empty", "reference"]},
            "passed": {"type": "boolean"},
            "max_abs_error": {"type": "number", "minimum": 0},
            "game": {"type": "array", "items": {"type": "number"}},
            "plain": {"type": "array", "items": {"type": "number"}},
            "tolerance": {"type": "array", "items": {"type": "number", "minimum": 0}},
        },
    }
    entry = defs["method_entry"]
    entry["properties"]["verdict"] = {"enum": list(VERDICTS)}
    entry["properties"]["failing_criteria"] = {"type": "array", "items": _criterion_names()}
    entry["properties"]["undecided_criteria"] = {"type": "array", "items": _criterion_names()}
    entry["properties"]["criteria"] = {
        "type": "object",
        "required": list(CRITERIA),
        "properties": {c: {"$ref": "#/$defs/criterion"} for c in CRITERIA},
        "additionalProperties": False,
    }
    entry["properties"]["evidence"]["items"]["properties"]["breaks"]["items"] = _criterion_names()
    entry["properties"]["unaudited"] = {"$ref": "#/$defs/unaudited"}
    entry["properties"]["completeness"] = {
        "type": "object",
        "required": ["residual_share", "max_abs_residual"],
        "properties": {
            "residual_share": {"type": "number", "minimum": 0},
            "max_abs_residual": {"type": "number", "minimum": 0},
            "per_sample": {"type": "array", "items": {"type": "number", "minimum": 0}},
            "worst": {"type": "object"},
        },
    }
    entry["properties"]["references"] = {
        "type": "object",
        "required": ["given", "used", "sampled"],
        "properties": {
            "given": {"type": "integer", "minimum": 0},
            "used": {"type": "integer", "minimum": 0},
            "sampled": {"type": "boolean"},
            "note": {"type": "string"},
        },
    }
    entry["properties"]["evaluations"] = {"type": "object"}
    entry["properties"]["implementation"] = {"type": "string"}
    entry["allOf"] = [
        {
            "if": {"properties": {"verdict": {"enum": ["reliable", "unreliable", "inconclusive"]}}},
            "then": {
                "required": [
                    "criteria",
                    "completeness_residual",
                    "noise_floor",
                    "evidence",
                    "by_order",
                    "unaudited",
                ]
            },
        }
    ]
    return s


@cache
def _schemas() -> dict[str, dict[str, Any]]:
    return {"xaudit.report/v1": _v1(), "xaudit.report/v2": v2_schema()}


def report_schema(version: str = "xaudit.report/v2") -> dict[str, Any]:
    return _schemas()[version]


def validate_report(report: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when ``report`` does not follow the schema it names (v1 or v2)."""
    import jsonschema

    name = report.get("schema")
    if name not in SCHEMAS:
        raise jsonschema.ValidationError(f"unknown report schema {name!r}; known: {', '.join(SCHEMAS)}")
    error = jsonschema.exceptions.best_match(_validator(str(name)).iter_errors(report))
    if error is not None:
        raise error


@cache
def _validator(name: str) -> Any:
    """The schema checked once per process (jsonschema.validate re-checks it on every call: 0.2 s)."""
    import jsonschema

    schema = _schemas()[name]
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


if __name__ == "__main__":
    target = Path(__file__).with_name(_V2_FILE)
    target.write_text(json.dumps(v2_schema(), indent=2) + "\n")
    print(f"wrote {target}")
