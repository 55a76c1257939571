"""Saliency (|grad|) and SmoothGrad: extras users ask for, not among the paper's fourteen."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from workers.methods import _passes
from workers.methods._base import AttributionContext, Capabilities, TorchMethod
from xaudit.contract.params import parameter_defaults

if TYPE_CHECKING:  # the catalogue loads no torch
    import torch

__all__ = ["Saliency", "SmoothGrad", "noise_groups"]


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
        spread = spread.clamp_min(1e-12)
        gen = torch.Generator(device="cpu").manual_seed(ctx.seed)
        total = torch.zeros_like(x)
        for count in noise_groups(samples, x.numel(), _passes.elements_per_pass(device)):
            eps = torch.randn((count, *x.shape), generator=gen).to(device) * noise * spread
            noisy = (x[None] + eps).reshape(-1, *x.shape[1:])
            total += (
                target_gradients_tensor(ctx, noisy, classes.repeat(count)).reshape(count, *x.shape).sum(0)
            )
        return total / samples * (inputs - baselines)  # as the mean over one draw of all, bit for bit


def noise_groups(samples: int, elements: int, budget: int) -> list[int]:
    """How many noisy copies of a call's ``elements`` to draw at once: all where they fit ``budget``
    elements, else groups that do (the noise, the noisy copies and their gradients of 32 copies, the
    default, of an audit call of 111 rows at 224x224 held 6 GB at once). Each group but the last holds
    a multiple of 16 elements: torch's CPU generator draws normals in blocks of 16, so the groups draw
    the same numbers as one draw of all (tests/unit/methods/test_pass_memory.py)."""
    if samples * elements <= budget:
        return [samples]
    align = 16 // math.gcd(elements, 16)
    step = max(align, budget // elements // align * align)
    groups = [min(step, samples - first) for first in range(0, samples, step)]
    if groups[-1] * elements < 16:  # a draw under 16 normals takes another path: join the one before
        last = groups.pop()
        groups[-1] += last
    return groups
