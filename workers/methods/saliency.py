"""Saliency (|grad|) and SmoothGrad: extras users ask for, not among the paper's fourteen."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from workers.methods._base import AttributionContext, Capabilities, Method, to_numpy, to_tensor
from xaudit.contract.params import parameter_defaults

__all__ = ["Saliency", "SmoothGrad"]


class Saliency(Method):
    name = "saliency"
    capabilities = Capabilities(gradients=True, hooks=False, baseline="none", stochastic=False)
    paper_context: ClassVar[str] = "not among the fourteen; a sensitivity map, not an allocation of effects"

    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        from workers.methods._autograd import target_gradients  # torch only when computing

        return np.abs(target_gradients(ctx, inputs, classes)).astype(np.float32)


class SmoothGrad(Method):
    """Mean gradient over Gaussian-perturbed copies, times (x - b) (SmoothGrad x Input)."""

    name = "smoothgrad"
    capabilities = Capabilities(gradients=True, hooks=False, baseline="single", stochastic=True)
    defaults: ClassVar[dict[str, Any]] = parameter_defaults(
        "smoothgrad"
    )  # declared in xaudit.contract.params
    paper_context: ClassVar[str] = "not among the fourteen"

    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        import torch

        from workers.methods._autograd import target_gradients_tensor

        p = self.params(ctx)
        samples, noise = int(p["samples"]), float(p["noise"])
        device = ctx.model.device
        x = to_tensor(inputs, device)
        spread = x.amax(dim=tuple(range(1, x.ndim)), keepdim=True) - x.amin(
            dim=tuple(range(1, x.ndim)), keepdim=True
        )
        gen = torch.Generator(device="cpu").manual_seed(ctx.seed)
        eps = torch.randn((samples, *x.shape), generator=gen).to(device) * noise * spread.clamp_min(1e-12)
        noisy = (x[None] + eps).reshape(-1, *x.shape[1:])
        cls = torch.as_tensor(classes, dtype=torch.long, device=device).repeat(samples)
        grads = target_gradients_tensor(ctx, noisy, cls).reshape(samples, *x.shape).mean(0)
        return (to_numpy(grads) * (inputs - baselines)).astype(np.float32)
