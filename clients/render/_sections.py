"""The page's sections, in reading order: header and signature, verdicts, the model's interactions, one
section per method (attributions and allocation), provenance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from clients.render._data import CRITERIA, CRITERION_TITLES, as_float, as_floats
from clients.render._figures import Picture, allocation_picture, interactions_picture
from clients.render._source import SignatureStatus
from clients.render._tables import (
    by_order_table,
    criterion_cell,
    decision_table,
    evidence_table,
    fmt,
    interactions_table,
    key_value_table,
    table,
    verdict_badge,
    verdict_table,
)

__all__ = [
    "decision_section",
    "figure",
    "header",
    "interactions_section",
    "method_section",
    "provenance_section",
]


def figure(picture: Picture, element_id: str, caption: str) -> str:
    cap = f"<figcaption>{caption}</figcaption>" if caption else ""
    return f'<figure><img id="{escape(element_id)}" src="{picture.uri}" alt="{escape(picture.alt)}">{cap}</figure>'


def signature_banner(status: SignatureStatus) -> str:
    key = (
        f' Key id <span class="mono">{escape(status.key_id[:16])}…</span>'
        + (" (claimed by the envelope, not checked)" if status.state == "not_checked" else "")
        if status.key_id
        else ""
    )
    return (
        f'<div class="banner {status.state}" id="signature-status" role="status">'
        f"{escape(status.headline)}: {escape(status.detail)}.{key}</div>"
    )


def _counts(report: Mapping[str, Any], methods: Sequence[Mapping[str, Any]]) -> str:
    summary = report.get("summary") or {}
    parts = []
    for key in ("reliable", "unreliable", "inconclusive", "not_applicable"):
        names = summary.get(key) or [m.get("name") for m in methods if m.get("verdict") == key]
        if names or key != "inconclusive":
            parts.append(f"{verdict_badge(key)} {len(names)}")
    return " · ".join(parts)


def header(report: Mapping[str, Any], status: SignatureStatus, methods: Sequence[Mapping[str, Any]]) -> str:
    model = report.get("model") or {}
    inputs = report.get("inputs") or {}
    count = inputs.get("count")
    return (
        "<header><h1>Which attribution methods can this model's reviewer trust?</h1>"
        f'<p class="note">Model <span class="mono">{escape(str(model.get("sha256", "?"))[:16])}…</span> '
        f"({escape(str(model.get('format', '?')))})"
        + (f", {escape(str(count))} audited input{'s' if count != 1 else ''}" if count is not None else "")
        + f", report {escape(str(report.get('schema', '?')))} created {escape(str(report.get('created', '?')))}.</p>"
        '<nav class="toc" aria-label="Contents"><a href="#decision">Decision</a> · <a href="#grid">Maps</a> · '
        '<a href="#methods">Method details</a> · <a href="#interactions">Interactions</a> · '
        '<a href="#provenance">Provenance</a></nav>'
        f"{signature_banner(status)}</header>"
    )


def _unaudited(report: Mapping[str, Any]) -> str:
    """Schema v2 states the effect mass the audit did not judge (game.unaudited); v1 does not."""
    entry = (report.get("game") or {}).get("unaudited")
    if not isinstance(entry, Mapping):
        return ""
    share = as_float(entry.get("share"))
    if share is None:
        return ""
    return f" · {share:.1%} of the effect mass above that order is not audited"


def decision_section(
    report: Mapping[str, Any], methods: Sequence[Mapping[str, Any]], config: Mapping[str, Any]
) -> str:
    order = config.get("audit_order", "?")
    return (
        '<section id="decision"><h2>Decision</h2>'
        f'<p id="summary">{_counts(report, methods)} · sets of up to {escape(str(order))} players judged'
        f"{escape(_unaudited(report))}</p>"
        f"{decision_table(methods, _level(config))}"
        '<details id="criteria"><summary>Scores of each criterion, per method</summary>'
        '<p class="note">Coverage: no effect dropped. No unrelated allocation: nothing given to players '
        "outside the set that caused an effect. Complete allocation: each effect handed out exactly once, "
        "not twice. ✔ when the score is at most the tolerance.</p>"
        f"{verdict_table(methods)}</details></section>"
    )


def _level(config: Mapping[str, Any]) -> float | None:
    confidence = config.get("confidence")
    return as_float(confidence.get("level")) if isinstance(confidence, Mapping) else None


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
        f"{escape(targets) or 'n/a'}; at the reference v(∅): {escape(refs) or 'n/a'}. An interaction I(S) "
        "is the part of the output that only the players of S together produce; the audit checks how each "
        "method hands these out.</p>",
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
            figure(
                picture,
                "interactions-figure",
                "Left: x = order |S| (how many players act together), y = total |I(S)|, mean over inputs; most "
                "mass at low orders means a model the audit sees well. Right: the largest interactions, bar = "
                "mean I(S) over inputs, ticks = each input (x: effect on the target, right of 0 raises it).",
            )
        )
        body.append(
            "<details><summary>Interaction tables</summary>"
            + table(
                "Effect mass by order",
                ["Order |S|", "Mass Σ|I(S)| (mean over inputs)"],
                [[str(m.get("order")), f'<span class="num">{fmt(m.get("mass"))}</span>'] for m in mass],
            )
            + interactions_table(top)
            + "</details>"
        )
    body.append("</section>")
    return "".join(body)


def _criteria_rows(method: Mapping[str, Any]) -> str:
    criteria = method.get("criteria") or {}
    rows = []
    for name in CRITERIA:
        c = criteria.get(name)
        if not isinstance(c, Mapping):
            continue
        rows.append(
            [
                escape(CRITERION_TITLES[name]),
                criterion_cell(c),
                f'<span class="num">{fmt(c.get("mean"))}</span>',
                f'<span class="num">{fmt(c.get("worst"))}</span>',
                f'<span class="num">{fmt(c.get("fraction_failing"), 2)}</span>',
            ]
        )
    if not rows:
        return ""
    return table(
        f"{escape(str(method.get('name')))}: criteria (scores are shares of effect mass misallocated; 0 is perfect)",
        ["Criterion", "Score vs tolerance", "Mean over inputs", "Worst input", "Share of inputs failing"],
        rows,
    )


def method_section(
    method: Mapping[str, Any],
    *,
    tolerances: Mapping[str, Any],
) -> str:
    name = str(method.get("name", "?"))
    verdict = str(method.get("verdict", ""))
    reason = str(method.get("reason", ""))
    body = [
        f'<details class="method" id="method-{escape(name)}"><summary><strong>{escape(name)}</strong> '
        f'{verdict_badge(verdict)} <span class="note">{escape(reason)}</span></summary>',
    ]
    if method.get("implementation"):
        body.append(f'<p class="note">Implementation: {escape(str(method["implementation"]))}</p>')
    context = method.get("paper_context") or {}
    if context.get("text"):
        body.append(
            f'<p class="context"><span class="label">{escape(str(context.get("label", "")))}</span>'
            f"{escape(str(context['text']))}</p>"
        )
    if verdict == "not_applicable":
        body.append(
            f'<p class="note">Not applicable to this model: {escape(reason) or "no reason given"}. No '
            "attributions and no allocation to show.</p></details>"
        )
        return "".join(body)
    body.append(_criteria_rows(method))
    by_order = method.get("by_order") or []
    if by_order:
        picture = allocation_picture(name, by_order, tolerances)
        body.append(
            figure(
                picture,
                f"allocation-{name}",
                "Left: x = order |S|, y = mean r(S) = Σ<sub>i∈S</sub> A<sub>i</sub>(S) / I(S), the share of each "
                "set's effect the method hands to the set's members; good: 1 (handed out exactly once). 2 means "
                "handed out twice (e.g. Occlusion gives every member the whole effect, so r(S) = |S|); below 0, "
                "handed out with the wrong sign. Right: x = order, y = share of the order's effect mass dropped, "
                "handed out in excess or given outside the set; good: 0, at most the dashed tolerance.",
            )
        )
    floor = method.get("noise_floor") or {}
    body.append(
        key_value_table(
            f"{escape(name)}: aggregate checks (informational, not criteria)",
            [
                (
                    "completeness residual: how far the attributions' sums are from v(T) − v(∅) over "
                    "sub-inputs T (Σ_T |d(T)| / Σ_T |v(T) − v(∅)|; 0 = complete)",
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
    body.append("</details>")
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
                ("output explained", model.get("output_name")),
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
        + '<details id="environment"><summary>Method parameters and environment</summary>'
        + key_value_table("Methods and parameters", method_rows)
        + key_value_table(
            "Environment",
            [*_ordered(env, _ENV_ORDER), *((f"package {k}", v) for k, v in sorted(packages.items()))],
            table_id="environment-table",
        )
        + "</details></section>"
    )
