"""Players for sequences (``windows:K``, ``tokens``) and what "absent" means for token ids."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from workers.errors import InvalidInput
from workers.players import Players

__all__ = ["TOKEN_BASELINES", "check_token_baselines", "token_names", "token_players", "window_players"]

# Baselines that keep token ids integers: a reference id, id 0, or a given tensor of ids.
TOKEN_BASELINES = ("token", "zeros", "tensor", "file")


def window_players(spec: str, sample_shape: tuple[int, ...]) -> Players:
    """``windows:K``: K equal windows over the last axis (every other axis goes with its window);
    named by their ranges, e.g. ``[0:16)``."""
    try:
        k = int(spec.split(":", 1)[1])
    except (IndexError, ValueError):
        raise InvalidInput(
            f"player spec '{spec}': expected windows:K with an integer K, e.g. windows:8"
        ) from None
    if not sample_shape:
        raise InvalidInput(f"player spec '{spec}' needs an input with at least one axis")
    length = sample_shape[-1]
    if not 1 <= k <= length:
        raise InvalidInput(f"player spec '{spec}': K must be between 1 and the last axis' length {length}")
    edges = np.linspace(0, length, k + 1).round().astype(int)
    window_of = np.repeat(np.arange(k), np.diff(edges))
    labels = np.broadcast_to(window_of, sample_shape).astype(np.int64).copy()
    names = tuple(f"[{edges[i]}:{edges[i + 1]})" for i in range(k))
    return Players(labels, names, spec, (1, k))


def token_players(spec: str, sample_shape: tuple[int, ...], names: Sequence[str] = ()) -> Players:
    """``tokens``: one player per position of a (positions,) token-id input, named by ``names``
    (e.g. the words, see :func:`token_names`) or ``t0``, ``t1``..."""
    if spec.strip().lower() != "tokens":
        raise InvalidInput(f"player spec '{spec}': expected tokens")
    if len(sample_shape) != 1:
        raise InvalidInput(
            f"player spec '{spec}' needs a token-id input of shape (positions,) per sample; got {sample_shape}"
        )
    n = sample_shape[0]
    if names and len(names) != n:
        raise InvalidInput(f"player spec '{spec}': {len(names)} names for {n} token positions")
    labels = tuple(str(v) for v in names) if names else tuple(f"t{i}" for i in range(n))
    return Players(np.arange(n, dtype=np.int64), labels, spec, (1, n))


def token_names(ids: np.ndarray, vocabulary: Sequence[str]) -> tuple[str, ...]:
    """Player names for token positions: the word where every sample has the same id there, else
    ``t<position>``; repeated words get ``#<position>`` so that names stay unique."""
    ids = np.asarray(ids).reshape(-1, np.asarray(ids).shape[-1]).astype(np.int64)
    words = []
    for i, column in enumerate(ids.T):
        same = (column == column[0]).all() and 0 <= int(column[0]) < len(vocabulary)
        words.append(str(vocabulary[int(column[0])]) if same else f"t{i}")
    counts = {w: words.count(w) for w in words}
    return tuple(f"{w}#{i}" if counts[w] > 1 else w for i, w in enumerate(words))


def check_token_baselines(spec: str, baselines: np.ndarray) -> None:
    """Token ids are replaced by ids, never blended: refuse references that are not integer ids."""
    kind = spec.partition(":")[0].strip().lower()
    if kind not in TOKEN_BASELINES:
        raise InvalidInput(
            f"baseline '{spec}' does not give token ids; use token:ID (e.g. the pad or mask id) for a token input"
        )
    if (baselines < 0).any() or not (baselines == np.round(baselines)).all():
        raise InvalidInput(f"baseline '{spec}' holds values that are not token ids (integers >= 0)")
