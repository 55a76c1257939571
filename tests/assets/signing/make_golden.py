"""Regenerate the golden signed reports in this directory (TEST-ONLY keys; never deploy them).

    .venv/bin/python tests/assets/signing/make_golden.py

Ed25519 signatures are deterministic, so running this again writes the same bytes; the unit tests
check that, so a change to the envelope format shows up as a diff here, on purpose.

Files written:
    TEST-ONLY-key-1.pem, TEST-ONLY-key-2.pem   private keys derived from fixed seeds (key 2 = after rotation)
    key-1.pub.pem, key-2.pub.pem                their public keys; key-3.pub.pem: an unrelated (wrong) key
    model.bin                                   stand-in model bytes (the model subject is their sha256)
    report.json                                 an xaudit.report/v1 document, as a worker writes it
    envelope-key-1.json, envelope-key-2.json    report.json signed with key 1 / key 2
    tampered-verdict.json                       key 1's envelope, occlusion_1 made reliable, old signature
    tampered-signature.json                     key 1's envelope with one signature byte changed
    tampered-payload-type.json                  key 1's envelope relabelled application/json, old signature
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from clients.verify import public_key_pem
from service.signing import ReportSigner
from xaudit.contract.spec import DEFAULT_TOLERANCES, FOURTEEN_METHODS, tensor_digest

HERE = Path(__file__).resolve().parent
MODEL_BYTES = b"xaudit golden test model: not a real model, TEST-ONLY bytes\n"
MODEL_NAME = "relu_cnn.onnx"


def test_only_key(n: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(
        hashlib.sha256(f"xaudit TEST-ONLY signing key {n}".encode()).digest()
    )


def inputs_digest() -> str:
    return tensor_digest(np.arange(4 * 1 * 8 * 8, dtype=np.float32).reshape(4, 1, 8, 8) / 256.0)


def _criteria(scores: dict[str, float]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name, score in scores.items():
        tolerance = DEFAULT_TOLERANCES[name]
        out[name] = {
            "score": score,
            "tolerance": tolerance,
            "passed": score <= tolerance,
            "mean": score,
            "worst": score,
            "fraction_failing": 0.0 if score <= tolerance else 1.0,
            "spread": 0.0,
        }
    return out


def _method(name: str) -> dict[str, object]:
    entry: dict[str, object] = {
        "name": name,
        "paper_context": {"label": "synthetic", "text": "golden test data, not a measurement"},
        "capabilities": {"gradients": True, "hooks": False, "baseline": "single", "stochastic": False},
        "seconds": 0.25,
        "among_fourteen": True,
    }
    if name == "grad_cam":
        return {**entry, "verdict": "not_applicable", "reason": "the model has no conv layer"}
    if name == "occlusion_1":
        scores = {"coverage": 0.0, "unrelated_allocation": 0.0, "complete_allocation": 0.5}
    elif name == "gradient_x_input":
        scores = {"coverage": 0.0, "unrelated_allocation": 0.125, "complete_allocation": 0.25}
    else:
        scores = {"coverage": 0.0, "unrelated_allocation": 1e-7, "complete_allocation": 2e-7}
    criteria = _criteria(scores)
    failing = [c for c, v in criteria.items() if not v["passed"]]
    return {
        **entry,
        "verdict": "unreliable" if failing else "reliable",
        "reason": "fails " + ", ".join(failing) if failing else "passes all three criteria",
        "failing_criteria": failing,
        "criteria": criteria,
        "completeness_residual": 0.0,
        "noise_floor": {
            "z": 4.0,
            "sigma": 1e-7,
            "by_order": [1e-7, 1e-7, 1e-7],
            "excluded_mass_share": 0.0,
            "repeats": 1,
        },
        "evidence": [],
        "by_order": [],
    }


def sample_report() -> bytes:
    """A synthetic report that follows workers/audit/report-v1.schema.json (the tests check it), with
    scores chosen to exercise every verdict: occlusion_1 and gradient_x_input unreliable, grad_cam n/a."""
    methods = [_method(name) for name in FOURTEEN_METHODS]
    report = {
        "schema": "xaudit.report/v1",
        "created": "2026-01-01T00:00:00Z",
        "seconds": 3.5,
        "model": {"sha256": hashlib.sha256(MODEL_BYTES).hexdigest(), "format": "onnx"},
        "inputs": {"sha256": inputs_digest(), "shape": [4, 1, 8, 8], "count": 4},
        "config": {
            "players": "grid:3x3",
            "baseline": "zeros",
            "target": "predicted",
            "methods": [{"name": name, "params": {}} for name in FOURTEEN_METHODS],
            "audit_order": 3,
            "tolerances": dict(DEFAULT_TOLERANCES),
            "seed": 0,
        },
        "environment": {
            "packages": {"xaudit": "0.1.0"},
            "python": "3.11",
            "device": "cpu",
            "execution_providers": ["CPUExecutionProvider"],
        },
        "game": {
            "players": [{"index": i, "name": f"r{i // 3}c{i % 3}", "size": 1} for i in range(9)],
            "n": 9,
            "exact": True,
            "efficiency_error": 0.0,
            "top_interactions": [],
            "mass_by_order": [{"order": 1, "mass": 0.75}, {"order": 2, "mass": 0.25}],
        },
        "methods": methods,
        "summary": {
            verdict: [m["name"] for m in methods if m["verdict"] == verdict]
            for verdict in ("reliable", "unreliable", "not_applicable")
        },
    }
    return json.dumps(report, sort_keys=True, separators=(",", ":")).encode()


def _retouch(envelope: bytes, edit: str) -> bytes:
    env = json.loads(envelope)
    if edit == "verdict":
        statement = json.loads(base64.b64decode(env["payload"]))
        for m in statement["predicate"]["methods"]:
            if m["name"] == "occlusion_1":
                m["verdict"] = "reliable"
        env["payload"] = base64.b64encode(json.dumps(statement, separators=(",", ":")).encode()).decode()
    elif edit == "signature":
        sig = bytearray(base64.b64decode(env["signatures"][0]["sig"]))
        sig[10] ^= 0x01
        env["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    elif edit == "payload-type":
        env["payloadType"] = "application/json"
    return json.dumps(env, separators=(",", ":")).encode()


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report = sample_report()
    (out / "model.bin").write_bytes(MODEL_BYTES)
    (out / "report.json").write_bytes(report)
    for n in (1, 2, 3):
        key = test_only_key(n)
        if n < 3:
            (out / f"TEST-ONLY-key-{n}.pem").write_bytes(
                key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
            )
            # Private keys are 0600 even when test-only: the signer warns otherwise.
            (out / f"TEST-ONLY-key-{n}.pem").chmod(0o600)
        (out / f"key-{n}.pub.pem").write_text(public_key_pem(key.public_key()))
    envelopes = {}
    for n in (1, 2):
        signer = ReportSigner(out, key_file=out / f"TEST-ONLY-key-{n}.pem")
        envelopes[n] = signer.sign(
            report, hashlib.sha256(MODEL_BYTES).hexdigest(), MODEL_NAME, inputs_digest()
        )
        (out / f"envelope-key-{n}.json").write_bytes(envelopes[n])
    for edit in ("verdict", "signature", "payload-type"):
        (out / f"tampered-{edit}.json").write_bytes(_retouch(envelopes[1], edit))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
