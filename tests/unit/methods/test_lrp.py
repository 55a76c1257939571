"""LRP-epsilon, LRP-alpha-beta and Deep Taylor against slow re-implementations from the papers.

Each reference walks one sample through dense layers (a convolution is its dense matrix) with
explicit per-unit loops, exactly as the rules are written in Bach et al. 2015 (eqs. 58, 60) and
Montavon et al. 2017 (z+ and z-beta rules). Zennit's stabiliser (add 1e-6 with the sign of the
denominator, +1 at zero) is reproduced so that agreement can be demanded to 1e-5.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from tests.models import CNN_SHAPE, MLP_FEATURES, relu_cnn, relu_mlp, sigmoid_mlp
from tests.unit.methods._context import Dense, context, dense_layers
from workers.methods import get_method
from xaudit.contract.errors import InvalidInput, NotApplicable

STAB = 1e-6


def _stab(z: float, eps: float = STAB) -> float:
    return z + eps * (1.0 if z >= 0 else -1.0)


Activation = Callable[[np.ndarray], np.ndarray]


def _forward(
    layers: list[Dense], x: np.ndarray, cap: float = np.inf, activation: Activation | None = None
) -> list[np.ndarray]:
    """Inputs of every layer, then the output; ``cap``: the activation is a ReLU clamped there (6:
    ReLU6); ``activation``: another one (LeakyReLU). Relevance passes the activations unchanged
    (Bach et al.: it is defined on the layers)."""
    acts = [x]
    for w, b, relu in layers:
        z = acts[-1] @ w + b
        f = activation or (lambda z: np.minimum(np.maximum(z, 0.0), cap))
        acts.append(f(z) if relu else z)
    return acts


def _output_relevance(out: np.ndarray, c: int) -> np.ndarray:
    r = np.zeros_like(out)
    r[c] = out[c]
    return r


def lrp_epsilon_ref(
    layers: list[Dense],
    x: np.ndarray,
    c: int,
    eps: float,
    cap: float = np.inf,
    activation: Activation | None = None,
) -> np.ndarray:
    acts = _forward(layers, x, cap, activation)
    r = _output_relevance(acts[-1], c)
    for (w, b, _), a in zip(reversed(layers), reversed(acts[:-1]), strict=True):
        r_in = np.zeros(len(a))
        for j in range(w.shape[1]):
            z_j = sum(a[i] * w[i, j] for i in range(len(a))) + b[j]
            for i in range(len(a)):
                r_in[i] += a[i] * w[i, j] / _stab(z_j, eps) * r[j]
        r = r_in
    return r


def alpha_beta_ref(
    layers: list[Dense],
    x: np.ndarray,
    c: int,
    alpha: float,
    beta: float,
    cap: float = np.inf,
    activation: Activation | None = None,
) -> np.ndarray:
    acts = _forward(layers, x, cap, activation)
    r = _output_relevance(acts[-1], c)
    for (w, b, _), a in zip(reversed(layers), reversed(acts[:-1]), strict=True):
        r_in = np.zeros(len(a))
        for j in range(w.shape[1]):
            z = [a[i] * w[i, j] for i in range(len(a))]
            z_pos = sum(max(v, 0.0) for v in z) + max(b[j], 0.0)
            z_neg = sum(min(v, 0.0) for v in z) + min(b[j], 0.0)
            for i in range(len(a)):
                r_in[i] += (alpha * max(z[i], 0.0) / _stab(z_pos) - beta * min(z[i], 0.0) / _stab(z_neg)) * r[
                    j
                ]
        r = r_in
    return r


def deep_taylor_ref(
    layers: list[Dense],
    x: np.ndarray,
    c: int,
    low: float | np.ndarray,
    high: float | np.ndarray,
    cap: float = np.inf,
    activation: Activation | None = None,
) -> np.ndarray:
    """Montavon et al. 2017: z-beta at the first layer for inputs in [low, high] (floats, or one bound
    per input position), z+ above."""
    acts = _forward(layers, x, cap, activation)
    lows, highs = np.broadcast_to(low, x.shape), np.broadcast_to(high, x.shape)
    r = _output_relevance(acts[-1], c)
    pairs = list(zip(layers, acts[:-1], strict=True))
    for depth in reversed(range(len(pairs))):
        (w, _, _), a = pairs[depth]
        r_in = np.zeros(len(a))
        for j in range(w.shape[1]):
            if depth == 0:  # z-beta: x_i w_ij - l_i w_ij^+ - h_i w_ij^-
                z = [
                    a[i] * w[i, j] - lows[i] * max(w[i, j], 0.0) - highs[i] * min(w[i, j], 0.0)
                    for i in range(len(a))
                ]
            else:  # z+: the positive terms, x_i w_ij^+ after a ReLU (x_i >= 0), also x_i w_ij^- after a
                # LeakyReLU (Zennit's ZPlus), biases ignored
                z = [max(a[i] * w[i, j], 0.0) for i in range(len(a))]
            total = _stab(sum(z))
            for i in range(len(a)):
                r_in[i] += z[i] / total * r[j]
        r = r_in
    return r


def _case(kind: str, seed: int) -> tuple[torch.nn.Sequential, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + seed)
    if kind == "mlp":
        return relu_mlp(seed), torch.randn(3, MLP_FEATURES, generator=gen)
    return relu_cnn(seed), torch.randn(3, *CNN_SHAPE, generator=gen)


def _compare(name: str, kind: str, params: dict, reference) -> None:
    model, x = _case(kind, seed=1)
    ctx = context(model, x, params=params)
    classes = np.array([0, 1, 2])
    refs = np.zeros_like(x.numpy())
    got = get_method(name).attribute(ctx, x.numpy(), refs, classes)
    assert got.shape == x.shape and got.dtype == np.float32
    layers = dense_layers(model, tuple(x.shape[1:]))
    flat = x.numpy().reshape(len(x), -1).astype(np.float64)
    want = np.stack([reference(layers, flat[k], int(classes[k])) for k in range(len(x))])
    np.testing.assert_allclose(got.reshape(len(x), -1), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("epsilon", [1e-6, 0.25])
def test_lrp_epsilon_matches_bach_2015(kind: str, epsilon: float) -> None:
    _compare("lrp_epsilon", kind, {"epsilon": epsilon}, lambda ls, x, c: lrp_epsilon_ref(ls, x, c, epsilon))


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize(("alpha", "beta"), [(2.0, 1.0), (1.0, 0.0)])
def test_lrp_alpha_beta_matches_bach_2015(kind: str, alpha: float, beta: float) -> None:
    params = {"alpha": alpha, "beta": beta}
    _compare("lrp_alpha_beta", kind, params, lambda ls, x, c: alpha_beta_ref(ls, x, c, alpha, beta))


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_deep_taylor_matches_montavon_2017(kind: str) -> None:
    params = {"low": -3.0, "high": 2.5}
    _compare("deep_taylor", kind, params, lambda ls, x, c: deep_taylor_ref(ls, x, c, -3.0, 2.5))


def test_deep_taylor_default_bounds_are_the_range_of_inputs_and_references() -> None:
    model, x = _case("mlp", seed=2)
    refs = np.full_like(x.numpy(), 5.0)  # the references widen the upper bound
    classes = np.array([0, 1, 2])
    got = get_method("deep_taylor").attribute(context(model, x), x.numpy(), refs, classes)
    low, high = float(x.min()), 5.0
    layers = dense_layers(model, (MLP_FEATURES,))
    want = np.stack(
        [deep_taylor_ref(layers, x.numpy()[k].astype(np.float64), k, low, high) for k in range(3)]
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_deep_taylor_conserves_the_target_score() -> None:
    # z+ without biases and z-beta are both conservative: relevance sums to the logit.
    model, x = _case("cnn", seed=3)
    classes = np.array([2, 0, 1])
    got = get_method("deep_taylor").attribute(context(model, x), x.numpy(), np.zeros_like(x.numpy()), classes)
    logits = model(x).detach().numpy()[np.arange(3), classes]
    np.testing.assert_allclose(got.reshape(3, -1).sum(1), logits, rtol=1e-4, atol=1e-5)


def test_lrp_epsilon_without_biases_is_gradient_times_input() -> None:
    # Ancona et al. 2018: LRP-0 on a bias-free ReLU net equals Gradient x Input and sums to the logit.
    model, x = _case("mlp", seed=4)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.zeros_(layer.bias)
    classes = np.array([1, 1, 0])
    got = get_method("lrp_epsilon").attribute(context(model, x), x.numpy(), np.zeros_like(x.numpy()), classes)
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(xg)[np.arange(3), classes].sum(), xg)
    np.testing.assert_allclose(got, (grad * x).numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got.sum(1), model(x).detach().numpy()[np.arange(3), classes], rtol=1e-4)


def test_alpha_beta_rejects_non_conservative_parameters() -> None:
    model, x = _case("mlp", seed=0)
    ctx = context(model, x, params={"alpha": 2.0, "beta": 2.0})
    with pytest.raises(InvalidInput, match="alpha - beta = 1"):
        get_method("lrp_alpha_beta").attribute(
            ctx, x.numpy(), np.zeros_like(x.numpy()), np.zeros(3, np.int64)
        )


def test_capabilities_are_declared() -> None:
    for name in ("lrp_epsilon", "lrp_alpha_beta", "deep_taylor"):
        caps = get_method(name).capabilities
        assert caps.hooks and caps.gradients and caps.baseline == "none" and not caps.stochastic


def test_chunked_rows_give_the_same_relevance(monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.methods._passes as module

    model, x = _case("cnn", seed=5)
    ctx = context(model, x)
    classes, refs = np.array([0, 1, 2]), np.zeros_like(x.numpy())
    whole = get_method("lrp_alpha_beta").attribute(ctx, x.numpy(), refs, classes)
    monkeypatch.setattr(module, "CHUNK", 2)
    # Float32 rounding only: the convolution's kernel may differ with the batch size (a few ulps).
    np.testing.assert_allclose(
        get_method("lrp_alpha_beta").attribute(ctx, x.numpy(), refs, classes), whole, rtol=1e-5, atol=1e-6
    )


def test_average_pooling_gets_lrp_0() -> None:
    # Zennit's Norm rule on the pool: LRP-0, i.e. the epsilon reference with its 1e-6 stabiliser.
    torch.manual_seed(6)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 2, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 3),
    ).eval()
    x = torch.randn(3, *CNN_SHAPE, generator=torch.Generator().manual_seed(7))
    classes = np.array([0, 1, 2])
    got = get_method("lrp_epsilon").attribute(context(model, x), x.numpy(), np.zeros_like(x.numpy()), classes)
    layers = dense_layers(model, CNN_SHAPE)
    flat = x.numpy().reshape(3, -1).astype(np.float64)
    want = np.stack([lrp_epsilon_ref(layers, flat[k], int(classes[k]), STAB) for k in range(3)])
    np.testing.assert_allclose(got.reshape(3, -1), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta", "deep_taylor"])
@pytest.mark.parametrize(("model", "operator"), [(sigmoid_mlp(), "Sigmoid")])
def test_operators_without_a_rule_are_refused(name: str, model: torch.nn.Module, operator: str) -> None:
    # Zennit alone would pass the gradient through them and return a number that is not LRP.
    # (Residual sums have a rule: tests/unit/methods/test_lrp_residual.py.)
    x = torch.randn(2, 4)
    with pytest.raises(NotApplicable, match=f"operator .*{operator}.* has no LRP rule") as info:
        get_method(name).attribute(
            context(model.eval(), x), x.numpy(), np.zeros_like(x.numpy()), np.zeros(2, np.int64)
        )
    assert info.value.method == name


@pytest.mark.parametrize("nonneg", [True, False])
def test_alpha_beta_keeps_its_blocks_as_views_of_one_stacked_weight(nonneg: bool) -> None:
    """The per-block weights are views of the stacked one: copies beside it held another 0.8 GB for
    VGG's 102M-weight Linear for as long as the model lived."""
    from workers.methods._lrp_rules import AlphaBeta

    layer = torch.nn.Conv2d(3, 4, 3)
    blocks = AlphaBeta()._blocks(layer, nonneg)
    assert blocks.weight is not None
    stacked = blocks.weight.untyped_storage().data_ptr()
    assert all(part.untyped_storage().data_ptr() == stacked for row in blocks.rows for part in row)
    w = layer.weight.detach()
    up, down = w.clamp(min=0), w.clamp(max=0)
    want = [[up], [down]] if nonneg else [[up, down], [down, up]]
    assert [
        [torch.equal(p, q) for p, q in zip(r, s, strict=True)] for r, s in zip(blocks.rows, want, strict=True)
    ] == [[True] * len(s) for s in want]
