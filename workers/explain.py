"""Attribution jobs: run the requested methods on the inputs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from workers.methods import AttributionContext, Method, attribute, get_method, release_derived
from workers.methods._isolation import judged_alone
from workers.metrics import observe_method
from workers.players import full_mask
from workers.prepare import Prepared
from workers.subgames import SubInputGame, subset_positions
from xaudit.contract.errors import NotApplicable

__all__ = ["ExplainResult", "explain", "job_params", "method_context"]

logger = logging.getLogger(__name__)

Progress = Callable[[float, str], None]


@dataclass
class ExplainResult:
    attributions: dict[str, np.ndarray] = field(default_factory=dict)  # method -> (B, *sample_shape)
    not_applicable: dict[str, str] = field(default_factory=dict)  # method -> reason
    seconds: dict[str, float] = field(default_factory=dict)


def job_params(prep: Prepared, name: str) -> dict[str, object]:
    """The job's parameters of method ``name``, with those fixed per job (e.g. Deep Taylor's input
    bounds) bound from all of the job's inputs and references: the maps and the audit use these."""
    given = dict(prep.spec.method_params.get(name, {}))
    references = (prep.baselines,) if prep.background is None else (prep.baselines, prep.background)
    return get_method(name).bind(given, prep.inputs, references)


def method_context(prep: Prepared, name: str) -> AttributionContext:
    return AttributionContext(prep.model, prep.players, prep.target, job_params(prep, name), prep.spec.seed)


def _from_game(prep: Prepared, name: str, game: SubInputGame | None) -> np.ndarray | None:
    """The map of a game-derived method read off a game played on the inputs themselves (with the
    job's reference), when that game includes the full set; None otherwise."""
    method = get_method(name)
    if game is None or method.capabilities.baseline != "single":
        return None
    full = subset_positions(game.subsets, full_mask(game.n))
    if full is None:
        return None
    per_player = method.from_game(dict(prep.spec.method_params.get(name, {})), prep.players, game)
    return None if per_player is None else prep.players.spread(per_player[:, int(full[0])])


def explain(
    prep: Prepared,
    methods: tuple[str, ...],
    progress: Progress | None = None,
    game: SubInputGame | None = None,
) -> ExplainResult:
    """Maps of ``methods`` on the inputs; methods that are functions of the game read ``game`` (played
    on ``prep.inputs`` against ``prep.baselines``) instead of evaluating the model again."""
    result = ExplainResult()
    for k, name in enumerate(methods):
        if progress:
            progress(k / len(methods), f"attributing with {name}")
        method = get_method(name)
        started = time.perf_counter()
        try:
            with judged_alone(name):
                result.attributions[name] = _attribute(prep, name, method, game)
        except NotApplicable as exc:
            logger.info("%s", exc)
            result.not_applicable[name] = exc.reason
        finally:
            release_derived()  # the next method derives its own (workers.methods.release_derived)
        result.seconds[name] = time.perf_counter() - started
        observe_method(name, result.seconds[name])
    if progress:
        progress(1.0, "done")
    return result


def _attribute(prep: Prepared, name: str, method: Method, game: SubInputGame | None) -> np.ndarray:
    derived = _from_game(prep, name, game)
    if derived is not None:
        return derived
    return attribute(
        method, method_context(prep, name), prep.inputs, prep.baselines, prep.classes, prep.background
    )
