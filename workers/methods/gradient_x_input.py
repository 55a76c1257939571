"""Gradient x Input: (x - b) * d target / dx, the first-order Taylor term at the reference."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from workers.methods._base import AttributionContext, Capabilities, TorchMethod

if TYPE_CHECKING:  # the catalogue loads no torch
    import torch

__all__ = ["GradientXInput"]


class GradientXInput(TorchMethod):
    """With the default zero reference this is the classic x * grad (Captum's InputXGradient)."""

    name = "gradient_x_input"
    capabilities = Capabilities(gradients=True, hooks=False, baseline="single", stochastic=False)
    paper_context: ClassVar[str] = "allocates only the first-order Taylor term; drops the rest"

    def attribute_tensors(
        self, ctx: AttributionContext, inputs: torch.Tensor, baselines: torch.Tensor, classes: torch.Tensor
    ) -> torch.Tensor:
        from workers.methods._autograd import target_gradients_tensor

        return (inputs - baselines) * target_gradients_tensor(ctx, inputs, classes)
