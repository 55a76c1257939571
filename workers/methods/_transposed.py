"""Transposed convolutions as affine layers of the rule methods: where their weights keep the outputs,
and the layer with other parameters. U-Net decoders upsample with them (MONAI's UNet and
AttentionUnet, BasicUNet's default), and each is a linear map plus a bias like a convolution, whose
weight is stored (in, out / groups, ...) instead of (out, in / groups, ...)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TRANSPOSED_TYPES", "output_axis", "transposed_convolution"]

TRANSPOSED_TYPES: tuple[type[nn.Module], ...] = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_BY_DIMENSIONS = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def output_axis(module: nn.Module) -> int:
    """The axis of a Linear/Conv layer's weight that runs over its outputs: 1 for a transposed
    convolution, 0 for the others."""
    return 1 if isinstance(module, TRANSPOSED_TYPES) else 0


def transposed_convolution(
    module: nn.Module, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``module`` (ConvTranspose1d/2d/3d) applied to ``a`` with other parameters."""
    assert isinstance(module, nn.ConvTranspose1d | nn.ConvTranspose2d | nn.ConvTranspose3d)
    padding = module.padding
    assert not isinstance(padding, str)  # a transposed convolution's padding is numeric
    op = _BY_DIMENSIONS[len(module.kernel_size)]
    return op(a, weight, bias, module.stride, padding, module.output_padding, module.groups, module.dilation)
