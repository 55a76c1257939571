"""A tensor's value with another tensor's gradient: how modified-backward methods (LRP rules,
DeepLIFT multipliers) change a layer's gradient without changing the forward pass."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["rerouted"]


class _Rerouted(torch.autograd.Function):
    """The value ``z`` in the forward pass; in the backward pass the gradient, repeated once per
    block of ``branch`` and times ``scale``, goes into ``branch``."""

    @staticmethod
    def forward(
        ctx: Any, z: torch.Tensor, branch: torch.Tensor, scale: torch.Tensor, axis: int
    ) -> torch.Tensor:
        ctx.save_for_backward(scale)
        ctx.axis, ctx.blocks = axis, branch.shape[axis] // z.shape[axis]
        return z

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor, None, None]:
        (scale,) = ctx.saved_tensors
        if ctx.blocks == 1:
            return None, grad * scale, None, None
        at = ctx.axis % grad.ndim  # the gradient broadcast over the blocks, not copied
        blocks = scale.reshape(*scale.shape[:at], ctx.blocks, -1, *scale.shape[at + 1 :])
        return None, (grad.unsqueeze(at) * blocks).flatten(at, at + 1), None, None


def rerouted(z: torch.Tensor, branch: torch.Tensor, scale: torch.Tensor, axis: int = 1) -> torch.Tensor:
    """``z``, whose gradient ``g`` reaches ``branch`` as ``g * scale`` (``g`` repeated along ``axis``
    once per block when ``branch`` stacks several blocks the size of ``z``)."""
    out: torch.Tensor = _Rerouted.apply(z, branch, scale, axis)
    return out
