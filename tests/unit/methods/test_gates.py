"""Multiplicative gates in LRP: EfficientNet's SiLU (x * sigmoid(x), two ONNX nodes), Hardswish, and
the squeeze-and-excitation blocks of EfficientNet and MobileNetV3 (x * sigmoid(branch(x))).

The rule holds the gate constant (docs/science.md 5.8): the product passes all of its relevance to
the activation it gates, none to the gate's branch; on SiLU and Hardswish that is Zennit's Pass. The
reference is Zennit's own hooks on a twin of the model whose gates are detached in its forward pass
and whose products get Zennit's Pass (Zennit itself has no rule for a product and would take the
product rule of the gradient, which is not conservative), and on a bias-free model relevance must
add up to the explained score, which the product rule breaks."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn
from zennit.core import Hook
from zennit.rules import Norm, Pass

from tests.models import to_onnx
from tests.unit.methods._context import pooled_cnn
from tests.unit.methods._zennit_reference import assert_equals_zennit, lrp_cases, zennit_relevance
from workers.methods import AttributionContext, get_method
from workers.methods import _modified_backward as modified_backward
from workers.methods._lrp_rules import LayerRule
from workers.models import load_model
from workers.players import parse_players
from workers.targets import Target

SHAPE = (3, 8, 8)
X = torch.randn(4, *SHAPE, generator=torch.Generator().manual_seed(5))


class _Product(nn.Module):
    """The reference twin's product: ``x`` times a gate set just before the call, so that the
    product is a module of one input a Zennit rule can hook (its Pass: relevance unchanged)."""

    gate: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate


class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int, gate: nn.Module, bias: bool) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.down = nn.Conv2d(channels, channels // 2, 1, bias=bias)
        self.relu = nn.ReLU()
        self.up = nn.Conv2d(channels // 2, channels, 1, bias=bias)
        self.gate = gate
        self.detached = False  # the reference twin: the gate as a constant
        self.product = _Product()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate(self.up(self.relu(self.down(self.pool(x)))))
        if not self.detached:
            return x * gate
        self.product.gate = gate.detach()
        return self.product(x)


def _gated_net(bias: bool = True) -> nn.Sequential:
    """``bias=False``: none in the convolutions and a zero one in the Linear layer (without one, it
    is exported as a MatMul)."""
    torch.manual_seed(3)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=bias),
        nn.SiLU(),
        _SqueezeExcite(8, nn.Sigmoid(), bias),
        nn.Conv2d(8, 8, 3, padding=1, bias=bias),
        nn.Hardswish(),
        _SqueezeExcite(8, nn.Hardsigmoid(), bias),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 3),
    ).eval()
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, nn.Conv2d | nn.Linear):
                layer.weight.mul_(3.0)  # scores of order 1, gates away from 0 and 1
        if not bias:
            model[8].bias.zero_()
    return model


def _context(model: nn.Module, params: dict, dynamo: bool = False) -> AttributionContext:
    loaded = load_model(to_onnx(model, X[:1], opset=18 if dynamo else 17, dynamo=dynamo), "onnx", "cpu")
    loaded.check_sample(X.numpy())
    return AttributionContext(loaded, parse_players("grid:2x2", SHAPE), Target(), params)


def _zennit(model: nn.Sequential, rules: list[LayerRule], x: torch.Tensor, classes: np.ndarray) -> np.ndarray:
    """Zennit's relevance with our rules' hooks on the main path's Conv/Linear layers (the gates'
    branches get none: no gradient reaches them), Norm on the last pooling, Pass on SiLU and
    Hardswish, on a twin whose gates are detached."""
    twin = copy.deepcopy(model)
    for module in twin.modules():
        if isinstance(module, _SqueezeExcite):
            module.detached = True
    hooks = {id(layer): rule for layer, rule in zip([twin[0], twin[3], twin[8]], rules, strict=True)}

    def mapping(ctx: dict, name: str, module: nn.Module) -> Hook | None:
        if id(module) in hooks:
            return hooks[id(module)].zennit()
        if module is twin[6]:
            return Norm()
        return Pass() if isinstance(module, nn.SiLU | nn.Hardswish | _Product) else None

    return zennit_relevance(twin, mapping, x, classes)


CASES = lrp_cases(3)


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gated_network_equals_zennit_with_constant_gates(name: str, dynamo: bool) -> None:
    model = _gated_net()
    ctx = _context(model, CASES[name][0], dynamo)
    assert_equals_zennit(name, ctx, X, lambda rules, classes: _zennit(model, rules, X, classes), 3, 1e-5)


def test_relevance_adds_up_to_the_score_only_with_constant_gates(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _gated_net(bias=False)
    ctx = _context(model, {})
    x = X.numpy()
    scores = ctx.model.predict(x)
    classes = scores.argmax(1)
    explained = scores[np.arange(len(x)), classes]
    relevance = get_method("lrp_epsilon").attribute(ctx, x, np.zeros_like(x), classes)
    np.testing.assert_allclose(relevance.reshape(len(x), -1).sum(1), explained, rtol=1e-4)
    # The product rule (the gate's gradient kept) hands relevance to the gate's branch, which never
    # reaches the input: the sum no longer matches.
    evaluate = modified_backward.evaluate
    monkeypatch.setattr(
        modified_backward, "evaluate", lambda plan, x, replace, held: evaluate(plan, x, replace)
    )
    product = get_method("lrp_epsilon").attribute(ctx, x, np.zeros_like(x), classes)
    assert np.abs(product.reshape(len(x), -1).sum(1) - explained).max() > 1e-2 * np.abs(explained).max()


def test_the_report_says_the_gates_are_held_constant() -> None:
    said = get_method("lrp_epsilon").implementation(_context(_gated_net(), {}).model)
    assert said is not None and said.endswith(
        "held constant (Ali et al. 2022, Arras et al. 2017): sigmoid gates"
    )


class _WrittenHardSigmoid(nn.Module):
    """A hard sigmoid as Keras writes MobileNetV3's: relu6(z + 3) * (1 / 6), three operators."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return nn.functional.relu6(z + 3.0) * (1.0 / 6.0)


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta"])
def test_a_written_out_hard_sigmoid_is_a_gate(name: str, dynamo: bool) -> None:
    """Before, LRP refused the product with it; now the gate is held as HardSigmoid's is: the same
    relevance as the model with nn.Hardsigmoid, and the report names it."""
    model = _gated_net()
    written = copy.deepcopy(model)
    written[5].gate = _WrittenHardSigmoid()
    classes = np.array([0, 1, 2, 1])
    params = CASES[name][0]
    x = X.numpy()
    ctx = _context(written, params, dynamo)
    got = get_method(name).attribute(ctx, x, np.zeros_like(x), classes)
    want = get_method(name).attribute(_context(model, params, dynamo), x, np.zeros_like(x), classes)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
    said = get_method(name).implementation(ctx.model)
    assert said is not None and said.endswith(
        "held constant (Ali et al. 2022, Arras et al. 2017): sigmoid gates"
    )


class _LayerScaled(nn.Module):
    """A GELU's output times a constant per feature (a layer scale, as ConvNeXt and CaiT write it):
    ``fold`` puts the constant into the next layer's weight instead, the same function."""

    def __init__(self, fold: bool) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3)
        self.gamma = nn.Parameter(torch.rand(8) + 0.5)
        self.fold = fold
        if fold:
            with torch.no_grad():
                self.b.weight.mul_(self.gamma)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.a(x))
        return self.b(h) if self.fold else self.b(self.gamma * h)


def test_a_gelu_times_a_constant_is_no_gated_unit() -> None:
    """A gated linear unit's gate multiplies another activation; a GELU times a constant is an
    activation scaled, whose relevance goes on to the GELU (it was held as a gate while the gated
    units' rule was written, and the pass lost the relevance there)."""
    from tests.unit.methods._context import context

    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    got = [
        get_method("lrp_epsilon").attribute(
            context(_LayerScaled(fold).eval(), x[:1]),
            x.numpy(),
            np.zeros_like(x.numpy()),
            np.array([0, 1, 2, 0]),
        )
        for fold in (False, True)
    ]
    assert np.abs(got[1]).max() > 1e-2
    np.testing.assert_allclose(got[0], got[1], rtol=1e-5, atol=1e-6)


class _MixedExcite(nn.Module):
    """Squeeze-and-excitation whose softmax gate is mixed across channels by a constant matrix with
    negative entries before the product (as CaiT mixes its attention weights across heads): held as
    the gate is, but no longer non-negative, so the product of a ReLU's output with it is signed."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.down, self.up = nn.Conv2d(channels, channels // 2, 1), nn.Conv2d(channels // 2, channels, 1)
        self.mix = nn.Parameter(torch.eye(channels) - 0.6 * torch.rand(channels, channels))
        self.detached = False
        self.product = _Product()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.up(torch.relu(self.down(self.pool(x)))), dim=1)
        gate = (weights.permute(0, 2, 3, 1) @ self.mix).permute(0, 3, 1, 2)
        if not self.detached:
            return x * gate
        self.product.gate = gate.detach()
        return self.product(x)


def _detached_reference(model: nn.Sequential) -> Callable[[list[LayerRule], np.ndarray], np.ndarray]:
    """Zennit on a twin of a :func:`pooled_cnn` whose block's gate is detached: the rules on its
    three layers, Norm on the pooling, Pass on the block's product."""
    twin = copy.deepcopy(model)
    twin[2].detached = True
    hooks = [twin[0], twin[3], twin[7]]

    def reference(rules: list[LayerRule], classes: np.ndarray) -> np.ndarray:
        by_layer = {id(layer): rule for layer, rule in zip(hooks, rules, strict=True)}

        def mapping(ctx: dict, name: str, module: nn.Module) -> Hook | None:
            if id(module) in by_layer:
                return by_layer[id(module)].zennit()
            if module is twin[5]:
                return Norm()
            return Pass() if isinstance(module, _Product) else None

        return zennit_relevance(twin, mapping, X, classes)

    return reference


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_mixed_gate_makes_its_product_signed(name: str, dynamo: bool) -> None:
    """The product of a ReLU's output with a mixed gate can be negative: a pass that took it for
    non-negative (as it may after a sigmoid or softmax gate) would drop alpha-beta's and Deep
    Taylor's terms of its negative part in the next layer."""
    model = pooled_cnn(lambda: _MixedExcite(8), 3, seed=6)
    with torch.no_grad():
        assert (model[:3](X) < 0).any()  # the mixed gate does turn products negative
    ctx = _context(model, CASES[name][0], dynamo)
    assert_equals_zennit(name, ctx, X, _detached_reference(model), 3, 1e-5)


class _UpsampledGate(nn.Module):
    """GhostNetV2's DFC attention: a sigmoid gate computed at half the resolution and upsampled
    (nearest) before its product with the features; the gate held, moved by the upsampling."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.pool = nn.AvgPool2d(2)
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.detached = False
        self.product = _Product()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = nn.functional.interpolate(
            torch.sigmoid(self.conv(self.pool(x))), scale_factor=2.0, mode="nearest"
        )
        if not self.detached:
            return x * gate
        self.product.gate = gate.detach()
        return self.product(x)


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_an_upsampled_gate_is_held(name: str, dynamo: bool) -> None:
    model = pooled_cnn(lambda: _UpsampledGate(8), 3, seed=7)
    ctx = _context(model, CASES[name][0], dynamo)
    assert_equals_zennit(name, ctx, X, _detached_reference(model), 3, 1e-5)
