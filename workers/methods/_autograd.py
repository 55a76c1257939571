"""Gradients of the target w.r.t. the input, in passes of bounded memory (workers.methods._passes)."""

from __future__ import annotations

import torch

from workers.methods._base import AttributionContext
from workers.methods._passes import rows_per_pass
from workers.metrics import count_backward

__all__ = ["target_gradients_tensor"]


def target_gradients_tensor(
    ctx: AttributionContext, points: torch.Tensor, classes: torch.Tensor
) -> torch.Tensor:
    """d target[class] / d input at ``points`` (k, *shape); one backward per pass of
    :func:`~workers.methods._passes.rows_per_pass` rows."""
    graph = ctx.model.torch_differentiable()
    model = ctx.target.wrap(graph)
    rows = rows_per_pass(points, graph)
    grads = []
    for start in range(0, points.shape[0], rows):
        x = points[start : start + rows].detach().requires_grad_(True)
        with torch.enable_grad():
            out = model(x)
            selected = out.gather(1, classes[start : start + rows, None]).sum()
            (grad,) = torch.autograd.grad(selected, x)
        grads.append(grad.detach())
    count_backward(points.shape[0], len(grads))
    return grads[0] if len(grads) == 1 else torch.cat(grads)  # one chunk: no copy
