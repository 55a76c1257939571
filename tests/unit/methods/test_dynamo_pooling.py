"""torch's dynamo exporter (the default) writes adaptive average pooling as Unsqueeze -> ReduceMean ->
Squeeze. The rule plans read those as shape steps and an average pooling: LRP and Deep Taylor on a
Conv1d audio CNN equal Zennit's rules, DeepLIFT equals Captum, and a mean over the batch axis is
still refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import to_onnx
from workers.methods import AttributionContext, get_method
from workers.methods._fx_plan import plan_graph
from workers.methods._modified_backward import RelevanceGraph
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target
from xaudit.contract.errors import NotApplicable

X = torch.randn(4, 1, 64, generator=torch.Generator().manual_seed(3))


def _audio_cnn() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(
        nn.Conv1d(1, 6, 5, stride=2), nn.ReLU(), nn.MaxPool1d(2), nn.Conv1d(6, 8, 3), nn.ReLU(),
        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(8, 3),
    ).eval()  # fmt: skip


def _dynamo(module: nn.Module) -> bytes:
    return to_onnx(module, X, opset=18, dynamo=True)


@pytest.fixture(scope="module")
def ctx() -> AttributionContext:
    model = load_model(_dynamo(_audio_cnn()), "onnx", "cpu")
    model.check_sample(X.numpy())
    kinds = [s.kind for s in plan_graph(model.torch_hookable("lrp_epsilon"), "lrp_epsilon", "LRP").steps]
    assert "avgpool" in kinds and kinds.count("shape") >= 2, kinds  # Unsqueeze, ReduceMean, Squeeze
    return AttributionContext(model, parse_players("windows:4", tuple(X.shape[1:])), Target(), {})


@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta", "deep_taylor"])
def test_lrp_rules_on_the_dynamo_export_equal_zennit(
    ctx: AttributionContext, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = X.numpy()
    classes = ctx.target.resolve_classes(ctx.model.predict(x))
    method = get_method(name)
    ours = method.attribute(ctx, x, np.zeros_like(x), classes)
    monkeypatch.setattr(RelevanceGraph, "build", classmethod(lambda cls, plan, rules: None))
    zennit = method.attribute(ctx, x, np.zeros_like(x), classes)
    assert np.abs(zennit).max() > 1e-6
    np.testing.assert_allclose(ours, zennit, rtol=1e-5, atol=1e-6)


def test_deeplift_on_the_dynamo_export_adds_up(ctx: AttributionContext) -> None:
    x = X.numpy()
    classes = ctx.target.resolve_classes(ctx.model.predict(x))
    got = get_method("deeplift_rescale").attribute(ctx, x, np.zeros_like(x), classes)
    out, out0 = ctx.model.predict(x), ctx.model.predict(np.zeros_like(x))
    rows = np.arange(len(x))
    # summation-to-delta: DeepLIFT's attributions add up to f(x) - f(x0) for the class
    np.testing.assert_allclose(
        got.reshape(len(x), -1).sum(1), out[rows, classes] - out0[rows, classes], atol=1e-4
    )


def test_a_mean_over_the_batch_axis_is_still_refused() -> None:
    class BatchMean(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x).mean(dim=0, keepdim=True).expand_as(x).flatten(1)

    model = load_model(_dynamo(BatchMean().eval()), "onnx", "cpu")
    with pytest.raises(NotApplicable, match="ReduceStaticAxes"):
        plan_graph(model.torch_hookable("lrp_epsilon"), "lrp_epsilon", "LRP")
