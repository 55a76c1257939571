"""``xaudit verify``: exit 0 valid, 1 invalid (one line why), 2 usage error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clients.cli.main import main
from tests.unit.signing.signing_golden import ASSETS


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["verify", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_valid_envelope_prints_the_verdict_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(
        capsys,
        str(ASSETS / "envelope-key-1.json"),
        "--key",
        str(ASSETS / "key-1.pub.pem"),
        "--model",
        str(ASSETS / "model.bin"),
    )
    assert code == 0, err
    assert out.startswith("valid: signed by key fe752b24") and "about the given model" in out
    assert "unreliable (2): gradient_x_input, occlusion_1" in out


def test_rotated_keys_repeat_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(
        capsys,
        str(ASSETS / "envelope-key-1.json"),
        "--key",
        str(ASSETS / "key-2.pub.pem"),
        "--key",
        str(ASSETS / "key-1.pub.pem"),
    )
    assert code == 0, err


@pytest.mark.parametrize(
    ("envelope", "key", "extra", "why"),
    [
        ("tampered-verdict.json", "key-1.pub.pem", [], "no signature verifies"),
        ("tampered-signature.json", "key-1.pub.pem", [], "no signature verifies"),
        ("envelope-key-1.json", "key-3.pub.pem", [], "no signature verifies"),
        ("envelope-key-1.json", "key-1.pub.pem", ["--model", "report.json"], "is not the subject"),
        ("report.json", "key-1.pub.pem", [], "this is an unsigned report (plain JSON"),
    ],
)
def test_invalid_exits_3_with_one_line(
    capsys: pytest.CaptureFixture[str], envelope: str, key: str, extra: list[str], why: str
) -> None:
    extra = [str(ASSETS / e) if e.endswith(".json") else e for e in extra]
    code, out, err = _run(capsys, str(ASSETS / envelope), "--key", str(ASSETS / key), *extra)
    assert code == 3
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("xaudit: invalid: ") and why in err


@pytest.mark.parametrize(
    ("envelope", "key", "why"),
    [
        ("missing.json", "key-1.pub.pem", "envelope file not found"),
        ("envelope-key-1.json", "missing.pem", "key file not found"),
        ("envelope-key-1.json", "report.json", "is not a PEM public key"),
        ("envelope-key-1.json", "TEST-ONLY-key-1.pem", "is not a PEM public key"),
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], envelope: str, key: str, why: str) -> None:
    code, _, err = _run(capsys, str(ASSETS / envelope), "--key", str(ASSETS / key))
    assert code == 2
    assert err.count("\n") == 1 and why in err


def test_missing_model_file_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(
        capsys,
        str(ASSETS / "envelope-key-1.json"),
        "--key",
        str(ASSETS / "key-1.pub.pem"),
        "--model",
        str(tmp_path / "nope.onnx"),
    )
    assert code == 2 and "model file not found" in err


def test_verifier_module_imports_neither_torch_nor_numpy() -> None:
    probe = "import sys, clients.verify; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
