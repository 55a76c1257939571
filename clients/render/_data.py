"""Plain values out of a report and its attributions: what the page and the figures draw from.

A report arrives as the service wrote it (JSON values), as ``run_audit`` returns it (numpy arrays and
scalars inside), or from older writers that stringified arrays (``"[0 3 7]"``); everything here reads
all three.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from xaudit.contract.layout import is_volume, spatial_axes

__all__ = [
    "CRITERIA",
    "CRITERION_TITLES",
    "InputKind",
    "Players",
    "as_float",
    "as_floats",
    "confidence_text",
    "input_kind",
    "normalise_report",
    "per_player",
    "players_of",
]

CRITERIA: tuple[str, ...] = ("coverage", "unrelated_allocation", "complete_allocation")
CRITERION_TITLES: dict[str, str] = {
    "coverage": "Coverage (nothing dropped)",
    "unrelated_allocation": "No unrelated allocation",
    "complete_allocation": "Complete allocation (nothing handed out twice)",
}

InputKind = str  # "image" (two spatial axes) or "vector" (anything else, drawn as bars)

# Short names for the narrow decision table.
CRITERION_SHORT: dict[str, str] = {
    "coverage": "coverage",
    "unrelated_allocation": "unrelated",
    "complete_allocation": "complete",
}


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def normalise_report(report: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy with numpy values turned into JSON values; NaN stays a float (shown as "n/a")."""
    loaded: dict[str, Any] = json.loads(json.dumps(report, default=_plain))
    return loaded


def as_floats(value: Any) -> list[float]:
    """A list of numbers from a JSON list, a numpy array or a stringified array; [] when unreadable."""
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip().strip("[]").replace(",", " ")
        try:
            return [float(v) for v in text.split()]
        except ValueError:
            return []
    try:
        return [float(v) for v in np.asarray(value, dtype=np.float64).ravel()]
    except (TypeError, ValueError):
        return []


def as_float(value: Any) -> float | None:
    """A finite float, or None for missing, null, NaN and non-numbers."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


@dataclass(frozen=True)
class Players:
    names: tuple[str, ...]
    sizes: tuple[int, ...]
    layout: tuple[int, int]  # rows, cols of an image's or a volume's grid
    spec: str
    depth: int = 1  # a volume's grid:DxRxC: its depth slabs (the page sums maps over depth)

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def is_grid(self) -> bool:
        """grid:RxC or grid:DxRxC, asked for or the default (``auto`` on an image or a volume)."""
        spec = self.spec.strip().lower()
        return spec.startswith("grid:") or (spec == "auto" and self.names[:1] in (("r0c0",), ("d0r0c0",)))


def players_of(report: Mapping[str, Any]) -> Players:
    game = report.get("game") or {}
    entries = sorted(game.get("players") or [], key=lambda p: int(p.get("index", 0)))
    names = tuple(str(p.get("name", f"player {i}")) for i, p in enumerate(entries))
    sizes = tuple(int(p.get("size", 1)) for p in entries)
    layout_values = [int(v) for v in as_floats(game.get("layout"))]
    depth = layout_values[0] if len(layout_values) == 3 else 1
    layout = (layout_values[-2], layout_values[-1]) if len(layout_values) in (2, 3) else (1, len(names))
    spec = str((report.get("config") or {}).get("players", ""))
    return Players(names, sizes, layout, spec, depth)


def input_kind(sample_shape: Sequence[int]) -> InputKind:
    """Images have two spatial axes (H, W), optionally after a channel axis (C, H, W) or before (H, W, C);
    a volume (C, D, H, W) or (D, H, W, C) is drawn as an image of its sums over depth."""
    shape = tuple(int(d) for d in sample_shape)
    if len(shape) == 2 and min(shape) >= 2:
        return "image"
    if len(shape) == 3 and (min(shape[-2:]) >= 2 or shape[-1] in (1, 3, 4)):
        return "image"
    if is_volume(shape) and min(shape[axis] for axis in spatial_axes(shape, 3)) >= 2:
        return "image"
    return "vector"


def per_player(
    attributions: np.ndarray, players: Players, labels: np.ndarray | None
) -> tuple[np.ndarray, tuple[str, ...]]:
    """(B, *sample_shape) -> (B, k) values with k bar names: per player when the element-to-player map is
    known (given, or one element per player), else per element."""
    flat = np.asarray(attributions, dtype=np.float64).reshape(len(attributions), -1)
    if labels is not None:
        lab = np.asarray(labels).reshape(-1)
        if lab.size == flat.shape[1] and players.n and int(lab.max()) < players.n:
            onehot = np.zeros((lab.size, players.n))
            onehot[np.arange(lab.size), lab] = 1.0
            return flat @ onehot, players.names
    if players.n == flat.shape[1] and all(s == 1 for s in players.sizes):
        return flat, players.names
    return flat, tuple(f"feature {i}" for i in range(flat.shape[1]))


def _interval(criterion: Mapping[str, Any]) -> tuple[float, float] | None:
    """A criterion's confidence interval: ``lower`` and ``upper`` in schema v2; None in v1 reports."""
    lo, hi = as_float(criterion.get("lower")), as_float(criterion.get("upper"))
    return (lo, hi) if lo is not None and hi is not None else None


def confidence_text(method: Mapping[str, Any]) -> str:
    """How sure the verdict is, in a few words: the deciding criterion's score against its tolerance
    and on how many inputs it holds or fails (a report carries no method-level confidence field)."""
    verdict = str(method.get("verdict", ""))
    if verdict == "not_applicable":
        return "–"
    criteria = {k: v for k, v in (method.get("criteria") or {}).items() if isinstance(v, Mapping)}
    if not criteria:
        return "not measured"

    def ratio(item: tuple[str, Mapping[str, Any]]) -> float:
        score, tol = as_float(item[1].get("score")), as_float(item[1].get("tolerance"))
        return (score or 0.0) / tol if tol else 0.0

    # v2 says where each interval sits against the tolerance (status); v1 only passed or not.
    failing = [
        i
        for i in criteria.items()
        if i[1].get("status", "fails" if i[1].get("passed") is False else "") == "fails"
    ]
    undecided = [i for i in criteria.items() if i[1].get("status") == "undecided"]
    name, c = max(failing or undecided or list(criteria.items()), key=ratio)
    score, tol = as_float(c.get("score")), as_float(c.get("tolerance"))
    interval = _interval(c)
    text = CRITERION_SHORT.get(name, name) + " "
    text += "n/a" if score is None else f"{score:.3f}"
    if interval is not None:
        text += f" [{interval[0]:.3f}, {interval[1]:.3f}]"
    if tol is not None:
        text += f" vs {tol:.3f}"
    share = as_float(c.get("fraction_failing"))
    if undecided and not failing:
        text += "; straddles it"
    elif str(method.get("verdict")) == "inconclusive" and not failing:
        text += "; not judged"
    elif share is not None:
        text += f"; fails on {share:.0%} of inputs" if failing else f"; holds on {1 - share:.0%}"
    return text
