"""``xaudit gate`` against a stand-in client serving the golden envelopes: exit codes, what is sent,
what is checked, what is written. The same command against a real server: tests/integration/gate."""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clients._types import SigningKey
from clients.cli.main import main
from clients.verify import key_id, load_public_key
from tests.unit.signing.signing_golden import ASSETS, asset, generator
from xaudit.contract.errors import Unavailable
from xaudit.contract.spec import DEFAULT_TOLERANCES


@dataclass
class _Job:
    id: str = "job-1"
    state: str = "succeeded"
    progress: float = 1.0
    message: str = ""

    def error(self) -> None:
        return None


@dataclass
class _Ref:
    sha256: str


@dataclass
class FakeClient:
    envelope: bytes
    keys: tuple[SigningKey, ...]
    address: str = "fake:1"
    submitted: list[Any] = field(default_factory=list)

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def upload_model(self, model: bytes, *, name: str | None = None) -> _Ref:
        import hashlib

        return _Ref(hashlib.sha256(model).hexdigest())

    def submit_audit(self, ref: _Ref, spec: Any, tensors: Mapping[str, np.ndarray]) -> _Job:
        self.submitted.append((ref, spec, dict(tensors)))
        return _Job(state="queued", progress=0.0)

    def watch(self, job_id: str) -> Iterator[_Job]:
        yield _Job(state="running", progress=0.5)
        yield _Job()

    def get_report(self, job_id: str) -> bytes:
        return self.envelope

    def signing_keys(self) -> tuple[SigningKey, ...]:
        return self.keys


def _key(n: int) -> SigningKey:
    pem = (ASSETS / f"key-{n}.pub.pem").read_text()
    return SigningKey(key_id(load_public_key(pem)), pem)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    inputs = tmp_path / "inputs.npy"
    # The inputs the golden report names (see make_golden.inputs_digest).
    np.save(inputs, np.arange(4 * 1 * 8 * 8, dtype=np.float32).reshape(4, 1, 8, 8) / 256.0)
    from xaudit.contract.spec import tensor_digest

    assert tensor_digest(np.load(inputs)) == generator().inputs_digest()
    return {"model": ASSETS / "model.bin", "input": inputs, "tmp": tmp_path}


def _policy(tmp: Path, text: str) -> Path:
    path = tmp / "policy.yaml"
    path.write_text(text)
    return path


def _gate(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    files: dict[str, Path],
    policy: str,
    *extra: str,
    envelope: str = "envelope-key-1.json",
    keys: tuple[SigningKey, ...] = (),
) -> tuple[int, str, str, FakeClient]:
    client = FakeClient(asset(envelope), keys or (_key(2), _key(1)))

    def fake_client_from_args(args: argparse.Namespace) -> FakeClient:
        return client

    monkeypatch.setattr("clients._connect.client_from_args", fake_client_from_args)
    tmp = files["tmp"]
    code = main(
        [
            "gate", "--server", "fake:1", "--policy", str(_policy(tmp, policy)),
            "--model", str(files["model"]), "--input", str(files["input"]),
            "--junit", str(tmp / "junit.xml"), "--summary", str(tmp / "summary.md"), *extra,
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    return code, out, err, client


IG_AND_OCC = "audit: [integrated_gradients, occlusion_1]\n"


def _last_line(err: str) -> str:
    """The one-line message; progress lines may come before it, nothing after it."""
    assert err.endswith("\n")
    lines = err.splitlines()
    assert sum(line.startswith("xaudit:") for line in lines) == 1, err
    return lines[-1]


def test_pass_sends_the_policy_and_writes_reports(monkeypatch, capsys, files) -> None:  # type: ignore[no-untyped-def]
    policy = IG_AND_OCC + "require_reliable: [integrated_gradients]\ntolerances: {coverage: 0.05}\n"
    code, out, err, client = _gate(monkeypatch, capsys, files, policy)
    assert code == 0, err
    assert "gate passed: report signed by key fe752b24" in out
    [(_, spec, tensors)] = client.submitted
    assert spec.methods == ("integrated_gradients", "occlusion_1")
    assert dict(spec.tolerances) == dict(DEFAULT_TOLERANCES)
    assert set(tensors) == {"inputs"}
    root = ET.parse(files["tmp"] / "junit.xml").getroot()
    assert [c.get("name") for c in root.iter("testcase")] == ["integrated_gradients", "occlusion_1"]
    assert root.find(".//failure") is None
    assert (files["tmp"] / "summary.md").read_text().startswith("## xaudit gate: passed")


def test_violation_exits_1_and_junit_names_complete_allocation(monkeypatch, capsys, files) -> None:  # type: ignore[no-untyped-def]
    code, out, err, _ = _gate(monkeypatch, capsys, files, IG_AND_OCC + "require_reliable: [occlusion_1]\n")
    assert code == 1
    assert _last_line(err) == "xaudit: gate failed: occlusion_1"
    assert "complete_allocation: score 0.5 > tolerance 0.05" in out
    [failure] = (
        ET.parse(files["tmp"] / "junit.xml").getroot().findall(".//testcase[@name='occlusion_1']/failure")
    )
    assert "complete_allocation" in (failure.text or "")


def test_pinned_key_rotation_list(monkeypatch, capsys, files) -> None:  # type: ignore[no-untyped-def]
    code, _, err, _ = _gate(
        monkeypatch, capsys, files, IG_AND_OCC,
        "--key", str(ASSETS / "key-2.pub.pem"), "--key", str(ASSETS / "key-1.pub.pem"),
    )  # fmt: skip
    assert code == 0, err


@pytest.mark.parametrize(
    ("extra", "envelope", "keys", "why"),
    [
        ((), "tampered-verdict.json", (), "the signed report does not verify: no signature verifies"),
        ((), "tampered-signature.json", (), "no signature verifies"),
        (("--key", str(ASSETS / "key-3.pub.pem")), "envelope-key-1.json", (), "no signature verifies"),
        ((), "envelope-key-1.json", ("key-3",), "no signature verifies"),
        ((), "envelope-key-1.json", ("lying",), "is really"),
        ((), "report.json", (), "the server returned an unsigned report"),
    ],
)
def test_bad_signature_exits_3_with_one_line(  # type: ignore[no-untyped-def]
    monkeypatch, capsys, files, extra, envelope, keys, why
) -> None:
    server_keys = {
        (): (),
        ("key-3",): (_key(3),),
        ("lying",): (SigningKey(_key(3).key_id, _key(1).public_key_pem),),
    }
    code, _, err, _ = _gate(
        monkeypatch, capsys, files, IG_AND_OCC, *extra, envelope=envelope, keys=server_keys[keys]
    )
    assert code == 3
    assert _last_line(err).startswith("xaudit: error: ") and why in _last_line(err)
    assert not (files["tmp"] / "junit.xml").exists()


def test_report_about_another_model_exits_3(monkeypatch, capsys, files, tmp_path) -> None:  # type: ignore[no-untyped-def]
    other = tmp_path / "other.onnx"
    other.write_bytes(b"another model")
    files = {**files, "model": other}
    code, _, err, _ = _gate(monkeypatch, capsys, files, IG_AND_OCC)
    assert code == 3 and "is not the subject of this report" in err


def test_report_about_other_inputs_exits_3(monkeypatch, capsys, files) -> None:  # type: ignore[no-untyped-def]
    np.save(files["input"], np.zeros((4, 1, 8, 8), dtype=np.float32))
    code, _, err, _ = _gate(monkeypatch, capsys, files, IG_AND_OCC)
    assert code == 3 and "inputs" in err and "not the subject" in err


def test_report_judged_with_other_tolerances_exits_3(monkeypatch, capsys, files) -> None:  # type: ignore[no-untyped-def]
    code, _, err, _ = _gate(
        monkeypatch, capsys, files, IG_AND_OCC + "tolerances: {complete_allocation: 0.6}\n"
    )
    assert code == 3 and "the report used tolerance complete_allocation=0.05, the policy asks 0.6" in err


@pytest.mark.parametrize(
    ("policy", "extra", "why"),
    [
        ("audit: [integrated_gradients\n", (), "not valid YAML"),
        ("require: [occlusion_1]\n", (), "unknown key 'require'"),
        (IG_AND_OCC, ("--methods", "saliency"), "drop --methods"),
        (IG_AND_OCC, ("--tolerance", "coverage=0.1"), "drop --tolerance"),
        (IG_AND_OCC + "confidence: 0.9\n", ("--confidence", "0.99"), "drop --confidence"),
        (IG_AND_OCC, ("--param", "lrp_epsilon.epsilon=0.1"), "names methods"),
    ],
)
def test_usage_errors_exit_2_before_any_call(  # type: ignore[no-untyped-def]
    monkeypatch, capsys, files, policy, extra, why
) -> None:
    code, _, err, client = _gate(monkeypatch, capsys, files, policy, *extra)
    assert code == 2 and err.count("\n") == 1 and why in err
    assert client.submitted == []


def test_missing_policy_file_exits_2(monkeypatch, capsys, files) -> None:  # type: ignore[no-untyped-def]
    code = main(["gate", "--policy", str(files["tmp"] / "nope.yaml"), "--model", "m", "--input", "x.npy"])
    assert code == 2 and "policy file not found" in capsys.readouterr().err


def test_unreachable_server_exits_2_with_one_line(monkeypatch, capsys, files) -> None:  # type: ignore[no-untyped-def]
    from clients._embedded import free_port

    address = f"127.0.0.1:{free_port()}"
    code = main(
        [
            "gate", "--server", address, "--policy", str(_policy(files["tmp"], IG_AND_OCC)),
            "--model", str(files["model"]), "--input", str(files["input"]),
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert (
        err.strip().splitlines()[-1].startswith(f"xaudit: error: cannot reach the xaudit server at {address}")
    )


def test_keys_command_writes_keyid_files(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    client = FakeClient(b"", (_key(2), _key(1)))
    monkeypatch.setattr("clients._connect.client_from_args", lambda args: client)
    assert main(["keys", "--server", "fake:1", "--out", str(tmp_path / "keys")]) == 0
    written = sorted(p.name for p in (tmp_path / "keys").iterdir())
    assert written == sorted(f"{k.key_id}.pem" for k in (_key(1), _key(2)))
    capsys.readouterr()
    pem1 = tmp_path / "keys" / f"{_key(1).key_id}.pem"
    assert main(["verify", str(ASSETS / "envelope-key-1.json"), "--key", str(pem1)]) == 0


def test_keys_command_refuses_a_mislabelled_key(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    client = FakeClient(b"", (SigningKey("0" * 64, _key(1).public_key_pem),))
    monkeypatch.setattr("clients._connect.client_from_args", lambda args: client)
    assert main(["keys", "--server", "fake:1", "--out", str(tmp_path / "keys")]) == 3
    assert "is really" in capsys.readouterr().err
    assert not (tmp_path / "keys").exists()


def test_failed_job_exits_2(monkeypatch, capsys, files) -> None:  # type: ignore[no-untyped-def]
    class FailingJob(_Job):
        def error(self) -> Unavailable:  # type: ignore[override]
            return Unavailable("the broker is down")

    def watch(self: FakeClient, job_id: str) -> Iterator[_Job]:
        yield FailingJob(state="failed")

    monkeypatch.setattr(FakeClient, "watch", watch)
    code, _, err, _ = _gate(monkeypatch, capsys, files, IG_AND_OCC)
    assert code == 2 and "the broker is down" in err
