"""A batch norm right after a Linear/Conv layer in LRP: the legacy exporter folds Conv+BatchNorm but
keeps BatchNormalization after a Gemm (a tabular model's Linear -> BatchNorm1d -> ReLU). LRP folds
the norm into the layer before it, as Zennit's canonizers do (docs/science.md 5.8): checked against
Zennit with its SequentialMergeBatchNorm canonizer on the torch model. A norm that cannot be folded
(after a concatenation, as DenseNet's, or after a layer that also feeds something else) gets the
epsilon rule as the diagonal layer it is (Zennit's Norm rule on it)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from torch import nn
from zennit.attribution import Gradient
from zennit.canonizers import SequentialMergeBatchNorm
from zennit.core import Composite, Hook
from zennit.rules import Norm

from tests.models import to_onnx
from workers.methods import AttributionContext, get_method
from workers.methods._lrp_rules import AlphaBeta, Epsilon, LayerRule, ZBox
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target

X = torch.randn(5, 6, generator=torch.Generator().manual_seed(51)) * 1.5


def _tabular() -> nn.Sequential:
    torch.manual_seed(52)
    model = nn.Sequential(
        nn.Linear(6, 10), nn.BatchNorm1d(10), nn.ReLU(), nn.Linear(10, 8), nn.BatchNorm1d(8), nn.ReLU(),
        nn.Linear(8, 3),
    ).eval()  # fmt: skip
    with torch.no_grad():  # trained-looking statistics, some negative scales
        for norm in (model[1], model[4]):
            norm.running_mean.uniform_(-1, 1)
            norm.running_var.uniform_(0.3, 3)
            norm.weight.uniform_(-1.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    return model


Z_PLUS = AlphaBeta(1.0, 0.0, zero_bias=True)
CASES = {
    "lrp_epsilon": ({}, [Epsilon(1e-6)] * 3),
    "lrp_alpha_beta": ({"alpha": 2.0, "beta": 1.0}, [AlphaBeta(2.0, 1.0)] * 3),
    "deep_taylor": ({"low": -5.0, "high": 5.0}, [ZBox(-5.0, 5.0), Z_PLUS, Z_PLUS]),
}


def _zennit(model: nn.Sequential, rules: list[LayerRule], classes: np.ndarray) -> np.ndarray:
    hooks = {id(layer): rule for layer, rule in zip([model[0], model[3], model[6]], rules, strict=True)}

    def mapping(ctx: dict, name: str, module: nn.Module) -> Hook | None:
        return hooks[id(module)].zennit() if id(module) in hooks else None

    c = torch.as_tensor(classes)
    composite = Composite(module_map=mapping, canonizers=[SequentialMergeBatchNorm()])
    with Gradient(model=model, composite=composite) as attributor:
        _, relevance = attributor(
            X.clone().requires_grad_(True),
            lambda out: torch.zeros_like(out).scatter_(1, c[:, None], 1.0) * out.detach(),
        )
    return relevance.detach().numpy()


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_norm_after_a_linear_layer_is_folded_as_zennits_canonizer_does(name: str) -> None:
    model = _tabular()
    data = to_onnx(model, X[:2])
    assert [n.op_type for n in onnx.load_from_string(data).graph.node].count("BatchNormalization") == 2
    loaded = load_model(data, "onnx", "cpu")
    loaded.check_sample(X.numpy())
    params, rules = CASES[name]
    ctx = AttributionContext(loaded, parse_players("features", (6,)), Target(), params)
    classes = np.array([0, 1, 2, 0, 1])
    ours = get_method(name).attribute(ctx, X.numpy(), np.zeros_like(X.numpy()), classes)
    want = _zennit(model, rules, classes)
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    # the norms' own statistics are untouched (folding works on a copy)
    assert float(model[1].running_var.min()) >= 0.3


class _DenseBlock(nn.Module):
    """DenseNet's pattern: a batch norm after a concatenation, which no canonizer merges into a layer
    (and one after a Linear layer that also feeds a skip connection)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(53)
        self.first, self.grow = nn.Conv2d(2, 3, 3, padding=1), nn.Conv2d(3, 3, 3, padding=1)
        self.norm, self.last = nn.BatchNorm2d(6), nn.Conv2d(6, 4, 3)
        self.linear, self.forked, self.head = nn.Linear(16, 5), nn.BatchNorm1d(5), nn.Linear(10, 3)
        with torch.no_grad():
            for norm in (self.norm, self.forked):
                norm.running_mean.uniform_(-1, 1)
                norm.running_var.uniform_(0.3, 3)
                norm.weight.uniform_(-1.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        h = torch.relu(self.norm(torch.cat([h, self.grow(h)], 1)))
        z = self.linear(nn.functional.max_pool2d(torch.relu(self.last(h)), 2).flatten(1))
        return self.head(torch.cat([torch.relu(self.forked(z)), z], 1))


IMAGES = torch.randn(4, 2, 6, 6, generator=torch.Generator().manual_seed(54))


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_norm_no_layer_takes_in_gets_the_epsilon_rule_as_a_diagonal_layer(name: str, dynamo: bool) -> None:
    """Such a norm keeps its gradient: the epsilon rule on it as the diagonal layer it is, its shift
    absorbing a share (Zennit's Norm rule on the BatchNorm). Before, LRP refused the model."""
    model = _DenseBlock()
    layers = [model.first, model.grow, model.last, model.linear, model.head]
    params, rules = CASES[name]
    rules = [rules[0], *[rules[1]] * 4]
    hooks = {id(layer): rule for layer, rule in zip(layers, rules, strict=True)}

    def mapping(ctx: dict, module_name: str, module: nn.Module) -> Hook | None:
        if isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d):
            return Norm()
        return hooks[id(module)].zennit() if id(module) in hooks else None

    classes = np.array([0, 1, 2, 0])
    c = torch.as_tensor(classes)
    with Gradient(model=model, composite=Composite(module_map=mapping)) as attributor:
        _, want = attributor(
            IMAGES.clone().requires_grad_(True),
            lambda out: torch.zeros_like(out).scatter_(1, c[:, None], 1.0) * out.detach(),
        )
    assert float(want.abs().max()) > 1e-6  # not a map of zeros (Deep Taylor's z+ keeps little here)
    data = to_onnx(model, IMAGES[:2], opset=18, dynamo=True) if dynamo else to_onnx(model, IMAGES[:2])
    loaded = load_model(data, "onnx", "cpu")
    ctx = AttributionContext(loaded, parse_players("grid:2x2", (2, 6, 6)), Target(), params)
    ours = get_method(name).attribute(ctx, IMAGES.numpy(), np.zeros_like(IMAGES.numpy()), classes)
    # (stabilisers of 1e-6 on small denominators: differences of 1e-4 of the largest)
    np.testing.assert_allclose(ours, want.detach().numpy(), rtol=1e-4, atol=1e-4 * float(want.abs().max()))
