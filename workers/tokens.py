"""Players for sequences (``windows:K``, ``tokens``) and what "absent" means for token ids."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from workers.players import Players, equal_parts
from xaudit.contract.errors import InvalidInput
from xaudit.contract.subspecs import parse_players

__all__ = [
    "TOKEN_BASELINES",
    "check_token_baselines",
    "pin_skipped",
    "skipped_positions",
    "token_names",
    "token_players",
    "window_players",
]

# Baselines that keep token ids integers: a reference id, id 0, or a given tensor of ids.
TOKEN_BASELINES = ("token", "zeros", "tensor", "file")


def window_players(spec: str, sample_shape: tuple[int, ...]) -> Players:
    """``windows:K[:axis=A]``: K equal windows over the sample's last axis, or its axis A (a
    (time, features) sequence's time is axis 0); every other axis goes with its window. Named by their
    ranges, e.g. ``[0:16)``."""
    parsed = parse_players(spec)  # syntax and bounds: the contract's one parser
    k = parsed.count
    if not sample_shape:
        raise InvalidInput(f"player spec '{spec}' needs an input with at least one axis")
    if not -len(sample_shape) <= parsed.axis < len(sample_shape):
        raise InvalidInput(
            f"player spec '{spec}': axis {parsed.axis} is not an axis of a {sample_shape} sample"
        )
    axis = parsed.axis % len(sample_shape)
    length = sample_shape[axis]
    if not 1 <= k <= length:
        which = "the last axis'" if parsed.axis == -1 else f"axis {axis}'s"
        raise InvalidInput(f"player spec '{spec}': K must be between 1 and {which} length {length}")
    edges, window_of = equal_parts(length, k)
    window_of = window_of.reshape(length, *[1] * (len(sample_shape) - axis - 1))
    labels = np.broadcast_to(window_of, sample_shape).astype(np.int64).copy()
    names = tuple(f"[{edges[i]}:{edges[i + 1]})" for i in range(k))
    return Players(labels, names, spec, (1, k))


def skipped_positions(spec: str, length: int) -> np.ndarray:
    """Positions named by ``tokens:skip=P,P,...`` (negative counts from the end), sorted; empty for
    ``tokens``."""
    _, _, arg = spec.strip().partition(":")
    if not arg:
        return np.zeros(0, dtype=np.int64)
    key, sep, raw = arg.partition("=")
    try:
        if key.strip().lower() != "skip" or not sep:
            raise ValueError
        positions = sorted(
            {int(p) % length if -length <= int(p) < length else length for p in raw.split(",")}
        )
    except ValueError:
        raise InvalidInput(f"player spec '{spec}': expected tokens or tokens:skip=P,P (positions)") from None
    if positions and positions[-1] >= length:
        raise InvalidInput(f"player spec '{spec}': a skipped position is outside the {length} positions")
    if len(positions) >= length:
        raise InvalidInput(f"player spec '{spec}' skips every position")
    return np.asarray(positions, dtype=np.int64)


def token_players(spec: str, sample_shape: tuple[int, ...], names: Sequence[str] = ()) -> Players:
    """``tokens``: one player per position of a (positions,) token-id input, named by ``names``
    (e.g. the words, see :func:`token_names`) or ``t0``, ``t1``...

    ``tokens:skip=P,P`` (e.g. ``skip=0,-1`` for [CLS] and [SEP]) keeps those positions at their ids
    in every sub-input and reference (:func:`pin_skipped`) and groups them into one last player,
    named by them in brackets, whose effect is zero by construction: a method that gives it
    anything shows unrelated allocation.
    """
    if spec.strip().lower().partition(":")[0] != "tokens":
        raise InvalidInput(f"player spec '{spec}': expected tokens")
    if len(sample_shape) != 1:
        raise InvalidInput(
            f"player spec '{spec}' needs a token-id input of shape (positions,) per sample; got {sample_shape}"
        )
    n = sample_shape[0]
    if names and len(names) != n:
        raise InvalidInput(f"player spec '{spec}': {len(names)} names for {n} token positions")
    position_names = [str(v) for v in names] if names else [f"t{i}" for i in range(n)]
    skipped = skipped_positions(spec, n)
    if not len(skipped):
        return Players(np.arange(n, dtype=np.int64), tuple(position_names), spec, (1, n))
    kept = np.setdiff1d(np.arange(n), skipped)
    labels = np.full(n, len(kept), dtype=np.int64)
    labels[kept] = np.arange(len(kept))
    special = "[" + ",".join(position_names[i] for i in skipped) + "]"
    player_names = (*(position_names[i] for i in kept), special)
    return Players(labels, player_names, spec, (1, len(player_names)))


def pin_skipped(
    spec: str, inputs: np.ndarray, baselines: np.ndarray, background: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """References with the skipped positions of ``tokens:skip=...`` set to the inputs' own ids, so
    that no sub-input and no method's reference ever changes them."""
    if spec.strip().lower().partition(":")[0] != "tokens" or inputs.ndim != 2:
        return baselines, background
    skipped = skipped_positions(spec, inputs.shape[1])
    if not len(skipped):
        return baselines, background
    baselines = baselines.copy()
    baselines[:, skipped] = inputs[:, skipped]
    if background is not None:
        values = inputs[:, skipped]
        if not (values == values[:1]).all():
            raise InvalidInput(
                f"player spec '{spec}': the skipped positions hold different ids across samples, so one "
                "background set cannot keep them; audit such samples separately"
            )
        background = background.copy()
        background[:, skipped] = values[0]
    return baselines, background


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
