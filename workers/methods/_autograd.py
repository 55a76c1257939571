"""Gradients of the target w.r.t. the input, in bounded chunks."""

from __future__ import annotations

import torch

from workers.methods._base import AttributionContext
from workers.metrics import count_backward

__all__ = ["GRAD_CHUNK", "target_gradients_tensor"]

GRAD_CHUNK = 512


def target_gradients_tensor(
    ctx: AttributionContext, points: torch.Tensor, classes: torch.Tensor
) -> torch.Tensor:
    """d target[class] / d input at ``points`` (k, *shape); one backward per chunk of rows."""
    model = ctx.target.wrap(ctx.model.torch_differentiable())
    grads = []
    for start in range(0, points.shape[0], GRAD_CHUNK):
        x = points[start : start + GRAD_CHUNK].detach().requires_grad_(True)
        with torch.enable_grad():
            out = model(x)
            selected = out.gather(1, classes[start : start + GRAD_CHUNK, None]).sum()
            (grad,) = torch.autograd.grad(selected, x)
        grads.append(grad.detach())
    count_backward(points.shape[0], len(grads))
    return grads[0] if len(grads) == 1 else torch.cat(grads)  # one chunk: no copy
