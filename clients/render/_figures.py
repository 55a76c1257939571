"""The page's figures, drawn with matplotlib (Agg, no pyplot state) and inlined as PNG data URIs.

matplotlib is imported inside the functions: importing ``clients.*`` must stay light. Every figure
comes back with its alt text, which states what the picture shows in words and numbers so that the
page can be read without seeing it (and without telling colours apart).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from clients.render._data import Players, as_float, as_floats

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "MAX_BARS",
    "MAX_INPUTS",
    "Picture",
    "allocation_picture",
    "bar_picture",
    "heatmap_picture",
    "interactions_picture",
]

# Inputs drawn per method; a batch beyond this is summarised in the caption, not drawn.
MAX_INPUTS = 8
DPI = 100
# Above this many features or groups, named bars become a profile over the unit index.
MAX_BARS = 40
_POS, _NEG = "#b2182b", "#2166ac"  # RdBu ends: red-blue stays distinct for the common colour blindnesses


@dataclass(frozen=True)
class Picture:
    uri: str
    alt: str


def _new_figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _encode(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _spatial(sample: np.ndarray) -> tuple[np.ndarray, bool]:
    """Sum a (C, H, W), (H, W, C) or (H, W) array over channels -> (H, W); True when channels were last."""
    a = np.asarray(sample, dtype=np.float64)
    if a.ndim == 2:
        return a, False
    channels_last = a.shape[-1] in (1, 3, 4) and a.shape[0] not in (1, 3, 4)
    return (a.sum(axis=-1), True) if channels_last else (a.sum(axis=0), False)


def _display_image(sample: np.ndarray) -> tuple[np.ndarray, bool]:
    """The input as something imshow can draw, scaled to [0, 1]; True when it is RGB."""
    a = np.asarray(sample, dtype=np.float64)
    rgb = False
    if a.ndim == 3:
        channels_last = a.shape[-1] in (1, 3, 4) and a.shape[0] not in (1, 3, 4)
        chw = a.transpose(1, 2, 0) if not channels_last else a
        if chw.shape[-1] == 3:
            a, rgb = chw, True
        else:
            a = chw.mean(axis=-1)
    lo, hi = float(a.min()), float(a.max())
    return ((a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)), rgb


def _grid_edges(size: int, parts: int) -> np.ndarray:
    # The same rounding as workers.players: patch boundaries fall where the audit's players do.
    return np.linspace(0, size, parts + 1).round()


def heatmap_picture(
    method: str,
    attributions: np.ndarray,
    inputs: np.ndarray | None,
    players: Players,
    classes: Sequence[float],
) -> Picture:
    """One row of heatmaps, one per audited input, overlaid on the input image when it is given."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    shown = min(len(attributions), MAX_INPUTS)
    heats = [_spatial(attributions[b])[0] for b in range(shown)]
    vmax = max(float(np.abs(h).max()) for h in heats) or 1.0
    norm = Normalize(-vmax, vmax)
    cmap = colormaps["RdBu_r"]
    fig = _new_figure(1.9 * shown + 1.0, 2.4)
    axes = fig.subplots(1, shown, squeeze=False)[0]
    for b, (ax, heat) in enumerate(zip(axes, heats, strict=True)):
        height, width = heat.shape
        if inputs is not None and b < len(inputs):
            image, rgb = _display_image(inputs[b])
            # Faded, so that the heat's colours stay readable over dark inputs.
            ax.imshow(image, cmap=None if rgb else "gray", interpolation="nearest", alpha=0.45)
        # Colour carries the sign, opacity the magnitude: where attribution is ~0 the input shows through.
        rgba = cmap(norm(heat))
        rgba[..., 3] = np.clip(np.abs(heat) / vmax, 0.0, 1.0) * 0.85 + (0.0 if inputs is not None else 0.15)
        ax.imshow(rgba, interpolation="nearest")
        if players.is_grid and players.layout[0] * players.layout[1] == players.n:
            # Black under white dashes: visible on dark and light pixels alike.
            for edge in _grid_edges(height, players.layout[0])[1:-1]:
                ax.axhline(edge - 0.5, color="black", linewidth=1.6)
                ax.axhline(edge - 0.5, color="white", linewidth=0.8, linestyle=(0, (3, 2)))
            for edge in _grid_edges(width, players.layout[1])[1:-1]:
                ax.axvline(edge - 0.5, color="black", linewidth=1.6)
                ax.axvline(edge - 0.5, color="white", linewidth=0.8, linestyle=(0, (3, 2)))
        label = f"input {b}"
        if b < len(classes):
            label += f", class {int(classes[b])}"
        ax.set_title(label, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=list(axes), shrink=0.85)
    bar.set_label("attribution (red +, blue -)", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    totals = ", ".join(f"input {b}: {float(attributions[b].sum()):.3g}" for b in range(shown))
    alt = (
        f"Attribution heatmaps of {method} for {shown} audited input"
        + ("s" if shown != 1 else "")
        + (" overlaid on the input image" if inputs is not None else " (input images not supplied)")
        + f"; red is positive, blue negative, opacity grows with magnitude; colour scale ±{vmax:.3g}. "
        + f"Total attribution per input: {totals}."
        + (f" {len(attributions) - shown} more inputs not drawn." if len(attributions) > shown else "")
    )
    return Picture(_encode(fig), alt)


def bar_picture(method: str, values: np.ndarray, names: Sequence[str], classes: Sequence[float]) -> Picture:
    """Per input, one horizontal bar per feature or group (a tabular model's "heatmap")."""
    shown = min(len(values), MAX_INPUTS)
    k = len(names)
    if k > MAX_BARS:
        return _profile_picture(method, values[:shown], names, classes)
    cols = min(shown, 4)
    rows = -(-shown // cols)
    fig = _new_figure(2.6 * cols + 0.8, (0.22 * k + 0.9) * rows)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    limit = float(np.abs(values[:shown]).max()) or 1.0
    y = np.arange(k)
    for b, ax in enumerate(axes):
        if b >= shown:
            ax.set_visible(False)
            continue
        v = values[b]
        ax.barh(y, v, color=[_POS if x >= 0 else _NEG for x in v], height=0.7)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlim(-1.1 * limit, 1.1 * limit)
        ax.set_yticks(y, list(names) if b % cols == 0 else [""] * k, fontsize=8)
        ax.invert_yaxis()
        ax.tick_params(axis="x", labelsize=7)
        label = f"input {b}"
        if b < len(classes):
            label += f", class {int(classes[b])}"
        ax.set_title(label, fontsize=9)
    parts = []
    for b in range(shown):
        top = int(np.argmax(np.abs(values[b])))
        parts.append(f"input {b}: largest |attribution| on {names[top]} ({values[b][top]:+.3g})")
    alt = (
        f"Bar charts of {method} attributions per {'feature' if names and names[0].startswith('feature') else 'player'}"
        f" ({', '.join(names)}) for {shown} audited input{'s' if shown != 1 else ''}; bars right of zero are"
        f" positive. " + "; ".join(parts) + "."
    )
    return Picture(_encode(fig), alt)


def _profile_picture(
    method: str, values: np.ndarray, names: Sequence[str], classes: Sequence[float]
) -> Picture:
    """Too many units for named bars (a long sequence, many features): one signed profile per input."""
    fig = _new_figure(9.5, 1.1 * len(values) + 0.6)
    axes = fig.subplots(len(values), 1, squeeze=False, sharex=True)[:, 0]
    limit = float(np.abs(values).max()) or 1.0
    x = np.arange(values.shape[1])
    for b, ax in enumerate(axes):
        v = values[b]
        ax.bar(x, v, width=1.0, color=[_POS if e >= 0 else _NEG for e in v])
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_ylim(-1.1 * limit, 1.1 * limit)
        ax.tick_params(labelsize=7)
        ax.set_ylabel(f"input {b}" + (f"\nclass {int(classes[b])}" if b < len(classes) else ""), fontsize=8)
    axes[-1].set_xlabel(f"unit index ({names[0]} … {names[-1]})", fontsize=8)
    parts = []
    for b, v in enumerate(values):
        top = int(np.argmax(np.abs(v)))
        parts.append(f"input {b}: largest |attribution| on {names[top]} ({v[top]:+.3g})")
    alt = (
        f"Attribution profiles of {method} over {len(names)} units for {len(values)} audited input"
        f"{'s' if len(values) != 1 else ''}; bars above zero are positive. " + "; ".join(parts) + "."
    )
    return Picture(_encode(fig), alt)


def interactions_picture(
    mass_by_order: Sequence[Mapping[str, Any]], top: Sequence[Mapping[str, Any]]
) -> Picture:
    """Left: effect mass per order |S|. Right: the largest interactions I(S), mean over inputs and each input."""
    fig = _new_figure(9.5, max(2.8, 0.3 * len(top) + 1.2))
    left, right = fig.subplots(1, 2, width_ratios=(1, 1.6))
    orders = [int(m.get("order", 0)) for m in mass_by_order]
    masses = [as_float(m.get("mass")) or 0.0 for m in mass_by_order]
    left.bar(orders, masses, color="#4d4d4d")
    left.set_xlabel("order |S|")
    left.set_ylabel("effect mass  Σ|I(S)| (mean over inputs)")
    left.set_xticks(orders)
    left.set_title("Effect mass by order", fontsize=10)
    labels = ["{" + ", ".join(str(n) for n in t.get("set", [])) + "}" for t in top]
    means = [as_float(t.get("mean_effect")) or 0.0 for t in top]
    y = np.arange(len(top))
    right.barh(y, means, color=[_POS if m >= 0 else _NEG for m in means], height=0.6, label="mean I(S)")
    for i, t in enumerate(top):
        effects = as_floats(t.get("effects"))
        right.plot(effects, [i] * len(effects), "k|", markersize=9, label="each input" if i == 0 else None)
    right.axvline(0, color="black", linewidth=0.8)
    right.set_yticks(y, labels, fontsize=8)
    right.invert_yaxis()
    right.set_xlabel("interaction effect I(S)")
    right.set_title("Largest interactions", fontsize=10)
    if top:
        right.legend(fontsize=7, loc="lower right")
    total = sum(masses)
    by_order = (
        ", ".join(f"order {o}: {m:.3g} ({m / total:.0%})" for o, m in zip(orders, masses, strict=True))
        if total
        else "none"
    )
    biggest = "; ".join(f"{label} mean {m:+.3g}" for label, m in zip(labels[:5], means[:5], strict=True))
    alt = f"Effect mass by order of the model's interactions: {by_order}. Largest interactions: {biggest}."
    return Picture(_encode(fig), alt)


def allocation_picture(
    method: str, by_order: Sequence[Mapping[str, Any]], tolerances: Mapping[str, Any]
) -> Picture:
    """Left: mean r(S) per order against 1. Right: dropped, excess and out-of-set share per order."""
    fig = _new_figure(9.5, 2.9)
    left, right = fig.subplots(1, 2)
    orders = np.array([int(o.get("order", 0)) for o in by_order])
    ratios = [as_float(o.get("mean_ratio")) for o in by_order]
    left.bar(orders, [r if r is not None else 0.0 for r in ratios], color="#4d4d4d", width=0.6)
    for order, o, r in zip(orders, by_order, ratios, strict=True):
        if r is None or not o.get("audited_sets"):
            left.annotate(
                "no set above\nnoise floor",
                (order, 0.0),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 3),
                textcoords="offset points",
            )
    left.axhline(1.0, color="black", linestyle="--", linewidth=1, label="r(S) = 1: handed out exactly once")
    left.axhline(0.0, color="black", linewidth=0.6)
    left.set_xticks(orders)
    left.set_xlabel("order |S|")
    left.set_ylabel("mean r(S)")
    left.set_title("Share of each effect handed out, r(S)", fontsize=10)
    left.legend(fontsize=7)
    series = (
        ("dropped", "dropped (coverage)", "//"),
        ("excess", "excess (complete alloc.)", ".."),
        ("out_of_set", "out of set (unrelated)", "xx"),
    )
    width = 0.26
    for j, (key, label, hatch) in enumerate(series):
        values = [as_float(o.get(key)) or 0.0 for o in by_order]
        right.bar(
            orders + (j - 1) * width,
            values,
            width,
            label=label,
            hatch=hatch,
            color=("#bdbdbd", "#ffffff", "#737373")[j],
            edgecolor="black",
            linewidth=0.6,
        )
    tolerance = as_float(tolerances.get("coverage"))
    if tolerance is not None:
        right.axhline(
            tolerance, color="black", linestyle="--", linewidth=1, label=f"tolerance {tolerance:.3g}"
        )
    right.set_xticks(orders)
    right.set_xlabel("order |S|")
    right.set_ylabel("share of the order's effect mass")
    right.set_title("Misallocated mass by order", fontsize=10)
    right.legend(fontsize=7)
    rows = "; ".join(
        f"order {int(o.get('order', 0))}: mean r(S) {_fmt(as_float(o.get('mean_ratio')))}, dropped "
        f"{_fmt(as_float(o.get('dropped')))}, excess {_fmt(as_float(o.get('excess')))}, out of set "
        f"{_fmt(as_float(o.get('out_of_set')))}"
        for o in by_order
    )
    alt = f"Allocation picture of {method} by order of the sets: {rows}."
    return Picture(_encode(fig), alt)
