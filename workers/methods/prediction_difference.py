"""Prediction Difference (Robnik-Sikonja & Kononenko 2008; Zintgraf et al. 2017): Occlusion-1 averaged
over references drawn from the background set."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from workers.methods._base import AttributionContext, Capabilities, Method
from workers.methods.occlusion import Occlusion1
from workers.players import Players
from workers.subgames import SubInputGame

__all__ = ["PredictionDifference"]


class PredictionDifference(Method):
    name = "prediction_difference"
    capabilities = Capabilities(gradients=False, hooks=False, baseline="distribution", stochastic=False)
    paper_context: ClassVar[str] = "Occlusion-1 averaged over baselines drawn from data (over-allocation)"

    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        return Occlusion1().attribute(ctx, inputs, baselines, classes)

    def from_game(self, params: Mapping[str, Any], players: Players, game: SubInputGame) -> np.ndarray | None:
        # One constituent: ``game`` is played against one background reference.
        return Occlusion1().from_game(params, players, game)
