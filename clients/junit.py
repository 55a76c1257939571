"""JUnit XML for CI systems: one test case per audited method.

A failed method carries a ``<failure>`` whose text lists the failing criteria with their scores and
tolerances; a skipped one (``not_applicable: ignore``) a ``<skipped>``; an informational unreliable
verdict passes and explains itself in ``<system-out>``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clients.policy import GateOutcome

__all__ = ["junit_xml", "write_junit"]


def junit_xml(outcome: GateOutcome, report: Mapping[str, Any], *, suite: str = "xaudit gate") -> bytes:
    model = report.get("model", {}) if isinstance(report.get("model"), dict) else {}
    model_digest = str(model.get("sha256", "unknown"))
    classname = f"xaudit.model_{model_digest[:12]}"
    counts = {
        "tests": len(outcome.methods),
        "failures": sum(m.status == "failed" for m in outcome.methods),
        "errors": 0,
        "skipped": sum(m.status == "skipped" for m in outcome.methods),
    }
    total = f"{sum(max(m.seconds, 0.0) for m in outcome.methods):.3f}"
    root = ET.Element("testsuites", {**{k: str(v) for k, v in counts.items()}, "time": total})
    testsuite = ET.SubElement(
        root, "testsuite", {"name": suite, **{k: str(v) for k, v in counts.items()}, "time": total}
    )
    props = ET.SubElement(testsuite, "properties")
    ET.SubElement(props, "property", {"name": "model_sha256", "value": model_digest})
    ET.SubElement(props, "property", {"name": "not_applicable", "value": outcome.policy.not_applicable})
    for m in outcome.methods:
        time = f"{max(m.seconds, 0.0):.3f}"  # the method's audit time, as the report measured it
        case = ET.SubElement(testsuite, "testcase", {"classname": classname, "name": m.method, "time": time})
        if m.status == "failed":
            if m.verdict == "not_applicable":
                message = f"{m.method} is not applicable and the policy says not_applicable: fail"
            elif m.verdict == "unreliable":
                names = ", ".join(c.name for c in m.failing) or "no criterion listed"
                message = f"{m.method} is required reliable but judged unreliable ({names})"
            else:
                message = f"{m.method}: {m.reason or m.verdict}"
            failure = ET.SubElement(case, "failure", {"message": message, "type": m.verdict})
            failure.text = m.failure_text()
        elif m.status == "skipped":
            ET.SubElement(case, "skipped", {"message": f"not applicable: {m.reason}"})
        elif m.verdict == "unreliable":
            out = ET.SubElement(case, "system-out")
            out.text = "informational (not in require_reliable)\n" + m.failure_text()
    ET.indent(root)
    data: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return data + b"\n"


def write_junit(path: Path, outcome: GateOutcome, report: Mapping[str, Any]) -> None:
    path.write_bytes(junit_xml(outcome, report))
