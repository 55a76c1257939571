"""The torch module that reads a target's per-class scores off a model (kept apart: it needs torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from workers.targets import Target

__all__ = ["TargetModule"]


class TargetModule(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, target: Target) -> None:
        super().__init__()
        self.model = model
        self.target = target

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        out = out.reshape(out.shape[0], -1)
        return out if self.target.kind == "logit" else self.target.transform(out)
