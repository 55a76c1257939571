"""LRP, LRP-alpha-beta and Deep Taylor through residual sums and concatenations.

The reference is Zennit run the way its authors run residual networks: on the torch model, with
its ResNet canonizer (batch norms merged into the convolutions, each residual sum made a ``Sum``
layer that gets the Norm rule, i.e. the proportional split). xaudit runs on the ONNX export, where
the sum is a plain Add and the batch norms were folded by the exporter.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import residual_mlp
from tests.models.blocks import concatenated_block, shuffled_unit, small_resnet
from tests.unit.methods._context import context, dense_layers
from tests.unit.methods.test_lrp import STAB, alpha_beta_ref, deep_taylor_ref, lrp_epsilon_ref
from workers.methods import get_method
from workers.methods._lrp_rules import AlphaBeta, Epsilon, LayerRule, ZBox
from xaudit.contract.errors import NotApplicable

CLASSES = np.array([0, 1, 3])


def _inputs() -> torch.Tensor:
    return torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _rules(name: str, x: torch.Tensor) -> tuple[dict[str, float], Callable[[int], LayerRule]]:
    low, high = float(x.min()), float(x.max())
    return {
        "lrp_epsilon": ({}, lambda i: Epsilon(1e-6)),
        "lrp_alpha_beta": ({}, lambda i: AlphaBeta(2.0, 1.0)),
        "deep_taylor": (
            {"low": low, "high": high},
            lambda i: ZBox(low, high) if i == 0 else AlphaBeta(1.0, 0.0, zero_bias=True),
        ),
    }[name]


def _zennit(
    model: nn.Module,
    first: nn.Module,
    x: torch.Tensor,
    rule: Callable[[int], LayerRule],
) -> np.ndarray:
    from zennit.attribution import Gradient
    from zennit.core import Composite
    from zennit.layer import Sum
    from zennit.rules import Norm
    from zennit.torchvision import ResNetCanonizer

    def mapping(ctx: dict, name: str, module: nn.Module) -> object:
        if isinstance(module, nn.Conv2d | nn.Linear):
            return rule(0 if module is first else 1).zennit()
        return Norm() if isinstance(module, Sum | nn.AdaptiveAvgPool2d) else None

    composite = Composite(module_map=mapping, canonizers=[ResNetCanonizer()])
    classes = torch.as_tensor(CLASSES)[:, None]
    with Gradient(model=model, composite=composite) as attributor:
        _, relevance = attributor(
            x.clone().requires_grad_(True),
            lambda out: torch.zeros_like(out).scatter_(1, classes, 1.0) * out.detach(),
        )
    return relevance.detach().numpy()


def _ours(name: str, model: nn.Module, x: torch.Tensor, params: dict[str, float]) -> np.ndarray:
    ctx = context(model, x[:1], params=params)
    return get_method(name).attribute(ctx, x.numpy(), np.zeros_like(x.numpy()), CLASSES)


# LRP-epsilon with epsilon 1e-6 divides by pre-activations near zero, where the exporter's folded
# batch norms and Zennit's merged ones differ by float32 rounding: a looser bound there.
TOLERANCE = {"lrp_epsilon": 1e-3, "lrp_alpha_beta": 2e-4, "deep_taylor": 2e-4}


# (model, its first layer's attribute): a residual network; a concatenation, which hands each part
# its slice; a channel split and shuffle (Slice or Split, Transpose, Reshape), through which the
# gradient routes relevance to where each value came from.
ZENNIT_CASES: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "resnet": (small_resnet, "conv1"),
    "concatenation": (concatenated_block, "stem"),
    "channel_shuffle": (shuffled_unit, "stem"),
}


@pytest.mark.parametrize("case", sorted(ZENNIT_CASES))
@pytest.mark.parametrize("name", sorted(TOLERANCE))
def test_equals_zennit_on_the_torch_model(name: str, case: str) -> None:
    build, first = ZENNIT_CASES[case]
    model, x = build(), _inputs()
    params, rule = _rules(name, x)
    ours = _ours(name, model, x, params)
    reference = copy.deepcopy(model)
    want = _zennit(reference, getattr(reference, first), x, rule)
    assert np.abs(ours - want).max() <= TOLERANCE[name] * np.abs(want).max()


def test_deep_taylor_conserves_the_score_through_residual_sums() -> None:
    model, x = small_resnet(), _inputs()
    params, _ = _rules("deep_taylor", x)
    relevance = _ours("deep_taylor", model, x, params)
    with torch.no_grad():
        scores = model(x).numpy()[np.arange(3), CLASSES]
    np.testing.assert_allclose(relevance.reshape(3, -1).sum(axis=1), scores, rtol=1e-4)


class _Batched(nn.Module):
    """DenseNet's first layer, a concatenation of one tensor, then an activation with no rule."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, padding=1)
        self.norm = nn.Softplus()
        self.head = nn.Linear(2 * 32 * 32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(torch.cat([torch.relu(self.conv(x))], dim=1)).flatten(1))


def test_what_has_no_rule_is_refused() -> None:
    """A concatenation of one tensor passes; the refusal names the operator after it."""
    x = torch.randn(2, 3, 32, 32)
    with pytest.raises(NotApplicable, match=r"operator Softplus .* has no LRP rule"):
        get_method("lrp_epsilon").attribute(
            context(_Batched().eval(), x), x.numpy(), np.zeros_like(x.numpy()), np.zeros(2, np.int64)
        )


# A sum as the model's output (MONAI's residual units end its UNet with conv(x) + conv1x1(x)): the
# proportional rule splits the output's relevance there, as Zennit's Sum layer with the Norm rule does.
TWO_HEADS_X = torch.randn(4, 6, generator=torch.Generator().manual_seed(41))
TWO_HEADS_CLASSES = np.array([0, 1, 2, 1])


class _TwoHeads(nn.Module):
    """relu(L0 x), then L1 h + L2 h as the output."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(42)
        self.stem, self.left, self.right = nn.Linear(6, 10), nn.Linear(10, 3), nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        return self.left(h) + self.right(h)


TWO_HEADS_REFERENCES = {
    "lrp_epsilon": ({}, lambda ls, x, c: lrp_epsilon_ref(ls, x, c, STAB)),
    "lrp_alpha_beta": ({}, lambda ls, x, c: alpha_beta_ref(ls, x, c, 2.0, 1.0)),
    "deep_taylor": ({"low": -4.0, "high": 4.0}, lambda ls, x, c: deep_taylor_ref(ls, x, c, -4.0, 4.0)),
}


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize("name", sorted(TWO_HEADS_REFERENCES))
def test_a_sum_at_the_output_hands_each_branch_its_share(name: str, dynamo: bool) -> None:
    """Relevance is linear in the output's: the branched pass is the sum of each branch's chain, whose
    output relevance is its own summand's value, its share z_i / z of the output's."""
    params, reference = TWO_HEADS_REFERENCES[name]
    model, x = _TwoHeads().eval(), TWO_HEADS_X
    got = get_method(name).attribute(
        context(model, x[:2], params=params, dynamo=dynamo), x.numpy(), np.zeros((4, 6)), TWO_HEADS_CLASSES
    )
    chains = [
        dense_layers(nn.Sequential(model.stem, nn.ReLU(), head), (6,)) for head in (model.left, model.right)
    ]
    flat = x.numpy().astype(np.float64)
    want = np.stack(
        [sum(reference(layers, flat[k], int(TWO_HEADS_CLASSES[k])) for layers in chains) for k in range(4)]
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class _ZennitResidual(nn.Module):
    """residual_mlp's twin for Zennit: its sum a Zennit Sum layer over the stacked summands."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        from zennit.layer import Sum

        self.a, self.sum = model.a, Sum()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sum(torch.stack([x, torch.relu(self.a(x))], dim=-1))


@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta"])
def test_an_identity_summand_at_the_output_keeps_its_share(name: str) -> None:
    """x + relu(Linear(x)) as the output: the input keeps its own share of the output's relevance."""
    from zennit.attribution import Gradient
    from zennit.core import Composite
    from zennit.layer import Sum
    from zennit.rules import Norm

    model = residual_mlp(3).eval()
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(43))
    classes = np.array([0, 1, 2, 3])
    got = get_method(name).attribute(context(model, x), x.numpy(), np.zeros((4, 4)), classes)
    rule = Epsilon(1e-6) if name == "lrp_epsilon" else AlphaBeta(2.0, 1.0)

    def mapping(ctx: dict, module_name: str, module: nn.Module) -> object:
        if isinstance(module, nn.Linear):
            return rule.zennit()
        return Norm() if isinstance(module, Sum) else None

    seed = torch.as_tensor(classes)[:, None]
    with Gradient(model=_ZennitResidual(model), composite=Composite(module_map=mapping)) as attributor:
        _, want = attributor(
            x.clone().requires_grad_(True),
            lambda out: torch.zeros_like(out).scatter_(1, seed, 1.0) * out.detach(),
        )
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-6)
