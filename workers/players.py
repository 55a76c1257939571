"""Players: a partition of one sample's elements into units (patches, features, groups, labels)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xaudit.contract.errors import InvalidInput, ResourceExhausted
from xaudit.contract.layout import channels_last, image_axes, is_volume, spatial_axes
from xaudit.contract.subspecs import parse_players as parse_player_spec

__all__ = [
    "MAX_PLAYERS",
    "WORD_PLAYERS",
    "Players",
    "as_masks",
    "equal_parts",
    "full_mask",
    "masks_from_bits",
    "parse_players",
    "subset_bits",
]

# Sets of players are bitmasks: uint64 up to WORD_PLAYERS players, Python integers (object arrays)
# above, where only sampled families of small sets are ever built (docs/science.md, sampled sets).
WORD_PLAYERS = 64
MAX_PLAYERS = 256


@dataclass(frozen=True, eq=False)
class Players:
    """``labels`` maps every element of one sample to a player 0..n-1."""

    labels: np.ndarray
    names: tuple[str, ...]
    spec: str
    # Players laid out as a grid (rows, cols), or (depth, rows, cols) for a volume's grid:DxRxC:
    # occlusion_patch slides its window over this layout.
    layout: tuple[int, ...]
    # grid:RxC only: where each row and each column of players starts on the last two axes, which
    # every leading axis (channels) shares; sums per player then need no table of labels.
    grid_starts: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def sizes(self) -> np.ndarray:
        return np.bincount(self.labels.ravel(), minlength=self.n)

    def sum_per_player(self, attributions: np.ndarray) -> np.ndarray:
        """(k, *sample_shape) element attributions -> (k, n) player attributions."""
        k = attributions.shape[0]
        if self.grid_starts is not None:  # in float64 as below, a tenth of the time at 224x224
            rows, cols = self.grid_starts
            planes = attributions.reshape(k, -1, *attributions.shape[-2:]).sum(axis=1, dtype=np.float64)
            return np.add.reduceat(np.add.reduceat(planes, rows, axis=1), cols, axis=2).reshape(k, -1)
        flat = attributions.reshape(k, -1).astype(np.float64)
        onehot = np.zeros((flat.shape[1], self.n))
        onehot[np.arange(flat.shape[1]), self.labels.ravel()] = 1.0
        return flat @ onehot

    def spread(self, per_player: np.ndarray) -> np.ndarray:
        """(k, n) player scores -> (k, *sample_shape), each element getting an equal share of its player's."""
        per_element = per_player / self.sizes[None, :]
        return per_element[:, self.labels].astype(np.float32)


def subset_bits(subsets: np.ndarray, n: int) -> np.ndarray:
    """(m,) bitmasks (uint64, or Python integers above 64 players) -> (m, n) bool membership."""
    if subsets.dtype == object:
        width = (n + 7) // 8
        raw = b"".join(int(s).to_bytes(width, "little") for s in subsets)
        packed = np.frombuffer(raw, dtype=np.uint8).reshape(len(subsets), width)
        return np.unpackbits(packed, axis=1, count=n, bitorder="little").astype(bool)
    shifts = np.arange(n, dtype=np.uint64)
    return ((subsets.astype(np.uint64)[:, None] >> shifts[None, :]) & np.uint64(1)).astype(bool)


def as_masks(masks: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    """Bitmasks in the representation used for ``n`` players (uint64, or object above WORD_PLAYERS)."""
    if n <= WORD_PLAYERS:
        return np.asarray(masks).astype(np.uint64)
    out: np.ndarray = np.empty(len(masks), dtype=np.object_)
    out[:] = [int(m) for m in masks]
    return out


def masks_from_bits(bits: np.ndarray) -> np.ndarray:
    """(m, n) bool membership -> (m,) bitmasks (inverse of :func:`subset_bits`)."""
    n = bits.shape[1]
    if n <= WORD_PLAYERS:
        weights = np.uint64(1) << np.arange(n, dtype=np.uint64)
        return (bits.astype(np.uint64) * weights[None]).sum(axis=1, dtype=np.uint64)
    packed = np.packbits(bits.astype(np.uint8), axis=1, bitorder="little")
    return as_masks([int.from_bytes(row.tobytes(), "little") for row in packed], n)


def full_mask(n: int) -> np.ndarray:
    """The grand coalition as a one-element mask array."""
    return as_masks([(1 << n) - 1], n)


def equal_parts(size: int, parts: int) -> tuple[np.ndarray, np.ndarray]:
    """An axis of ``size`` elements cut into ``parts`` (at most ``size``: none empty) as equal as
    rounding allows: the ``parts + 1`` edges, and each element's part."""
    edges = np.linspace(0, size, parts + 1).round().astype(int)
    return edges, np.repeat(np.arange(parts), np.diff(edges))


def _grid(spec: str, shape: tuple[int, ...]) -> Players:
    """Patches over the image's height and width, or over a volume's depth, height and width with
    grid:DxRxC (xaudit.contract.layout: the last axes, or the ones before the channels of a
    channels-last sample), shared by every channel."""
    parsed = parse_player_spec(spec)
    sides = (parsed.depth, parsed.rows, parsed.cols) if parsed.depth else (parsed.rows, parsed.cols)
    last = channels_last(shape)
    if len(shape) < len(sides) + last:
        what = "three spatial axes (a volume)" if parsed.depth else "two spatial axes"
        raise InvalidInput(f"player spec '{spec}' needs an input with {what}; got shape {shape}")
    axes = spatial_axes(shape, len(sides))
    sizes = tuple(shape[axis] for axis in axes)
    if not all(1 <= side <= size for side, size in zip(sides, sizes, strict=True)):
        raise InvalidInput(
            f"player spec '{spec}' does not fit the input's {'x'.join(map(str, sizes))} spatial axes"
        )
    edges, index = zip(
        *(equal_parts(size, side) for side, size in zip(sides, sizes, strict=True)), strict=True
    )
    block = np.ravel_multi_index(np.meshgrid(*index, indexing="ij"), sides)  # one label per spatial element
    labels = np.broadcast_to(block[..., None] if last else block, shape).copy()
    letters = "drc"[-len(sides) :]
    names = tuple("".join(f"{a}{i}" for a, i in zip(letters, at, strict=True)) for at in np.ndindex(*sides))
    # the fast sums read an image's last two axes
    starts = (edges[0][:-1], edges[1][:-1]) if len(sides) == 2 and not last else None
    return Players(labels.astype(np.int64), names, spec, sides, starts)


def _from_labels(spec: str, labels: np.ndarray, names: Sequence[str] | None) -> Players:
    if labels.dtype.kind not in "iu":
        raise InvalidInput(f"player spec '{spec}': labels must be integers, got {labels.dtype}")
    values, dense = np.unique(labels, return_inverse=True)
    n = len(values)
    if names:
        if len(names) != int(labels.max()) + 1 or values[0] != 0 or n != len(names):
            raise InvalidInput(
                f"player spec '{spec}' does not partition the input: groups must be 0..{len(names) - 1}, "
                f"each used at least once (found {n} distinct groups)"
            )
        player_names = tuple(str(v) for v in names)
    else:
        player_names = tuple(f"label {int(v)}" for v in values)
    return Players(dense.reshape(labels.shape).astype(np.int64), player_names, spec, (1, n))


def auto_players(sample_shape: tuple[int, ...]) -> str | None:
    """The spec ``auto`` stands for on one sample of this shape: ``grid:2x2x2`` for a volume (its
    depth, height and width at least 2: 8 blocks, an exact game of 256 sub-inputs), ``grid:3x3`` for
    an image (its height and width at least 3), ``features`` for at most 16 elements; None where
    there is no default."""
    if is_volume(sample_shape) and all(sample_shape[a] >= 2 for a in spatial_axes(sample_shape, 3)):
        return "grid:2x2x2"
    if len(sample_shape) >= 2 and all(sample_shape[axis] >= 3 for axis in image_axes(sample_shape)):
        return "grid:3x3"
    if int(np.prod(sample_shape)) <= 16:
        return "features"
    return None


def parse_players(
    spec: str,
    sample_shape: tuple[int, ...],
    *,
    player_mask: np.ndarray | None = None,
    player_groups: np.ndarray | None = None,
    group_names: Sequence[str] = (),
) -> Players:
    """Build players from a spec: ``auto``, ``grid:RxC``, ``grid:DxRxC``, ``features``, ``groups:FILE.json``,
    ``mask:FILE.npy``, ``windows:K[:axis=A]`` (K windows over the last axis, or axis A),
    ``tokens[:skip=P,P]`` (one per position of a token-id input).

    File contents arrive already loaded (``player_mask``, ``player_groups``), never as paths.
    """
    kind = parse_player_spec(spec).kind  # syntax and bounds: the contract's one parser
    size = int(np.prod(sample_shape))
    if kind == "auto":
        default = auto_players(sample_shape)
        if default is not None and default.startswith("grid:"):
            players = _grid(default, sample_shape)
        elif default == "features":
            players = _from_flat("features", np.arange(size), sample_shape, _feature_names(group_names, size))
        else:
            raise InvalidInput(
                f"no default players for an input of shape {sample_shape} with {size} elements; "
                "pass --players (windows:K for a signal, windows:K:axis=0 for a (time, features) sequence, "
                "grid:RxC for an image, grid:DxRxC for a volume, groups:FILE.json or mask:FILE.npy)"
            )
    elif kind == "grid":
        players = _grid(spec, sample_shape)
    elif kind in ("windows", "tokens"):
        from workers.tokens import token_players, window_players

        if kind == "windows":
            players = window_players(spec, sample_shape)
        else:
            players = token_players(spec, sample_shape, group_names)
    elif kind == "features":
        players = _from_flat(spec, np.arange(size), sample_shape, _feature_names(group_names, size))
    elif kind == "groups":
        if player_groups is None:
            raise InvalidInput(f"player spec '{spec}' needs its group file")
        groups = np.asarray(player_groups).ravel()
        if groups.size != size:
            raise InvalidInput(
                f"player spec '{spec}' does not partition the input: {groups.size} group entries "
                f"for {size} input features"
            )
        players = _from_flat(spec, groups, sample_shape, list(group_names) or None)
    elif kind == "mask":
        if player_mask is None:
            raise InvalidInput(f"player spec '{spec}' needs its label mask")
        mask = np.asarray(player_mask)
        if tuple(mask.shape) != tuple(sample_shape):
            raise InvalidInput(
                f"player spec '{spec}' does not partition the input: mask shape {tuple(mask.shape)} "
                f"differs from the input's {tuple(sample_shape)}"
            )
        players = _from_labels(spec, mask, list(group_names) or None)
    else:
        raise InvalidInput(
            f"unknown player spec '{spec}' (use auto, grid:RxC, grid:DxRxC, features, groups:FILE.json, "
            "mask:FILE.npy, windows:K[:axis=A], tokens)"
        )
    if players.n > MAX_PLAYERS:
        raise ResourceExhausted(f"{players.n} players; at most {MAX_PLAYERS} are supported")
    if players.n < 1:
        raise InvalidInput(f"player spec '{spec}' gives no players")
    return players


def _feature_names(names: Sequence[str], size: int) -> list[str]:
    """Given names (``--names``) for one player per feature, or x0, x1, ..."""
    if not names:
        return [f"x{i}" for i in range(size)]
    if len(names) != size:
        raise InvalidInput(f"{len(names)} player names for {size} features: give one name per feature")
    return [str(n) for n in names]


def _from_flat(spec: str, groups: np.ndarray, shape: tuple[int, ...], names: Sequence[str] | None) -> Players:
    players = _from_labels(spec, groups.reshape(shape).astype(np.int64), names)
    return Players(players.labels, players.names, spec, (1, players.n))
