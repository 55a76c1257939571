"""LeakyReLU, PReLU and instance norms in the rule methods (workers/methods/_fx_plan.py).

MONAI's U-Nets, the medical segmentation models most often trained today, use them by default
(UNet: instance norm and PReLU; BasicUNet: instance norm and LeakyReLU), and every rule method
refused them by name. LeakyReLU and PReLU are x times 1 or their slope: LRP passes relevance through
them unchanged (Zennit's Pass, which for a piecewise-linear activation is its gradient), DeepLIFT
takes their Rescale multiplier, RevealCancel its rule with f = the activation. An instance norm on
its input's own statistics is LRP's held norm (Ali et al. 2022), as a layer norm is, per channel over
the axes after it; DeepLIFT and RevealCancel have no rule for it (Captum's gradient, a refusal)."""

from __future__ import annotations

import copy
import gc
import weakref

import numpy as np
import pytest
import torch
from torch import nn
from zennit.core import Hook
from zennit.rules import Norm, Pass

from tests.unit.methods._context import context, dense_layers
from tests.unit.methods._zennit_reference import assert_equals_zennit, lrp_cases, zennit_relevance
from tests.unit.methods.test_lrp import STAB, alpha_beta_ref, deep_taylor_ref, lrp_epsilon_ref
from tests.unit.methods.test_relu6 import rescale_ref
from tests.unit.methods.test_revealcancel import revealcancel_ref
from workers.methods import get_method
from workers.methods._fx_plan import family_plan, held_constant
from workers.methods._rescale_graph import RescaleGraph
from xaudit.contract.errors import NotApplicable

SLOPE = 0.2
X = torch.randn(4, 6, generator=torch.Generator().manual_seed(21)) * 2
CLASSES = np.array([0, 1, 2, 1])


def _leaky(z: np.ndarray) -> np.ndarray:
    return np.where(z > 0, z, SLOPE * z)


def _leaky_slope(z: np.ndarray) -> np.ndarray:
    return np.where(z > 0, 1.0, SLOPE)


def _leaky_mlp() -> nn.Sequential:
    """A LeakyReLU and a PReLU of the same slope: the references take one activation."""
    torch.manual_seed(22)
    return nn.Sequential(
        nn.Linear(6, 10), nn.LeakyReLU(SLOPE), nn.Linear(10, 8), nn.PReLU(init=SLOPE), nn.Linear(8, 3)
    ).eval()


def _twin() -> nn.Sequential:
    """The same layers with ReLUs: dense_layers flags each activation's layer."""
    twin = copy.deepcopy(_leaky_mlp())
    twin[1], twin[3] = nn.ReLU(), nn.ReLU()
    return twin


REFERENCES = {
    "lrp_epsilon": ({}, lambda ls, x, c: lrp_epsilon_ref(ls, x, c, STAB, activation=_leaky)),
    "lrp_alpha_beta": ({}, lambda ls, x, c: alpha_beta_ref(ls, x, c, 2.0, 1.0, activation=_leaky)),
    "deep_taylor": (
        {"low": -8.0, "high": 8.0},
        lambda ls, x, c: deep_taylor_ref(ls, x, c, -8.0, 8.0, activation=_leaky),
    ),
}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_lrp_passes_relevance_through_leaky_activations(name: str) -> None:
    params, reference = REFERENCES[name]
    got = get_method(name).attribute(
        context(_leaky_mlp(), X, params=params), X.numpy(), np.zeros((4, 6)), CLASSES
    )
    layers = dense_layers(_twin(), (6,))
    flat = X.numpy().astype(np.float64)
    want = np.stack([reference(layers, flat[k], int(CLASSES[k])) for k in range(4)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_deeplift_takes_the_rescale_multiplier_of_leaky_activations() -> None:
    x0 = X.flip(0) * 0.5
    ctx = context(_leaky_mlp(), X)
    assert RescaleGraph.build(ctx.model.torch_hookable("deeplift_rescale"), "deeplift_rescale") is not None
    got = get_method("deeplift_rescale").attribute(ctx, X.numpy(), x0.numpy(), CLASSES)
    layers = dense_layers(_twin(), (6,))
    flat, flat0 = X.numpy().astype(np.float64), x0.numpy().astype(np.float64)
    want = np.stack(
        [rescale_ref(layers, flat[k], flat0[k], int(CLASSES[k]), _leaky, _leaky_slope) for k in range(4)]
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_revealcancel_takes_its_rule_with_the_leaky_activation() -> None:
    x0 = X.flip(0) * 0.5
    got = get_method("deeplift_revealcancel").attribute(
        context(_leaky_mlp(), X), X.numpy(), x0.numpy(), CLASSES
    )
    layers = dense_layers(_twin(), (6,))
    flat, flat0 = X.numpy().astype(np.float64), x0.numpy().astype(np.float64)

    def leaky(v: float) -> float:
        return v if v > 0 else SLOPE * v

    want = np.stack([revealcancel_ref(layers, flat[k], flat0[k], int(CLASSES[k]), leaky) for k in range(4)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class _HeldInstanceNorm(nn.Module):
    """The twin's instance norm: its scale 1 / std detached, so that Zennit's Norm rule on it is the
    held-norm rule."""

    def __init__(self, norm: nn.InstanceNorm2d) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        centred = z - z.mean((2, 3), keepdim=True)
        scale = torch.rsqrt(centred.square().mean((2, 3), keepdim=True) + self.norm.eps).detach()
        return centred * scale * self.norm.weight[:, None, None] + self.norm.bias[:, None, None]


def _unet_block() -> nn.Sequential:
    """MONAI's U-Net layers in small: convolution, instance norm (affine), PReLU per channel, LeakyReLU."""
    torch.manual_seed(23)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.InstanceNorm2d(4, affine=True),
        nn.PReLU(4, init=0.25),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.InstanceNorm2d(4, affine=True),
        nn.LeakyReLU(0.1),
        nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(64, 3),
    )
    with torch.no_grad():
        for norm in (model[1], model[4]):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.3, 0.3)
        model[2].weight.uniform_(0.05, 0.4)
    return model.eval()


def _zennit_block(model: nn.Sequential, rules: list, x: torch.Tensor, classes: np.ndarray) -> np.ndarray:
    twin = copy.deepcopy(model)
    twin[1], twin[4] = _HeldInstanceNorm(twin[1]), _HeldInstanceNorm(twin[4])
    hooks = {id(layer): rule for layer, rule in zip((twin[0], twin[3], twin[8]), rules, strict=True)}

    def mapping(ctx: dict, name: str, module: nn.Module) -> Hook | None:
        if id(module) in hooks:
            return hooks[id(module)].zennit()
        if isinstance(module, _HeldInstanceNorm):
            return Norm(stabilizer=1e-12)  # the pass takes the held norm's exact gradient (LRP-0)
        if isinstance(module, nn.AvgPool2d):
            return Norm()
        if isinstance(module, nn.PReLU | nn.LeakyReLU):
            return Pass()
        return None

    return zennit_relevance(twin, mapping, x, classes)


BLOCK_X = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(24))


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize("name", sorted(lrp_cases(3)))
def test_lrp_holds_instance_norms_as_layer_norms(name: str, dynamo: bool) -> None:
    model = _unet_block()
    ctx = context(model, BLOCK_X[:1], params=lrp_cases(3)[name][0], dynamo=dynamo)
    assert_equals_zennit(
        name, ctx, BLOCK_X, lambda rules, classes: _zennit_block(model, rules, BLOCK_X, classes), 3, 1e-4
    )


def test_the_report_names_the_held_instance_norms_and_the_other_families_refuse_them() -> None:
    ctx = context(_unet_block(), BLOCK_X[:1])
    graph = ctx.model.torch_hookable("lrp_epsilon")
    assert "instance norms' scales" in held_constant(graph, "lrp_epsilon")
    assert "layer norms" not in held_constant(graph, "lrp_epsilon")
    with pytest.raises(NotApplicable, match="InstanceNorm2d"):
        get_method("deeplift_revealcancel").attribute(
            ctx, BLOCK_X.numpy(), np.zeros_like(BLOCK_X.numpy()), np.zeros(4, int)
        )


def test_an_instance_norm_with_running_statistics_is_not_held() -> None:
    """In eval mode it is a fixed per-channel scale, not a normalisation of its input: not a norm.
    (The exporters write it as a BatchNormalization; a traced graph keeps the module.)"""
    model = _unet_block()
    model[1] = nn.InstanceNorm2d(4, affine=True, track_running_stats=True).eval()
    with pytest.raises(NotApplicable, match="InstanceNorm2d"):
        family_plan(torch.fx.symbolic_trace(model), "lrp_epsilon", "LRP")
    assert family_plan(torch.fx.symbolic_trace(_unet_block()), "lrp_epsilon", "LRP") is not None


def test_a_bound_slope_does_not_keep_its_model_alive() -> None:
    """The cache of bound PReLUs is keyed by onnx2torch's module: a value that held the module would
    keep each model's PReLU modules and slopes alive for the worker's life."""
    ctx = context(_leaky_mlp(), X)
    graph = ctx.model.torch_hookable("lrp_epsilon")
    family_plan(graph, "lrp_epsilon", "LRP")
    prelu = weakref.ref(next(m for m in graph.modules() if type(m).__name__ == "OnnxPReLU"))
    assert prelu() is not None
    del ctx, graph
    gc.collect()
    assert prelu() is None
