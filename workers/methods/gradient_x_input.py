"""Gradient x Input: (x - b) * d target / dx, the first-order Taylor term at the reference."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from workers.methods._base import AttributionContext, Capabilities, Method

__all__ = ["GradientXInput"]


class GradientXInput(Method):
    """With the default zero reference this is the classic x * grad (Captum's InputXGradient)."""

    name = "gradient_x_input"
    capabilities = Capabilities(gradients=True, hooks=False, baseline="single", stochastic=False)
    paper_context: ClassVar[str] = "allocates only the first-order Taylor term; drops the rest"

    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        from workers.methods._autograd import target_gradients  # torch only when computing

        return ((inputs - baselines) * target_gradients(ctx, inputs, classes)).astype(np.float32)
