"""Forward-only helpers: target values with sets of players replaced by the reference."""

from __future__ import annotations

import numpy as np

from workers.methods._base import AttributionContext
from workers.sub_inputs import masked_samples

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
    # each sample's row of its own, then its w copies with the removed players at the reference
    kept = np.concatenate([np.ones((1, removed.shape[1]), dtype=bool), ~removed.astype(bool)])
    w = len(removed)
    k = len(inputs)
    out = np.empty((k, w))
    rows_per_chunk = max(1, _ROWS_PER_STEP // (w + 1))
    for start in range(0, k, rows_per_chunk):
        x = inputs[start : start + rows_per_chunk]
        b = baselines[start : start + rows_per_chunk]
        c = classes[start : start + rows_per_chunk]
        batch = masked_samples(kept, x, b, ctx.players)  # (kc * (w + 1), *shape)
        values = ctx.target.values(ctx.model.predict(batch), np.repeat(c, w + 1)).reshape(len(x), w + 1)
        out[start : start + len(x)] = values[:, :1] - values[:, 1:]
    return out
