"""Attribution jobs: run the requested methods on the inputs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from workers.methods import AttributionContext, attribute, get_method
from workers.metrics import observe_method
from workers.prepare import Prepared
from xaudit.contract.errors import NotApplicable

__all__ = ["ExplainResult", "explain"]

logger = logging.getLogger(__name__)

Progress = Callable[[float, str], None]


@dataclass
class ExplainResult:
    attributions: dict[str, np.ndarray] = field(default_factory=dict)  # method -> (B, *sample_shape)
    not_applicable: dict[str, str] = field(default_factory=dict)  # method -> reason
    seconds: dict[str, float] = field(default_factory=dict)


def method_context(prep: Prepared, name: str) -> AttributionContext:
    params = dict(prep.spec.method_params.get(name, {}))
    return AttributionContext(prep.model, prep.players, prep.target, params, prep.spec.seed)


def explain(prep: Prepared, methods: tuple[str, ...], progress: Progress | None = None) -> ExplainResult:
    result = ExplainResult()
    for k, name in enumerate(methods):
        if progress:
            progress(k / len(methods), f"attributing with {name}")
        method = get_method(name)
        started = time.perf_counter()
        try:
            result.attributions[name] = attribute(
                method, method_context(prep, name), prep.inputs, prep.baselines, prep.classes, prep.background
            )
        except NotApplicable as exc:
            logger.info("%s", exc)
            result.not_applicable[name] = exc.reason
        result.seconds[name] = time.perf_counter() - started
        observe_method(name, result.seconds[name])
    if progress:
        progress(1.0, "done")
    return result
