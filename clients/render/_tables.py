"""The page's tables as HTML strings: every table has a caption and scoped headers, and every verdict
is a symbol plus a word (✔ pass / ✘ fail), so nothing depends on colour."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

from clients.render._data import CRITERIA, CRITERION_TITLES, as_float, as_floats

__all__ = [
    "by_order_table",
    "criterion_cell",
    "decision_table",
    "evidence_table",
    "fmt",
    "interactions_table",
    "key_value_table",
    "table",
    "verdict_badge",
    "verdict_table",
]

_VERDICTS = {
    "reliable": ("✔", "reliable", "ok"),
    "unreliable": ("✘", "unreliable", "bad"),
    "inconclusive": ("?", "inconclusive", "unsure"),
    "not_applicable": ("–", "not applicable", "na"),
}
# v2 criteria carry an interval: its place against the tolerance.
_STATUS = {
    "holds": ("✔", "pass", "ok", "≤"),
    "fails": ("✘", "fail", "bad", ">"),
    "undecided": ("?", "undecided", "unsure", "straddles"),
}


def fmt(value: Any, digits: int = 3) -> str:
    """One format for every number on the page: fixed ``digits`` decimals (a share of 4e-9 reads
    0.000 beside 0.012, not 4.00e-09), thousands separated above 10,000."""
    f = as_float(value)
    if f is None:
        return "n/a"
    if abs(f) >= 1e4:
        return f"{f:,.0f}"
    text = f"{f:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def table(
    caption: str,
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    row_headers: bool = True,
    cls: str = "",
    table_id: str = "",
) -> str:
    """Cells are HTML already (callers escape); the first cell of each row is a row header by default."""
    head = "".join(f'<th scope="col">{h}</th>' for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            cells.append(f'<th scope="row">{cell}</th>' if i == 0 and row_headers else f"<td>{cell}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    attrs = (f' id="{escape(table_id)}"' if table_id else "") + (f' class="{cls}"' if cls else "")
    return (
        f"<table{attrs}><caption>{caption}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def verdict_badge(verdict: str) -> str:
    symbol, word, cls = _VERDICTS.get(verdict, ("?", verdict or "unknown", "na"))
    return f'<span class="verdict {cls}"><span aria-hidden="true">{symbol}</span> {escape(word)}</span>'


def criterion_cell(criterion: Mapping[str, Any] | None) -> str:
    if not criterion:
        return '<span class="na">– not measured</span>'
    score, tolerance = as_float(criterion.get("score")), as_float(criterion.get("tolerance"))
    status = criterion.get("status")
    lower, upper = as_float(criterion.get("lower")), as_float(criterion.get("upper"))
    if status in _STATUS and lower is not None and upper is not None:
        symbol, word, cls, relation = _STATUS[str(status)]
        level = as_float(criterion.get("level"))
        shown = f"{level:.0%} " if level is not None else ""
        return (
            f'<span class="verdict {cls}"><span aria-hidden="true">{symbol}</span> {word}</span>'
            f'<br><span class="num">{fmt(score)} [{fmt(lower)}, {fmt(upper)}] {relation} {fmt(tolerance)}</span>'
            f'<br><span class="note">{shown}interval</span>'
        )
    passed = bool(criterion.get("passed"))
    symbol, word, cls = ("✔", "pass", "ok") if passed else ("✘", "fail", "bad")
    relation = "≤" if passed else ">"
    if score is None or tolerance is None:
        relation = "vs"
    return (
        f'<span class="verdict {cls}"><span aria-hidden="true">{symbol}</span> {word}</span>'
        f'<br><span class="num">{fmt(score)} {relation} {fmt(tolerance)}</span>'
    )


def verdict_table(methods: Sequence[Mapping[str, Any]]) -> str:
    headers = [
        "Method",
        "Verdict",
        *(CRITERION_TITLES[c] for c in CRITERIA),
        "Reason",
    ]
    rows = []
    for m in methods:
        name = escape(str(m.get("name", "?")))
        criteria = m.get("criteria") or {}
        applicable = m.get("verdict") != "not_applicable"
        rows.append(
            [
                f'<a href="#method-{name}">{name}</a>',
                verdict_badge(str(m.get("verdict", ""))),
                *(
                    criterion_cell(criteria.get(c)) if applicable else '<span class="na">– n/a</span>'
                    for c in CRITERIA
                ),
                escape(str(m.get("reason", ""))),
            ]
        )
    caption = (
        "Verdicts: each criterion's score (mass-weighted share of effects misallocated) and, in v2 "
        "reports, its confidence interval against the tolerance; ✔ pass when the interval (or, in v1, "
        "the score) is within tolerance, ✘ fail when it lies above, ? undecided when it straddles it"
    )
    return table(caption, headers, rows, cls="verdicts", table_id="verdict-table")


def _short_reason(method: Mapping[str, Any]) -> str:
    """The decision table's reason, one line: which criteria fail (the numbers are in the confidence
    column), or the report's own words for the verdicts that need them, without the worst-set detail
    (that is in the method's details)."""
    verdict = str(method.get("verdict", ""))
    failing = [str(c) for c in method.get("failing_criteria") or []]
    if verdict == "unreliable" and failing:
        from clients.render._data import CRITERION_SHORT

        return "fails " + ", ".join(CRITERION_SHORT.get(c, c) for c in failing)
    if verdict == "reliable":
        return "within tolerance on every criterion"
    return str(method.get("reason", "")).split("; worst:")[0] or "–"


def decision_table(methods: Sequence[Mapping[str, Any]], level: float | None = None) -> str:
    """The page's first table: per method its verdict, how sure it is and why, nothing else."""
    from clients.render._data import confidence_text

    rows = []
    for m in methods:
        name = escape(str(m.get("name", "?")))
        rows.append(
            [
                f'<a href="#method-{name}">{name}</a>',
                verdict_badge(str(m.get("verdict", ""))),
                f'<span class="num">{escape(confidence_text(m))}</span>',
                escape(_short_reason(m)),
            ]
        )
    interval = f" [{level:.0%} interval]" if level is not None else ""
    caption = (
        f"Confidence: the deciding criterion's score{interval} vs its tolerance (share of effect mass "
        "misallocated; 0 is perfect) and how many inputs agree"
    )
    return table(
        caption,
        ["Method", "Verdict", "Confidence", "Reason"],
        rows,
        cls="decision",
        table_id="decision-table",
    )


def _set_name(names: Iterable[Any]) -> str:
    return escape("{" + ", ".join(str(n) for n in names) + "}")


def interactions_table(top: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for t in top:
        effects = ", ".join(fmt(e) for e in as_floats(t.get("effects")))
        members = ", ".join(str(int(v)) for v in as_floats(t.get("members")))
        rows.append(
            [
                _set_name(t.get("set", [])),
                escape(members),
                str(int(as_float(t.get("order")) or 0)),
                f'<span class="num">{fmt(t.get("mean_effect"))}</span>',
                f'<span class="num">{fmt(t.get("mean_abs_effect"))}</span>',
                f'<span class="num">{effects}</span>',
            ]
        )
    return table(
        "The model's largest interactions I(S), ranked by mean |I(S)| over the audited inputs",
        ["Set S", "Player indices", "Order |S|", "Mean I(S)", "Mean |I(S)|", "I(S) per input"],
        rows,
    )


def by_order_table(method: str, by_order: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [
            str(int(as_float(o.get("order")) or 0)),
            str(o.get("sets", "")),
            str(o.get("audited_sets", "")),
            f'<span class="num">{fmt(o.get("mass"))}</span>',
            f'<span class="num">{fmt(o.get("mean_ratio"))}</span>',
            f'<span class="num">{fmt(o.get("dropped"))}</span>',
            f'<span class="num">{fmt(o.get("excess"))}</span>',
            f'<span class="num">{fmt(o.get("out_of_set"))}</span>',
        ]
        for o in by_order
    ]
    return table(
        f"{escape(method)}: allocation by order (shares of the order's effect mass)",
        [
            "Order |S|",
            "Sets",
            "Audited (input, set) pairs",
            "Mass Σ|I(S)|",
            "Mean r(S)",
            "Dropped",
            "Excess",
            "Out of set",
        ],
        rows,
    )


def _shares(shares: Mapping[str, Any]) -> str:
    if not shares:
        return "–"
    return escape(", ".join(f"{k}: {fmt(v)}" for k, v in shares.items()))


def evidence_table(method: str, evidence: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [
            _set_name(e.get("set", [])),
            str(e.get("sample", "")),
            str(e.get("order", "")),
            f'<span class="num">{fmt(e.get("effect"))}</span>',
            f'<span class="num">{fmt(e.get("ratio"))}</span>',
            _shares(e.get("member_shares") or {}),
            _shares(e.get("outside_shares") or {}),
            escape(", ".join(str(b) for b in e.get("breaks", []))) or "–",
        ]
        for e in evidence
    ]
    return table(
        f"{escape(method)}: evidence, the sets whose allocation is furthest off, however small (shares are A<sub>i</sub>(S)/I(S))",
        [
            "Set S",
            "Input",
            "Order",
            "I(S)",
            "r(S)",
            "Shares to members",
            "Shares outside S",
            "Breaks (its share above the tolerance)",
        ],
        rows,
    )


def key_value_table(caption: str, items: Iterable[tuple[str, Any]], table_id: str = "") -> str:
    rows = [[escape(str(k)), f'<span class="mono">{escape(_text(v))}</span>'] for k, v in items]
    return table(caption, ["Field", "Value"], rows, table_id=table_id)


def _text(value: Any) -> str:
    if isinstance(value, float):
        return fmt(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(_text(v) for v in value) if value else "–"
    if isinstance(value, dict):
        return "; ".join(f"{k}={_text(v)}" for k, v in sorted(value.items())) if value else "–"
    return "–" if value is None else str(value)
