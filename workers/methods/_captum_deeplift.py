"""Captum's DeepLift with the Softmax rule Captum itself adopted after 0.9.0: the Rescale multiplier
of every other nonlinearity, ``grad_output * (y - y0) / (x - x0)`` (docs/science.md 5.8).

Captum 0.9.0 subtracts the mean of those multipliers over the whole tensor, every row of the batch
included. A row's attributions then depend on the rows that share its pass, so the scores changed
with the pass size, and they no longer add up to f(x) - f(x0). Captum removed the step upstream
(meta-pytorch/captum#1367, pull request #1849), in no release yet."""

from __future__ import annotations

import torch
from captum.attr import DeepLift
from captum.attr._core.deep_lift import nonlinear
from torch import nn

__all__ = ["RowwiseDeepLift", "corrected"]


def corrected(module: nn.Module) -> bool:
    """Whether RowwiseDeepLift takes ``module`` with its own rule instead of Captum's (exactly
    nn.Softmax, the class Captum's rule is keyed on)."""
    return type(module) is nn.Softmax


class RowwiseDeepLift(DeepLift):  # type: ignore[misc]  # captum ships no type information
    """Captum's DeepLift whose Softmax multipliers are computed row by row, as its other rules are."""

    def _backward_hook(
        self, module: nn.Module, grad_input: torch.Tensor, grad_output: torch.Tensor
    ) -> torch.Tensor:
        if not corrected(module) or not self.satisfies_attribute_criteria(module):
            return super()._backward_hook(module, grad_input, grad_output)  # its own checks and errors
        multipliers = nonlinear(module, module.input, module.output, grad_input, grad_output, eps=self.eps)
        del module.input, module.output  # as Captum's hook does: the next pass sets them again
        return multipliers
