"""Read the report document out of the bytes GetReport returns (a DSSE envelope or plain JSON) and
print its verdicts. Reading is not verifying: ``xaudit verify`` checks signatures."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from clients._columns import aligned
from xaudit.contract.errors import InvalidInput
from xaudit.contract.spec import CRITERIA

__all__ = ["STATUS_MARKS", "report_document", "report_summary", "settings_line", "verdict_table"]


def report_document(data: bytes) -> dict[str, Any]:
    """The report document (xaudit.report/v1 or v2) inside ``data`` (the predicate of an enveloped statement)."""
    try:
        outer = json.loads(data)
        if isinstance(outer, dict) and "payload" in outer and "payloadType" in outer:
            statement = json.loads(base64.b64decode(outer["payload"], validate=True))
            outer = statement.get("predicate")
    except (ValueError, TypeError):
        raise InvalidInput("the report is not a JSON document or a DSSE envelope") from None
    if isinstance(outer, dict) and "payloadType" in outer and not str(outer.get("payload", "")):
        raise InvalidInput("the envelope has no payload")
    if not isinstance(outer, dict) or not isinstance(outer.get("methods"), list):
        raise InvalidInput("the report has no list of methods")
    return outer


STATUS_MARKS = {"holds": "", "fails": " ✗", "undecided": " ?"}  # v2 criterion status -> table mark


def _score(criteria: Mapping[str, Any], name: str) -> str:
    entry = criteria.get(name)
    if not isinstance(entry, dict) or not isinstance(entry.get("score"), int | float):
        return "-"
    status = entry.get("status")
    if status in STATUS_MARKS and isinstance(entry.get("upper"), int | float):  # v2: the interval decides
        return f"{entry['score']:.3f} [{entry['lower']:.3f}, {entry['upper']:.3f}]{STATUS_MARKS[status]}"
    return f"{entry['score']:.3f}" + ("" if entry.get("passed") else " ✗")


def _unaudited_line(report: Mapping[str, Any]) -> str | None:
    game = report.get("game")
    unaudited = game.get("unaudited") if isinstance(game, dict) else None
    if not isinstance(unaudited, dict) or not isinstance(unaudited.get("share"), int | float):
        return None
    line = (
        f"unaudited (the audit's, not the methods'): {unaudited['share']:.1%} of the effect mass "
        f"above order {unaudited.get('audit_order', '?')} (net remainder; limit {unaudited.get('limit', 0.5):.0%})"
    )
    if isinstance(unaudited.get("absolute_share"), int | float):
        line += f"; {unaudited['absolute_share']:.1%} as absolute high-order mass"
    return line


def verdict_table(report: Mapping[str, Any]) -> str:
    """One row per method: verdict, every criterion's score with its interval (v2 reports: ✗ the
    interval lies above the tolerance, ? it straddles it; v1 reports: ✗ above tolerance) and, for a
    method the audit could not judge (not applicable, inconclusive), the reason why; under it, which
    implementation ran where the report names one (DeepLIFT: xaudit's pass or Captum's)."""
    rows = [("METHOD", "VERDICT", *(c.upper() for c in CRITERIA), "REASON")]
    for method in report["methods"]:
        criteria = method.get("criteria") or {}
        verdict = str(method.get("verdict", "?"))
        reason = str(method.get("reason", "")) if verdict in ("not_applicable", "inconclusive") else ""
        rows.append(
            (
                str(method.get("name", "?")),
                verdict.replace("_", " "),
                *(_score(criteria, c) for c in CRITERIA),
                " ".join(reason.split()),
            )
        )
    lines = aligned(rows)
    tolerances = (
        report.get("config", {}).get("tolerances") if isinstance(report.get("config"), dict) else None
    )
    if isinstance(tolerances, dict):
        lines.append("tolerances: " + ", ".join(f"{k} {v}" for k, v in sorted(tolerances.items())))
    confidence = (
        report.get("config", {}).get("confidence") if isinstance(report.get("config"), dict) else None
    )
    if isinstance(confidence, dict) and isinstance(confidence.get("level"), int | float):
        count = report.get("inputs", {}).get("count", "?") if isinstance(report.get("inputs"), dict) else "?"
        lines.append(f"intervals: {confidence['level']:.0%} confidence over {count} samples")
    unaudited = _unaudited_line(report)
    if unaudited:
        lines.append(unaudited)
    ran: dict[str, list[str]] = {}  # which implementation each verdict judges, said once per text
    for method in report["methods"]:
        refs = method.get("references")
        if isinstance(refs, dict) and refs.get("sampled"):
            lines.append(
                f"{method.get('name')}: map and audit averaged over {refs.get('used')} of "
                f"{refs.get('given')} background samples (a seeded subset)"
            )
        if isinstance(method.get("implementation"), str):
            ran.setdefault(method["implementation"], []).append(str(method.get("name")))
    lines.extend(f"{', '.join(names)}: ran {text}" for text, names in ran.items())
    return "\n".join(lines)


def settings_line(
    report: Mapping[str, Any], *, requested_order: int | None = None, background_given: int | None = None
) -> str:
    """What the audit actually used, said once: players, the order judged and the background set,
    with what was cut from the request (the order to the player count, the background to its cap)."""
    config = _section(report, "config")
    game = _section(report, "game")
    players = game.get("players") or []
    parts = [f"players {config.get('players', '?')} ({len(players)})"]
    order = config.get("audit_order")
    used_order = min(int(order), len(players)) if isinstance(order, int) and players else order
    text = f"sets judged up to order {used_order}"
    if requested_order is not None and isinstance(used_order, int) and used_order < requested_order:
        text += f" (--audit-order {requested_order} cut to the {len(players)} players)"
    parts.append(text)
    used = config.get("background_samples")
    if isinstance(used, int) and used:
        text = f"background {used} samples"
        if background_given is not None and background_given > used:
            text += f" ({used} of the {background_given} given, a seeded subset)"
        parts.append(text)
    output = _section(report, "model").get("output_name")
    of = f" of output '{output}'" if isinstance(output, str) else ""  # which output: docs/science.md 2
    parts.append(f"baseline {config.get('baseline', '?')}, target {config.get('target', '?')}{of}")
    return "settings: " + "; ".join(parts)


def report_summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """The machine-readable summary that ``--json`` prints: verdicts, reasons and scores per method."""
    methods = []
    for method in report["methods"]:
        criteria = method.get("criteria") or {}
        methods.append(
            {
                "name": method.get("name"),
                "verdict": method.get("verdict"),
                "reason": method.get("reason", ""),
                "scores": {
                    c: criteria[c].get("score") for c in CRITERIA if isinstance(criteria.get(c), dict)
                },
            }
        )
    config = _section(report, "config")
    model = _section(report, "model")
    return {
        "schema": report.get("schema"),
        "model_sha256": model.get("sha256"),
        "tolerances": config.get("tolerances"),
        "methods": methods,
        "summary": {
            v: [m["name"] for m in methods if m["verdict"] == v]
            for v in ("reliable", "unreliable", "inconclusive", "not_applicable")
        },
    }


def _section(doc: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``doc[key]`` when it is an object, else an empty one (reports are read defensively)."""
    value = doc.get(key)
    return value if isinstance(value, dict) else {}
