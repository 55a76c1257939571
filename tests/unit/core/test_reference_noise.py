"""A model whose output at the reference is rounding noise, not a value (workers/nudge.py).

Instance norms after a convolution of an all-zero image (MONAI's BasicUNet and UNet, with their
default affine parameters) normalise a constant map: float32 residue divided by sqrt(eps), then
multiplied again by each such layer after it. onnxruntime and torch each give their own noise there,
and so does onnxruntime at another step from the reference. Without the reference check, every game
method was judged on v(empty) = that noise (Shapley values "reliable") and the gradient methods
refused as if the conversion were wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import relu_cnn, to_onnx
from workers.audit import run_audit
from workers.nudge import NUDGE, nudge_test
from workers.prepare import prepare
from xaudit.contract.spec import JobSpec

X = np.random.default_rng(0).normal(size=(3, 1, 16, 16)).astype(np.float32)


def _block(inputs: int, outputs: int) -> list[nn.Module]:
    return [nn.Conv2d(inputs, outputs, 3, padding=1), nn.InstanceNorm2d(outputs), nn.LeakyReLU(0.1)]


@pytest.fixture(scope="module")
def instance_normed() -> bytes:
    """BasicUNet's encoder in small: convolution, instance norm (no affine part), LeakyReLU."""
    torch.manual_seed(0)
    net = nn.Sequential(
        *_block(1, 8), *_block(8, 8), nn.MaxPool2d(2), *_block(8, 16), *_block(16, 16),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 3),
    ).eval()  # fmt: skip
    return to_onnx(net, torch.from_numpy(X[:1]))


def _audit(model: bytes, baseline: str) -> dict:
    spec = JobSpec(
        players="grid:2x2",
        baseline=baseline,
        target="class:0",
        device="cpu",
        methods=("shapley_value", "gradient_x_input"),
    )
    return run_audit(prepare(spec, model, None, {"inputs": X})).report


def test_noise_at_the_reference_makes_every_verdict_inconclusive(instance_normed: bytes) -> None:
    report = _audit(instance_normed, "zeros")
    check = next(c for c in report["game"]["checks"] if c["name"] == "reference")
    assert not check["passed"]
    shapley, gradient = report["methods"]
    assert shapley["verdict"] == "inconclusive"
    assert "rounding noise there, not a value" in shapley["reason"]
    assert "choose another baseline" in shapley["reason"]
    # The converted graph is not blamed for a difference no graph could avoid.
    assert gradient["verdict"] == "not_applicable"
    assert "rounding noise, not a value" in gradient["reason"]
    assert "computes other outputs" not in gradient["reason"]


def test_a_steep_reference_with_a_value_passes(instance_normed: bytes) -> None:
    """A constant image other than 0: the zero padding at the borders gives the norms a variance, and
    the model a value, steep as it is there."""
    report = _audit(instance_normed, "constant:0.3")
    checks = {c["name"]: c for c in report["game"]["checks"]}
    assert checks["reference"]["passed"] and checks["empty"]["passed"]
    assert checks["reference"]["max_abs_error"] > 0  # the nudge moved the model
    assert all(m["verdict"] != "inconclusive" for m in report["methods"])


def test_an_ordinary_network_passes_at_a_zero_reference() -> None:
    net = relu_cnn(seed=1)
    x = np.random.default_rng(1).normal(size=(3, 1, 8, 8)).astype(np.float32)
    spec = JobSpec(players="grid:2x2", device="cpu", methods=("shapley_value",))
    report = run_audit(prepare(spec, to_onnx(net, torch.from_numpy(x[:1])), None, {"inputs": x})).report
    assert all(c["passed"] for c in report["game"]["checks"])


def test_the_nudge_test_tells_a_steep_value_from_noise() -> None:
    rows = np.zeros((2, 64), dtype=np.float32)

    def steep(r: np.ndarray) -> np.ndarray:
        return 1e4 * r.astype(np.float64).sum(axis=1) + 1.0

    def normalised(r: np.ndarray) -> np.ndarray:  # (x - mean) / std: no value at a constant row
        r = r.astype(np.float64)
        centred = r - r.mean(axis=1, keepdims=True)
        return centred[:, 0] / np.sqrt(centred.var(axis=1) + 1e-30)

    assert not nudge_test(steep, rows, 1.0, 1e-4).noise.any()
    noisy = nudge_test(normalised, rows, 1.0, 1e-4)
    assert noisy.noise.all() and (noisy.change > 0.5).all()
    # No step, no test: ids are never nudged (workers/audit/checks.py).
    assert not nudge_test(normalised, rows, 0.0, 1e-4).noise.any()
    assert NUDGE < 1e-4
