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

from clients.render._data import as_float, as_floats
from xaudit.contract.layout import channels_last

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "Picture",
    "allocation_picture",
    "interactions_picture",
]

DPI = 100
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
    """Sum a (C, H, W), (H, W, C) or (H, W) array over channels -> (H, W), and a volume's over channels
    and depth; True when channels were last."""
    a = np.asarray(sample, dtype=np.float64)
    if a.ndim == 2:
        return a, False
    last = channels_last(a.shape)
    a = a.sum(axis=-1) if last else a.sum(axis=0)
    return (a.sum(axis=0) if a.ndim == 3 else a), last


def _display_image(sample: np.ndarray) -> tuple[np.ndarray, bool]:
    """The input as something imshow can draw, scaled to [0, 1]; True when it is RGB."""
    a = np.asarray(sample, dtype=np.float64)
    rgb = False
    if a.ndim == 4:  # a volume: its middle depth slice, channels averaged
        a = a.mean(axis=-1 if channels_last(a.shape) else 0)
        a = a[len(a) // 2]
    if a.ndim == 3:
        chw = a if channels_last(a.shape) else a.transpose(1, 2, 0)
        if chw.shape[-1] == 3:
            a, rgb = chw, True
        else:
            a = chw.mean(axis=-1)
    lo, hi = float(a.min()), float(a.max())
    return ((a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)), rgb


def _grid_edges(size: int, parts: int) -> np.ndarray:
    # The same rounding as workers.players: patch boundaries fall where the audit's players do.
    return np.linspace(0, size, parts + 1).round()


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
