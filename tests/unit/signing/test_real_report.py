"""A real audit report (tests/assets/signing/real-report.json, see its README) through signing,
independent verification, the policy, JUnit and the summary."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey

from clients.junit import junit_xml
from clients.policy import evaluate, load_policy
from clients.summary import gate_markdown
from clients.verify import check_inputs_subject, check_model_subject, load_public_key, verify_envelope
from service.signing import ReportSigner
from tests.unit.signing.signing_golden import ASSETS, asset, pem
from xaudit.contract.spec import FOURTEEN_METHODS, tensor_digest

ROOT = ASSETS.parents[2]
MODEL = ROOT / "workers" / "assets" / "digits_cnn.onnx"
INPUTS = ROOT / "workers" / "assets" / "digits_inputs.npy"


def _signed(tmp_path: Path) -> bytes:
    report = asset("real-report.json")
    doc = json.loads(report)
    signer = ReportSigner(tmp_path, key_file=ASSETS / "TEST-ONLY-key-1.pem")
    return signer.sign(report, doc["model"]["sha256"], MODEL.name, doc["inputs"]["sha256"])


def test_real_report_signs_and_verifies_about_the_real_model_and_inputs(tmp_path: Path) -> None:
    envelope = _signed(tmp_path)
    verified = verify_envelope(envelope, [pem(1)])
    check_model_subject(verified.statement, MODEL.read_bytes())
    check_inputs_subject(verified.statement, tensor_digest(np.load(INPUTS)[:2]))
    assert verified.payload.endswith(b',"predicate":' + asset("real-report.json").strip() + b"}")
    public = load_public_key(pem(1))
    key = SSlibKey.from_crypto(public, keyid=verified.key_id)
    assert list(Envelope.from_dict(json.loads(envelope)).verify([key], 1)) == [verified.key_id]


def test_strict_policy_fails_exactly_the_unreliable_methods_naming_their_criteria() -> None:
    report = json.loads(asset("real-report.json"))
    outcome = evaluate(load_policy(ROOT / "deploy" / "policies" / "strict.yaml"), report)
    assert [m.method for m in outcome.methods] == list(FOURTEEN_METHODS)
    assert {m.method for m in outcome.failed} == set(report["summary"]["unreliable"])
    root = ET.fromstring(junit_xml(outcome, report))
    by_name = {m["name"]: m for m in report["methods"]}
    for case in root.iter("testcase"):
        failure = case.find("failure")
        expected = by_name[str(case.get("name"))].get("failing_criteria", [])
        assert (failure is not None) == bool(expected)
        for criterion in expected:
            assert f"{criterion}: score " in (failure.text or "")  # type: ignore[union-attr]
    text = gate_markdown(outcome, report, "k")
    assert text.count("❌ FAIL") == len(report["summary"]["unreliable"])


def test_gradients_only_policy_on_the_real_report() -> None:
    report = json.loads(asset("real-report.json"))
    policy = load_policy(ROOT / "deploy" / "policies" / "gradients-only.yaml")
    outcome = evaluate(policy, report)
    # Judged by the report's own verdicts (made with the default tolerances): IG and EG are reliable.
    assert outcome.passed
    assert [m.status for m in outcome.methods] == ["passed", "passed", "passed"]
