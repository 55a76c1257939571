"""Forward-only helpers: target values with sets of players replaced by the reference."""

from __future__ import annotations

import numpy as np

from workers.methods._base import AttributionContext

__all__ = ["removal_deltas"]

# Rows of masked inputs built at once: bounds memory for large inputs.
_ROWS_PER_STEP = 2048


def removal_deltas(
    ctx: AttributionContext,
    inputs: np.ndarray,
    baselines: np.ndarray,
    classes: np.ndarray,
    removed: np.ndarray,
) -> np.ndarray:
    """v(x) - v(x with the players of ``removed[w]`` at the reference), shape (k, w).

    ``removed`` is (w, n) bool over players; replacement copies reference values (no arithmetic).
    """
    element_removed = removed[:, ctx.players.labels]  # (w, *shape)
    w = len(removed)
    k = len(inputs)
    out = np.empty((k, w))
    rows_per_chunk = max(1, _ROWS_PER_STEP // (w + 1))
    for start in range(0, k, rows_per_chunk):
        x = inputs[start : start + rows_per_chunk]
        b = baselines[start : start + rows_per_chunk]
        c = classes[start : start + rows_per_chunk]
        # Written in place, row 0 of each sample its input, then its w occluded copies: one C-ordered
        # pass (np.where's broadcast result, flattened to rows, was copied again: workers/game.py).
        batch = np.empty((len(x), w + 1, *x.shape[1:]), dtype=np.result_type(x, b))
        np.copyto(batch, x[:, None])
        np.copyto(batch[:, 1:], b[:, None], where=element_removed[None])
        batch = batch.reshape(-1, *x.shape[1:])
        values = ctx.target.values(ctx.model.predict(batch), np.repeat(c, w + 1)).reshape(len(x), w + 1)
        out[start : start + len(x)] = values[:, :1] - values[:, 1:]
    return out
