"""The arrows between the rooms stay one-way (docs/architecture.md): the import-linter contracts in
pyproject.toml, and nothing outside the CLI imports the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _env() -> dict[str, str]:
    # This tree first (a worktree beside an editable install of another checkout).
    path = os.pathsep.join([str(ROOT), str(ROOT / "proto"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def test_import_linter_contracts_are_kept() -> None:
    pytest.importorskip("importlinter")
    run = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_nothing_imports_the_cli() -> None:
    grimp = pytest.importorskip("grimp")
    sys_path = [str(ROOT), str(ROOT / "proto")]
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    graph = grimp.build_graph("xaudit", "service", "workers", "clients", cache_dir=None)
    cli = {m for m in graph.modules if m == "clients.cli" or m.startswith("clients.cli.")}
    importers = {
        importer
        for module in cli
        for importer in graph.find_modules_that_directly_import(module)
        if importer not in cli
    }
    assert not importers, f"only the CLI may import the CLI: {sorted(importers)}"
