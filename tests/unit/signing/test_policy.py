"""Gate policies: strict parsing with errors that name the key, and how reports are judged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.policy import Policy, evaluate, load_policy, parse_policy
from tests.unit.signing.signing_golden import asset
from xaudit.contract.errors import InvalidInput
from xaudit.contract.spec import DEFAULT_TOLERANCES, FOURTEEN_METHODS

POLICIES = Path(__file__).resolve().parents[3] / "deploy" / "policies"


def test_empty_policy_means_audit_all_fourteen_require_nothing() -> None:
    policy = parse_policy("")
    assert policy == Policy()
    assert policy.audit == FOURTEEN_METHODS
    assert policy.audit_tolerances() == dict(DEFAULT_TOLERANCES)


def test_full_policy() -> None:
    policy = parse_policy(
        "audit: [integrated_gradients, occlusion_1]\n"
        "require_reliable: [integrated_gradients]\n"
        "tolerances: {complete_allocation: 0.02}\n"
        "not_applicable: fail\n"
    )
    assert policy.audit == ("integrated_gradients", "occlusion_1")
    assert policy.require_reliable == ("integrated_gradients",)
    assert policy.audit_tolerances() == {**DEFAULT_TOLERANCES, "complete_allocation": 0.02}
    assert policy.not_applicable == "fail"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("audit: [integrated_gradients\n", "not valid YAML at line"),
        ("- a\n- b\n", "must be a mapping"),
        ("audti: all\n", "unknown key 'audti'"),
        ("audit: everything\n", "'audit' must be \"all\" or a list"),
        ("audit: [ig]\n", "'audit' names unknown method 'ig'"),
        ("audit: []\n", "'audit' is empty"),
        ("audit: [occlusion_1, occlusion_1]\n", "'audit' lists 'occlusion_1' twice"),
        ("require_reliable: integrated_gradients\n", "'require_reliable' must be a list"),
        (
            "audit: [occlusion_1]\nrequire_reliable: [saliency]\n",
            "'require_reliable' names 'saliency', which 'audit'",
        ),
        ("tolerances: 0.1\n", "'tolerances' must be a mapping"),
        ("tolerances: {completeness: 0.1}\n", "unknown criterion 'completeness'"),
        ("tolerances: {coverage: high}\n", "'tolerances.coverage' must be a number"),
        ("tolerances: {coverage: true}\n", "'tolerances.coverage' must be a number"),
        ("tolerances: {coverage: .nan}\n", "'tolerances.coverage' must be a number"),
        ("tolerances: {coverage: -0.1}\n", "'tolerances.coverage' must be >= 0"),
        ("not_applicable: skip\n", "'not_applicable' must be 'ignore' or 'fail'"),
        ("audit: all\naudit: [occlusion_1]\n", "duplicate key 'audit'"),
    ],
)
def test_malformed_policies_name_the_key(text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as info:
        parse_policy(text, "p.yaml")
    assert str(info.value).startswith("p.yaml: ")
    assert "\n" not in str(info.value)


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="policy file not found"):
        load_policy(tmp_path / "nope.yaml")


@pytest.mark.parametrize("path", sorted(POLICIES.glob("*.yaml")), ids=lambda p: p.name)
def test_example_policies_parse(path: Path) -> None:
    policy = load_policy(path)
    assert set(policy.require_reliable) <= set(policy.audit)


def test_example_policies_exist() -> None:
    assert {"strict.yaml", "gradients-only.yaml"} <= {p.name for p in POLICIES.glob("*.yaml")}


REPORT = json.loads(asset("report.json"))  # occlusion_1 and gradient_x_input unreliable, grad_cam n/a


def _statuses(policy: Policy) -> dict[str, str]:
    return {m.method: m.status for m in evaluate(policy, REPORT).methods}


def test_required_reliable_method_passes() -> None:
    outcome = evaluate(
        parse_policy("audit: [integrated_gradients]\nrequire_reliable: [integrated_gradients]"), REPORT
    )
    assert outcome.passed and _statuses(outcome.policy) == {"integrated_gradients": "passed"}


def test_required_unreliable_method_fails_with_its_failing_criteria() -> None:
    outcome = evaluate(parse_policy("audit: [occlusion_1]\nrequire_reliable: [occlusion_1]"), REPORT)
    assert not outcome.passed
    [failed] = outcome.failed
    assert [c.name for c in failed.failing] == ["complete_allocation"]
    assert failed.failing[0].score == 0.5 and failed.failing[0].tolerance == 0.05
    assert "complete_allocation: score 0.5 > tolerance 0.05" in failed.failure_text()


def test_unrequired_unreliable_method_is_informational() -> None:
    outcome = evaluate(parse_policy("audit: [occlusion_1, integrated_gradients]"), REPORT)
    assert outcome.passed
    assert outcome.methods[0].verdict == "unreliable" and outcome.methods[0].status == "passed"


def test_not_applicable_ignore_skips_and_fail_fails() -> None:
    assert _statuses(parse_policy("audit: [grad_cam]\nnot_applicable: ignore")) == {"grad_cam": "skipped"}
    assert _statuses(parse_policy("audit: [grad_cam]\nnot_applicable: fail")) == {"grad_cam": "failed"}
    required = parse_policy("audit: [grad_cam]\nrequire_reliable: [grad_cam]")
    assert evaluate(required, REPORT).passed  # ignore: a method that cannot run is not judged


def test_method_missing_from_the_report_fails() -> None:
    outcome = evaluate(parse_policy("audit: [saliency]"), REPORT)
    assert not outcome.passed and outcome.methods[0].verdict == "missing"


def test_all_fourteen_strictly() -> None:
    outcome = evaluate(parse_policy(f"require_reliable: [{', '.join(FOURTEEN_METHODS)}]"), REPORT)
    assert {m.method for m in outcome.failed} == {"occlusion_1", "gradient_x_input"}


def _v2(report: dict, verdict: str, count: int = 4, level: float = 0.95) -> dict:  # type: ignore[type-arg]
    """The golden report as a v2 one: integrated_gradients with ``verdict``, intervals at ``level``."""
    methods = [dict(m) for m in report["methods"]]
    for m in methods:
        if m["name"] == "integrated_gradients":
            m["verdict"] = verdict
            m["criteria"] = {
                c: dict(
                    v, lower=0.0, upper=0.08, level=level, status="undecided" if c == "coverage" else "holds"
                )
                for c, v in m["criteria"].items()
            }
    return dict(
        report,
        schema="xaudit.report/v2",
        methods=methods,
        inputs=dict(report["inputs"], count=count),
        config=dict(report["config"], confidence={"level": level}),
    )


def test_inconclusive_is_never_a_pass_unless_the_policy_allows_it() -> None:
    report = _v2(REPORT, "inconclusive")
    strict = evaluate(parse_policy("require_reliable: [integrated_gradients]"), report)
    ig = next(m for m in strict.methods if m.method == "integrated_gradients")
    assert ig.status == "failed" and not strict.passed
    assert [c.describe() for c in ig.failing] == ["coverage: score 0 [0, 0.08] straddles tolerance 0.05"]
    lenient = parse_policy("require_reliable: [integrated_gradients]\nallow_inconclusive: true")
    assert evaluate(lenient, report).passed
    informational = evaluate(parse_policy("audit: [integrated_gradients]"), report)
    assert informational.methods[0].status == "passed"  # not required: informational


def test_min_samples_and_confidence_are_required_of_the_report() -> None:
    policy = parse_policy("require_reliable: [integrated_gradients]\nmin_samples: 10\nconfidence: 0.99")
    assert policy.min_samples == 10 and policy.confidence == 0.99
    outcome = evaluate(policy, _v2(REPORT, "reliable", count=4, level=0.95))
    ig = next(m for m in outcome.methods if m.method == "integrated_gradients")
    assert ig.status == "failed"
    assert "audited on 4 samples; the policy requires at least 10" in ig.reason
    assert "intervals are at 95%; the policy requires 99%" in ig.reason
    assert evaluate(policy, _v2(REPORT, "reliable", count=12, level=0.99)).passed
    # A v1 report has no intervals at all.
    assert not evaluate(
        parse_policy("require_reliable: [integrated_gradients]\nconfidence: 0.9"), REPORT
    ).passed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("min_samples: 0", "'min_samples' must be a whole number >= 1"),
        ("min_samples: 2.5", "'min_samples' must be a whole number >= 1"),
        ("confidence: 1.0", "'confidence' must be a level between 0.5 and 1"),
        ("confidence: yes", "'confidence' must be a level between 0.5 and 1"),
        ("allow_inconclusive: 1", "'allow_inconclusive' must be true or false"),
    ],
)
def test_malformed_confidence_keys(text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_policy(text)
