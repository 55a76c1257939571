"""Scores pooled over batches of samples: a data-set audit keeps, per batch, only what pools.

Per sample: the numerators and denominators of every criterion (B,) (the per-sample breakdown and
the bootstrap over samples need them). Per set: sums over the batch's samples (1, m), enough for
the set-sampling standard error, since the audited sets are the same for every sample. The (B, m)
per-set detail of a batch (its evidence) is dropped once its worst sets are in the report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from workers.audit.scores import AllocationScores

__all__ = ["compact", "merge", "merge_by_order"]

_PER_SAMPLE = (
    "dropped",
    "excess",
    "out_of_set",
    "mass",
    "excluded_mass",
    "absent",
    "attribution_mass",
    "residual",
    "game_mass",
)
_PER_SET = ("set_dropped", "set_excess", "set_out_of_set")


def compact(scores: AllocationScores) -> AllocationScores:
    """Per-set arrays summed over samples: (B, m) -> (1, m); effects kept only where audited."""
    summed = {name: getattr(scores, name).sum(axis=0, keepdims=True) for name in _PER_SET}
    return dataclasses.replace(
        scores,
        **summed,
        set_effect=np.where(scores.audited, scores.set_effect, 0.0).sum(axis=0, keepdims=True),
        audited=np.asarray(scores.audited.any(axis=0, keepdims=True)),
        ratio=np.full((1, scores.ratio.shape[1]), np.nan),
    )


def merge(parts: Sequence[AllocationScores]) -> AllocationScores:
    """Scores over all samples of ``parts`` (compacted batches audited with the same sets, in order)."""
    first = parts[0]
    joined: dict[str, Any] = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _PER_SAMPLE}
    for name in (*_PER_SET, "set_effect"):
        joined[name] = sum(getattr(p, name) for p in parts)
    joined["audited"] = np.stack([p.audited for p in parts]).any(axis=0)
    joined["by_order"] = merge_by_order([p.by_order for p in parts])
    return dataclasses.replace(first, **joined)


def merge_by_order(tables: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per-order rows of several batches: masses add, shares combine weighted by mass."""
    out = []
    for rows in zip(*tables, strict=True):
        mass = sum(float(r["mass"]) for r in rows)
        row: dict[str, Any] = {
            "order": rows[0]["order"],
            "sets": rows[0]["sets"],
            "audited_sets": sum(int(r["audited_sets"]) for r in rows),
            "mass": mass,
        }
        for key in ("dropped", "excess", "out_of_set"):
            row[key] = sum(float(r[key]) * float(r["mass"]) for r in rows) / mass if mass else 0.0
        ratios = [
            (float(r["mean_ratio"]), int(r["audited_sets"])) for r in rows if r["mean_ratio"] is not None
        ]
        count = sum(c for _, c in ratios)
        row["mean_ratio"] = sum(v * c for v, c in ratios) / count if count else None
        out.append(row)
    return out
