"""Several named inputs: one explained, the others held at each sample's own values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from clients.cli.main import main
from workers.explain import explain
from workers.game import play
from workers.inputs import input_key
from workers.prepare import prepare
from xaudit.contract.errors import InvalidInput
from xaudit.contract.spec import JobSpec

Model = tuple[bytes, torch.nn.Module]
Inputs = tuple[np.ndarray, np.ndarray]


def _spec(**kw: object) -> JobSpec:
    kw.setdefault("players", "grid:2x2")
    kw.setdefault("explain", "image")
    kw.setdefault("device", "cpu")
    return JobSpec(**kw)  # type: ignore[arg-type]


def _torch(module: torch.nn.Module, image: np.ndarray, clinical: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return module(torch.from_numpy(image), torch.from_numpy(clinical)).numpy()


def test_each_sample_keeps_its_own_held_input(
    image_tabular_model: Model, image_tabular_inputs: Inputs
) -> None:
    data, module = image_tabular_model
    image, clinical = image_tabular_inputs
    prep = prepare(_spec(), data, None, {"inputs": image, input_key("clinical"): clinical})
    assert prep.inputs.shape == (2, 1, 8, 8)
    np.testing.assert_allclose(prep.full_outputs, _torch(module, image, clinical), rtol=1e-5, atol=1e-5)
    game = play(prep.model, prep.inputs, prep.baselines, prep.players, prep.target, prep.classes)
    # The empty coalition masks the image only: the clinical variables stay each sample's own.
    empty = _torch(module, np.zeros_like(image), clinical)[np.arange(2), prep.classes]
    np.testing.assert_allclose(game.empty, empty, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(game.full, prep.target_values, rtol=1e-5, atol=1e-5)


def test_gradient_methods_differentiate_the_explained_input_only(
    image_tabular_model: Model, image_tabular_inputs: Inputs
) -> None:
    data, module = image_tabular_model
    image, clinical = image_tabular_inputs
    spec = _spec(methods=("integrated_gradients", "deeplift_rescale"))
    prep = prepare(spec, data, None, {"inputs": image, input_key("clinical"): clinical})
    result = explain(prep, spec.methods)
    reference = _torch(module, np.zeros_like(image), clinical)[np.arange(2), prep.classes]
    for name, maps in result.attributions.items():
        assert maps.shape == image.shape, name
        # Completeness against each sample's own clinical variables.
        np.testing.assert_allclose(
            maps.reshape(2, -1).sum(axis=1), prep.target_values - reference, rtol=1e-3, atol=1e-3
        )


@pytest.mark.parametrize(
    ("explain_name", "extra", "message"),
    [
        ("image", {input_key("age"): np.ones((2, 4), np.float32)}, "has no input named 'age'"),
        ("image", {}, "missing required input 'clinical'"),
        ("", {input_key("clinical"): np.ones((2, 4), np.float32)}, "pick the one to explain with --explain"),
        ("scan", {input_key("clinical"): np.ones((2, 4), np.float32)}, "has no input named 'scan'"),
        (
            "image",
            {input_key("clinical"): np.ones((3, 4), np.float32)},
            r"'clinical' holds 3 samples on its batch axis 0 \(declared \(batch, 4\)\); 'image' holds 2",
        ),
        (
            "image",
            {input_key("clinical"): np.ones((2, 5), np.float32)},
            r"input 'clinical': the model declares \(batch, 4\) .*given \(2, 5\)",
        ),
    ],
)
def test_input_names_and_shapes_are_checked_against_the_model(
    image_tabular_model: Model,
    image_tabular_inputs: Inputs,
    explain_name: str,
    extra: dict[str, np.ndarray],
    message: str,
) -> None:
    image, _ = image_tabular_inputs
    with pytest.raises(InvalidInput, match=message) as info:
        prepare(_spec(explain=explain_name), image_tabular_model[0], None, {"inputs": image, **extra})
    assert "\n" not in str(info.value)


def test_cli_audits_named_inputs_and_refuses_mismatches(
    image_tabular_model: Model,
    image_tabular_inputs: Inputs,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    model = tmp_path / "model.onnx"
    model.write_bytes(image_tabular_model[0])
    image, clinical = image_tabular_inputs
    np.save(tmp_path / "image.npy", image)
    np.save(tmp_path / "clinical.npy", clinical)
    job = ["--model", str(model), "--input", f"image={tmp_path / 'image.npy'}"]
    job += ["--input", f"clinical={tmp_path / 'clinical.npy'}", "--players", "grid:2x2", "--device", "cpu"]
    out = tmp_path / "report.json"
    methods = ["--methods", "integrated_gradients,occlusion_1"]
    assert main(["audit", *job, "--explain", "image", *methods, "--out", str(out)]) == 0
    report = json.loads(out.read_bytes())
    assert report["model"]["input_name"] == "image"
    assert {m["name"]: m["verdict"] for m in report["methods"]} == {
        "integrated_gradients": "reliable",
        "occlusion_1": "unreliable",
    }
    capsys.readouterr()
    for extra, message in (
        (["--explain", "scan"], "--explain scan names no input given"),
        ([], "pick the explained one with --explain"),
    ):
        assert main(["audit", *job, *extra, *methods, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    bad = ["--input", f"age={tmp_path / 'clinical.npy'}", "--input", f"image={tmp_path / 'image.npy'}"]
    assert (
        main(["audit", "--model", str(model), *bad, "--explain", "image", *methods, "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no input named 'age'" in err[0], err


def test_named_inputs_need_an_onnx_model() -> None:
    from tests.models import MLP_FEATURES, relu_mlp, to_torchscript

    model = to_torchscript(relu_mlp(0), torch.zeros(2, MLP_FEATURES))
    x = np.ones((2, MLP_FEATURES), np.float32)
    with pytest.raises(InvalidInput, match="need an ONNX model"):
        prepare(JobSpec(players="features", explain="x", device="cpu"), model, None, {"inputs": x})


def test_rule_methods_see_the_graph_with_held_inputs_as_constants(
    image_tabular_model: Model, image_tabular_inputs: Inputs
) -> None:
    image, clinical = image_tabular_inputs
    spec = _spec(methods=("lrp_epsilon", "grad_cam"))
    prep = prepare(spec, image_tabular_model[0], None, {"inputs": image, input_key("clinical"): clinical})
    result = explain(prep, spec.methods)
    # The image and the held clinical branch meet in a concatenation with a constant part: the
    # clinical features' share is absorbed as a bias's is (docs/science.md 5.8); the image's runs.
    assert "lrp_epsilon" not in result.not_applicable
    assert result.attributions["lrp_epsilon"].shape == image.shape
    assert np.abs(result.attributions["lrp_epsilon"]).max() > 0
    assert result.attributions["grad_cam"].shape == image.shape
