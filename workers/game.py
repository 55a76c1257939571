"""The masking game v(T) = target(f(x_T)), evaluated in bounded, batched chunks."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from workers.device_budget import equal_parts
from workers.interactions import (
    FamilyIndex,
    all_subset_bits,
    moebius_dense_limited,
    popcounts,
    shapley_from_interactions,
    subsets_up_to,
)
from workers.players import Players, full_mask, subset_bits
from workers.sub_inputs import ExactSubInputs, masked_samples
from workers.targets import Target
from xaudit.contract.errors import InvalidInput, ResourceExhausted

if TYPE_CHECKING:  # the model stack (torch, onnx) loads only when a model does
    from workers.device_rows import GameRows
    from workers.models.base import ModelAdapter

__all__ = ["MAX_EXACT_PLAYERS", "GameResult", "play"]

# Exact (all-order) work: 2^n forward passes per sample.
MAX_EXACT_PLAYERS = 16
# Dense order-limited bookkeeping stays below 2^22 entries; above, the caller passes a sparse family
# of sets (workers.audit.sets).
MAX_LIMITED_PLAYERS = 22

ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class GameResult:
    """v and I over ``subsets`` (bitmasks, all of them when exact) for each of B samples."""

    n: int
    order: int
    subsets: np.ndarray  # (m,) uint64
    values: np.ndarray  # (B, m) v(T)
    full: np.ndarray  # (B,) v(N), evaluated directly (also in order-limited mode)
    interactions: np.ndarray  # (B, m) I(S)
    classes: np.ndarray  # (B,) target class per sample
    # Survey weights of sampled sets (workers.audit.sets): sums over sets estimate sums over all
    # sets of those orders. None: every set counts once.
    weights: np.ndarray | None = None

    @property
    def exact(self) -> bool:
        return self.order >= self.n

    @property
    def empty(self) -> np.ndarray:
        return self.values[:, 0]

    @property
    def efficiency_error(self) -> np.ndarray:
        """|v(N) - v(empty) - sum_S I(S)|: 0 up to rounding when exact, the high-order remainder otherwise
        (unweighted: the audit's weighted remainder is workers.audit.unaudited)."""
        return np.abs(self.full - self.empty - self.interactions[:, 1:].sum(axis=1))

    def shapley(self) -> np.ndarray:
        """Exact Shapley values (B, n) when exact; the order-limited approximation otherwise."""
        return shapley_from_interactions(self.subsets, self.interactions, self.n)


_Call = tuple["ModelAdapter", slice, slice]  # the model, the samples, the sub-inputs of one call


def _calls(model: ModelAdapter, samples: int, m: int, rows: int) -> Iterator[_Call]:
    """The forward calls of a game of ``m`` sub-inputs per sample, at most ``rows`` rows each and of
    equal size where they can be (:func:`workers.device_budget.equal_parts`): whole samples together
    when they fit and share the model (one-input models), else one sample's chunks at a time (a
    model with held-fixed inputs binds them per sample: workers.inputs)."""
    per_call = rows // m
    if per_call > 1 and all(model.for_sample(s) is model for s in range(samples)):
        per_call = equal_parts(samples, per_call)
        for first in range(0, samples, per_call):
            yield model, slice(first, first + per_call), slice(0, m)
        return
    rows = equal_parts(m, rows)
    for s in range(samples):
        bound = model.for_sample(s)
        for start in range(0, m, rows):
            yield bound, slice(s, s + 1), slice(start, min(start + rows, m))


def _check_finite(values: np.ndarray) -> None:
    """A NaN or infinite v(T) would reach every score and verdict as a number (or a JSON null)."""
    bad = ~np.isfinite(values)
    if bad.any():
        raise InvalidInput(
            f"the model's output is NaN or infinite on {int(bad.sum())} of {values.size} sub-inputs "
            f"(inputs with some players set to the reference, {values.shape[1]} per sample); the "
            "reference (--baseline) puts the model where it is not defined"
        )


def _rows_on_device(model: ModelAdapter, players: Players, bits: np.ndarray, calls: int) -> GameRows | None:
    """The sub-inputs built where the model runs, on a GPU that takes them there, for a game of
    several ``calls`` (workers.device_rows). On an H200 the 16-player digits game took 4.96 ms at
    16,384 rows per call against 8.0 ms with the half tables, while the 8-player game, one call of
    1,024 rows, took 0.84 ms against 0.60 ms: sending the labels and subsets costs more than it
    saves there (README, GPU; bench/game_calls.py). None on the CPU (no model takes device rows there),
    where the half tables are fastest."""
    if not model.takes_device_rows or calls < 2:
        return None
    from workers.device_rows import GameRows  # torch: only with a model on a GPU

    return GameRows(players, bits, model.device)


def play(
    model: ModelAdapter,
    inputs: np.ndarray,
    baselines: np.ndarray,
    players: Players,
    target: Target,
    classes: np.ndarray,
    order: int | None = None,
    progress: ProgressFn | None = None,
    family: FamilyIndex | None = None,
) -> GameResult:
    """Evaluate v on every T (or every |T| <= order) for each sample; Moebius-transform to I(S).

    ``family``: an indexed, downward-closed set of bitmasks to play instead (the sub-inputs of
    sampled sets, indexed once per audit: workers.audit.sets); then I(S) comes from a sparse
    transform over the family and nothing is 2^n.
    """
    n = players.n
    order = n if order is None else min(order, n)
    if family is None:
        if order >= n and n > MAX_EXACT_PLAYERS:
            raise ResourceExhausted(
                f"{n} players: exact games are capped at {MAX_EXACT_PLAYERS}; set an audit order"
            )
        if n > MAX_LIMITED_PLAYERS:
            raise ResourceExhausted(
                f"{n} players: order-limited games are capped at {MAX_LIMITED_PLAYERS} players"
            )
        subsets = subsets_up_to(n, order)
    else:
        subsets = family.subsets
        order = int(popcounts(subsets).max()) if len(subsets) else 0
    grand = full_mask(n)
    needs_full = order < n
    evaluated = np.concatenate([subsets, grand]) if needs_full else subsets
    values = np.empty((len(inputs), len(evaluated)))
    rows = model.rows_per_call(math.prod(inputs.shape[1:]))  # math.prod: np.prod of a tuple costs ~25 us
    # once: (m, n) bool; every subset in bitmask order is the same table for every call at this n
    exact_table = family is None and not needs_full and n <= MAX_EXACT_PLAYERS
    bits = all_subset_bits(n) if exact_table else subset_bits(evaluated, n)
    done, total = 0, len(inputs) * len(evaluated)
    exact: ExactSubInputs | None = None
    exact_for: slice | None = None  # the samples ``exact`` holds: built once per group of samples
    calls = list(_calls(model, len(inputs), len(evaluated), rows))
    on_device = _rows_on_device(model, players, bits, len(calls))
    for call_model, samples, chunk in calls:
        if on_device is not None:
            out = call_model.predict_rows(on_device.rows(samples, chunk, inputs, baselines))
        else:
            if exact_table and exact_for != samples:
                exact, exact_for = (
                    ExactSubInputs.build(n, players, inputs[samples], baselines[samples]),
                    samples,
                )
            if exact is not None:
                sub_inputs = exact.rows(chunk.start, chunk.stop)
            else:
                sub_inputs = masked_samples(bits[chunk], inputs[samples], baselines[samples], players)
            out = call_model.predict(sub_inputs)
        per_sample = chunk.stop - chunk.start
        cls = np.repeat(np.asarray(classes)[samples], per_sample)
        values[samples, chunk] = target.values(out, cls).reshape(-1, per_sample)
        done += len(cls)
        if progress:
            progress(done, total)
    _check_finite(values)
    game_values = values[:, : len(subsets)]
    full = values[:, -1]
    if family is None:
        interactions = moebius_dense_limited(subsets, game_values, n)
    else:
        interactions = family.moebius(game_values)
    return GameResult(n, order, subsets, game_values, full, interactions, np.asarray(classes))
