"""What the terminal shows (issue: a CLI that speaks plainly): the verdict table on stdout with the
reason of every not-applicable verdict, --json, the settings said once, the paths written; one-line
argument errors checked before torch is imported; did-you-mean; quiet third-party warnings; a
closed pipe handled like any Unix tool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clients.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
X = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch

    from tests.models import relu_mlp, to_onnx

    root = tmp_path_factory.mktemp("cli")
    paths = {"model": root / "m.onnx", "x": root / "x.npy", "bg": root / "bg.npy", "text": root / "notes.pt"}
    paths["model"].write_bytes(to_onnx(relu_mlp(0, features=4), torch.from_numpy(X)))
    np.save(paths["x"], X)
    from workers.methods.references import MAX_EXACT_REFERENCES

    bg = np.random.default_rng(1).normal(size=(MAX_EXACT_REFERENCES + 8, 4)).astype(np.float32)
    np.save(paths["bg"], bg)
    paths["text"].write_text("these are my notes, not a model\n")
    return paths


def _run(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "clients.cli.main", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _audit_args(files: dict[str, Path], out: Path) -> list[str]:
    return ["audit", "--model", str(files["model"]), "--input", str(files["x"]), "--players", "features",
            "--methods", "shapley_value,grad_cam,expected_gradients", "--background", str(files["bg"]),
            "--audit-order", "9", "--device", "cpu", "--out", str(out)]  # fmt: skip


def test_audit_prints_verdicts_reasons_settings_and_paths_on_stdout(files, tmp_path, capsys):
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    assert main([*_audit_args(files, out), "--html", str(page)]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].split()[:2] == ["METHOD", "VERDICT"] and lines[0].split()[-1] == "REASON"
    grad_cam = next(line for line in lines if line.startswith("grad_cam"))
    assert "not applicable" in grad_cam and "the model has no convolution layer" in grad_cam
    settings = [line for line in lines if line.startswith("settings: ")]
    assert len(settings) == 1
    assert "players features (4)" in settings[0]
    assert "--audit-order 9 cut to the 4 players" in settings[0]
    report = json.loads(out.read_text())
    used, given = report["config"]["background_samples"], len(np.load(files["bg"]))
    assert used < given and f"background {used} samples ({used} of the {given} given" in settings[0]
    assert f"report: {out.resolve()}" in lines and f"html: {page.resolve()}" in lines
    assert "METHOD" not in captured.err  # progress and logs only on stderr


def test_audit_json_summary(files, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main([*_audit_args(files, out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    report = json.loads(out.read_text())
    assert [m["verdict"] for m in summary["methods"]] == [m["verdict"] for m in report["methods"]]
    assert summary["summary"]["not_applicable"] == ["grad_cam"]
    assert summary["written"] == {"report": str(out.resolve())}
    assert summary["settings"].startswith("players features (4)")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["audit"], "xaudit audit: error: the following arguments are required: --model, --input ("),
        (["audti"], "xaudit: error: unknown command 'audti'; did you mean 'audit'?"),
        (["keys", "rotat"], "argument action: invalid choice: 'rotat' (choose from 'fetch', 'rotate'); did you mean 'rotate'?"),
        (["audit", "--model", "m.onnx", "--input", "x.npy", "--out", "r.json", "--audit-order", "0"],
         "argument --audit-order: must be at least 1, got 0"),
        (["audit", "--model", "{model}", "--input", "{x}", "--out", "r.json", "--methods", "shapley_vlaue"],
         "unknown method 'shapley_vlaue'; did you mean 'shapley_value'?"),
        (["audit", "--model", "{text}", "--input", "{x}", "--out", "r.json"],
         "is a text file, not a TorchScript model"),
        (["audit", "--model", "{model}", "--input", "missing.npy", "--out", "r.json"], "input file not found"),
        (["audit", "--model", "{model}", "--input", "{x}", "--out", "no/such/dir/r.json"], "does not exist"),
        (["audit", "--model", "{model}", "--input", "{x}", "--out", "."], "cannot write .: it is a directory"),
        (["audit", "--model", "{model}", "--input", "{x}", "--out", "r.json", "--attributions-out", "."],
         "cannot write .: it is a directory"),
        (["explain", "--model", "{model}", "--input", "{x}", "--out", "."], "cannot write .: it is a directory"),
    ],
)  # fmt: skip
def test_argument_errors_are_one_line_and_import_no_torch(files, args, expected):
    argv = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    code = (
        "import sys; from clients.cli.main import main; code = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(code)"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1, run.stderr
    assert expected in run.stderr and "Traceback" not in run.stderr


def test_third_party_warnings_are_quiet_by_default_and_shown_with_v(tmp_path):
    code = (
        "import sys, warnings; import clients.cli.main as m; m.quiet_third_party('-v' in sys.argv); "
        "warnings.warn_explicit('Setting forward, backward hooks', UserWarning, 'x.py', 1, module='captum.attr'); "
        "warnings.warn_explicit('torch.jit.script is deprecated', FutureWarning, 'x.py', 1, module='torch.jit'); "
        "warnings.warn_explicit('something of ours', UserWarning, 'x.py', 1, module='workers.audit')"
    )
    # In-process main() calls above set PYTHONWARNINGS for their children: start from a clean one.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "GRPC_VERBOSITY")}
    quiet = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60, env=env
    )
    assert "captum" not in quiet.stderr.lower() and "torch.jit" not in quiet.stderr
    assert "something of ours" in quiet.stderr  # only the known ones are filtered
    loud = subprocess.run(
        [sys.executable, "-c", code, "-v"], capture_output=True, text=True, cwd=ROOT, timeout=60, env=env
    )
    assert "forward, backward hooks" in loud.stderr and "torch.jit.script is deprecated" in loud.stderr


def test_a_closed_pipe_ends_quietly():
    # `xaudit methods | head -0`: stdout is a pipe whose reader has gone before anything is written.
    code = (
        "import os, sys; r, w = os.pipe(); os.close(r); os.dup2(w, 1); "
        "from clients.cli.main import main; code = main(['methods']); "
        "sys.stderr.write(f'exit {code}')"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert run.stderr == "exit 141", run.stderr  # no BrokenPipeError, no "Exception ignored" at exit


def test_names_name_the_features_in_the_report_and_the_page(files, tmp_path, capsys):
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    argv = ["audit", "--model", str(files["model"]), "--input", str(files["x"]), "--players", "features",
            "--methods", "shapley_value", "--device", "cpu", "--out", str(out), "--html", str(page)]  # fmt: skip
    assert main([*argv, "--names", "age,income,debt,tenure"]) == 0
    report = json.loads(out.read_text())
    assert [p["name"] for p in report["game"]["players"]] == ["age", "income", "debt", "tenure"]
    assert "(columns: age, income, debt, tenure)" in page.read_text()
    capsys.readouterr()
    assert main([*argv, "--names", "age,income"]) == 2
    assert "2 player names for 4 features: give one name per feature" in capsys.readouterr().err
