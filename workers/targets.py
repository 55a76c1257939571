"""Targets: the scalar read from the model output that the game and every method explain."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from xaudit.contract.errors import InvalidInput
from xaudit.contract.subspecs import parse_target as parse_target_spec

if TYPE_CHECKING:  # torch loads lazily: the service parses targets without it
    import torch

__all__ = ["Target", "parse_target"]

TargetKind = Literal["logit", "prob", "logodds"]


@dataclass(frozen=True)
class Target:
    """``kind`` of score for class ``fixed_class`` (None: the class predicted for the full input)."""

    kind: TargetKind = "logit"
    fixed_class: int | None = None
    spec: str = "predicted"
    # A named model output to read instead of the first floating-point one (``output:NAME[INDEX]``).
    output: str | None = None

    def resolve_classes(self, outputs: np.ndarray) -> np.ndarray:
        """Class per sample from the full inputs' outputs (k, C)."""
        k, classes = outputs.shape
        if self.fixed_class is not None:
            if not 0 <= self.fixed_class < classes:
                raise InvalidInput(
                    f"target class {self.fixed_class} is out of range: the model has {classes} outputs"
                )
            return np.full(k, self.fixed_class, dtype=np.int64)
        return outputs.argmax(axis=1).astype(np.int64)

    def values(self, outputs: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """Target values (k,) float64 from raw outputs (k, C)."""
        if self.kind == "logit":  # hot path of the game: no transform
            return outputs[np.arange(len(classes)), classes].astype(np.float64)
        scores = self.transform_np(outputs.astype(np.float64))
        return scores[np.arange(len(classes)), classes]

    def transform_np(self, outputs: np.ndarray) -> np.ndarray:
        import torch

        return self.transform(torch.from_numpy(outputs)).numpy()

    def transform(self, outputs: torch.Tensor) -> torch.Tensor:
        """Raw outputs (k, C) -> per-class target scores (k, C)."""
        import torch

        if self.kind == "logit":
            return outputs
        if outputs.shape[1] == 1:
            # One output: a binary model's logit.
            log_p = torch.nn.functional.logsigmoid(outputs)
            log_q = torch.nn.functional.logsigmoid(-outputs)
        else:
            log_p = torch.log_softmax(outputs, dim=1)
            log_q = torch.log1p(-torch.exp(log_p).clamp(max=1 - 1e-12))
        return torch.exp(log_p) if self.kind == "prob" else log_p - log_q

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """A module giving per-class target scores, so Captum/Zennit can select a class by index."""
        from workers._target_module import TargetModule

        return TargetModule(module, self)


def parse_target(spec: str) -> Target:
    """``predicted`` (default: logit of the predicted class), ``class:K``, ``logit[:K]``, ``prob[:K]``,
    ``logodds[:K]``, ``output:NAME[INDEX]``: the contract's parse (xaudit.contract.subspecs), as a Target."""
    parsed = parse_target_spec(spec)
    return Target(parsed.kind, parsed.fixed_class, parsed.text, parsed.output)
