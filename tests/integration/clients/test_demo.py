"""`xaudit demo` end to end, as a new user runs it: it starts its own embedded service, audits the
shipped digits CNN, prints the verdict table and leaves a signed report that verifies offline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clients._report import report_document

pytestmark = [pytest.mark.integration, pytest.mark.slow]

XAUDIT = Path(sys.executable).with_name("xaudit")
# docs/science.md, section 5.3, measured on this kind of model: complete methods pass, first-order and occlusion fail.
EXPECTED = {
    "integrated_gradients": "reliable",
    "deeplift_rescale": "reliable",
    "gradient_x_input": "unreliable",
    "occlusion_1": "unreliable",
}


def _demo(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "demo-report.json"
    env = {k: v for k, v in os.environ.items() if k not in ("XAUDIT_SERVER", "XAUDIT_HOME")}
    run = subprocess.run(
        [str(XAUDIT), "demo", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=1200,
    )
    return run, out


def _table(stdout: str) -> dict[str, str]:
    rows = {}
    for line in stdout.splitlines():
        cells = line.split()
        if len(cells) >= 2 and cells[1] in ("reliable", "unreliable", "not"):
            rows[cells[0]] = cells[1] if cells[1] != "not" else "not_applicable"
    return rows


def test_demo_audits_the_shipped_model_and_the_report_verifies(tmp_path: Path) -> None:
    run, out = _demo(tmp_path, "--methods", ",".join(EXPECTED))
    assert run.returncode == 0, run.stderr[-3000:]
    assert _table(run.stdout) == EXPECTED
    assert f"report: {out.resolve()}" in run.stdout
    report = report_document(out.read_bytes())
    assert {m["name"]: m["verdict"] for m in report["methods"]} == EXPECTED
    assert report["config"]["players"] == "grid:2x4"

    # The printed verify command works as printed (offline: keys saved beside the report).
    command = next(
        line.strip() for line in run.stdout.splitlines() if line.strip().startswith("xaudit verify")
    )
    verify = subprocess.run([str(XAUDIT), *command.split()[1:]], capture_output=True, text=True, cwd=tmp_path)
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout.startswith("valid: signed by key") and "about the given model" in verify.stdout
    # The service it started is gone: nothing listens at the address it printed.
    address = run.stderr.split("embedded xaudit service on ", 1)[1].split()[0]
    gone = subprocess.run([str(XAUDIT), "jobs", "--server", address], capture_output=True, text=True)
    assert gone.returncode == 2 and "cannot reach" in gone.stderr


def test_demo_with_all_fourteen_methods(tmp_path: Path) -> None:
    run, out = _demo(tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    verdicts = _table(run.stdout)
    assert len(verdicts) == 14
    for name, verdict in EXPECTED.items():
        assert verdicts[name] == verdict, (name, run.stdout)
    assert len(report_document(out.read_bytes())["methods"]) == 14
