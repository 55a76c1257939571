"""Graphs with merges, data movement and batch norms, as real architectures write them: a small
torchvision ResNet (residual sums, one overlapping max-pool), a DenseNet-style concatenation, a
DenseNet layer (a batch norm after the concatenation, which no exporter folds) and a ShuffleNet unit
(channel split, concatenation, shuffle). Seeded, in eval mode, on 3x32x32 inputs."""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "BLOCK_SHAPE",
    "channel_shuffle",
    "concatenated_block",
    "dense_layer",
    "shuffled_unit",
    "small_resnet",
]

BLOCK_SHAPE = (3, 32, 32)


def small_resnet(seed: int = 0) -> nn.Module:
    """torchvision's ResNet with one BasicBlock per stage; batch norms that are not the identity, so
    that folding them matters."""
    from torchvision.models.resnet import BasicBlock, ResNet

    torch.manual_seed(seed)
    model = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=4).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    return model


class _Concatenated(nn.Module):
    """A DenseNet-style block: the stem's maps beside two convolutions of them, concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.left = nn.Conv2d(4, 3, 3, padding=1)
        self.right = nn.Conv2d(4, 2, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(9, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        joined = torch.relu(torch.cat([h, self.left(h), self.right(h)], dim=1))
        return self.head(self.pool(joined).flatten(1))


def concatenated_block(seed: int = 2) -> nn.Module:
    torch.manual_seed(seed)
    return _Concatenated().eval()


class _DenseLayer(nn.Module):
    """DenseNet's layer: the features so far, concatenated, then batch norm, ReLU, convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.grow = nn.Conv2d(4, 2, 3, padding=1)
        self.norm = nn.BatchNorm2d(6)
        self.conv = nn.Conv2d(6, 3, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        joined = torch.cat([h, torch.relu(self.grow(h))], dim=1)
        return self.head(self.pool(self.conv(torch.relu(self.norm(joined)))).flatten(1))


def dense_layer(seed: int = 6) -> nn.Module:
    torch.manual_seed(seed)
    model = _DenseLayer().eval()
    with torch.no_grad():  # statistics and some negative scales, so that the norm is no identity
        model.norm.running_mean.uniform_(-0.3, 0.3)
        model.norm.running_var.uniform_(0.5, 1.5)
        model.norm.weight.uniform_(-1.0, 1.5)
    return model


def channel_shuffle(t: torch.Tensor, groups: int = 2) -> torch.Tensor:
    """ShuffleNet's channel shuffle: (b, g, c/g, h, w) -> transpose -> (b, c, h, w)."""
    b, c, height, width = t.shape
    return t.view(b, groups, c // groups, height, width).transpose(1, 2).reshape(b, c, height, width)


class _Shuffled(nn.Module):
    """A ShuffleNet v2 unit: split the channels, convolve one half, concatenate, shuffle the channels."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.branch = nn.Conv2d(2, 2, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        kept, convolved = h.chunk(2, dim=1)
        joined = torch.cat([kept, torch.relu(self.branch(convolved))], dim=1)
        return self.head(self.pool(channel_shuffle(joined)).flatten(1))


def shuffled_unit(seed: int = 4) -> nn.Module:
    torch.manual_seed(seed)
    return _Shuffled().eval()
