"""Checks of the game that can fail (docs/science.md, section 6): v(N) and v(empty) from the masked
batch against a separate plain evaluation of the model on the inputs and on the references, and
that plain evaluation at the references against one at the references moved by a hair
(:mod:`workers.nudge`).

The Moebius efficiency of an exactly enumerated game holds by construction and is not a check. These
can fail: a masking that does not reproduce x at T = N or b at T = empty, a model whose output depends
on the batch it is evaluated in, a target read from the wrong class, a model whose output at the
reference is rounding noise rather than a value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workers.game import GameResult
from workers.nudge import NUDGE, nudge_test
from workers.prepare import Prepared

__all__ = ["GAME_CHECK_RTOL", "GameCheck", "check_failure", "game_checks"]

# Relative to the game's scale: float32 models give ~1e-7; batch-dependent kernels a little more.
GAME_CHECK_RTOL = 1e-4
_UNSEEN = 1e-2  # of the game's range: the reference check's floor (game_checks)


def check_failure(name: str, max_abs_error: float) -> str:
    """The reason a failed check gives (``name`` as in GameCheck and the report)."""
    if name == "reference":
        return (
            f"the model's output at the reference moves by {max_abs_error:.3g} when the reference "
            f"moves by {NUDGE:g} of the inputs' scale, and not ten times as much for a step ten times "
            "as large: it is rounding noise there, not a value (a normalisation of a map the "
            "reference makes constant, for one); choose another baseline: blur, or one from data"
        )
    value = "v(N)" if name == "full" else "v(empty)"
    return (
        f"{value} differs from the plain evaluation by {max_abs_error:.3g}; make the model "
        "deterministic across batches before judging"
    )


@dataclass(frozen=True)
class GameCheck:
    # "full" (v(N) vs f(x)), "empty" (v(empty) vs f(b)) or "reference" (f(b) vs f(b nudged))
    name: str
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


def game_checks(prep: Prepared, game: GameResult) -> tuple[GameCheck, GameCheck, GameCheck]:
    """v(N) against f(x), v(empty) against f(b), and f(b) against f at b moved by NUDGE of the sample's
    scale max |x - b|, sample by sample. That last one's tolerance is a hundredth of the game's range
    max |v(T) - v(empty)| (or the others' tolerance, if larger), or a third of the change a step ten
    times as large makes: a model with a value at b, however steep, changes about ten times as much
    there; rounding noise changes as much (:mod:`workers.nudge`)."""
    inputs = prep.inputs.astype(np.float32, copy=False)
    baselines = prep.baselines.astype(np.float32, copy=False)
    scale = np.abs(game.values).max(axis=1) + np.abs(game.full)
    tolerance = GAME_CHECK_RTOL * np.maximum(scale, 1.0)
    # Ids have no neighbours: a nudged id is another id, or none (a nudge of 0 checks nothing).
    spread = np.abs(inputs - baselines).reshape(len(inputs), -1).max(axis=1)
    # Below a hundredth of the game's range, a change is one no criterion (judged to 0.05 of the
    # effect mass) can see: a dynamically quantized model's one-step jump (1.1e-4 on a game of range
    # 0.07, 1 of 40 nudges; tests/unit/models/test_batch_coupling.py) is not noise that matters.
    unseen = np.maximum(tolerance, _UNSEEN * np.abs(game.values - game.empty[:, None]).max(axis=1))
    reference = nudge_test(
        lambda rows: _plain(prep, rows, game.classes),
        baselines,
        0.0 if prep.model.takes_ids else spread,
        unseen,
    )
    return (
        GameCheck("full", game.full, _plain(prep, inputs, game.classes), tolerance),
        GameCheck("empty", game.empty, reference.at, tolerance),
        GameCheck("reference", reference.at, reference.near, reference.tolerance),
    )
