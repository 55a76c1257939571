"""Expected Gradients is judged, not diced: reliable for every seed on an additive ReLU model and on
the shipped digits CNN (or inconclusive with a reason, never unreliable while its criteria hold)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from workers.audit import run_audit
from workers.prepare import prepare
from xaudit.contract.spec import JobSpec

ASSETS = Path(__file__).resolve().parents[3] / "workers" / "assets"
SEEDS = range(10)


class AdditiveRelu(nn.Module):
    """out_c = sum_i a_ci relu(w_i x_i + b_i) + c_c: no interactions between features."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(11)
        self.w = nn.Parameter(torch.randn(6, generator=gen))
        self.b = nn.Parameter(0.3 * torch.randn(6, generator=gen))
        self.head = nn.Linear(6, 3)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(3, 6, generator=gen))
            self.head.bias.copy_(0.3 * torch.randn(3, generator=gen))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(x * self.w + self.b))


def _check(report: dict[str, Any]) -> None:
    entry = report["methods"][0]
    criteria = entry["criteria"]
    assert entry["verdict"] in ("reliable", "inconclusive"), entry["reason"]
    if entry["verdict"] == "inconclusive":
        assert "raise" in entry["reason"]
    for c in criteria.values():  # the point estimates hold; the interval decides the rest
        assert c["passed"], entry["reason"]
    assert entry["references"] == {
        "given": report["config"]["background_given"],
        "used": report["config"]["background_given"],
        "sampled": False,
        "note": "every background sample, for the map and the audit",
    }


@pytest.fixture(scope="module")
def additive() -> tuple[bytes, dict[str, np.ndarray]]:
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(4, 6, generator=gen)
    background = torch.randn(6, 6, generator=gen).numpy()
    return to_onnx(AdditiveRelu().eval(), x), {"inputs": x.numpy(), "background": background}


@pytest.mark.parametrize("seed", SEEDS)
def test_additive_relu_model(additive: tuple[bytes, dict[str, np.ndarray]], seed: int) -> None:
    model, tensors = additive
    spec = JobSpec(players="features", device="cpu", methods=("expected_gradients",), seed=seed)
    report = run_audit(prepare(spec, model, "onnx", tensors)).report
    _check(report)
    assert report["methods"][0]["verdict"] == "reliable", report["methods"][0]["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_digits_cnn(seed: int) -> None:
    tensors = {
        "inputs": np.load(ASSETS / "digits_inputs.npy")[:2],
        "background": np.load(ASSETS / "digits_background.npy")[:4],
    }
    spec = JobSpec(players="grid:2x4", device="cpu", methods=("expected_gradients",), seed=seed)
    report = run_audit(prepare(spec, (ASSETS / "digits_cnn.onnx").read_bytes(), "onnx", tensors)).report
    _check(report)
