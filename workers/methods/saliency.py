"""Saliency (|grad|) and SmoothGrad: extras users ask for, not among the paper's fourteen."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from workers.methods._base import AttributionContext, Capabilities, TorchMethod
from xaudit.contract.params import parameter_defaults

if TYPE_CHECKING:  # the catalogue loads no torch
    import torch

__all__ = ["Saliency", "SmoothGrad"]


class Saliency(TorchMethod):
    name = "saliency"
    capabilities = Capabilities(gradients=True, hooks=False, baseline="none", stochastic=False)
    paper_context: ClassVar[str] = "not among the fourteen; a sensitivity map, not an allocation of effects"

    def attribute_tensors(
        self, ctx: AttributionContext, inputs: torch.Tensor, baselines: torch.Tensor, classes: torch.Tensor
    ) -> torch.Tensor:
        from workers.methods._autograd import target_gradients_tensor  # torch only when computing

        return target_gradients_tensor(ctx, inputs, classes).abs()


class SmoothGrad(TorchMethod):
    """Mean gradient over Gaussian-perturbed copies, times (x - b) (SmoothGrad x Input)."""

    name = "smoothgrad"
    capabilities = Capabilities(gradients=True, hooks=False, baseline="single", stochastic=True)
    defaults: ClassVar[dict[str, Any]] = parameter_defaults(
        "smoothgrad"
    )  # declared in xaudit.contract.params
    paper_context: ClassVar[str] = "not among the fourteen"

    def passes_per_row(self, params: Mapping[str, Any]) -> int:
        return int(self.params_from(params)["samples"])

    def attribute_tensors(
        self, ctx: AttributionContext, inputs: torch.Tensor, baselines: torch.Tensor, classes: torch.Tensor
    ) -> torch.Tensor:
        import torch

        from workers.methods._autograd import target_gradients_tensor

        p = self.params(ctx)
        samples, noise = int(p["samples"]), float(p["noise"])
        device, x = inputs.device, inputs
        spread = x.amax(dim=tuple(range(1, x.ndim)), keepdim=True) - x.amin(
            dim=tuple(range(1, x.ndim)), keepdim=True
        )
        gen = torch.Generator(device="cpu").manual_seed(ctx.seed)
        eps = torch.randn((samples, *x.shape), generator=gen).to(device) * noise * spread.clamp_min(1e-12)
        noisy = (x[None] + eps).reshape(-1, *x.shape[1:])
        grads = (
            target_gradients_tensor(ctx, noisy, classes.repeat(samples)).reshape(samples, *x.shape).mean(0)
        )
        return grads * (inputs - baselines)
