"""A batch norm right after a Linear/Conv layer in LRP: the legacy exporter folds Conv+BatchNorm but
keeps BatchNormalization after a Gemm (a tabular model's Linear -> BatchNorm1d -> ReLU). LRP folds
the norm into the layer before it, as Zennit's canonizers do (docs/science.md 5.8): checked against
Zennit with its SequentialMergeBatchNorm canonizer on the torch model. A norm that cannot be folded
(its layer also feeds something else) is still refused."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from torch import nn
from zennit.attribution import Gradient
from zennit.canonizers import SequentialMergeBatchNorm
from zennit.core import Composite, Hook

from tests.models import to_onnx
from workers.methods import AttributionContext, get_method
from workers.methods._fx_plan import family_plan
from workers.methods._lrp_rules import AlphaBeta, Epsilon, LayerRule, ZBox
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target
from xaudit.contract.errors import NotApplicable

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


class _Forked(nn.Module):
    """A Linear layer whose output feeds a norm and a skip connection: nothing to fold it into."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.norm, self.head = nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.linear(x)
        return self.head(torch.relu(self.norm(z)) + z)


def test_a_norm_whose_layer_feeds_something_else_is_refused() -> None:
    graph = load_model(to_onnx(_Forked().eval(), X[:2]), "onnx", "cpu").torch_hookable("lrp_epsilon")
    with pytest.raises(NotApplicable, match="BatchNorm"):
        family_plan(graph, "lrp_epsilon", "LRP")
