"""DeepLIFT with the Rescale rule and DeepSHAP, through Captum on a hookable graph."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from workers.methods._base import AttributionContext, Capabilities, Method, to_numpy, to_tensor

__all__ = ["DeepLiftRescale", "DeepShap"]


def _deeplift(
    ctx: AttributionContext, method: str, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
) -> np.ndarray:
    import torch  # here, not at import: the catalogue loads no torch
    from captum.attr import DeepLift

    device = ctx.model.device
    model = ctx.target.wrap(ctx.model.torch_hookable(method))
    explainer = DeepLift(model, multiply_by_inputs=True)
    with torch.enable_grad():
        attributions = explainer.attribute(
            to_tensor(inputs, device),
            baselines=to_tensor(baselines, device),
            target=torch.as_tensor(classes, dtype=torch.long, device=device),
        )
    return to_numpy(attributions)


class DeepLiftRescale(Method):
    name = "deeplift_rescale"
    capabilities = Capabilities(gradients=True, hooks=True, baseline="single", stochastic=False)
    paper_context: ClassVar[str] = (
        "splits each Taylor term by degree, like Integrated Gradients; expected to pass"
    )

    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        return _deeplift(ctx, self.name, inputs, baselines, classes)


class DeepShap(Method):
    """DeepLIFT Rescale averaged over background references (Captum's DeepLiftShap, constituent-wise)."""

    name = "deepshap"
    capabilities = Capabilities(gradients=True, hooks=True, baseline="distribution", stochastic=False)
    paper_context: ClassVar[str] = (
        "DeepLIFT Rescale averaged over baselines drawn from data; Shapley-like split"
    )

    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        return _deeplift(ctx, self.name, inputs, baselines, classes)
