"""JUnit XML and Markdown summaries of a judged report: valid, complete, and naming what failed."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from clients.junit import junit_xml
from clients.policy import evaluate, parse_policy
from clients.summary import gate_markdown, verdict_summary
from tests.unit.signing.signing_golden import asset

REPORT = json.loads(asset("report.json"))


def _parse(policy_text: str) -> ET.Element:
    outcome = evaluate(parse_policy(policy_text), REPORT)
    data = junit_xml(outcome, REPORT)
    assert data.startswith(b"<?xml version='1.0' encoding='utf-8'?>")
    return ET.fromstring(data)


def test_one_testcase_per_audited_method_with_consistent_counts() -> None:
    root = _parse("require_reliable: [occlusion_1, integrated_gradients]\n")
    [suite] = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == 14 == int(suite.get("tests", "0")) == int(root.get("tests", "0"))
    assert int(suite.get("failures", "0")) == len(suite.findall("testcase/failure")) == 1
    assert int(suite.get("skipped", "0")) == len(suite.findall("testcase/skipped")) == 1
    names = [c.get("name") for c in cases]
    assert names[:2] == ["gradient_x_input", "occlusion_1"]


def test_failure_names_the_failing_criterion_with_score_and_tolerance() -> None:
    root = _parse("audit: [occlusion_1, integrated_gradients]\nrequire_reliable: [occlusion_1]\n")
    [failure] = root.findall(".//testcase[@name='occlusion_1']/failure")
    assert "complete_allocation" in failure.get("message", "")
    assert "complete_allocation: score 0.5 > tolerance 0.05" in (failure.text or "")
    assert root.find(".//testcase[@name='integrated_gradients']/failure") is None


def test_not_applicable_is_skipped_or_failed_per_policy() -> None:
    skipped = _parse("audit: [grad_cam]\nnot_applicable: ignore\n")
    assert skipped.find(".//testcase[@name='grad_cam']/skipped") is not None
    failed = _parse("audit: [grad_cam]\nnot_applicable: fail\n")
    [failure] = failed.findall(".//testcase[@name='grad_cam']/failure")
    assert "not applicable" in failure.get("message", "")


def test_informational_unreliable_passes_and_explains() -> None:
    root = _parse("audit: [gradient_x_input]\n")
    case = root.find(".//testcase[@name='gradient_x_input']")
    assert case is not None and case.find("failure") is None
    out = case.find("system-out")
    assert out is not None and "unrelated_allocation" in (out.text or "")


def test_markdown_summary_states_result_and_scores() -> None:
    outcome = evaluate(
        parse_policy("audit: [occlusion_1, grad_cam]\nrequire_reliable: [occlusion_1]\n"), REPORT
    )
    text = gate_markdown(outcome, REPORT, "k" * 64)
    assert text.startswith("## xaudit gate: FAILED (1 method(s))")
    assert "| `occlusion_1` | yes | unreliable | ❌ FAIL | 0 / 0.05 | 0 / 0.05 | 0.5 / 0.05 ✗ |" in text
    assert "| `grad_cam` | no | not_applicable | ⏭ skipped |" in text
    assert "k" * 64 in text
    passed = gate_markdown(evaluate(parse_policy("audit: [integrated_gradients]\n"), REPORT), REPORT, "k")
    assert passed.startswith("## xaudit gate: passed")
    assert "Implementations:" not in passed  # the golden report predates the field


def test_markdown_summary_names_the_implementation_that_ran() -> None:
    report = json.loads(json.dumps(REPORT))
    entry = next(m for m in report["methods"] if m["name"] == "deeplift_rescale")
    entry["implementation"] = "Captum's DeepLift: xaudit's Rescale pass has no rule\nfor this graph"
    policy = parse_policy("audit: [deeplift_rescale, integrated_gradients]\n")
    text = gate_markdown(evaluate(policy, report), report, "k")
    # one line per method, whatever the worker wrote
    assert (
        "Implementations:\n- `deeplift_rescale`: Captum's DeepLift: xaudit's Rescale pass has no rule for this graph\n"
        in text
    )
    assert "`integrated_gradients`:" not in text.split("Implementations:")[1]


def test_verdict_summary_lists_the_three_verdicts() -> None:
    text = verdict_summary(REPORT)
    assert "unreliable (2): gradient_x_input, occlusion_1" in text
    assert "not applicable (1): grad_cam" in text
    assert text.splitlines()[1].startswith("reliable (11): ")


def test_junit_carries_each_methods_audit_time_and_the_total() -> None:
    root = _parse("require_reliable: [occlusion_1]\n")
    seconds = {m["name"]: float(m["seconds"]) for m in REPORT["methods"]}
    cases = root.findall("testsuite/testcase")
    for case in cases:
        assert float(case.get("time", "nan")) == round(seconds[case.get("name", "")], 3)
    assert sum(float(c.get("time", "0")) for c in cases) > 0
    assert float(root.get("time", "0")) == float(root.find("testsuite").get("time", "-1")) > 0  # type: ignore[union-attr]


def test_methods_the_policy_does_not_require_are_info_not_passed() -> None:
    outcome = evaluate(parse_policy("require_reliable: [integrated_gradients]\n"), REPORT)
    labels = {m.method: m.label for m in outcome.methods}
    assert labels["integrated_gradients"] == "PASSED"
    assert labels["gradient_x_input"] == "INFO"  # unreliable, but informational
    assert labels["occlusion_patch"] == "INFO"  # reliable, still not what the gate decides on
    markdown = gate_markdown(outcome, REPORT, "k")
    assert "| `gradient_x_input` | no | unreliable | ℹ️ info (not required) |" in markdown
