"""ConvNeXt V2's global response normalisation holds its scale, as a layer norm does (docs/science.md 5.8).

GRN (timm's GlobalResponseNorm, in every ConvNeXt V2 block) computes ``x + beta + gamma * x * scale``
with ``scale = s / (mean(s over the channels) + eps)``, ``s`` each channel's L2 norm over the
positions. Both exporters write the scale as ReduceL2, ReduceMean, Add and Div, and LRP stopped at
the ReduceL2. Fused into one ``ResponseScale`` (workers/models/norm_fusion.py), the scale is held
as a norm's scale is: the product hands ``x`` all of its relevance, the scale's branch none.

The reference is Zennit's own hooks on a twin whose scale is detached in its forward pass: the
product is a module with Zennit's Pass, the per-channel scale and shift and the residual sum
modules with Norm (LRP-0, as the pass treats constants and sums of activations)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from timm.layers.grn import GlobalResponseNorm
from torch import nn
from zennit.core import Hook
from zennit.rules import Norm, Pass

from tests.unit.methods._context import context
from tests.unit.methods._zennit_reference import assert_equals_zennit, lrp_cases, zennit_relevance
from workers.methods._fx_plan import held_constant

X = torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(8))
CASES = lrp_cases(3)


class _Op(nn.Module):
    """One input, a function set before each call: an operation of the twin a Zennit rule hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.fn = lambda x: x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class _Response(GlobalResponseNorm):
    """timm's GRN (channels first); ``twin``: the reference's forward, the scale detached."""

    def __init__(self, channels: int) -> None:
        super().__init__(channels, channels_last=False)
        with torch.no_grad():
            self.weight.copy_(1 + torch.randn(channels))
            self.bias.copy_(0.2 * torch.randn(channels))
        self.twin = False
        self.product, self.affine, self.sum = _Op(), _Op(), _Op()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.twin:
            return super().forward(x)
        norm = x.norm(p=2, dim=self.spatial_dim, keepdim=True)
        scale = (norm / (norm.mean(dim=self.channel_dim, keepdim=True) + self.eps)).detach()
        self.product.fn = lambda z: z * scale
        weight, bias = self.weight.view(self.wb_shape), self.bias.view(self.wb_shape)
        self.affine.fn = lambda z: bias + weight * z
        self.sum.fn = lambda stacked: stacked.sum(-1)
        return self.sum(torch.stack([x, self.affine(self.product(x))], -1))


def _model() -> nn.Sequential:
    torch.manual_seed(9)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        _Response(8),
        nn.Conv2d(8, 8, 1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 3),
    ).eval()


def _zennit(model: nn.Sequential, rules: list, classes: np.ndarray) -> np.ndarray:
    twin = copy.deepcopy(model)
    response = twin[2]
    response.twin = True
    hooks = {id(layer): rule for layer, rule in zip([twin[0], twin[3], twin[7]], rules, strict=True)}

    def mapping(ctx: dict, name: str, module: nn.Module) -> Hook | None:
        if id(module) in hooks:
            return hooks[id(module)].zennit()
        if module is response.product:
            return Pass()
        if module is response.affine or module is response.sum:
            return Norm(stabilizer=1e-12)
        return Norm() if module is twin[5] else None

    return zennit_relevance(twin, mapping, X, classes)


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_global_response_norm_holds_its_scale(name: str, dynamo: bool) -> None:
    model = _model()
    ctx = context(model, X, params=CASES[name][0], dynamo=dynamo)
    assert_equals_zennit(name, ctx, X, lambda rules, classes: _zennit(model, rules, classes), 3, 1e-5)
    assert "response norms' scales" in held_constant(ctx.model.torch_hookable(name), name)
