"""The at-a-glance grid: every method's attribution map beside the input, one shared symmetric colour
scale per sample (so that methods compare by colour), drawn the way the input reads: an image, a row
of named features, or the text with its tokens highlighted.

Figures are matplotlib (imported inside the functions, like ``_figures``); text is plain HTML spans
whose values are also in their ``title`` and in the alt text, so nothing depends on colour alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

import numpy as np

from clients.render._data import Players, input_kind, per_player
from clients.render._figures import Picture, _display_image, _encode, _grid_edges, _new_figure, _spatial

__all__ = ["MAX_GRID_SAMPLES", "grid_section"]

# Samples drawn in the grid: the page must stay one screen per sample or so.
MAX_GRID_SAMPLES = 4
_COLS = 8  # image cells per row (the input, then the methods)
_RED, _WHITE, _BLUE = np.array([178, 24, 43]), np.array([247, 247, 247]), np.array([33, 102, 172])


def _scale_text(vmax: float) -> str:
    return f"±{vmax:.3g}"


def _verdict_word(verdict: str) -> str:
    return verdict.replace("_", " ") or "?"


def _image_picture(
    b: int,
    image: np.ndarray | None,
    heats: Sequence[tuple[str, str, np.ndarray]],
    players: Players,
    label: str,
) -> Picture:
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    vmax = max(float(np.abs(h).max()) for _, _, h in heats) or 1.0
    norm, cmap = Normalize(-vmax, vmax), colormaps["RdBu_r"]
    cells = len(heats) + 1
    cols = min(_COLS, cells)
    rows = -(-cells // cols)
    fig = _new_figure(1.22 * cols + 0.9, 1.42 * rows + 0.1)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    height, width = heats[0][2].shape

    def patches(ax: object) -> None:
        if players.is_grid and players.depth * players.layout[0] * players.layout[1] == players.n:
            for edge in _grid_edges(height, players.layout[0])[1:-1]:
                ax.axhline(edge - 0.5, color="#555555", linewidth=0.6)  # type: ignore[attr-defined]
            for edge in _grid_edges(width, players.layout[1])[1:-1]:
                ax.axvline(edge - 0.5, color="#555555", linewidth=0.6)  # type: ignore[attr-defined]

    if image is not None:
        shown, rgb = _display_image(image)
        axes[0].imshow(shown, cmap=None if rgb else "gray", interpolation="nearest")
    else:
        axes[0].text(0.5, 0.5, "input\nnot supplied", ha="center", va="center", fontsize=7)
    axes[0].set_title(label, fontsize=7.5, fontweight="bold")
    patches(axes[0])
    for ax, (name, verdict, heat) in zip(axes[1:], heats, strict=False):
        ax.imshow(heat, cmap=cmap, norm=norm, interpolation="nearest")
        patches(ax)
        ax.set_title(f"{name}\n{_verdict_word(verdict)}", fontsize=7)
    for ax in axes[cells:]:
        ax.set_visible(False)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=list(axes), shrink=0.8, pad=0.01)
    bar.set_label("attribution (red +, blue −)", fontsize=7)
    bar.ax.tick_params(labelsize=6)
    totals = "; ".join(f"{name} total {float(h.sum()):+.3g}" for name, _, h in heats)
    alt = (
        f"Input {b} ({label}) and the attribution map of each of {len(heats)} methods on one colour scale "
        f"{_scale_text(vmax)} (red positive, blue negative, white zero). {totals}."
    )
    return Picture(_encode(fig), alt)


def _vector_picture(
    b: int,
    values: np.ndarray,
    names: Sequence[str],
    methods: Sequence[tuple[str, str]],
    feature_values: Sequence[float] | None,
    label: str,
) -> Picture:
    """Rows are methods, columns the named features; each cell the attribution, coloured and written."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    m, k = values.shape
    vmax = float(np.abs(values).max()) or 1.0
    norm, cmap = Normalize(-vmax, vmax), colormaps["RdBu_r"]
    annotate = k <= 16
    fig = _new_figure(min(10.6, 2.2 + (0.72 if annotate else 0.12) * k), 0.8 + 0.27 * m)
    ax = fig.subplots()
    image = ax.imshow(values, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    ax.set_yticks(np.arange(m), [f"{n} ({_verdict_word(v)})" for n, v in methods], fontsize=7)
    if annotate:
        ticks = [
            f"{n}\n= {feature_values[i]:.3g}" if feature_values is not None else str(n)
            for i, n in enumerate(names)
        ]
        ax.set_xticks(np.arange(k), ticks, fontsize=7)
        for r in range(m):
            for c in range(k):
                v = values[r, c]
                ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if abs(v) > 0.6 * vmax else "black")  # fmt: skip
    else:
        ax.set_xlabel(f"unit index ({names[0]} … {names[-1]})", fontsize=7)
        ax.tick_params(axis="x", labelsize=6)
    ax.xaxis.tick_top()
    ax.set_title(label, fontsize=8, fontweight="bold")
    bar = fig.colorbar(image, ax=ax, shrink=0.9, pad=0.01)
    bar.set_label("attribution (red +, blue −)", fontsize=7)
    bar.ax.tick_params(labelsize=6)
    tops = "; ".join(
        f"{name}: largest |attribution| on {names[int(np.argmax(np.abs(row)))]} "
        f"({row[int(np.argmax(np.abs(row)))]:+.3g})"
        for (name, _), row in zip(methods, values, strict=True)
    )
    alt = (
        f"Input {b} ({label}): attribution of each of {m} methods (rows) to each of {k} units "
        f"(columns: {', '.join(names[:16])}{'…' if k > 16 else ''}) on one colour "
        f"scale {_scale_text(vmax)}. {tops}."
    )
    return Picture(_encode(fig), alt)


def _colour(value: float, vmax: float) -> str:
    t = max(-1.0, min(1.0, value / vmax)) if vmax else 0.0
    end = _RED if t >= 0 else _BLUE
    rgb = (_WHITE + (end - _WHITE) * abs(t)).round().astype(int)
    return "#" + "".join(f"{c:02x}" for c in rgb)


def _text_table(
    b: int,
    values: np.ndarray,
    words: Sequence[str],
    methods: Sequence[tuple[str, str]],
    label: str,
) -> str:
    vmax = float(np.abs(values).max()) or 1.0
    rows = []
    for (name, verdict), row in zip(methods, values, strict=True):
        spans = []
        for word, v in zip(words, row, strict=False):
            ink = "#fff" if abs(v) > 0.6 * vmax else "#111"
            spans.append(
                f'<span class="tok" style="background:{_colour(float(v), vmax)};color:{ink}" '
                f'title="{escape(word)}: {v:+.3g}">{escape(word)}</span>'
            )
        rows.append(
            f'<tr><th scope="row">{escape(name)} <span class="na">({escape(_verdict_word(verdict))})</span></th>'
            f'<td class="text-row">{" ".join(spans)}</td></tr>'
        )
    legend = (
        f'<span class="legend" aria-hidden="true"></span> −{vmax:.3g} … 0 … +{vmax:.3g} '
        "(blue: the token lowers the target, red: raises it; hover a token for its value)"
    )
    return (
        f'<table class="text-grid" id="grid-text-{b}"><caption>{escape(label)}: each method\'s attribution '
        f"per token on one colour scale {legend}</caption>"
        '<thead><tr><th scope="col">Method</th><th scope="col">Text</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _words(
    b: int, inputs: np.ndarray | None, vocab: Sequence[str] | None, players: Players, length: int
) -> list[str]:
    """The sample's tokens as words: from the vocabulary when both it and integer ids are at hand,
    else the players' names (the same for every sample where the batch's tokens differ)."""
    if (
        vocab
        and inputs is not None
        and b < len(inputs)
        and np.issubdtype(np.asarray(inputs).dtype, np.integer)
    ):
        ids = np.asarray(inputs[b]).reshape(-1)[:length]
        return [vocab[int(i)] if 0 <= int(i) < len(vocab) else f"#{int(i)}" for i in ids]
    if players.n == length:
        return list(players.names)
    return [f"t{i}" for i in range(length)]


def grid_section(
    methods: Sequence[Mapping[str, object]],
    maps: Mapping[str, np.ndarray],
    inputs: np.ndarray | None,
    players: Players,
    labels: np.ndarray | None,
    classes: Sequence[float],
    vocab: Sequence[str] | None = None,
) -> str:
    """The section: one figure (or text table) per sample, up to :data:`MAX_GRID_SAMPLES`."""
    from clients.render._sections import figure

    head = (
        '<section id="grid"><h2>What each method attributes</h2>'
        '<p class="note">Each method\'s attribution map beside the input, one colour scale per sample shared '
        "by all methods (red raises the target, blue lowers it, white: no attribution). A reliable method's "
        "map is the one to read; where methods disagree, trust the ones the decision table calls reliable.</p>"
    )
    drawn = [
        (
            str(m.get("name")),
            str(m.get("verdict", "")),
            np.asarray(maps[str(m.get("name"))], dtype=np.float64),
        )
        for m in methods
        if str(m.get("name")) in maps and m.get("verdict") != "not_applicable"
    ]
    drawn = [d for d in drawn if d[2].ndim >= 2 and len(d[2])]
    if not drawn:
        return head + (
            '<p class="note">No attribution maps were supplied with this report (render with --attributions '
            "A.npz, or use --html on audit/submit, which has them).</p></section>"
        )
    batch = min(len(d[2]) for d in drawn)
    shown = min(batch, MAX_GRID_SAMPLES)
    sample_shape = drawn[0][2].shape[1:]
    kind = "text" if players.spec.strip().lower().startswith("tokens") else input_kind(sample_shape)
    body = [head]
    ungrouped = False
    method_names = [(n, v) for n, v, _ in drawn]
    for b in range(shown):
        label = f"input {b}" + (f", class {int(classes[b])}" if b < len(classes) else "")
        if kind == "image":
            heats = [(n, v, _spatial(a[b])[0]) for n, v, a in drawn]
            image = inputs[b] if inputs is not None and b < len(inputs) else None
            volume = len(sample_shape) == 4
            caption = (
                ("First cell: the input's middle depth slice" if volume else "First cell: the input")
                + " (lines: the players' patches); then each method's map"
                + (" summed over depth" if volume else "")
                + ", titled with its verdict; colour bar: attribution, shared by the row. Read the maps of "
                "the reliable methods."
                if b == 0
                else ""
            )
            body.append(figure(_image_picture(b, image, heats, players, label), f"grid-{b}", caption))
            continue
        rows = []
        names: tuple[str, ...] = ()
        for _, _, a in drawn:
            values, names = per_player(a[b : b + 1], players, labels)
            rows.append(values[0])
        matrix = np.vstack(rows)
        if b == 0 and names != players.names and players.n and players.n != len(names):
            ungrouped = True
        if kind == "text":
            body.append(
                _text_table(
                    b, matrix, _words(b, inputs, vocab, players, matrix.shape[1]), method_names, label
                )
            )
            continue
        feature_values = None
        if inputs is not None and b < len(inputs):
            flat = np.asarray(inputs[b], dtype=np.float64).reshape(-1)
            if flat.size == len(names):
                feature_values = [float(v) for v in flat]
        body.append(
            figure(
                _vector_picture(b, matrix, names, method_names, feature_values, label),
                f"grid-{b}",
                "Rows: methods (with their verdicts); columns: the players, with the input's value where each is "
                "one feature; cell: the attribution, also written out. Read the rows of the reliable methods."
                if b == 0
                else "",
            )
        )
    if ungrouped:
        body.append(
            '<p class="note">Drawn per input feature: the feature-to-group map is not in the report (render '
            "with --groups FILE.json).</p>"
        )
    if batch > shown:
        body.append(f'<p class="note">The first {shown} of {batch} audited inputs are drawn.</p>')
    missing = [
        str(m.get("name"))
        for m in methods
        if m.get("verdict") != "not_applicable" and str(m.get("name")) not in maps
    ]
    if missing:
        body.append(f'<p class="note">No attribution map for: {escape(", ".join(missing))}.</p>')
    body.append("</section>")
    return "".join(body)
