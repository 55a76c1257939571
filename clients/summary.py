"""Human summaries of a verified report: plain text for the terminal, Markdown for CI job pages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clients._report import STATUS_MARKS
from clients.policy import GateOutcome
from xaudit.contract.spec import CRITERIA

__all__ = ["gate_markdown", "verdict_summary"]

_ICON = {"passed": "✅ pass", "failed": "❌ FAIL", "skipped": "⏭ skipped", "info": "ℹ️ info (not required)"}


def verdict_summary(report: Mapping[str, Any]) -> str:
    """A few lines: the model, then the method names by verdict."""
    model = report.get("model", {}) if isinstance(report.get("model"), dict) else {}
    summary = report.get("summary", {}) if isinstance(report.get("summary"), dict) else {}
    lines = [f"model sha256 {model.get('sha256', '?')} ({model.get('format', '?')})"]
    for key, label in (
        ("reliable", "reliable"),
        ("unreliable", "unreliable"),
        ("inconclusive", "inconclusive"),
        ("not_applicable", "not applicable"),
    ):
        if key not in summary and key == "inconclusive":  # v1 reports have no such verdict
            continue
        names = summary.get(key) or []
        lines.append(f"{label} ({len(names)}): {', '.join(names) if names else '-'}")
    return "\n".join(lines)


def _cell(criteria: Mapping[str, Any], name: str) -> str:
    entry = criteria.get(name)
    if not isinstance(entry, dict) or not isinstance(entry.get("score"), int | float):
        return "-"
    status = entry.get("status")
    if status in STATUS_MARKS:  # v2: the interval decides
        mark = STATUS_MARKS[status]
        bounds = f" [{entry.get('lower', 0.0):.3g}, {entry.get('upper', 0.0):.3g}]"
        return f"{entry['score']:.3g}{bounds} / {entry.get('tolerance', '?')}{mark}"
    mark = "" if entry.get("passed") else " ✗"
    return f"{entry['score']:.3g} / {entry.get('tolerance', '?')}{mark}"


def gate_markdown(outcome: GateOutcome, report: Mapping[str, Any], key_id: str) -> str:
    model = report.get("model", {}) if isinstance(report.get("model"), dict) else {}
    verdict = "passed" if outcome.passed else f"FAILED ({len(outcome.failed)} method(s))"
    lines = [
        f"## xaudit gate: {verdict}",
        "",
        f"- model sha256: `{model.get('sha256', '?')}`",
        f"- report signed by key `{key_id}` (signature verified)",
        f"- not_applicable: `{outcome.policy.not_applicable}`",
        "",
        "| method | required | verdict | result | "
        + " | ".join(f"{c} (score / tol.)" for c in CRITERIA)
        + " |",
        "|---|---|---|---|" + "---|" * len(CRITERIA),
    ]
    for m in outcome.methods:
        cells = [_cell(m.criteria, c) for c in CRITERIA]
        lines.append(
            f"| `{m.method}` | {'yes' if m.required else 'no'} | {m.verdict} | {_ICON['info' if m.label == 'INFO' else m.status]} | "
            + " | ".join(cells)
            + " |"
        )
    reasons = [m for m in outcome.methods if m.status != "passed" and m.reason]
    if reasons:
        # One line each, whatever the worker wrote: a newline would end the list item.
        lines += ["", "Notes:"] + [f"- `{m.method}`: {' '.join(m.reason.split())}" for m in reasons]
    audited = {m.method for m in outcome.methods}
    ran = [
        (str(entry.get("name")), " ".join(entry["implementation"].split()))
        for entry in report.get("methods", [])
        if isinstance(entry, dict)
        and entry.get("name") in audited
        and isinstance(entry.get("implementation"), str)
    ]
    if ran:  # what each verdict judges, where that depends on the model's graph
        lines += ["", "Implementations:"] + [f"- `{name}`: {text}" for name, text in ran]
    return "\n".join(lines) + "\n"
