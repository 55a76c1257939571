"""The CI jobs in deploy/ci: valid YAML, and every option they give `xaudit gate` exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from clients.cli.main import build_parser

CI = Path(__file__).resolve().parents[3] / "deploy" / "ci"


def _gate_options() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    gate = sub.choices["gate"]  # type: ignore[index]
    return {opt for action in gate._actions for opt in action.option_strings}


def gate_script(path: Path) -> str:
    """The shell block of the CI job that runs `xaudit gate`."""
    doc: Any = yaml.safe_load(path.read_text())
    if "jobs" in doc:
        steps = doc["jobs"]["gate"]["steps"]
        blocks = [s["run"] for s in steps if "xaudit gate" in s.get("run", "")]
    else:
        blocks = [line for line in doc["xaudit-gate"]["script"] if "xaudit gate" in line]
    [block] = blocks
    return str(block)


@pytest.mark.parametrize("name", ["github-actions.yml", "gitlab-ci.yml"])
def test_ci_job_passes_only_real_gate_options(name: str) -> None:
    script = gate_script(CI / name)
    command = script[script.index("xaudit gate") :].replace("\\\n", " ")
    used = {t for t in shlex.split(command) if t.startswith("--")}
    assert {"--policy", "--model", "--input", "--junit", "--summary"} <= used
    assert used <= _gate_options()
    assert "--key" in script  # pinned keys, as the README recommends


def test_github_workflow_shape() -> None:
    doc: Any = yaml.safe_load((CI / "github-actions.yml").read_text())
    steps = doc["jobs"]["gate"]["steps"]
    assert any(s.get("uses", "").startswith("actions/checkout@") for s in steps)
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()"
    assert "$GITHUB_STEP_SUMMARY" in gate_script(CI / "github-actions.yml")


def test_gitlab_job_publishes_junit_even_on_failure() -> None:
    job: Any = yaml.safe_load((CI / "gitlab-ci.yml").read_text())["xaudit-gate"]
    assert job["artifacts"]["when"] == "always"
    assert job["artifacts"]["reports"]["junit"] == "xaudit-junit.xml"
    assert re.search(r"--junit xaudit-junit\.xml", gate_script(CI / "gitlab-ci.yml"))


def test_readme_names_both_files() -> None:
    text = (CI / "README.md").read_text()
    assert "github-actions.yml" in text and "gitlab-ci.yml" in text
