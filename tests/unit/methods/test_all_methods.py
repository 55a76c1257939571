"""Every registered method x every small model format: runs on a batch, keeps the input's shape, stays
finite; ONNX and TorchScript exports of one model give the same attributions (Captum's habit of a
methods x models table)."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import torch

from tests.models import CNN_SHAPE, MLP_FEATURES, relu_cnn, relu_mlp, to_onnx, to_torchscript
from workers.explain import ExplainResult, explain
from workers.methods import ALL_METHODS, get_method
from workers.prepare import prepare
from xaudit.contract.spec import JobSpec

MODELS = {"cnn": (relu_cnn, CNN_SHAPE, "grid:2x2"), "mlp": (relu_mlp, (MLP_FEATURES,), "features")}
FORMATS = ("onnx", "torchscript")
# Only these may refuse, and only on these models.
NOT_APPLICABLE = {("grad_cam", "mlp"): "the model has no convolution layer"}
FAST = {
    "integrated_gradients": {"steps": 16},
    "expected_gradients": {"steps": 8},
    "smoothgrad": {"samples": 4},
}


@cache
def _run(kind: str, fmt: str) -> tuple[ExplainResult, np.ndarray]:
    builder, shape, players = MODELS[kind]
    gen = torch.Generator().manual_seed(21)
    inputs = torch.randn(3, *shape, generator=gen)
    background = torch.randn(2, *shape, generator=gen)
    module = builder(seed=20)
    data = to_onnx(module, inputs) if fmt == "onnx" else to_torchscript(module, inputs)
    spec = JobSpec(kind="attribution", players=players, device="cpu", methods=ALL_METHODS, method_params=FAST)
    prep = prepare(spec, data, fmt, {"inputs": inputs.numpy(), "background": background.numpy()})
    return explain(prep, ALL_METHODS), inputs.numpy()


def test_table_covers_every_registered_method() -> None:
    assert len(ALL_METHODS) == 16
    assert {m for m, _ in NOT_APPLICABLE} <= set(ALL_METHODS)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("method", ALL_METHODS)
def test_method_runs_on_a_batch(method: str, kind: str, fmt: str) -> None:
    result, inputs = _run(kind, fmt)
    if (method, kind) in NOT_APPLICABLE:
        assert method not in result.attributions
        assert result.not_applicable[method] == NOT_APPLICABLE[(method, kind)]
        return
    assert method not in result.not_applicable, result.not_applicable.get(method)
    got = result.attributions[method]
    assert got.shape == inputs.shape
    assert got.dtype == np.float32
    assert np.isfinite(got).all()
    assert np.abs(got).max() > 0  # something was attributed


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("method", [m for m in ALL_METHODS if not get_method(m).capabilities.stochastic])
def test_onnx_and_torchscript_exports_agree(method: str, kind: str) -> None:
    if (method, kind) in NOT_APPLICABLE:
        pytest.skip("not applicable to this model")
    onnx_result, _ = _run(kind, "onnx")
    ts_result, _ = _run(kind, "torchscript")
    np.testing.assert_allclose(
        onnx_result.attributions[method], ts_result.attributions[method], rtol=1e-5, atol=1e-5
    )
