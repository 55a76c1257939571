"""Bad input gives one line and a non-zero exit from the CLI, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from tests.models import relu_mlp, to_onnx
from workers.prepare import prepare
from xaudit.contract.errors import InvalidInput, InvalidModel, UnknownMethod
from xaudit.contract.spec import JobSpec

X = np.random.default_rng(0).normal(size=(2, 6)).astype(np.float32)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    model = to_onnx(relu_mlp(0), torch.from_numpy(X))
    paths = {"model": root / "m.onnx", "x": root / "x.npy"}
    paths["model"].write_bytes(model)
    np.save(paths["x"], X)
    np.save(root / "nan.npy", np.where(np.arange(12).reshape(2, 6) == 3, np.nan, X))
    np.save(root / "inf.npy", np.full((2, 6), np.inf, np.float32))
    np.save(root / "shape.npy", np.zeros((2, 5), np.float32))
    (root / "truncated.onnx").write_bytes(model[: len(model) // 2])
    (root / "garbage.onnx").write_bytes(b"\x00not a model at all" * 10)
    external = onnx.load_from_string(model)
    init = external.graph.initializer[0]
    init.data_location = onnx.TensorProto.EXTERNAL
    entry = init.external_data.add()
    entry.key, entry.value = "location", "weights.bin"
    init.ClearField("raw_data")
    (root / "external.onnx").write_bytes(external.SerializeToString())
    (root / "groups.json").write_text(
        json.dumps({"groups": [0, 0, 1, 1, 3, 3], "names": ["a", "b", "c", "d"]})
    )
    for name in ("nan", "inf", "shape", "truncated", "garbage", "external", "groups"):
        paths[name] = (
            root
            / f"{name}.{'json' if name == 'groups' else 'onnx' if name in ('truncated', 'garbage', 'external') else 'npy'}"
        )
    return paths


def xaudit(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The CLI in a real process (startup costs seconds: used for a few cases)."""
    cmd = [sys.executable, "-m", "clients.cli.main", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def xaudit_here(capsys: pytest.CaptureFixture[str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    """The same entry point in this process."""
    from clients.cli.main import main

    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, captured.out, captured.err)


@pytest.mark.parametrize(
    ("model", "inputs", "extra", "expected"),
    [
        ("model", "shape", [], "does not match"),
        ("model", "nan", [], "NaN or Inf"),
        ("model", "inf", [], "NaN or Inf"),
        ("model", "x", ["--methods", "occlusion_1,magic"], "unknown method 'magic'"),
        ("model", "x", ["--players", "groups"], "does not partition the input"),
        ("truncated", "x", [], "ONNX"),
        ("garbage", "x", [], "ONNX"),
        ("external", "x", [], "external data"),
    ],
)
def test_cli_one_line_error(
    capsys: pytest.CaptureFixture[str],
    files: dict[str, Path],
    model: str,
    inputs: str,
    extra: list[str],
    expected: str,
) -> None:
    extra = [f"groups:{files['groups']}" if e == "groups" else e for e in extra]
    out = files["x"].parent / "out.npz"
    result = xaudit_here(capsys, "explain", "--model", files[model], "--input", files[inputs], "--device", "cpu",
                    "--players", "features", *extra, "--out", out)  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("xaudit: error: "), result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr


def test_explain_writes_every_method(capsys: pytest.CaptureFixture[str], files: dict[str, Path]) -> None:
    out = files["x"].parent / "ok.npz"
    result = xaudit_here(capsys, "explain", "--model", files["model"], "--input", files["x"], "--players", "features",
                    "--methods", "occlusion_1,integrated_gradients", "--out", out)  # fmt: skip
    assert result.returncode == 0, result.stderr
    arrays = np.load(out)
    assert arrays["occlusion_1"].shape == X.shape and arrays["integrated_gradients"].shape == X.shape
    assert arrays["target_values"].shape == (2,)


def test_a_real_process_prints_one_line(files: dict[str, Path]) -> None:
    result = xaudit(
        "audit", "--model", files["truncated"], "--input", files["x"], "--out", files["x"].parent / "r.json"
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_typed_errors_in_the_core(files: dict[str, Path]) -> None:
    model = files["model"].read_bytes()
    with pytest.raises(InvalidModel):
        prepare(JobSpec(device="cpu"), files["external"].read_bytes(), None, {"inputs": X})
    with pytest.raises(InvalidInput, match="NaN"):
        prepare(JobSpec(device="cpu", players="features"), model, None, {"inputs": np.load(files["nan"])})
    with pytest.raises(UnknownMethod):
        from workers.methods import resolve_method_names

        resolve_method_names("integrated_gradients,nope")
    init = onnx.load_from_string(model).graph.initializer[0]
    assert numpy_helper.to_array(init).size > 0  # the external-data copy above really stripped real weights
