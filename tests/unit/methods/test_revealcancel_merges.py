"""DeepLIFT RevealCancel through sums, concatenations, data movement and batch norms, against the
same computation written as one layer.

The rule under test (docs/science.md 5.8): a sum is one linear layer whose terms are the summands'
own terms, and a concatenation concatenates its parts. Each model below has a twin without the
merge whose layers compute the same function with the same terms, so the two must give the same
attributions: ``conv_a(h) + conv_b(g)`` is one convolution of ``cat(h, g)`` with the weights side
by side, ``conv(h) + h`` is one convolution of ``cat(h, h)`` with an identity kernel beside W, and
``cat(conv_a(h), conv_b(h))`` is one convolution with the filters stacked, and ShuffleNet's channel
split and shuffle are zero weights and permuted weights in the convolutions that read them, and a
batch norm is folded into the layers before it (a depthwise 1x1 convolution on a ReLU's output). The
twins without merges run in float32 with the float64 redo, the others in float64: they agree to
float32 rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from tests.models.blocks import BLOCK_SHAPE, channel_shuffle, dense_layer, shuffled_unit
from tests.unit.methods._context import context
from workers.methods import get_method

SHAPE = (2, 6, 6)
CLASSES = np.array([0, 1, 2, 1])


def _attribute(model: nn.Module, x: torch.Tensor, x0: torch.Tensor) -> np.ndarray:
    ctx = context(model.eval(), x[:1])
    return get_method("deeplift_revealcancel").attribute(ctx, x.numpy(), x0.numpy(), CLASSES)


def _conv(cin: int, cout: int, generator: torch.Generator) -> nn.Conv2d:
    conv = nn.Conv2d(cin, cout, 3, padding=1)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=generator) * 0.5)
        assert conv.bias is not None
        conv.bias.copy_(torch.randn(conv.bias.shape, generator=generator) * 0.1)
    return conv


class _Head(nn.Module):
    def __init__(self, channels: int, generator: torch.Generator) -> None:
        super().__init__()
        self.conv = _conv(channels, 3, generator)
        self.fc = nn.Linear(3 * 36, 3)
        with torch.no_grad():
            self.fc.weight.copy_(torch.randn(self.fc.weight.shape, generator=generator) * 0.2)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(y)).flatten(1))


class _TwoBranchSum(nn.Module):
    """relu(conv_a(h) + conv_b(g)) with h, g two ReLU branches of the input."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.first, self.second = _conv(2, 3, g), _conv(2, 3, g)
        self.a, self.b, self.head = _conv(3, 4, g), _conv(3, 4, g), _Head(4, g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, g = torch.relu(self.first(x)), torch.relu(self.second(x))
        return self.head(torch.relu(self.a(h) + self.b(g)))

    def twin(self) -> nn.Module:
        joined = nn.Conv2d(6, 4, 3, padding=1)
        with torch.no_grad():
            joined.weight.copy_(torch.cat([self.a.weight, self.b.weight], dim=1))
            joined.bias.copy_(self.a.bias + self.b.bias)
        return _Joined(self.first, self.second, joined, self.head)


class _Joined(nn.Module):
    def __init__(self, first: nn.Module, second: nn.Module, joined: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.first, self.second, self.joined, self.head = first, second, joined, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        g = torch.relu(self.second(x)) if self.second is not None else h
        return self.head(torch.relu(self.joined(torch.cat([h, g], dim=1))))


class _Residual(nn.Module):
    """relu(conv(h) + h): a ResNet block's identity skip."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.first, self.conv, self.head = _conv(2, 3, g), _conv(3, 3, g), _Head(3, g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        return self.head(torch.relu(self.conv(h) + h))

    def twin(self) -> nn.Module:
        joined = nn.Conv2d(6, 3, 3, padding=1)
        identity = torch.zeros(3, 3, 3, 3)
        identity[torch.arange(3), torch.arange(3), 1, 1] = 1.0  # the centre tap: y_c = h_c
        with torch.no_grad():
            joined.weight.copy_(torch.cat([self.conv.weight, identity], dim=1))
            joined.bias.copy_(self.conv.bias)
        return _Joined(self.first, None, joined, self.head)  # type: ignore[arg-type]


class _Concatenated(nn.Module):
    """relu(cat(conv_a(h), conv_b(h))): an Inception-style block."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.first, self.a, self.b, self.head = _conv(2, 3, g), _conv(3, 2, g), _conv(3, 3, g), _Head(5, g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        return self.head(torch.relu(torch.cat([self.a(h), self.b(h)], dim=1)))

    def twin(self) -> nn.Module:
        stacked = nn.Conv2d(3, 5, 3, padding=1)
        with torch.no_grad():
            stacked.weight.copy_(torch.cat([self.a.weight, self.b.weight]))
            stacked.bias.copy_(torch.cat([self.a.bias, self.b.bias]))
        return _Stacked(self.first, stacked, self.head)


class _Stacked(nn.Module):
    def __init__(self, first: nn.Module, stacked: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.first, self.stacked, self.head = first, stacked, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.stacked(torch.relu(self.first(x)))))


class _ShuffleUnit(nn.Module):
    """A ShuffleNet v2 unit: split the channels, convolve one half, concatenate, shuffle."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.first, self.branch, self.head = _conv(2, 4, g), _conv(2, 2, g), _Head(4, g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        kept, convolved = h.chunk(2, dim=1)
        return self.head(channel_shuffle(torch.cat([kept, torch.relu(self.branch(convolved))], dim=1)))

    def twin(self) -> nn.Module:
        """No data movement: the branch convolves all of h with zero weights on the kept half, and
        the head's first convolution reads cat(h, branch) with its weights moved to where the
        shuffle took each channel from (zero for h's convolved half)."""
        branch = nn.Conv2d(4, 2, 3, padding=1)
        moved = self.head.conv.weight.new_zeros(3, 6, 3, 3)
        source = channel_shuffle(torch.arange(4.0).view(1, 4, 1, 1)).flatten().long()  # shuffled j <- joined
        where = torch.tensor([0, 1, 4, 5])  # joined channel k in cat(h, branch): h 0-1, branch 4-5
        with torch.no_grad():
            branch.weight.zero_()
            branch.weight[:, 2:] = self.branch.weight
            branch.bias.copy_(self.branch.bias)
            moved[:, where[source]] = self.head.conv.weight
            head = _Head(6, torch.Generator().manual_seed(0))
            head.conv.weight.copy_(moved)
            head.conv.bias.copy_(self.head.conv.bias)
            head.fc.load_state_dict(self.head.fc.state_dict())
        return _Unmoved(self.first, branch, head)


class _Unmoved(nn.Module):
    def __init__(self, first: nn.Module, branch: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.first, self.branch, self.head = first, branch, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        return self.head(torch.cat([h, torch.relu(self.branch(h))], dim=1))


def _norm(channels: int, generator: torch.Generator) -> nn.BatchNorm2d:
    """An eval-mode batch norm with some negative scales (there the parts swap)."""
    norm = nn.BatchNorm2d(channels).eval()
    with torch.no_grad():
        norm.running_mean.copy_(torch.randn(channels, generator=generator) * 0.3)
        norm.running_var.copy_(torch.rand(channels, generator=generator) + 0.5)
        norm.weight.copy_(torch.randn(channels, generator=generator))
        norm.bias.copy_(torch.randn(channels, generator=generator) * 0.1)
    return norm


def _scale_and_shift(norm: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    scale = norm.weight / torch.sqrt(norm.running_var + norm.eps)
    return scale.detach(), (norm.bias - norm.running_mean * scale).detach()


class _NormedConv(nn.Module):
    """relu(norm(conv(h))): a batch norm the exporter keeps (it folds one straight after a
    convolution), applied after the convolution's ReLU input, as the twin folds it."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.first, self.conv, self.norm, self.head = _conv(2, 3, g), _conv(3, 3, g), _norm(3, g), _Head(3, g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        return self.head(torch.relu(self.norm(torch.cat([self.conv(h)], dim=1))))

    def twin(self) -> nn.Module:
        """The norm folded into the convolution: W s and b s + t."""
        scale, shift = _scale_and_shift(self.norm)
        folded = nn.Conv2d(3, 3, 3, padding=1)
        with torch.no_grad():
            folded.weight.copy_(self.conv.weight * scale[:, None, None, None])
            folded.bias.copy_(self.conv.bias * scale + shift)
        return _Stacked(self.first, folded, self.head)


class _NormThenConv(nn.Module):
    """conv(norm(h)) on a ReLU's output, a chain without merges (the float32 pass)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.first, self.norm, self.head = _conv(2, 3, g), _norm(3, g), _Head(3, g)
        self.conv = nn.Conv2d(3, 3, 1)  # 1x1: no zero padding, which the norm would not shift
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=g) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(self.norm(torch.relu(self.first(x))))))

    def twin(self) -> nn.Module:
        """The norm folded into the convolution after it: W s over its inputs, b + W t."""
        scale, shift = _scale_and_shift(self.norm)
        folded = nn.Conv2d(3, 3, 1)
        with torch.no_grad():
            folded.weight.copy_(self.conv.weight * scale[None, :, None, None])
            folded.bias.copy_(self.conv.bias + (self.conv.weight * shift[None, :, None, None]).sum((1, 2, 3)))
        return _Stacked(self.first, folded, self.head)


class _DenseNormed(nn.Module):
    """DenseNet's layer: relu(norm(cat(h, conv(h)))), the norm after a concatenation."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.first, self.conv, self.norm, self.head = _conv(2, 3, g), _conv(3, 2, g), _norm(5, g), _Head(5, g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        return self.head(torch.relu(self.norm(torch.cat([h, self.conv(h)], dim=1))))

    def twin(self) -> nn.Module:
        """The norm folded into each part: a depthwise 1x1 convolution of h (one term per unit) and
        the convolution's W s and b s + t."""
        scale, shift = _scale_and_shift(self.norm)
        each = nn.Conv2d(3, 3, 1, groups=3)
        folded = nn.Conv2d(3, 2, 3, padding=1)
        with torch.no_grad():
            each.weight.copy_(scale[:3].view(3, 1, 1, 1))
            each.bias.copy_(shift[:3])
            folded.weight.copy_(self.conv.weight * scale[3:, None, None, None])
            folded.bias.copy_(self.conv.bias * scale[3:] + shift[3:])
        return _Folded(self.first, each, folded, self.head)


class _Folded(nn.Module):
    def __init__(self, first: nn.Module, each: nn.Module, folded: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.first, self.each, self.folded, self.head = first, each, folded, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        return self.head(torch.relu(torch.cat([self.each(h), self.folded(h)], dim=1)))


CHAINS = {"batch_norm_before_a_convolution"}  # no merge or move: the float32 pass
MODELS = {
    "two_branch_sum": _TwoBranchSum,
    "identity_skip": _Residual,
    "concatenation": _Concatenated,
    "channel_split_and_shuffle": _ShuffleUnit,
    "batch_norm_after_a_convolution": _NormedConv,
    "batch_norm_before_a_convolution": _NormThenConv,
    "batch_norm_after_a_concatenation": _DenseNormed,
}


@pytest.mark.parametrize("reference", ["zeros", "random"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_merge_equals_its_one_layer_twin(name: str, reference: str) -> None:
    model = MODELS[name](seed=3)
    x = torch.randn(4, *SHAPE, generator=torch.Generator().manual_seed(4))
    x0 = (
        torch.zeros_like(x)
        if reference == "zeros"
        else torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    )
    with torch.no_grad():  # the twin computes the same function
        torch.testing.assert_close(model.twin()(x), model(x), rtol=1e-5, atol=1e-5)
    merged = _attribute(model, x, x0)
    twin = _attribute(model.twin(), x, x0)
    scale = np.abs(twin).max()
    assert np.abs(merged - twin).max() <= 1e-4 * scale
    # and it is DeepLIFT: the attributions add up to f(x) - f(x0)
    with torch.no_grad():
        delta = (model(x) - model(x0)).numpy()[np.arange(4), CLASSES]
    # Float32 rounding: of the multipliers (a merge's float64 plan computes only W da in float64), and
    # in a chain, which runs in float32, of the differences too.
    within = 1e-4 if name in CHAINS else 1e-5
    np.testing.assert_allclose(merged.reshape(4, -1).sum(axis=1), delta, rtol=within, atol=within)


def test_a_torchvision_resnet_runs_and_adds_up_with_a_zero_reference() -> None:
    from torchvision.models.resnet import BasicBlock, ResNet

    torch.manual_seed(0)
    model = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=4).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    ctx = context(model, x[:1])
    classes = np.array([0, 3])
    attributions = get_method("deeplift_revealcancel").attribute(
        ctx, x.numpy(), np.zeros_like(x.numpy()), classes
    )
    assert np.isfinite(attributions).all()
    # Max pooling takes the gradient (not summation-to-delta in general); with the stem's ReLU and
    # a zero reference it still adds up here to well within the scale of the scores.
    with torch.no_grad():
        delta = (model(x) - model(torch.zeros_like(x))).numpy()[np.arange(2), classes]
    np.testing.assert_allclose(attributions.reshape(2, -1).sum(axis=1), delta, rtol=0.05, atol=1e-3)


@pytest.mark.parametrize("block", [dense_layer, shuffled_unit], ids=["dense_layer", "shuffle_unit"])
def test_real_blocks_add_up(block: Callable[[], nn.Module]) -> None:
    """A DenseNet layer (batch norm after a concatenation) and a ShuffleNet unit: summation-to-delta
    against a random reference (neither has a max-pool)."""
    model = block()
    x = torch.randn(3, *BLOCK_SHAPE, generator=torch.Generator().manual_seed(7))
    x0 = torch.randn(x.shape, generator=torch.Generator().manual_seed(8))
    classes = np.array([0, 1, 3])
    got = get_method("deeplift_revealcancel").attribute(context(model, x[:1]), x.numpy(), x0.numpy(), classes)
    with torch.no_grad():
        delta = (model(x) - model(x0)).numpy()[np.arange(3), classes]
    np.testing.assert_allclose(got.reshape(3, -1).sum(axis=1), delta, rtol=1e-5, atol=1e-6)
