"""Checks of the game that can fail (docs/science.md, section 6): v(N) and v(empty) from the masked
batch against a separate plain evaluation of the model on the inputs and on the references.

The Moebius efficiency of an exactly enumerated game holds by construction and is not a check. These
can fail: a masking that does not reproduce x at T = N or b at T = empty, a model whose output depends
on the batch it is evaluated in, a target read from the wrong class.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workers.game import GameResult
from workers.prepare import Prepared

__all__ = ["GAME_CHECK_RTOL", "GameCheck", "check_failure", "game_checks"]

# Relative to the game's scale: float32 models give ~1e-7; batch-dependent kernels a little more.
GAME_CHECK_RTOL = 1e-4


def check_failure(name: str, max_abs_error: float) -> str:
    """The reason a failed check gives (``name``: "full" or "empty", as in GameCheck and the report)."""
    value = "v(N)" if name == "full" else "v(empty)"
    return f"{value} differs from the plain evaluation by {max_abs_error:.3g}"


@dataclass(frozen=True)
class GameCheck:
    name: str  # "full" (v(N) vs f(x)) or "empty" (v(empty) vs f(b))
    game: np.ndarray  # (B,)
    plain: np.ndarray  # (B,)
    tolerance: np.ndarray  # (B,)

    @property
    def max_abs_error(self) -> float:
        return float(np.abs(self.game - self.plain).max()) if len(self.game) else 0.0

    @property
    def passed(self) -> bool:
        return bool(np.all(np.abs(self.game - self.plain) <= self.tolerance))

    def section(self) -> dict[str, object]:
        return {
            "name": self.name,
            "passed": self.passed,
            "max_abs_error": self.max_abs_error,
            "game": self.game,
            "plain": self.plain,
            "tolerance": self.tolerance,
        }


def _plain(prep: Prepared, tensors: np.ndarray, classes: np.ndarray) -> np.ndarray:
    if prep.model.per_sample:  # held-fixed inputs differ per sample (workers.inputs)
        return np.concatenate(
            [
                prep.target.values(prep.model.for_sample(s).predict(tensors[s : s + 1]), classes[s : s + 1])
                for s in range(len(tensors))
            ]
        )
    return np.asarray(prep.target.values(prep.model.predict(tensors), classes), dtype=np.float64)


def game_checks(prep: Prepared, game: GameResult) -> tuple[GameCheck, GameCheck]:
    """v(N) against f(x) and v(empty) against f(b), sample by sample."""
    inputs = prep.inputs.astype(np.float32, copy=False)
    baselines = prep.baselines.astype(np.float32, copy=False)
    scale = np.abs(game.values).max(axis=1) + np.abs(game.full)
    tolerance = GAME_CHECK_RTOL * np.maximum(scale, 1.0)
    return (
        GameCheck("full", game.full, _plain(prep, inputs, game.classes), tolerance),
        GameCheck("empty", game.empty, _plain(prep, baselines, game.classes), tolerance),
    )
