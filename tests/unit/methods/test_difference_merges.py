"""A difference of two activations is a merge for LRP (workers/methods/_fx_plan.py).

PoolFormer's token mixer is ``pool(x) - x``, FastViT's RepMixer ``mixer(x) - norm(x)``: LRP refused
the ``Sub`` by name on both exporters' graphs. Its gradient hands the relevance of ``a - b`` to
``a`` and ``-b`` in the shares ``a / z`` and ``-b / z``, the proportional rule on ``a + (-b)``, so
``pool(x) - x`` passes relevance as the linear map ``P - I`` does by its gradient: LRP-epsilon must
equal the per-unit reference that composes that map into the layer after it. RevealCancel, which
would have to swap the subtrahend's parts, still refuses it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.unit.methods._context import context
from tests.unit.methods._moves import assert_lrp_epsilon_through_a_move, cnn_around
from workers.methods import get_method
from xaudit.contract.errors import NotApplicable

SHAPE = (1, 4, 4)


class _PoolMixer(nn.AvgPool2d):
    """PoolFormer's token mixer, ``pool(x) - x`` (an average pool that leaves padding out); as an
    AvgPool2d, the per-unit references read it as the linear map it is."""

    def __init__(self) -> None:
        super().__init__(3, 1, 1, count_include_pad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) - x


def _poolformer_like() -> nn.Sequential:
    return cnn_around(_PoolMixer(), 32, seed=8)


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_lrp_epsilon_splits_a_difference_as_the_proportional_rule(dynamo: bool) -> None:
    assert_lrp_epsilon_through_a_move(_poolformer_like(), _poolformer_like(), SHAPE, dynamo)


@pytest.mark.parametrize("name", ["lrp_alpha_beta", "deep_taylor"])
def test_the_other_lrp_rules_pass_it_too_and_revealcancel_refuses_it(name: str) -> None:
    x = torch.randn(2, *SHAPE, generator=torch.Generator().manual_seed(1))
    ctx = context(_poolformer_like(), x[:1])
    classes = np.array([0, 2])
    relevance = get_method(name).attribute(ctx, x.numpy(), np.zeros_like(x.numpy()), classes)
    assert relevance.shape == x.shape and np.isfinite(relevance).all() and np.abs(relevance).max() > 1e-3
    with pytest.raises(NotApplicable, match="Sub"):
        get_method("deeplift_revealcancel").attribute(ctx, x.numpy(), np.zeros_like(x.numpy()), classes)
