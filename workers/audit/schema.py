"""The JSON Schema of xaudit.report/v1 and a validator (used by tests and by ``xaudit render``)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["report_schema", "validate_report"]


@cache
def report_schema() -> dict[str, Any]:
    text = resources.files("workers.audit").joinpath("report-v1.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


def validate_report(report: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when ``report`` does not follow xaudit.report/v1."""
    import jsonschema

    jsonschema.validate(report, report_schema(), cls=jsonschema.Draft202012Validator)
