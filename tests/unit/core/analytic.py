"""Analytic models whose effects are known in closed form (docs/science.md, section 7)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["CubicTerm", "Polynomial"]


class Polynomial(nn.Module):
    """v = 2 x1 + 3 x1 x2 - x2 x3 x4 (players x1..x4 as features 0..3); a second, constant output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = 2 * x[:, 0] + 3 * x[:, 0] * x[:, 1] - x[:, 1] * x[:, 2] * x[:, 3]
        return torch.stack([v, torch.full_like(v, -100.0)], dim=1)


class CubicTerm(nn.Module):
    """v = x1^2 x2 + x3: Integrated Gradients splits x1^2 x2 by degree, 2/3 to x1 and 1/3 to x2."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = x[:, 0] ** 2 * x[:, 1] + x[:, 2]
        return torch.stack([v, torch.full_like(v, -100.0)], dim=1)
