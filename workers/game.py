"""The masking game v(T) = target(f(x_T)), evaluated in bounded, batched chunks."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from workers.interactions import (
    FamilyIndex,
    all_subset_bits,
    moebius_dense_limited,
    popcounts,
    shapley_from_interactions,
    subsets_up_to,
)
from workers.players import Players, full_mask, subset_bits
from workers.targets import Target
from xaudit.contract.errors import InvalidInput, ResourceExhausted

if TYPE_CHECKING:  # the model stack (torch, onnx) loads only when a model does
    from workers.models.base import ModelAdapter

__all__ = ["MAX_EXACT_PLAYERS", "GameResult", "masked_from_bits", "masked_inputs", "masked_samples", "play"]

# Exact (all-order) work: 2^n forward passes per sample.
MAX_EXACT_PLAYERS = 16
# Dense order-limited bookkeeping stays below 2^22 entries; above, the caller passes a sparse family
# of sets (workers.audit.sets).
MAX_LIMITED_PLAYERS = 22

ProgressFn = Callable[[int, int], None]


def masked_inputs(x: np.ndarray, baseline: np.ndarray, players: Players, subsets: np.ndarray) -> np.ndarray:
    """x_T for each T: elements of players in T from x, the rest from the baseline (exact copies, no arithmetic)."""
    return masked_from_bits(subset_bits(subsets, players.n), x, baseline, players)


def masked_from_bits(bits: np.ndarray, x: np.ndarray, baseline: np.ndarray, players: Players) -> np.ndarray:
    """Sub-inputs from player membership ``bits`` (m, n)."""
    return masked_samples(bits, x[None], baseline[None], players)


def masked_samples(
    bits: np.ndarray, inputs: np.ndarray, baselines: np.ndarray, players: Players
) -> np.ndarray:
    """The sub-inputs of several samples, (k * m, *shape): for each of the k samples (with its own
    reference), one row per membership row of ``bits`` (m, n), in one pass."""
    keep = bits[None, :, players.labels]  # (1, m, *shape): True where the element comes from the input
    # Written into a C-ordered array: np.where's output takes its layout from the broadcast operands
    # (strides of 0), and flattening that to rows copied it again, element by element (3.5x the
    # whole masking at 8 players).
    masked = np.empty((len(inputs), len(bits), *inputs.shape[1:]), dtype=np.float32)
    np.copyto(masked, baselines[:, None])
    np.copyto(masked, inputs[:, None], where=keep)
    return masked.reshape(-1, *inputs.shape[1:])


# Sub-inputs of an exact game whose players are a few elements each (tabular features, small
# patches) are built by gathering through a cached (2^n, E) index table: the masked copy branches on
# every element and runs 1.4-7x slower there (several samples per call; one sample at 8 players:
# the same), while for players of tens of elements it is as fast or faster and needs no table
# (bench/suite.py, game). The table is capped at 8 MB (2^20 int64 entries).
_GATHER_ELEMENTS = 1 << 20
_GATHER_PLAYER_ELEMENTS = 8


def _gather_index(n: int, players: Players) -> np.ndarray | None:
    """(2^n, E) index of every subset's sub-input into [reference | input] (one sample's E elements
    side by side): element e of row T reads column e + E where T holds e's player, else column e.
    None where the masked copy is the better way (large players) or the table too large."""
    elements = players.labels.size
    if (2**n) * elements > _GATHER_ELEMENTS or elements > _GATHER_PLAYER_ELEMENTS * n:
        return None
    return _cached_gather_index(n, players.labels.astype(np.intp, copy=False).tobytes())


@lru_cache(maxsize=2)
def _cached_gather_index(n: int, labels: bytes) -> np.ndarray:
    owner = np.frombuffer(labels, dtype=np.intp)
    index = np.arange(owner.size, dtype=np.intp) + all_subset_bits(n)[:, owner] * np.intp(owner.size)
    index.flags.writeable = False
    return index


def gathered_samples(index: np.ndarray, inputs: np.ndarray, baselines: np.ndarray) -> np.ndarray:
    """What :func:`masked_samples` builds, (k * m, *shape), read through a gather index (m, E)."""
    k = len(inputs)
    sides = np.concatenate([baselines.reshape(k, -1), inputs.reshape(k, -1)], axis=1, dtype=np.float32)
    return np.take(sides, index, axis=1).reshape(k * len(index), *inputs.shape[1:])


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
    """The forward calls of a game of ``m`` sub-inputs per sample, at most ``rows`` rows each: whole
    samples together when they fit and share the model (one-input models), else one sample's chunks
    at a time (a model with held-fixed inputs binds them per sample: workers.inputs)."""
    per_call = rows // m
    if per_call > 1 and all(model.for_sample(s) is model for s in range(samples)):
        for first in range(0, samples, per_call):
            yield model, slice(first, first + per_call), slice(0, m)
        return
    for s in range(samples):
        bound = model.for_sample(s)
        for start in range(0, m, rows):
            yield bound, slice(s, s + 1), slice(start, start + rows)


def _check_finite(values: np.ndarray) -> None:
    """A NaN or infinite v(T) would reach every score and verdict as a number (or a JSON null)."""
    bad = ~np.isfinite(values)
    if bad.any():
        raise InvalidInput(
            f"the model's output is NaN or infinite on {int(bad.sum())} of {values.size} sub-inputs "
            f"(inputs with some players set to the reference, {values.shape[1]} per sample); the "
            "reference (--baseline) puts the model where it is not defined"
        )


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
    index = _gather_index(n, players) if exact_table else None
    done, total = 0, len(inputs) * len(evaluated)
    for call_model, samples, chunk in _calls(model, len(inputs), len(evaluated), rows):
        sub = bits[chunk]
        if index is None:
            sub_inputs = masked_samples(sub, inputs[samples], baselines[samples], players)
        else:
            sub_inputs = gathered_samples(index[chunk], inputs[samples], baselines[samples])
        out = call_model.predict(sub_inputs)
        cls = np.repeat(np.asarray(classes)[samples], len(sub))
        values[samples, chunk] = target.values(out, cls).reshape(-1, len(sub))
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
