"""Transposed convolutions are affine layers for the rule methods (workers/methods/_transposed.py).

MONAI's UNet and AttentionUnet upsample with ConvTranspose (followed by a batch norm in
AttentionUnet), and LRP, Deep Taylor and RevealCancel refused both by name. A transposed
convolution keeps its weight as (in, out / groups, ...): the rules' stacked weights and the folded
batch norm must use its output axis, not the first. LRP's rules against Zennit's are in
test_modified_backward.py ("transposed"); here RevealCancel against the per-unit reference on the
layer's dense matrix, from both exporters, and the folded norm against its twin folded by hand."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from tests.unit.methods._context import context
from tests.unit.methods._moves import assert_revealcancel_equals_the_reference
from workers.methods import get_method

SHAPE = (1, 3, 3)


def _decoder(seed: int, norm: bool = False) -> nn.Sequential:
    """3x3 maps upsampled to 6x6 by a transposed convolution (and a batch norm), as a U-Net does."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1),
        nn.ReLU(),
        nn.ConvTranspose2d(3, 2, 2, stride=2),
        *([nn.BatchNorm2d(2)] if norm else []),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(72, 3),
    )
    with torch.no_grad():
        model[0].bias.uniform_(-0.3, 0.3)
        model[2].bias.uniform_(-0.3, 0.3)
        if norm:
            model[3].running_mean.uniform_(-0.2, 0.2)
            model[3].running_var.uniform_(0.5, 2.0)
            model[3].weight.uniform_(0.5, 1.5)
            model[3].weight[0] *= -1  # a negative scale flips that channel's weights' signs
            model[3].bias.uniform_(0.0, 0.3)  # most units active after the ReLU
    return model.eval()


def _folded(model: nn.Sequential) -> nn.Sequential:
    """``model`` with its batch norm folded into the transposed convolution by hand."""
    conv, norm = copy.deepcopy(model[2]), model[3]
    scale = norm.weight / torch.sqrt(norm.running_var + norm.eps)
    with torch.no_grad():
        conv.weight.mul_(scale.reshape(1, -1, 1, 1))  # (in, out, kh, kw): outputs on axis 1
        conv.bias.copy_((conv.bias - norm.running_mean) * scale + norm.bias)
    return nn.Sequential(model[0], model[1], conv, *model[4:]).eval()


def _rows(seed: int) -> torch.Tensor:
    return torch.randn(4, *SHAPE, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_revealcancel_equals_the_per_unit_reference(dynamo: bool) -> None:
    assert_revealcancel_equals_the_reference(_decoder(6), _decoder(6), SHAPE, dynamo)


@pytest.mark.parametrize("method", ["lrp_epsilon", "lrp_alpha_beta", "deep_taylor"])
def test_a_batch_norm_after_it_folds_along_its_output_axis(method: str) -> None:
    """The legacy exporter keeps the norm after a transposed convolution as its own node (it folds
    the ones after convolutions), and LRP folds it into the layer: the twin folded by hand must get
    the same relevance."""
    model, x = _decoder(7, norm=True), _rows(3)
    twin = _folded(model)
    torch.testing.assert_close(model(x), twin(x))
    classes = np.array([2, 0, 1, 1])
    attributions = [
        get_method(method).attribute(context(m, x[:1]), x.numpy(), np.zeros_like(x.numpy()), classes)
        for m in (model, twin)
    ]
    assert np.abs(attributions[1]).max() > 1e-3
    np.testing.assert_allclose(attributions[0], attributions[1], rtol=1e-4, atol=1e-6)
