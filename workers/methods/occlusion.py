"""Occlusion (Zeiler & Fergus 2014): the drop in the target when units are replaced by the reference.

Attributions are per element: a player's score is shared equally by its elements, so that summing
per player gives back the occlusion difference exactly (Captum's FeatureAblation gives every
element the whole difference instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from workers.methods._base import AttributionContext, Capabilities, Method
from workers.methods._perturbation import removal_deltas
from workers.players import Players
from workers.subgames import SubInputGame, restricted_removals
from xaudit.contract.errors import InvalidInput
from xaudit.contract.params import parameter_defaults

__all__ = ["Occlusion1", "OcclusionPatch", "patch_windows"]


class Occlusion1(Method):
    """Occludes one player at a time: a_i = v(N) - v(N minus i)."""

    name = "occlusion_1"
    capabilities = Capabilities(gradients=False, hooks=False, baseline="single", stochastic=False)
    paper_context: ClassVar[str] = "gives the whole effect of S to every member of S (over-allocation)"

    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        removed = np.eye(ctx.players.n, dtype=bool)
        return ctx.players.spread(removal_deltas(ctx, inputs, baselines, classes, removed))

    def from_game(self, params: Mapping[str, Any], players: Players, game: SubInputGame) -> np.ndarray | None:
        self.params_from(params)
        return restricted_removals(game, np.eye(players.n, dtype=bool))


def _parse_pair(value: Any, what: str) -> tuple[int, int]:
    text = str(value).lower()
    try:
        rows, cols = (int(v) for v in text.split("x")) if "x" in text else (int(text), int(text))
    except ValueError:
        raise InvalidInput(f"occlusion_patch {what} '{value}': expected RxC, e.g. 2x2") from None
    if rows < 1 or cols < 1:
        raise InvalidInput(f"occlusion_patch {what} '{value}' must be positive")
    return rows, cols


def patch_windows(layout: tuple[int, ...], window: tuple[int, int], stride: tuple[int, int]) -> np.ndarray:
    """(w, n) bool: the players covered by each window sliding over the players' grid layout; over a
    volume's (depth, rows, cols) layout, over the rows and columns of each depth slab."""
    *depth, rows, cols = layout
    slabs = depth[0] if depth else 1
    wr, wc = min(window[0], rows), min(window[1], cols)
    grid = np.arange(slabs * rows * cols).reshape(slabs, rows, cols)
    starts_r = sorted({*range(0, rows - wr + 1, stride[0]), rows - wr})
    starts_c = sorted({*range(0, cols - wc + 1, stride[1]), cols - wc})
    placed = [(d, r, c) for d in range(slabs) for r in starts_r for c in starts_c]
    windows = np.zeros((len(placed), slabs * rows * cols), dtype=bool)
    for k, (d, r, c) in enumerate(placed):
        windows[k, grid[d, r : r + wr, c : c + wc].ravel()] = True
    return windows


class OcclusionPatch(Method):
    """Occludes windows of players (default 2x2 players, stride one player; 1x2 for a row of players).

    Each player receives the mean difference of the windows that cover it (Captum's convention for
    overlapping windows).
    """

    name = "occlusion_patch"
    capabilities = Capabilities(gradients=False, hooks=False, baseline="single", stochastic=False)
    defaults: ClassVar[dict[str, Any]] = parameter_defaults(
        "occlusion_patch"
    )  # declared in xaudit.contract.params
    paper_context: ClassVar[str] = "gives the whole effect to every unit of every patch that S touches"

    def attribute(
        self, ctx: AttributionContext, inputs: np.ndarray, baselines: np.ndarray, classes: np.ndarray
    ) -> np.ndarray:
        windows = self._windows(self.params(ctx), ctx.players)
        deltas = removal_deltas(ctx, inputs, baselines, classes, windows)  # (k, w)
        return ctx.players.spread(_mean_over_windows(deltas, windows))

    def from_game(self, params: Mapping[str, Any], players: Players, game: SubInputGame) -> np.ndarray | None:
        windows = self._windows(self.params_from(params), players)
        deltas = restricted_removals(game, windows)  # (B, m, w)
        return None if deltas is None else _mean_over_windows(deltas, windows)

    @staticmethod
    def _windows(p: Mapping[str, Any], players: Players) -> np.ndarray:
        return patch_windows(
            players.layout, _parse_pair(p["window"], "window"), _parse_pair(p["stride"], "stride")
        )


def _mean_over_windows(deltas: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """(..., w) window differences -> (..., n): each player gets the mean of the windows covering it."""
    coverage = windows.sum(axis=0)  # windows per player
    return deltas @ windows.astype(np.float64) / np.maximum(coverage, 1)
