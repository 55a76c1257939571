"""Method attributions on sub-inputs x_T, batched across sub-inputs and samples, summed per player."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from workers.audit.device_subinputs import DeviceSubInputs, on_device
from workers.device_budget import budget_scale
from workers.methods import AttributionContext, Method, derived_seed
from workers.methods._embedding import attributed_elements, run_method
from workers.models.base import ModelAdapter
from workers.players import Players, subset_bits
from workers.sub_inputs import masked_samples
from workers.subgames import SubInputGame
from workers.targets import Target

__all__ = ["SubInputAttributions", "attribute_sub_inputs", "from_per_player", "sub_inputs_from_game"]

# Elements of stacked sub-inputs handed to a method in one call: bounds memory for large inputs.
_MAX_ELEMENTS_PER_CALL = 16 * 1024 * 1024
# Sub-inputs per call, from several samples or from one sample's chunk: enough that a small model's
# call is not dominated by per-call set-up (at 512, the rule methods lost 8-10 points of throughput
# on the digits CNN: bench/suite.py, methods), few enough that progress (and a cancellation check)
# comes every few seconds. Fixed, not timed: how calls are cut decides stochastic methods' seeds.
_MAX_SUB_INPUTS_PER_CALL = 1024


@dataclass(frozen=True)
class SubInputAttributions:
    """Per-player attributions a_i(x_T): (B, m, n) over samples, subsets, players."""

    per_player: np.ndarray
    # Attribution mass given to players absent from T, and all mass, per sample: (B,), (B,).
    absent_mass: np.ndarray
    total_mass: np.ndarray


def attribute_sub_inputs(
    method: Method,
    model: ModelAdapter,
    players: Players,
    target: Target,
    params: dict[str, object],
    seed: int,
    inputs: np.ndarray,
    baselines: np.ndarray,
    classes: np.ndarray,
    subsets: np.ndarray,
    tick: Callable[[], None] | None = None,
) -> SubInputAttributions:
    """Run ``method`` on every x_T (T in ``subsets``) of every sample, each with its own reference ``baselines[s]``.

    For distribution methods the caller passes one background sample as the reference (constituent).
    ``tick`` is called after each batch of samples (progress; it may raise Cancelled).
    """
    n_samples, m, n = len(inputs), len(subsets), players.n
    sample_elements = attributed_elements(method, model, inputs)
    elements_per_call = _elements_per_call(method, model, params)
    rows_per_call = max(1, min(_MAX_SUB_INPUTS_PER_CALL, elements_per_call // max(1, sample_elements)))
    if m > rows_per_call:  # many sub-inputs (sampled sets above 10 players): one sample at a time
        return _attribute_in_chunks(
            method,
            model,
            players,
            target,
            params,
            seed,
            inputs,
            baselines,
            classes,
            subsets,
            rows_per_call,
            tick,
        )
    samples_per_call = max(
        1, min(elements_per_call // max(1, m * sample_elements), _MAX_SUB_INPUTS_PER_CALL // m)
    )
    if model.per_sample:  # held-fixed inputs differ per sample (workers.inputs)
        samples_per_call = 1
    out = np.empty((n_samples, m, n))
    steps = _steps(model, players)
    bits = subset_bits(subsets, n)
    for start in range(0, n_samples, samples_per_call):
        stop = min(n_samples, start + samples_per_call)
        # Seed per call: reproducible for the same inputs and memory bound.
        ctx = AttributionContext(
            model.for_sample(start), players, target, params, derived_seed(seed, "sub-inputs", start)
        )
        part = slice(start, stop)
        sums = steps.per_player(method, ctx, bits, inputs[part], baselines[part], classes[part])
        out[start:stop] = sums.reshape(stop - start, m, n)
        if tick is not None:
            tick()
    return from_per_player(out, subsets, n)


def _elements_per_call(method: Method, model: ModelAdapter, params: dict[str, object]) -> int:
    """Elements of sub-inputs per call: larger where they are built and attributed on a GPU
    (workers.device_budget), and shared among the passes a row costs (Integrated Gradients' steps),
    so that progress and a cancellation check come as often for every method. At 224x224 a call of
    111 sub-inputs took 9 s of Gradient x Input on resnet18, and over ten minutes of Integrated
    Gradients at 64 steps before calls were cut by passes. Stochastic methods keep the CPU's calls:
    their seeds follow how the calls are cut, so a job draws the same noise on any device."""
    if method.capabilities.stochastic:
        return _MAX_ELEMENTS_PER_CALL
    scale = budget_scale(model.device) if on_device(model) else 1
    return max(1, _MAX_ELEMENTS_PER_CALL * scale // method.passes_per_row(params))


class _HostSubInputs:
    """Sub-inputs built, attributed and summed per player in numpy (the CPU's path)."""

    def __init__(self, players: Players) -> None:
        self._players = players

    def per_player(
        self,
        method: Method,
        ctx: AttributionContext,
        bits: np.ndarray,
        inputs: np.ndarray,
        baselines: np.ndarray,
        classes: np.ndarray,
    ) -> np.ndarray:
        """As :meth:`DeviceSubInputs.per_player`."""
        m = len(bits)
        batch = masked_samples(bits, inputs, baselines, self._players)
        elements = run_method(method, ctx, batch, np.repeat(baselines, m, axis=0), np.repeat(classes, m))
        return self._players.sum_per_player(elements)


def _steps(model: ModelAdapter, players: Players) -> _HostSubInputs | DeviceSubInputs:
    return DeviceSubInputs(players, model.device) if on_device(model) else _HostSubInputs(players)


def _attribute_in_chunks(
    method: Method,
    model: ModelAdapter,
    players: Players,
    target: Target,
    params: dict[str, object],
    seed: int,
    inputs: np.ndarray,
    baselines: np.ndarray,
    classes: np.ndarray,
    subsets: np.ndarray,
    rows: int,
    tick: Callable[[], None] | None,
) -> SubInputAttributions:
    """As :func:`attribute_sub_inputs`, ``rows`` sub-inputs of one sample per call: a method's memory
    (activations, hooks) stays bounded however many sets are audited."""
    n_samples, m, n = len(inputs), len(subsets), players.n
    out = np.empty((n_samples, m, n))
    steps = _steps(model, players)
    for s in range(n_samples):
        sample = slice(s, s + 1)
        for first in range(0, m, rows):
            bits = subset_bits(subsets[first : first + rows], n)
            ctx = AttributionContext(
                model.for_sample(s), players, target, params, derived_seed(seed, "sub-inputs", s, first)
            )
            sums = steps.per_player(method, ctx, bits, inputs[sample], baselines[sample], classes[sample])
            out[s, first : first + len(bits)] = sums
            if tick is not None:
                tick()
    return from_per_player(out, subsets, n)


def from_per_player(per_player: np.ndarray, subsets: np.ndarray, n: int) -> SubInputAttributions:
    """Absent-unit and total mass measured on (B, m, n) sub-input attributions."""
    magnitude = np.abs(per_player)
    absent = (magnitude * (~subset_bits(subsets, n))[None]).sum(axis=(1, 2))
    return SubInputAttributions(per_player, absent, magnitude.sum(axis=(1, 2)))


def sub_inputs_from_game(
    method: Method, params: dict[str, object], players: Players, game: SubInputGame
) -> SubInputAttributions | None:
    """The method's attributions on every x_T read off the game (no model evaluation), or None where
    the method is not a function of the game or the sets are not downward closed."""
    per_player = method.from_game(params, players, game)
    return None if per_player is None else from_per_player(per_player, game.subsets, players.n)
