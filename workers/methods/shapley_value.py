"""Shapley values of the masking game: exact over the present players up to a limit, permutation
sampling beyond it (workers.shapley_estimate; docs/science.md)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from workers.methods._base import AttributionContext, Capabilities, Method, derived_seed
from workers.players import Players
from workers.shapley_estimate import estimate_shapley
from workers.sub_inputs import masked_from_bits
from workers.subgames import SubInputGame, restricted_shapley
from workers.targets import Target
from xaudit.contract.params import parameter_defaults

if TYPE_CHECKING:  # importing it loads torch, which `xaudit methods` must not
    from workers.models.base import ModelAdapter

__all__ = ["ShapleyValue"]


class ShapleyValue(Method):
    name = "shapley_value"
    capabilities = Capabilities(gradients=False, hooks=False, baseline="single", stochastic=False)
    # Permutations per sample when more players are present than exact enumeration affords.
    defaults: ClassVar[dict[str, Any]] = parameter_defaults(
        "shapley_value"
    )  # declared in xaudit.contract.params
    paper_context: ClassVar[str] = (
        "equal split: each member gets the same share of each effect; expected to pass"
    )

    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        params = self.params(ctx)
        permutations = int(params["permutations"])  # bounds: checked by params (xaudit.contract.params)
        players = ctx.players
        out = np.zeros((len(inputs), players.n))
        for s, (x, b) in enumerate(zip(inputs, baselines, strict=True)):
            differs = (np.asarray(x) != np.asarray(b)).reshape(-1).astype(np.float64)
            present = np.bincount(players.labels.reshape(-1), weights=differs, minlength=players.n) > 0
            rng = np.random.default_rng(derived_seed(ctx.seed, self.name, s))
            value = functools.partial(
                _values, ctx.model.for_sample(s), ctx.target, players, x, b, int(classes[s])
            )
            out[s] = estimate_shapley(value, present, permutations, rng).values
        return players.spread(out)

    def from_game(self, params: Mapping[str, Any], players: Players, game: SubInputGame) -> np.ndarray | None:
        self.params_from(params)
        return restricted_shapley(game)


def _values(
    model: ModelAdapter,
    target: Target,
    players: Players,
    x: np.ndarray,
    b: np.ndarray,
    cls: int,
    bits: np.ndarray,
) -> np.ndarray:
    """v(T) for coalitions ``bits`` (r, n) of one sample, in the model's forward calls."""
    rows = model.rows_per_call(x.size)
    classes = np.full(rows, cls)
    values = np.empty(len(bits))
    for start in range(0, len(bits), rows):
        chunk = bits[start : start + rows]
        masked = masked_from_bits(chunk, x, b, players)
        values[start : start + len(chunk)] = target.values(model.predict(masked), classes[: len(chunk)])
    return values
