"""Expected Gradients (Erion et al. 2021): Integrated Gradients averaged over references drawn from data.

The constituent for one reference b is (x - b) * mean over alpha ~ U(0, 1) of grad(b + alpha (x - b)),
which is what Captum's GradientShap computes with ``stdevs=0`` for a single baseline; the
background average happens in :func:`workers.methods.attribute`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from workers.methods._autograd import target_gradients_tensor
from workers.methods._base import AttributionContext, Capabilities, Method, to_numpy, to_tensor

__all__ = ["ExpectedGradients"]


class ExpectedGradients(Method):
    name = "expected_gradients"
    capabilities = Capabilities(gradients=True, hooks=False, baseline="distribution", stochastic=True)
    defaults: ClassVar[dict[str, Any]] = {"samples_per_reference": 16}
    paper_context: ClassVar[str] = "Integrated Gradients averaged over baselines drawn from data"

    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        samples = int(self.params(ctx)["samples_per_reference"])
        device = ctx.model.device
        x, b = to_tensor(inputs, device), to_tensor(baselines, device)
        gen = torch.Generator(device="cpu").manual_seed(ctx.seed)
        alphas = torch.rand((samples, x.shape[0]), generator=gen, dtype=torch.float32).to(device)
        shape = (samples, x.shape[0]) + (1,) * (x.ndim - 1)
        points = (b[None] + alphas.reshape(shape) * (x - b)[None]).reshape(-1, *x.shape[1:])
        cls = torch.as_tensor(classes, dtype=torch.long, device=device).repeat(samples)
        grads = target_gradients_tensor(ctx, points, cls).reshape(samples, *x.shape).mean(0)
        return to_numpy(grads * (x - b))
