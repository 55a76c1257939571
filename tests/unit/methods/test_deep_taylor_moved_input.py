"""Deep Taylor's z-beta rule where the input reaches the first layer padded or cropped, not just
reshaped: Keras writes ZeroPadding2D before a ResNet's or MobileNet's first convolution as its own Pad,
and a reflection-padded convolution exports as Pad then Conv. The bounds hold where the input does: a
zero pad's positions hold no input, so their bounds are 0 as their value is (the numbers of the same
convolution with the padding inside it), and a copying pad's copies keep the input's bounds; the
bound terms' relevance goes back to the input by the move's gradient (docs/science.md 5.8). Before,
Deep Taylor was refused on these graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.unit.methods._context import context, dense_layers
from tests.unit.methods.test_lrp import deep_taylor_ref
from workers.methods import get_method
from xaudit.contract.errors import NotApplicable

_SHAPE = (2, 6, 6)
_LOW, _HIGH = -2.5, 3.0


def _padded_cnn(pad: nn.Module, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        pad,
        nn.Conv2d(2, 3, 3),
        nn.ReLU(),
        nn.Conv2d(3, 4, 3, stride=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 2 * 2, 3),
    ).eval()


def _reference(model: nn.Sequential, x: np.ndarray, target: int) -> np.ndarray:
    """z-beta at the convolution over the padded input, its bounds the pad of the input's bounds (the
    pad of a constant: 0 at a zero pad's positions), relevance taken back by the pad's transpose."""
    layers = dense_layers(model, _SHAPE)
    pad, _, _ = layers[0]  # (input, padded) 0/1 matrix
    held = np.ones(pad.shape[0]) @ pad  # how much input each padded position holds
    padded = x @ pad
    relevance = deep_taylor_ref(layers[1:], padded, target, _LOW * held, _HIGH * held)
    return pad @ relevance


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize(
    "pad", [nn.ZeroPad2d(1), nn.ZeroPad2d((2, 0, 1, 1)), nn.ReflectionPad2d(1), nn.ReplicationPad2d(1)]
)
def test_deep_taylor_sees_the_input_through_a_pad(pad: nn.Module, dynamo: bool) -> None:
    model = _padded_cnn(pad, seed=3)
    x = torch.randn(3, *_SHAPE, generator=torch.Generator().manual_seed(4))
    ctx = context(model, x, params={"low": _LOW, "high": _HIGH}, dynamo=dynamo)
    classes = np.array([0, 2, 1])
    got = get_method("deep_taylor").attribute(ctx, x.numpy(), np.zeros_like(x.numpy()), classes)
    flat = x.numpy().reshape(3, -1).astype(np.float64)
    want = np.stack([_reference(model, flat[k], int(classes[k])) for k in range(3)])
    np.testing.assert_allclose(got.reshape(3, -1), want, rtol=1e-4, atol=1e-5)


def test_a_zero_pad_before_the_convolution_is_the_convolution_padding_itself() -> None:
    """The same weights with ``padding=1`` inside the convolution: the same relevance, which sums to
    the target's logit (z-beta and z+ without biases conserve it)."""
    padded = _padded_cnn(nn.ZeroPad2d(1), seed=5)
    inside = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), *list(padded)[2:]).eval()
    with torch.no_grad():
        inside[0].weight.copy_(padded[1].weight)
        inside[0].bias.zero_()
        padded[1].bias.zero_()
        for layer in (padded[3], padded[6]):
            layer.bias.zero_()
    x = torch.randn(3, *_SHAPE, generator=torch.Generator().manual_seed(6))
    classes = np.array([1, 1, 0])
    refs = np.zeros_like(x.numpy())
    params = {"low": _LOW, "high": _HIGH}
    deep_taylor = get_method("deep_taylor")
    got = deep_taylor.attribute(context(padded, x, params=params), x.numpy(), refs, classes)
    want = deep_taylor.attribute(context(inside, x, params=params), x.numpy(), refs, classes)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    logits = padded(x).detach().numpy()[np.arange(3), classes]
    np.testing.assert_allclose(got.reshape(3, -1).sum(1), logits, rtol=1e-4, atol=1e-5)


class _Normalize(nn.Module):
    """A normalization baked into the exported model, (x - mean) * scale per channel (a negative
    scale where a channel is inverted), as Keras' Normalization layer and many deployments write it."""

    def __init__(self, mean: list[float], scale: list[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(-1, 1, 1))
        self.register_buffer("scale", torch.tensor(scale).view(-1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) * self.scale


def _normalized_cnn(pad: bool, seed: int) -> tuple[nn.Sequential, nn.Sequential]:
    """The model, and its part from the first convolution on."""
    torch.manual_seed(seed)
    head = nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=0 if pad else 1),
        nn.ReLU(),
        nn.Conv2d(3, 4, 3, stride=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 2 * 2, 3),
    )
    prefix = [_Normalize([0.3, -0.2], [1.5, -0.8])] + ([nn.ZeroPad2d(1)] if pad else [])
    return nn.Sequential(*prefix, *head).eval(), head.eval()


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize("pad", [False, True], ids=["conv", "pad-conv"])
def test_deep_taylor_sees_the_input_through_a_normalization(pad: bool, dynamo: bool) -> None:
    """z-beta at the first convolution with the input's box carried through the normalization (per
    channel, swapped where the scale is negative; 0 at a zero pad's positions), and its relevance
    taken back unchanged through the normalization, as where it is preprocessing. Before,
    Deep Taylor was refused: its first layer did not read the input."""
    model, head = _normalized_cnn(pad, seed=7)
    x = torch.randn(3, *_SHAPE, generator=torch.Generator().manual_seed(8))
    ctx = context(model, x, params={"low": _LOW, "high": _HIGH}, dynamo=dynamo)
    classes = np.array([1, 0, 2])
    got = get_method("deep_taylor").attribute(ctx, x.numpy(), np.zeros_like(x.numpy()), classes)
    double = model.double()
    prefix = nn.Sequential(*list(double)[: len(model) - len(head)])
    with torch.no_grad():
        ends = [prefix(torch.full((1, *_SHAPE), bound, dtype=torch.float64)) for bound in (_LOW, _HIGH)]
        low, high = (t.reshape(-1).numpy() for t in (torch.minimum(*ends), torch.maximum(*ends)))
        a = prefix(x.double()).reshape(3, -1).numpy()
    model.float()
    moved_shape = tuple(ends[0].shape[1:])
    layers = dense_layers(head, moved_shape)
    moves = dense_layers(nn.Sequential(nn.ZeroPad2d(1)), _SHAPE)[0][0] if pad else np.eye(a.shape[1])
    want = np.stack([moves @ deep_taylor_ref(layers, a[k], int(classes[k]), low, high) for k in range(3)])
    np.testing.assert_allclose(got.reshape(3, -1), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["lrp_epsilon", "lrp_alpha_beta"])
def test_lrp_of_a_baked_normalization_is_that_of_the_normalized_input(name: str) -> None:
    """With the normalization inside the model, the relevance is the one the model without it gives
    the normalized input, position by position (as where the normalization is preprocessing); x
    times the gradient would give x / (x - mean) of it."""
    model, head = _normalized_cnn(pad=False, seed=9)
    x = torch.randn(3, *_SHAPE, generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        a = model[0](x)
    classes = np.array([2, 1, 0])
    method = get_method(name)
    got = method.attribute(context(model, x), x.numpy(), np.zeros_like(x.numpy()), classes)
    want = method.attribute(context(head, a), a.numpy(), np.zeros_like(a.numpy()), classes)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
    assert np.abs(want).max() > 1e-3


class _ForkedNormalization(nn.Module):
    """The input read normalized by one convolution and raw by another: its relevance does not come
    back through the normalization alone. (The normalized input read twice is fine: both readers
    read the one tensor the relevance is taken at.)"""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.normalize = _Normalize([0.3, -0.2], [1.5, -0.8])
        self.left, self.right = nn.Conv2d(2, 3, 3, padding=1), nn.Conv2d(2, 3, 3, padding=1)
        self.head = nn.Linear(3 * 6 * 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.normalize(x)
        return self.head((torch.relu(self.left(a)) + torch.relu(self.right(x))).flatten(1))


def test_an_input_read_past_its_normalization_is_refused_by_deep_taylor_only() -> None:
    x = torch.randn(2, *_SHAPE, generator=torch.Generator().manual_seed(12))
    model = _ForkedNormalization().eval()
    refs, classes = np.zeros_like(x.numpy()), np.array([0, 1])
    with pytest.raises(NotApplicable, match="z-beta rule needs the input itself"):
        get_method("deep_taylor").attribute(
            context(model, x, params={"low": _LOW, "high": _HIGH}), x.numpy(), refs, classes
        )
    relevance = get_method("lrp_epsilon").attribute(context(model, x), x.numpy(), refs, classes)
    assert np.isfinite(relevance).all() and np.abs(relevance).max() > 1e-4


class _Twice(nn.Module):
    """relu(conv(x)) computed by two layers with the same weights and summed (``twice``), or once and
    doubled: the same function, and the same Deep Taylor map when every layer that reads the input
    gets z-beta (the second layer got z+ before, as if its input were an activation)."""

    def __init__(self, twice: bool) -> None:
        super().__init__()
        torch.manual_seed(13)
        self.left, self.right = nn.Conv2d(2, 3, 3, padding=1), nn.Conv2d(2, 3, 3, padding=1)
        self.right.load_state_dict(self.left.state_dict())
        self.head, self.twice = nn.Linear(3 * 6 * 6, 3), twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left = torch.relu(self.left(x))
        merged = left + torch.relu(self.right(x)) if self.twice else left * 2.0
        return self.head(merged.flatten(1))


def test_every_layer_that_reads_the_input_gets_z_beta() -> None:
    x = torch.randn(3, *_SHAPE, generator=torch.Generator().manual_seed(14))
    refs, classes, params = np.zeros_like(x.numpy()), np.array([0, 2, 1]), {"low": _LOW, "high": _HIGH}
    deep_taylor = get_method("deep_taylor")
    got = deep_taylor.attribute(context(_Twice(True).eval(), x, params=params), x.numpy(), refs, classes)
    want = deep_taylor.attribute(context(_Twice(False).eval(), x, params=params), x.numpy(), refs, classes)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
    assert np.abs(want).max() > 1e-3
