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
from tests.unit.methods._context import context
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
    """DenseNet's first layer: a concatenation of one tensor, then a batch norm (no rule)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, padding=1)
        self.norm = nn.BatchNorm2d(2)
        self.head = nn.Linear(2 * 32 * 32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(torch.cat([torch.relu(self.conv(x))], dim=1)).flatten(1))


@pytest.mark.parametrize(
    ("model", "shape", "refusal"),
    [
        # x + relu(Linear(x)) as the output: the output's relevance would have no rule to split it.
        (residual_mlp, (4,), "'add' comes after the last Linear/Conv layer"),
        # a concatenation of one tensor passes; the refusal names the operator after it
        (_Batched, (3, 32, 32), r"operator BatchNorm2d .* has no LRP rule"),
    ],
)
def test_what_has_no_rule_is_refused(
    model: Callable[[], nn.Module], shape: tuple[int, ...], refusal: str
) -> None:
    x = torch.randn(2, *shape)
    with pytest.raises(NotApplicable, match=refusal):
        get_method("lrp_epsilon").attribute(
            context(model().eval(), x), x.numpy(), np.zeros_like(x.numpy()), np.zeros(2, np.int64)
        )
