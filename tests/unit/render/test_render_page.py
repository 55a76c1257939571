"""The rendered page, read structurally: a heatmap per applicable method, verdicts in words and
symbols, captions and scoped headers on every table, alt text on every image, nothing external."""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from clients.render import SignatureStatus, render_html
from tests.unit.render._html import Page, parse
from tests.unit.render._reports import GROUP_NAMES, GROUPS, image_audit, tabular_audit

ASSETS = Path(__file__).parent / "assets"
CRITERIA = ("coverage", "unrelated_allocation", "complete_allocation")


def _applicable(report: dict) -> list[str]:  # type: ignore[type-arg]
    return [m["name"] for m in report["methods"] if m["verdict"] != "not_applicable"]


@pytest.fixture(scope="module")
def image_page() -> tuple[Page, dict]:  # type: ignore[type-arg]
    a = image_audit()
    return parse(render_html(a.report, attributions=a.attributions, inputs=a.inputs)), a.report


@pytest.fixture(scope="module")
def tabular_page() -> tuple[Page, dict]:  # type: ignore[type-arg]
    a = tabular_audit(False)
    return parse(render_html(a.report, attributions=a.attributions, inputs=a.inputs)), a.report


def _png(uri: str) -> Image.Image:
    prefix = "data:image/png;base64,"
    assert uri.startswith(prefix)
    return Image.open(io.BytesIO(base64.b64decode(uri[len(prefix) :])))


@pytest.mark.slow  # the real audit of the digits CNN, or 11 methods' figures
def test_image_page_has_one_grid_per_input_and_an_allocation_picture_per_method(image_page):
    page, report = image_page
    names = _applicable(report)
    assert len(names) == 4
    for b in range(2):
        grid = page.images[f"grid-{b}"]
        assert all(name in grid["alt"] for name in names)
        assert f"Input {b} (input {b}, class" in grid["alt"]
        assert _png(grid["src"]).size[0] > 500
    for name in names:
        assert name in page.images[f"allocation-{name}"]["alt"]
    assert "interactions-figure" in page.images


@pytest.mark.slow  # the real audit of the digits CNN, or 11 methods' figures
def test_grid_alt_text_states_the_attribution_totals_on_one_scale():
    a = image_audit()
    page = parse(render_html(a.report, attributions=a.attributions, inputs=a.inputs))
    for b in range(len(a.inputs)):
        alt = page.images[f"grid-{b}"]["alt"]
        vmax = max(float(np.abs(m[b].sum(axis=0)).max()) for m in a.attributions.values())
        assert f"one colour scale ±{vmax:.3g}" in alt
        for name, maps in a.attributions.items():
            assert f"{name} total {float(maps[b].sum()):+.3g}" in alt


@pytest.mark.slow  # the real audit of the digits CNN, or 11 methods' figures
def test_decision_and_criterion_tables_read_without_colour(image_page):
    page, report = image_page
    decision = page.table("decision-table")
    assert decision.col_headers == ["Method", "Verdict", "Confidence", "Reason"]
    assert decision.row_headers == [m["name"] for m in report["methods"]]
    for row, method in zip(decision.rows, report["methods"], strict=True):
        assert (
            row[1]
            == {
                "reliable": "✔ reliable",
                "unreliable": "✘ unreliable",
                "inconclusive": "? inconclusive",
            }[method["verdict"]]
        )
        if method["verdict"] == "unreliable":
            short = {
                "coverage": "coverage",
                "unrelated_allocation": "unrelated",
                "complete_allocation": "complete",
            }
            assert row[3] == "fails " + ", ".join(short[c] for c in method["failing_criteria"])
            assert " vs 0.050; fails on " in row[2]
        elif method["verdict"] == "reliable":
            assert row[3] == "within tolerance on every criterion" and " vs 0.050; holds on " in row[2]
        else:
            assert row[3] == method["reason"].split("; worst:")[0]
    table = page.table("verdict-table")
    assert table.col_headers[:2] == ["Method", "Verdict"]
    assert len(table.col_headers) == 6
    assert table.row_headers == [m["name"] for m in report["methods"]]
    for row, method in zip(table.rows, report["methods"], strict=True):
        for cell, criterion in zip(row[2:5], CRITERIA, strict=True):
            c = method["criteria"][criterion]  # v2: the interval's place against the tolerance
            expected = {"holds": "✔ pass", "fails": "✘ fail", "undecided": "? undecided"}[c["status"]]
            assert cell.startswith(expected), (method["name"], criterion, cell)
            assert f"{c['tolerance']:.3f}" in cell


@pytest.mark.slow  # the real audit of the digits CNN, or 11 methods' figures
def test_every_table_has_a_caption_and_scoped_headers(image_page, tabular_page):
    for page, _ in (image_page, tabular_page):
        assert len(page.tables) > 10
        for table in page.tables:
            assert table.caption.strip(), table
            assert table.col_headers, table.caption
            assert table.unscoped_th == 0, table.caption
            assert all(len(r) == len(table.col_headers) for r in table.rows), table.caption


@pytest.mark.slow  # the real audit of the digits CNN, or 11 methods' figures
def test_every_image_has_alt_text_and_nothing_loads_from_outside(image_page, tabular_page):
    for page, _ in (image_page, tabular_page):
        assert page.anonymous_images == 0
        for image in page.images.values():
            assert len(image["alt"]) > 40
        assert not page.tags & {"script", "link", "iframe", "object", "embed"}
        for url in page.urls:
            assert url.startswith(("#", "data:image/png;base64,")), url[:60]


def test_tabular_page_draws_a_method_by_feature_grid_and_says_not_applicable(tabular_page):
    page, report = tabular_page
    assert "grid_cam" not in str(page.images)
    assert "Not applicable to this model: the model has no convolution layer" in page.text
    alt = page.images["grid-0"]["alt"]
    assert alt.startswith("Input 0 (input 0, class")
    assert "(columns: x0, x1, x2, x3, x4, x5)" in alt
    assert all(name in alt for name in _applicable(report)) and "grad_cam" not in alt


def test_groups_are_summed_per_group_when_the_map_is_given():
    a = tabular_audit(True)
    page = parse(render_html(a.report, attributions=a.attributions, player_labels=GROUPS))
    for b in range(len(a.inputs)):
        alt = page.images[f"grid-{b}"]["alt"]
        assert f"(columns: {', '.join(GROUP_NAMES)})" in alt
        for name in _applicable(a.report):
            sums = np.stack([a.attributions[name][b, g == GROUPS].sum() for g in range(3)])
            top = int(np.argmax(np.abs(sums)))
            assert f"{name}: largest |attribution| on {GROUP_NAMES[top]} ({sums[top]:+.3g})" in alt
    without = parse(render_html(a.report, attributions=a.attributions))
    assert "feature 0" in without.images["grid-0"]["alt"]
    assert "--groups FILE.json" in without.text


def test_report_bytes_and_report_dict_give_the_same_tables():
    a = tabular_audit(False)
    from_dict = parse(render_html(a.report, attributions=a.attributions))
    from_json = parse(render_html(json.loads(a.report_bytes), attributions=a.attributions))
    assert [t.rows for t in from_dict.tables] == [t.rows for t in from_json.tables]
    assert from_dict.images.keys() == from_json.images.keys()


@pytest.mark.slow  # the real audit of the digits CNN, or 11 methods' figures
def test_a_report_with_stringified_arrays_and_no_attributions_still_renders():
    report = json.loads((ASSETS / "digits_report_stringified.json").read_text())
    page = parse(render_html(report))
    assert page.text.count("No attribution maps were supplied") == 1
    interactions = next(t for t in page.tables if t.caption.startswith("The model's largest interactions"))
    assert interactions.rows[0][:3] == ["{r1c2}", "6", "1"]
    assert len(interactions.rows[0][5].split(", ")) == 4  # one I(S) per input
    assert {f"allocation-{m['name']}" for m in report["methods"]} <= page.images.keys()


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (SignatureStatus("verified", "ab" * 32, "checked"), "✔ signature verified"),
        (SignatureStatus("not_checked", "cd" * 32, "no key"), "(claimed by the envelope, not checked)"),
        (None, "⚠ unsigned report"),
    ],
)
def test_signature_status_and_key_id_are_shown(status, expected):
    a = tabular_audit(False)
    page = parse(render_html(a.report, signature=status))
    assert expected in page.text
    signature = page.table("signature-table")
    assert signature.row_headers == ["status", "key id", "detail"]
    if status is not None:
        assert status.key_id in page.text
    model = page.table("model-table")
    assert model.rows[0] == ["sha256", a.report["model"]["sha256"]]
    assert page.table("inputs-table").rows[0][1] == a.report["inputs"]["sha256"]


def test_print_css_hides_navigation_and_keeps_details_collapsed():
    a = tabular_audit(False)
    html = render_html(a.report)
    css = re.search(r"@media print \{(.*)\}\s*</style>", html, re.S)
    assert css is not None
    assert re.search(r"nav\.toc \{ display: none; \}", css.group(1))
    assert "section#interactions, section#provenance { break-before: page; }" in css.group(1)
    assert html.count('<details class="method"') == len(a.report["methods"])
    assert '<details class="method" open' not in html
    assert "break-inside: avoid" in css.group(1)


def test_importing_the_renderer_does_not_import_matplotlib():
    code = "import sys, clients.render; assert 'matplotlib' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])


def test_a_minimal_report_without_game_or_criteria_renders_what_it_has():
    report = {
        "schema": "xaudit.report/v1",
        "model": {"sha256": "0" * 64, "format": "onnx"},
        "methods": [{"name": "saliency", "verdict": "unreliable", "reason": "fails coverage (0.3 > 0.05)"}],
    }
    page = parse(render_html(report))
    assert "carries no interaction (game) section" in page.text
    row = page.table("verdict-table").rows[0]
    assert row[:2] == ["saliency", "✘ unreliable"]
    assert row[2] == "– not measured"


def test_long_vectors_are_drawn_without_sixty_named_ticks():
    a = tabular_audit(False)
    wide = {"shapley_value": np.random.default_rng(0).normal(size=(2, 60))}
    alt = parse(render_html(a.report, attributions=wide)).images["grid-0"]["alt"]
    assert "to each of 60 units (columns: feature 0, feature 1," in alt
    top = int(np.argmax(np.abs(wide["shapley_value"][0])))
    assert f"shapley_value: largest |attribution| on feature {top} " in alt


def test_numbers_share_one_format():
    from clients.render._tables import fmt

    assert [fmt(3.73e-09), fmt(0.0), fmt(-1e-9), fmt(0.8201), fmt(12345.6), fmt(None)] == [
        "0.000", "0.000", "0.000", "0.820", "12,346", "n/a",
    ]  # fmt: skip


def test_a_v2_report_with_inconclusive_verdicts_and_intervals_renders():
    report = {
        "schema": "xaudit.report/v2",
        "model": {"sha256": "0" * 64, "format": "onnx"},
        "game": {"unaudited": {"share": 0.125, "limit": 0.5}},
        "methods": [
            {
                "name": "saliency",
                "verdict": "inconclusive",
                "reason": "too few samples to decide",
                "criteria": {
                    "coverage": {
                        "score": 0.04,
                        "lower": 0.01,
                        "upper": 0.09,
                        "level": 0.95,
                        "tolerance": 0.05,
                        "status": "undecided",
                        "passed": True,
                        "interval": {"samples": 4},
                    },
                    "complete_allocation": {
                        "score": 0.0,
                        "lower": 0.0,
                        "upper": 0.01,
                        "tolerance": 0.05,
                        "status": "holds",
                        "passed": True,
                    },
                },
            },
            {"name": "occlusion_1", "verdict": "reliable", "reason": "ok"},
        ],
    }
    page = parse(render_html(report))
    row = page.table("decision-table").rows[0]
    assert row[1] == "? inconclusive"
    assert row[2] == "coverage 0.040 [0.010, 0.090] vs 0.050; straddles it"
    assert row[3] == "too few samples to decide"
    assert page.table("decision-table").rows[1][2] == "not measured"  # no criteria, nothing invented
    assert "12.5% of the effect mass above that order is not audited" in page.text
