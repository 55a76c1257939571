"""Exact Shapley values from the game: phi_i = sum over S containing i of I(S) / |S|."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from workers.game import MAX_EXACT_PLAYERS, play
from workers.methods._base import AttributionContext, Capabilities, Method
from workers.players import Players
from workers.subgames import SubInputGame, restricted_shapley
from xaudit.contract.errors import NotApplicable

__all__ = ["ShapleyValue"]


class ShapleyValue(Method):
    name = "shapley_value"
    capabilities = Capabilities(gradients=False, hooks=False, baseline="single", stochastic=False)
    paper_context: ClassVar[str] = "equal split: each member gets the same share of each effect; expected to pass"

    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        if ctx.players.n > MAX_EXACT_PLAYERS:
            raise NotApplicable(self.name, f"exact Shapley values need at most {MAX_EXACT_PLAYERS} players")
        game = play(ctx.model, inputs, baselines, ctx.players, ctx.target, classes)
        return ctx.players.spread(game.shapley())

    def from_game(self, params: Mapping[str, Any], players: Players, game: SubInputGame) -> np.ndarray | None:
        self.params_from(params)
        return restricted_shapley(game)
