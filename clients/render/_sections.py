"""The page's sections, in reading order: header and signature, verdicts, the model's interactions, one
section per method (attributions and allocation), provenance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

import numpy as np

from clients.render._data import Players, as_float, as_floats, input_kind, per_player
from clients.render._figures import (
    MAX_INPUTS,
    Picture,
    allocation_picture,
    bar_picture,
    heatmap_picture,
    interactions_picture,
)
from clients.render._source import SignatureStatus
from clients.render._tables import (
    by_order_table,
    evidence_table,
    fmt,
    interactions_table,
    key_value_table,
    table,
    verdict_badge,
    verdict_table,
)

__all__ = ["header", "interactions_section", "method_section", "provenance_section", "verdicts_section"]


def _figure(picture: Picture, element_id: str, caption: str) -> str:
    return (
        f'<figure><img id="{escape(element_id)}" src="{picture.uri}" alt="{escape(picture.alt)}">'
        f"<figcaption>{caption}</figcaption></figure>"
    )


def signature_banner(status: SignatureStatus) -> str:
    key = (
        f'<br>Key id: <span class="mono">{escape(status.key_id)}</span>'
        + (" (claimed by the envelope, not checked)" if status.state == "not_checked" else "")
        if status.key_id
        else ""
    )
    return (
        f'<div class="banner {status.state}" id="signature-status" role="status">'
        f"{escape(status.headline)}: {escape(status.detail)}.{key}</div>"
    )


def header(report: Mapping[str, Any], status: SignatureStatus, methods: Sequence[Mapping[str, Any]]) -> str:
    summary = report.get("summary") or {}
    parts = []
    for key in ("reliable", "unreliable", "inconclusive", "not_applicable"):
        if key == "inconclusive" and key not in summary:  # v1 reports have no such verdict
            continue
        names = summary.get(key) or [m.get("name") for m in methods if m.get("verdict") == key]
        parts.append(
            f"{verdict_badge(key)}: {len(names)}"
            + (f" ({escape(', '.join(map(str, names)))})" if names else "")
        )
    model = report.get("model") or {}
    toc = "".join(
        f'<li><a href="#method-{escape(str(m.get("name")))}">{escape(str(m.get("name")))}</a></li>'
        for m in methods
    )
    return (
        "<header><h1>xaudit: attribution method audit</h1>"
        f'<p class="note">Report {escape(str(report.get("schema", "?")))}, created {escape(str(report.get("created", "?")))}; '
        f'model <span class="mono">{escape(str(model.get("sha256", "?"))[:16])}…</span> '
        f"({escape(str(model.get('format', '?')))}).</p>"
        f"{signature_banner(status)}"
        f'<p id="summary">{"; ".join(parts)}.</p></header>'
        '<nav class="toc" aria-label="Contents"><strong>Contents</strong><ul>'
        '<li><a href="#verdicts">Verdicts</a></li><li><a href="#interactions">The model\'s interactions</a></li>'
        f'{toc}<li><a href="#provenance">Provenance</a></li></ul></nav>'
    )


def verdicts_section(methods: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> str:
    order = config.get("audit_order", "?")
    return (
        '<section id="verdicts"><h2>Verdicts</h2>'
        '<p class="note">A method is reliable when it hands out the model\'s actual effects (Harsanyi '
        "interactions I(S) of the players) within tolerance on all three criteria: it drops none "
        "(coverage), gives none to units outside the set that caused it (no unrelated allocation) and "
        f"hands each out exactly once (complete allocation). Sets are judged up to order {escape(str(order))}"
        " and above each method's noise floor.</p>"
        f"{verdict_table(methods)}</section>"
    )


def interactions_section(game: Mapping[str, Any]) -> str:
    if not game:
        return (
            '<section id="interactions"><h2>The model\'s interactions</h2>'
            '<p class="note">This report carries no interaction (game) section.</p></section>'
        )
    players = game.get("players") or []
    names = ", ".join(str(p.get("name")) for p in players)
    targets = ", ".join(fmt(v) for v in as_floats(game.get("target_values")))
    refs = ", ".join(fmt(v) for v in as_floats(game.get("reference_values")))
    exact = (
        "all subsets enumerated"
        if game.get("exact")
        else f"sets up to order {game.get('enumerated_order')} only"
    )
    body = [
        '<section id="interactions"><h2>The model\'s interactions</h2>',
        f"<p>{len(players)} players ({escape(names)}); {escape(exact)}. Target v(N) per input: "
        f"{escape(targets) or 'n/a'}; at the reference v(∅): {escape(refs) or 'n/a'}.</p>",
    ]
    remainder = as_float(game.get("unexplained_high_order"))  # v1 reports
    if remainder is not None:
        body.append(f"<p>Unexplained high-order remainder: {fmt(remainder)}.</p>")
    unaudited = game.get("unaudited")  # v2 reports: the audit's own line, never a method's coverage
    if isinstance(unaudited, Mapping) and as_float(unaudited.get("share")) is not None:
        absolute = as_float(unaudited.get("absolute_share"))
        body.append(
            f'<p id="unaudited">Unaudited mass (the audit\'s, not charged to any method): '
            f"{fmt(as_float(unaudited.get('share')))} of the effect mass lies above audit order "
            f"{escape(str(unaudited.get('audit_order', '?')))} as net remainder (limit "
            f"{fmt(as_float(unaudited.get('limit')))})"
            + (f"; {fmt(absolute)} as absolute high-order mass" if absolute is not None else "")
            + ".</p>"
        )
    mass = game.get("mass_by_order") or []
    top = game.get("top_interactions") or []
    if mass or top:
        picture = interactions_picture(mass, top)
        body.append(
            _figure(
                picture,
                "interactions-figure",
                "Left: total |I(S)| per order |S|, mean over inputs. Right: the largest interactions, bar = "
                "mean over inputs, ticks = each input.",
            )
        )
        body.append(
            table(
                "Effect mass by order",
                ["Order |S|", "Mass Σ|I(S)| (mean over inputs)"],
                [[str(m.get("order")), f'<span class="num">{fmt(m.get("mass"))}</span>'] for m in mass],
            )
        )
        body.append(interactions_table(top))
    body.append("</section>")
    return "".join(body)


def _attribution_block(
    name: str,
    attributions: np.ndarray | None,
    inputs: np.ndarray | None,
    players: Players,
    labels: np.ndarray | None,
    classes: Sequence[float],
) -> str:
    if attributions is None:
        return '<p class="note">No attribution maps were supplied for this method (render with --attributions).</p>'
    maps = np.asarray(attributions)
    if maps.ndim < 2 or len(maps) == 0:
        return '<p class="note">The attribution array for this method is empty.</p>'
    more = f" The first {MAX_INPUTS} of {len(maps)} inputs are drawn." if len(maps) > MAX_INPUTS else ""
    if input_kind(maps.shape[1:]) == "image":
        picture = heatmap_picture(name, maps, inputs, players, classes)
        caption = (
            "Attribution heatmaps"
            + (" over the input" if inputs is not None else "")
            + ("; dotted lines mark the players' patches." if players.is_grid else ".")
        )
    else:
        values, bar_names = per_player(maps, players, labels)
        picture = bar_picture(name, values, bar_names, classes)
        caption = "Attribution per " + ("player" if bar_names == players.names else "input feature") + "."
        if bar_names != players.names and players.n != values.shape[1]:
            caption += " The feature-to-group map is not in the report (render with --groups FILE.json)."
    return _figure(picture, f"heatmap-{name}", escape(caption + more))


def method_section(
    method: Mapping[str, Any],
    *,
    attributions: np.ndarray | None,
    inputs: np.ndarray | None,
    players: Players,
    labels: np.ndarray | None,
    classes: Sequence[float],
    tolerances: Mapping[str, Any],
) -> str:
    name = str(method.get("name", "?"))
    verdict = str(method.get("verdict", ""))
    body = [
        f'<section class="method" id="method-{escape(name)}"><h3>{escape(name)}: {verdict_badge(verdict)}</h3>',
        f"<p>{escape(str(method.get('reason', '')))}</p>",
    ]
    context = method.get("paper_context") or {}
    if context.get("text"):
        body.append(
            f'<p class="context"><span class="label">{escape(str(context.get("label", "")))}</span>'
            f"{escape(str(context['text']))}</p>"
        )
    if verdict == "not_applicable":
        body.append(
            '<p class="note">Not applicable to this model: no attributions and no allocation to show.</p>'
        )
        body.append("</section>")
        return "".join(body)
    body.append("<h4>Attributions</h4>")
    body.append(_attribution_block(name, attributions, inputs, players, labels, classes))
    body.append("<h4>Allocation</h4>")
    by_order = method.get("by_order") or []
    if by_order:
        picture = allocation_picture(name, by_order, tolerances)
        body.append(
            _figure(
                picture,
                f"allocation-{name}",
                "Left: mean r(S), the share of each set's effect the method hands out (1 = exactly once). Right: "
                "mass dropped, handed out in excess, and given to units outside the set, as shares of each "
                "order's effect mass; dashed line: tolerance.",
            )
        )
    floor = method.get("noise_floor") or {}
    body.append(
        key_value_table(
            f"{escape(name)}: aggregate allocation checks",
            [
                (
                    "completeness residual (Σ_T |d(T)| / Σ_T |v(T) − v(∅)|)",
                    method.get("completeness_residual"),
                ),
                ("out-of-set share (mass to units outside S)", method.get("out_of_set_share")),
                ("absent-unit share (attribution to masked units)", method.get("absent_unit_share")),
                ("noise floor σ (z = " + fmt(floor.get("z"), 1) + ")", floor.get("sigma")),
                ("effect mass under the noise floor (share)", floor.get("excluded_mass_share")),
                ("seconds", method.get("seconds")),
            ],
        )
    )
    if by_order:
        body.append(by_order_table(name, by_order))
    evidence = method.get("evidence") or []
    if evidence:
        body.append(evidence_table(name, evidence))
    all_orders = method.get("all_orders")
    if isinstance(all_orders, dict) and all_orders.get("scores"):
        scores = ", ".join(f"{k} {fmt(v)}" for k, v in all_orders["scores"].items())
        note = str(all_orders.get("note", "not used for the verdict"))
        body.append(f'<p class="note">Scores over all orders: {escape(scores)} ({escape(note)}).</p>')
    body.append("</section>")
    return "".join(body)


# Known keys in reading order, the rest sorted: the same page whether the report came straight from
# run_audit or from signed bytes (whose keys are sorted).
_CONFIG_ORDER = ("players", "baseline", "target", "audit_order", "tolerances", "seed", "noise_z")
_ENV_ORDER = ("python", "platform", "device", "execution_providers")


def _ordered(items: Mapping[str, Any], first: Sequence[str]) -> list[tuple[str, Any]]:
    head = [(k, items[k]) for k in first if k in items]
    return head + sorted((k, v) for k, v in items.items() if k not in first)


def provenance_section(report: Mapping[str, Any], status: SignatureStatus) -> str:
    model = report.get("model") or {}
    inputs = report.get("inputs") or {}
    config = dict(report.get("config") or {})
    env = dict(report.get("environment") or {})
    methods_cfg = config.pop("methods", [])
    method_rows = [
        (str(m.get("name")), m.get("params") or {}) if isinstance(m, dict) else (str(m), {})
        for m in methods_cfg
    ]
    packages = env.pop("packages", {}) or {}
    return (
        '<section id="provenance"><h2>Provenance</h2>'
        + key_value_table(
            "Signature",
            [
                ("status", status.headline),
                ("key id", status.key_id or "–"),
                ("detail", status.detail),
            ],
            table_id="signature-table",
        )
        + key_value_table(
            "Model",
            [
                ("sha256", model.get("sha256")),
                ("format", model.get("format")),
                ("input name", model.get("input_name")),
            ],
            table_id="model-table",
        )
        + key_value_table(
            "Inputs",
            [
                ("digest (sha256 of shape + float32 data)", inputs.get("sha256")),
                ("shape", inputs.get("shape")),
                ("count", inputs.get("count")),
            ],
            table_id="inputs-table",
        )
        + key_value_table("Configuration", _ordered(config, _CONFIG_ORDER), table_id="config-table")
        + key_value_table("Methods and parameters", method_rows)
        + key_value_table(
            "Environment",
            [*_ordered(env, _ENV_ORDER), *((f"package {k}", v) for k, v in sorted(packages.items()))],
            table_id="environment-table",
        )
        + "</section>"
    )
