"""Evidence: the sets where a method's allocation departs most from the model's effects."""

from __future__ import annotations

from typing import Any

import numpy as np

from workers.audit.scores import AllocationScores
from workers.players import Players, subset_bits

__all__ = ["worst_sets"]


def worst_sets(
    scores: AllocationScores,
    subsets: np.ndarray,
    interactions: np.ndarray,
    shares: np.ndarray,
    players: Players,
    tolerances: dict[str, float],
    limit: int = 5,
) -> list[dict[str, Any]]:
    """Up to ``limit`` (sample, set) pairs ranked by the mass they put wrong, with the criteria they break.

    A set breaks a criterion when its own share (dropped, excess or out-of-set mass over abs(I(S)))
    exceeds that criterion's tolerance; smaller departures are shown but break nothing.
    """
    wrong = scores.set_dropped + scores.set_excess + scores.set_out_of_set  # (B, m)
    order = np.argsort(-wrong, axis=None, kind="stable")[:limit]
    members_of = subset_bits(subsets, players.n)
    out: list[dict[str, Any]] = []
    for flat in order:
        sample, k = np.unravel_index(flat, wrong.shape)
        if wrong[sample, k] <= 0:
            break
        members = np.flatnonzero(members_of[k])
        effect = float(interactions[sample, k])
        breaks = [
            name
            for name, value in (
                ("coverage", scores.set_dropped[sample, k]),
                ("complete_allocation", scores.set_excess[sample, k]),
                ("unrelated_allocation", scores.set_out_of_set[sample, k]),
            )
            if value > tolerances[name] * abs(effect)
        ]
        share_of = shares[sample, k] / effect
        outside = np.argsort(-np.abs(shares[sample, k]) * ~members_of[k])[:3]
        out.append(
            {
                "sample": int(sample),
                "set": [players.names[i] for i in members],
                "members": [int(i) for i in members],
                "order": len(members),
                "effect": effect,
                "ratio": float(scores.ratio[sample, k]),
                "member_shares": {players.names[i]: float(share_of[i]) for i in members},
                "outside_shares": {
                    players.names[i]: float(share_of[i])
                    for i in outside
                    if not members_of[k, i] and share_of[i] != 0
                },
                "breaks": breaks,
            }
        )
    return out
