"""NaN and infinity from the model never reach a map, a score or a verdict as numbers: a method whose
attributions are not finite is not applicable (the others are judged), and a model undefined at the
reference stops the job with a clear error instead of a report of NaNs (or a schema failure)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from workers.audit import run_audit
from workers.explain import explain
from workers.prepare import prepare
from xaudit.contract.errors import InvalidInput
from xaudit.contract.spec import JobSpec


class _SqrtThenLinear(nn.Module):
    """sqrt(|x|) then a linear layer: finite everywhere, but its gradient is infinite at 0."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.sqrt(torch.abs(x)))


class _LogOfSum(nn.Module):
    """log of the input's sum: -inf when every feature is at the zero reference."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = x.sum(dim=1, keepdim=True)
        return torch.cat([torch.log(total), -torch.log(total)], dim=1)


X = np.array([[0.0, 1.0, 4.0, 9.0], [1.0, 0.0, 2.0, 3.0]], np.float32)


def _model(module: nn.Module) -> bytes:
    torch.manual_seed(0)
    return to_onnx(module.eval(), torch.from_numpy(X))


def test_a_method_with_infinite_gradients_is_not_applicable_and_the_rest_are_judged() -> None:
    model = _model(_SqrtThenLinear())
    spec = JobSpec(players="features", methods=("gradient_x_input", "occlusion_1"), device="cpu")
    result = explain(prepare(spec, model, "onnx", {"inputs": X}), spec.methods)
    # 0 * inf at the zero features: NaN without the check
    assert "non-finite attributions" in result.not_applicable["gradient_x_input"]
    assert "2 of 2 inputs" in result.not_applicable["gradient_x_input"]
    assert np.isfinite(result.attributions["occlusion_1"]).all()

    audit = spec.__class__(kind="audit", players="features", methods=spec.methods, device="cpu")
    report = run_audit(prepare(audit, model, "onnx", {"inputs": X})).report
    verdicts = {m["name"]: m for m in report["methods"]}
    assert verdicts["gradient_x_input"]["verdict"] == "not_applicable"
    assert "non-finite" in verdicts["gradient_x_input"]["reason"]
    assert verdicts["occlusion_1"]["verdict"] != "not_applicable"


def test_a_model_undefined_at_the_reference_stops_the_audit_with_a_clear_error() -> None:
    model = _model(_LogOfSum())
    spec = JobSpec(kind="audit", players="features", methods=("occlusion_1",), device="cpu")
    prep = prepare(spec, model, "onnx", {"inputs": np.abs(X) + 1.0})  # finite on the inputs themselves
    with pytest.raises(InvalidInput, match=r"NaN or infinite on 2 of 32 sub-inputs .*--baseline"):
        run_audit(prep)
