"""``xaudit gate``, ``keys`` and ``verify`` against a real embedded server (`xaudit serve` as a child:
gRPC server, local worker, filesystem broker, SQLite) auditing the shipped ReLU CNN on digits."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients._embedded import embedded_service, free_port
from clients.cli.main import main
from service.signing import ReportSigner

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ASSETS = Path(__file__).resolve().parents[3] / "workers" / "assets"
MODEL = ASSETS / "digits_cnn.onnx"
INPUTS = ASSETS / "digits_inputs.npy"
# Both policies audit the same methods with the same tolerances: the second gate run reuses the
# first one's job through the idempotency key instead of auditing again.
AUDIT = "audit: [integrated_gradients, occlusion_1]\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    home = tmp_path_factory.mktemp("gate-home")
    with embedded_service(home, startup_timeout=120.0) as address:
        yield address, home


def _gate(address: str, tmp: Path, policy: str, *extra: str) -> int:
    path = tmp / "policy.yaml"
    path.write_text(policy)
    return main(
        [
            "gate", "--server", address, "--policy", str(path), "--model", str(MODEL),
            "--input", str(INPUTS), "--players", "grid:2x4",
            "--junit", str(tmp / "junit.xml"), "--summary", str(tmp / "summary.md"),
            "--envelope-out", str(tmp / "report.dsse.json"), *extra,
        ]
    )  # fmt: skip


def _last_line(err: str) -> str:
    lines = err.splitlines()
    assert sum(line.startswith("xaudit:") for line in lines) == 1, err
    return lines[-1]


def test_integrated_gradients_required_passes_on_the_relu_cnn(
    server: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _gate(server[0], tmp_path, AUDIT + "require_reliable: [integrated_gradients]\n")
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "gate passed" in out
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert [c.get("name") for c in root.iter("testcase")] == ["integrated_gradients", "occlusion_1"]
    assert root.find(".//failure") is None
    assert "## xaudit gate: passed" in (tmp_path / "summary.md").read_text()


def test_occlusion_1_required_fails_on_complete_allocation(
    server: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _gate(server[0], tmp_path, AUDIT + "require_reliable: [occlusion_1]\n")
    _, err = capsys.readouterr()
    assert code == 1, err
    assert _last_line(err) == "xaudit: gate failed: occlusion_1"
    root = ET.parse(tmp_path / "junit.xml").getroot()
    [failure] = root.findall(".//testcase[@name='occlusion_1']/failure")
    assert "complete_allocation" in failure.get("message", "")
    assert "complete_allocation: score" in (failure.text or "")
    assert root.find(".//testcase[@name='integrated_gradients']/failure") is None


def test_keys_then_offline_verify_of_the_served_envelope(
    server: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _gate(server[0], tmp_path, AUDIT) == 0
    assert main(["keys", "--server", server[0], "--out", str(tmp_path / "keys")]) == 0
    [key] = sorted((tmp_path / "keys").glob("*.pem"))
    capsys.readouterr()
    envelope = str(tmp_path / "report.dsse.json")
    assert main(["verify", envelope, "--key", str(key), "--model", str(MODEL)]) == 0
    assert "about the given model" in capsys.readouterr().out
    # The exact served bytes: one changed byte and it no longer verifies.
    data = bytearray((tmp_path / "report.dsse.json").read_bytes())
    data[len(data) // 2] ^= 0x01
    (tmp_path / "tampered.json").write_bytes(bytes(data))
    assert main(["verify", str(tmp_path / "tampered.json"), "--key", str(key)]) == 3


def test_pinned_wrong_key_exits_3(
    server: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = Path(__file__).resolve().parents[2] / "assets" / "signing" / "key-3.pub.pem"
    code = _gate(server[0], tmp_path, AUDIT, "--key", str(wrong))
    assert code == 3
    assert "the signed report does not verify" in _last_line(capsys.readouterr().err)


def test_reports_signed_before_a_key_rotation_still_verify(
    server: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _gate(server[0], tmp_path, AUDIT) == 0
    # A second service with the first one's keys, rotated: it signs with a new key and publishes both.
    home = tmp_path / "rotated-home"
    shutil.copytree(server[1] / "keys", home / "keys")
    new = ReportSigner.rotate(home / "keys")
    with embedded_service(home, startup_timeout=120.0) as address:
        assert main(["keys", "--server", address, "--out", str(tmp_path / "keys")]) == 0
    keys = sorted((tmp_path / "keys").glob("*.pem"))
    assert len(keys) == 2 and (tmp_path / "keys" / f"{new.key_id}.pem") in keys
    capsys.readouterr()
    args = ["verify", str(tmp_path / "report.dsse.json"), "--model", str(MODEL)]
    assert main([*args, *[a for k in keys for a in ("--key", str(k))]]) == 0
    assert main([*args, "--key", str(tmp_path / "keys" / f"{new.key_id}.pem")]) == 3


def test_unreachable_server_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{free_port()}"
    assert _gate(address, tmp_path, AUDIT) == 2
    assert _last_line(capsys.readouterr().err).startswith(
        f"xaudit: error: cannot reach the xaudit server at {address}"
    )


def test_malformed_policy_exits_2_with_one_line(
    server: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _gate(server[0], tmp_path, "audit: [integrated_gradients, occlusion_1\n") == 2
    assert "not valid YAML" in _last_line(capsys.readouterr().err)
    assert not (tmp_path / "junit.xml").exists()


def _ci_script(name: str) -> str:
    import yaml

    doc = yaml.safe_load((Path(__file__).resolve().parents[3] / "deploy" / "ci" / name).read_text())
    if "jobs" in doc:
        [block] = [s["run"] for s in doc["jobs"]["gate"]["steps"] if "xaudit gate" in s.get("run", "")]
    else:
        [block] = [line for line in doc["xaudit-gate"]["script"] if "xaudit gate" in line]
    # The shipped jobs use 16 players; 8 keep this test's audit the one the module already ran.
    return str(block).replace("grid:4x4", "grid:2x4")


@pytest.mark.parametrize(("name", "shell"), [("github-actions.yml", "bash"), ("gitlab-ci.yml", "sh")])
@pytest.mark.parametrize(("required", "status"), [("integrated_gradients", 0), ("occlusion_1", 1)])
def test_shipped_ci_jobs_run_the_gate(
    server: tuple[str, Path], tmp_path: Path, name: str, shell: str, required: str, status: int
) -> None:
    import os
    import subprocess
    import sys

    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    shutil.copy(MODEL, repo / "models" / "model.onnx")
    (repo / ".xaudit").mkdir()
    shutil.copy(INPUTS, repo / ".xaudit" / "inputs.npy")
    (repo / ".xaudit" / "policy.yaml").write_text(AUDIT + f"require_reliable: [{required}]\n")
    assert main(["keys", "--server", server[0], "--out", str(repo / ".xaudit" / "keys")]) == 0
    env = dict(
        os.environ,
        XAUDIT_SERVER=server[0],
        MODEL="models/model.onnx",
        GITHUB_STEP_SUMMARY=str(tmp_path / "step-summary.md"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    run = subprocess.run(
        [shell, "-e", "-c", _ci_script(name)], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == status, run.stderr[-2000:]
    root = ET.parse(repo / "xaudit-junit.xml").getroot()
    assert int(root.get("failures", "-1")) == status
    assert (repo / "xaudit-report.dsse.json").is_file()
