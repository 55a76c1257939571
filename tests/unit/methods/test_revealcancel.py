"""DeepLIFT RevealCancel: a per-unit reference written from Shrikumar et al. 2017, summation-to-delta,
a closed-form case where it differs from Rescale, and clear refusals of unsupported graphs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from tests.models import CNN_SHAPE, MLP_FEATURES, maxpool_cnn, relu_cnn, relu_mlp, sigmoid_mlp
from tests.unit.methods._context import Dense, context, dense_layers
from workers.methods import get_method
from workers.targets import Target
from xaudit.contract.errors import NotApplicable


def _relu(v: float) -> float:
    return max(v, 0.0)


def revealcancel_ref(
    layers: list[Dense], x: np.ndarray, x0: np.ndarray, c: int, f: Callable[[float], float] = _relu
) -> np.ndarray:
    """One sample, one unit at a time; ``f``: the activation after each layer flagged ReLU (ReLU6, say).

    Linear rule (3.5.1): a term w_ij * da_i counts towards dz_j+ when positive, towards dz_j- when
    negative. RevealCancel (3.5.3): dy+ = 1/2 (f(z0 + dz+) - f(z0)) + 1/2 (f(z0 + dz- + dz+) - f(z0 + dz-)),
    dy- symmetric, m+ = dy+/dz+, m- = dy-/dz-. Chain rule for multipliers (3.3): the multiplier of
    a_i through unit j is w_ij m+_j when w_ij da_i > 0 and w_ij m-_j when it is < 0; when da_i = 0
    it is w_ij (m+_j + m-_j) / 2 (the authors' code, Dense and Conv layers). A part that is absent
    (dz+ = 0 or dz- = 0) has multiplier 0.
    """
    acts, acts0, rules = [x], [x0], []
    for w, b, relu in layers:
        a, a0 = acts[-1], acts0[-1]
        n_in, n_out = w.shape
        z = [sum(a[i] * w[i, j] for i in range(n_in)) + b[j] for j in range(n_out)]
        z0 = [sum(a0[i] * w[i, j] for i in range(n_in)) + b[j] for j in range(n_out)]
        m_pos, m_neg = np.zeros(n_out), np.zeros(n_out)
        if relu:
            for j in range(n_out):
                terms = [w[i, j] * (a[i] - a0[i]) for i in range(n_in)]
                dp = sum(t for t in terms if t > 0)
                dn = sum(t for t in terms if t < 0)
                dy_p = 0.5 * (f(z0[j] + dp) - f(z0[j])) + 0.5 * (f(z0[j] + dn + dp) - f(z0[j] + dn))
                dy_n = 0.5 * (f(z0[j] + dn) - f(z0[j])) + 0.5 * (f(z0[j] + dp + dn) - f(z0[j] + dp))
                m_pos[j] = dy_p / dp if dp != 0 else 0.0
                m_neg[j] = dy_n / dn if dn != 0 else 0.0
        rules.append((m_pos, m_neg))
        acts.append(np.array([f(v) for v in z]) if relu else np.array(z))
        acts0.append(np.array([f(v) for v in z0]) if relu else np.array(z0))
    m_out = np.zeros(len(acts[-1]))
    m_out[c] = 1.0  # multiplier of the target logit
    for depth in reversed(range(len(layers))):
        w, _, relu = layers[depth]
        a, a0 = acts[depth], acts0[depth]
        m_pos, m_neg = rules[depth]
        m_in = np.zeros(w.shape[0])
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                if not relu:  # a linear layer alone: the multiplier is the weight
                    m_in[i] += w[i, j] * m_out[j]
                elif w[i, j] * (a[i] - a0[i]) > 0:
                    m_in[i] += w[i, j] * m_pos[j] * m_out[j]
                elif w[i, j] * (a[i] - a0[i]) < 0:
                    m_in[i] += w[i, j] * m_neg[j] * m_out[j]
                elif a[i] == a0[i]:  # no difference: the mean of both multipliers (zero-difference rule)
                    m_in[i] += w[i, j] * 0.5 * (m_pos[j] + m_neg[j]) * m_out[j]
        m_out = m_in
    return (x - x0) * m_out


def _batch(shape: tuple[int, ...], seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(4, *shape, generator=torch.Generator().manual_seed(seed))


def _attribute(
    ctx, x: torch.Tensor, x0: torch.Tensor, classes: np.ndarray, name: str = "deeplift_revealcancel"
):
    return get_method(name).attribute(ctx, x.numpy(), x0.numpy(), classes)


def _conv_flatten_relu(seed: int) -> nn.Sequential:
    """Conv -> Flatten -> ReLU: the ReLU's split comes from the convolution through a reshape."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, 2, 3, stride=2), nn.Flatten(), nn.ReLU(), nn.Linear(18, 3))
    with torch.no_grad():
        model[0].bias.uniform_(-0.5, 0.5)
    return model.eval()


REFERENCE_MODELS = {
    "mlp": (relu_mlp, (MLP_FEATURES,)),
    "cnn": (relu_cnn, CNN_SHAPE),
    "conv_flatten_relu": (_conv_flatten_relu, CNN_SHAPE),
}


@pytest.mark.parametrize("kind", sorted(REFERENCE_MODELS))
@pytest.mark.parametrize("reference", ["zeros", "random"])
def test_matches_per_unit_reference(kind: str, reference: str) -> None:
    builder, shape = REFERENCE_MODELS[kind]
    model = builder(11)
    x = _batch(shape, 1)
    x0 = torch.zeros_like(x) if reference == "zeros" else _batch(shape, 2, 0.5)
    classes = np.array([0, 1, 2, 1])
    got = _attribute(context(model, x), x, x0, classes)
    layers = dense_layers(model, shape)
    flat, flat0 = (t.numpy().reshape(4, -1).astype(np.float64) for t in (x, x0))
    want = np.stack([revealcancel_ref(layers, flat[k], flat0[k], int(classes[k])) for k in range(4)])
    np.testing.assert_allclose(got.reshape(4, -1), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
@pytest.mark.parametrize("builder", [relu_mlp, relu_cnn])
@pytest.mark.parametrize("reference", ["zeros", "random"])
def test_summation_to_delta(builder, fmt: str, reference: str) -> None:
    model = builder(seed=12)
    shape = (MLP_FEATURES,) if builder is relu_mlp else CNN_SHAPE
    x = _batch(shape, 3)
    x0 = torch.zeros_like(x) if reference == "zeros" else _batch(shape, 4)
    classes = np.array([2, 0, 1, 2])
    got = _attribute(context(model, x, fmt=fmt), x, x0, classes)
    double = model.double()
    delta = (double(x.double()) - double(x0.double())).detach().numpy()[np.arange(4), classes]
    model.float()
    np.testing.assert_allclose(got.reshape(4, -1).sum(1), delta, rtol=1e-5, atol=1e-6)
    assert np.abs(got).max() > 1e-3  # not trivially zero


def test_summation_to_delta_holds_for_probability_targets() -> None:
    model, x = relu_mlp(seed=13), _batch((MLP_FEATURES,), 5)
    x0 = _batch((MLP_FEATURES,), 6)
    classes = np.array([0, 1, 2, 0])
    got = _attribute(context(model, x, target=Target("prob")), x, x0, classes)
    probs = [torch.softmax(model(t).double(), 1).detach().numpy()[np.arange(4), classes] for t in (x, x0)]
    np.testing.assert_allclose(got.sum(1), probs[0] - probs[1], rtol=1e-5, atol=1e-6)


def test_max_pooling_uses_the_gradient_and_can_break_completeness() -> None:
    # Documented behaviour: the audit must be able to find this.
    model, x = maxpool_cnn(seed=14), _batch(CNN_SHAPE, 7)
    x0 = _batch(CNN_SHAPE, 8)
    classes = np.array([0, 1, 2, 0])
    got = _attribute(context(model, x), x, x0, classes)
    delta = (model(x) - model(x0)).detach().numpy()[np.arange(4), classes]
    assert np.isfinite(got).all()
    assert np.abs(got.reshape(4, -1).sum(1) - delta).max() > 1e-2


def _cancelling_model() -> nn.Sequential:
    """y0 = relu(x1 - x2 + 1), y1 = 0."""
    model = nn.Sequential(nn.Linear(2, 1), nn.ReLU(), nn.Linear(1, 2))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, -1.0]]))
        model[0].bias.fill_(1.0)
        model[2].weight.copy_(torch.tensor([[1.0], [0.0]]))
        model[2].bias.zero_()
    return model.eval()


def test_differs_from_rescale_where_contributions_cancel() -> None:
    # x = (3, 2), x0 = 0: dz+ = 3, dz- = -2, z0 = 1, dy = 1.
    # Rescale: m = dy/dz = 1 -> (3, -2).
    # RevealCancel: dy+ = (4-1)/2 + (2-0)/2 = 2.5, dy- = (0-1)/2 + (2-4)/2 = -1.5 -> (2.5, -1.5).
    x, x0 = torch.tensor([[3.0, 2.0]]), torch.zeros(1, 2)
    ctx = context(_cancelling_model(), x)
    classes = np.array([0])
    reveal = _attribute(ctx, x, x0, classes)
    rescale = _attribute(ctx, x, x0, classes, name="deeplift_rescale")
    np.testing.assert_allclose(reveal, [[2.5, -1.5]], rtol=1e-6)
    np.testing.assert_allclose(rescale, [[3.0, -2.0]], rtol=1e-5)


@pytest.mark.parametrize(("model", "operator"), [(sigmoid_mlp(), "Sigmoid")])
def test_unsupported_operators_are_named(model: nn.Module, operator: str) -> None:
    x = torch.randn(2, 4)
    with pytest.raises(NotApplicable, match=operator) as info:
        _attribute(context(model.eval(), x), x, torch.zeros_like(x), np.zeros(2, np.int64))
    assert info.value.method == "deeplift_revealcancel"


def test_flatten_via_shape_arithmetic_is_supported() -> None:
    # x.view(x.size(0), -1) exports as Shape/Gather/Concat/Reshape: shape nodes are static.
    class Viewed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.pool, self.fc = nn.Conv2d(1, 2, 3), nn.AvgPool2d(2), nn.Linear(18, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.pool(torch.relu(self.conv(x)))
            return self.fc(torch.relu(h.view(h.size(0), -1)))

    torch.manual_seed(3)
    model, x = Viewed().eval(), _batch(CNN_SHAPE, 9)
    x0 = _batch(CNN_SHAPE, 10)
    classes = np.array([0, 1, 1, 0])
    got = _attribute(context(model, x), x, x0, classes)
    delta = (model.double()(x.double()) - model(x0.double())).detach().numpy()[np.arange(4), classes]
    np.testing.assert_allclose(got.reshape(4, -1).sum(1), delta, rtol=1e-5, atol=1e-6)


def test_capabilities_are_declared() -> None:
    caps = get_method("deeplift_revealcancel").capabilities
    assert caps.hooks and caps.gradients and caps.baseline == "single" and not caps.stochastic


def test_chunked_rows_give_the_same_attributions(monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.methods.deeplift_revealcancel as module

    model, x = relu_cnn(seed=15), _batch(CNN_SHAPE, 11)
    x0 = _batch(CNN_SHAPE, 12)
    classes = np.array([0, 1, 2, 0])
    ctx = context(model, x)
    whole = _attribute(ctx, x, x0, classes)
    monkeypatch.setattr(module, "CHUNK", 3)
    # Float32 passes: another batch size may change how a kernel blocks its sums (rounding only).
    np.testing.assert_allclose(_attribute(ctx, x, x0, classes), whole, rtol=1e-5, atol=1e-7)


def _zero_difference_model() -> nn.Sequential:
    """h = relu(W1 x + b1), g = relu(W2 h + b2), out = W3 g (weights as nn.Linear stores them: out x in)."""
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1), nn.ReLU(), nn.Linear(1, 2))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[2.0, -3.0], [1.0, 0.0]]))
        model[0].bias.copy_(torch.tensor([-0.5, 0.0]))
        model[2].weight.copy_(torch.tensor([[1.0, 1.0]]))
        model[2].bias.copy_(torch.tensor([-0.2]))
        model[4].weight.copy_(torch.tensor([[1.0], [-1.0]]))
        model[4].bias.zero_()
    return model.eval()


def test_zero_difference_unit_passes_the_mean_multiplier() -> None:
    # At x = (1, 1), x0 = 0: h1 has dz+ = 2, dz- = -3, z0 = -0.5, so dh1 = 0 but dh1+ = 0.75 and
    # dh1- = -0.75 cancel (m+ = 0.375, m- = 0.25). g has dz+ = 1 (from h2), dz- absent: m+ = 0.8,
    # m- = 0. h1's difference is zero, so it gets W2 (m+ + m-)/2 = 0.4, and x gets
    # (2 * 0.375 * 0.4 + 1 * 0.8, -3 * 0.25 * 0.4) = (1.1, -0.3); dropping h1 would give (0.8, 0).
    model = _zero_difference_model()
    x, x0 = torch.tensor([[1.0, 1.0]]), torch.zeros(1, 2)
    classes = np.array([0])
    got = _attribute(context(model, x), x, x0, classes)
    np.testing.assert_allclose(got, [[1.1, -0.3]], rtol=1e-6, atol=1e-7)
    ref = revealcancel_ref(dense_layers(model, (2,)), x.numpy()[0].astype(np.float64), np.zeros(2), 0)
    np.testing.assert_allclose(ref, [1.1, -0.3], rtol=1e-7, atol=1e-7)  # float32 weights (0.2)
    assert got.sum() == pytest.approx(0.8, abs=1e-6)  # summation-to-delta: g(x) - g(x0) = 0.8


def _near_cancelling_model() -> nn.Sequential:
    """h = relu(0.7 x1 - 0.3 x2 + 0.9 x3 + 0.2), g = relu(1.5 h - 0.3), out = (g, -g)."""
    model = nn.Sequential(nn.Linear(3, 1), nn.ReLU(), nn.Linear(1, 1), nn.ReLU(), nn.Linear(1, 2))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[0.7, -0.3, 0.9]]))
        model[0].bias.fill_(0.2)
        model[2].weight.fill_(1.5)
        model[2].bias.fill_(-0.3)
        model[4].weight.copy_(torch.tensor([[1.0], [-1.0]]))
        model[4].bias.zero_()
    return model.eval()


def test_differences_float32_cannot_resolve_are_redone_in_float64() -> None:
    # h's terms (about +-1) cancel to ~3e-9, below float32's rounding of their sum, yet the sign of
    # dh routes g's multipliers back (m+ or m-) and h's large parts carry them to x: float32 alone
    # gets attributions wrong by O(1) here; those rows must come out as the float64 rule gives.
    model = _near_cancelling_model()
    rows = []
    for k in range(16):
        x1, x2 = 1.3 + 0.1 * k, 2.9 - 0.05 * k
        rows.append([x1, x2, -(0.7 * x1 - 0.3 * x2 + 3e-9) / 0.9])
    x = torch.tensor(rows, dtype=torch.float32)
    x0 = torch.zeros_like(x)
    classes = np.zeros(16, dtype=np.int64)
    got = _attribute(context(model, x[:2]), x, x0, classes)
    layers = dense_layers(model, (3,))
    flat, flat0 = x.numpy().astype(np.float64), x0.numpy().astype(np.float64)
    want = np.stack([revealcancel_ref(layers, flat[k], flat0[k], 0) for k in range(16)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("per_row_reference", [False, True])
@pytest.mark.parametrize("tolerance", [None, 1e-3])
def test_the_relu_rule_in_blocks_of_rows_is_the_rule_whole(
    per_row_reference: bool, tolerance: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks that do not divide the rows evenly, a shared and a per-row reference, the rows flagged
    as unresolved: the same tensors as one call over all rows."""
    import workers.methods._revealcancel_rules as rules

    gen = torch.Generator().manual_seed(4)
    total = torch.randn(37, 3, 4, 4, generator=gen)
    total[5] = 0.0  # a row with no difference at all
    spread = total.abs() + torch.rand(37, 3, 4, 4, generator=gen)
    pos = torch.lerp(total, spread, 0.5)
    split = rules.Split(pos, total - pos, total, spread)
    z0 = torch.randn(37 if per_row_reference else 1, 3, 4, 4, generator=gen) * 0.1
    whole = rules.reveal_cancel(z0, split, tolerance)
    monkeypatch.setattr(rules, "_BLOCK_BYTES", 5 * 48 * 4)  # blocks of 5 rows of 48 floats
    blocked = rules.reveal_cancel(z0, split, tolerance)
    for field in ("delta", "mean", "half_diff"):
        assert torch.equal(getattr(blocked, field), getattr(whole, field))
    if tolerance is None:
        assert blocked.unresolved is None and whole.unresolved is None
    else:
        assert whole.unresolved is not None and 0 < int(whole.unresolved.sum()) < 37
        assert blocked.unresolved is not None and torch.equal(blocked.unresolved, whole.unresolved)
