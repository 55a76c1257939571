"""Sub-inputs x_T (docs/science.md section 2): every element from the input where T holds its player,
else from the reference, bit for bit (the one arithmetic allowed is adding -0.0, see ExactSubInputs)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from workers.interactions import all_subset_bits
from workers.players import Players

__all__ = ["ExactSubInputs", "masked_from_bits", "masked_samples"]


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


# Tables of ExactSubInputs per group of samples, at most (low and high halves, float32). At 16 players
# that admits inputs of up to 16,384 elements (one sample per call); larger ones take the masked copy.
_TABLE_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class _Halves:
    """The players split into a low half (players 0..low-1) and a high half; per half, which elements
    each of its subsets (bitmask order) takes from the input."""

    low: int
    low_keep: np.ndarray  # (2^low, E) bool
    high_keep: np.ndarray  # (2^(n - low), E) bool
    low_owned: np.ndarray  # (E,) bool: the element's player is in the low half


@lru_cache(maxsize=4)
def _halves(n: int, low: int, labels: bytes) -> _Halves:
    owner = np.frombuffer(labels, dtype=np.int64)
    low_owned = owner < low
    low_keep = all_subset_bits(low)[:, np.where(low_owned, owner, 0)] & low_owned
    high_keep = all_subset_bits(n - low)[:, np.where(low_owned, 0, owner - low)] & ~low_owned
    for array in (low_keep, high_keep, low_owned):
        array.flags.writeable = False
    return _Halves(low, low_keep, high_keep, low_owned)


def _table(keep: np.ndarray, x: np.ndarray, fill: np.ndarray) -> np.ndarray:
    """(k, rows, E) float32, C-ordered (np.where would lay it out after its broadcast operands, and
    the additions then read it with strides): ``x`` where ``keep``, else ``fill``."""
    table = np.empty((len(x), *keep.shape), dtype=np.float32)
    np.copyto(table, fill)
    np.copyto(table, x, where=keep)
    return table


class ExactSubInputs:
    """Every subset's sub-input of a few samples, in bitmask order, built as the sum of two small
    tables: row T = L[T's low players] + H[T's high players]. Each element belongs to one half; the
    other half's table holds -0.0 there, and v + (-0.0) is v bit for bit for every float, so the rows
    are the same exact copies as :func:`masked_samples` builds. An addition needs no branch per
    element, a masked copy does: 2.4x faster at 8 players of the digits CNN, 10-11x at 16 players
    and for 16 tabular features, 6-9x on 3x32x32 and 3x224x224 images (bench/suite.py, game)."""

    def __init__(self, halves: _Halves, inputs: np.ndarray, baselines: np.ndarray) -> None:
        k = len(inputs)
        x = inputs.reshape(k, 1, -1)
        reference = baselines.reshape(k, 1, -1)
        self._shape = inputs.shape[1:]
        self._low = halves.low
        self._low_table = _table(halves.low_keep, x, np.where(halves.low_owned, reference, -0.0))
        self._high_table = _table(halves.high_keep, x, np.where(halves.low_owned, -0.0, reference))

    @classmethod
    def build(
        cls, n: int, players: Players, inputs: np.ndarray, baselines: np.ndarray
    ) -> ExactSubInputs | None:
        """The tables for these samples, or None where they would outgrow :data:`_TABLE_BYTES`."""
        low = n // 2  # 2^low + 2^(n - low) table rows: the fewest
        rows = 2**low + 2 ** (n - low)
        if len(inputs) * rows * players.labels.size * 4 > _TABLE_BYTES:
            return None
        labels = players.labels.astype(np.int64, copy=False).tobytes()
        return cls(_halves(n, low, labels), inputs, baselines)

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Sub-inputs of subsets ``start`` .. ``stop - 1`` for every sample: (k * (stop - start), *shape)."""
        k, span = len(self._low_table), 2**self._low
        out = np.empty((k, stop - start, self._low_table.shape[-1]), dtype=np.float32)
        # Subsets in bitmask order come in runs of 2^low that share their high players: a partial run
        # at each end (one addition each), the whole runs between them in one broadcast addition.
        whole_from = min(stop, -(-start // span) * span)
        whole_to = max(whole_from, stop // span * span)
        for first, last in ((start, whole_from), (whole_to, stop)):
            if first < last:
                high, low = divmod(first, span)
                np.add(
                    self._high_table[:, high : high + 1],
                    self._low_table[:, low : low + last - first],
                    out=out[:, first - start : last - start],
                )
        if whole_from < whole_to:
            runs = (whole_to - whole_from) // span
            np.add(
                self._high_table[:, whole_from // span : whole_to // span, None],
                self._low_table[:, None],
                out=out[:, whole_from - start : whole_to - start].reshape(k, runs, span, -1),
            )
        return out.reshape(k * (stop - start), *self._shape)
