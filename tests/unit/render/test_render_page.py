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
def test_image_page_has_an_overlaid_heatmap_and_allocation_picture_per_method(image_page):
    page, report = image_page
    names = _applicable(report)
    assert len(names) == 4
    for name in names:
        heat = page.images[f"heatmap-{name}"]
        assert name in heat["alt"] and "overlaid on the input image" in heat["alt"]
        assert _png(heat["src"]).size[0] > 200
        assert name in page.images[f"allocation-{name}"]["alt"]
    assert "interactions-figure" in page.images


@pytest.mark.slow  # the real audit of the digits CNN, or 11 methods' figures
def test_heatmap_alt_text_states_the_attribution_totals():
    a = image_audit()
    page = parse(render_html(a.report, attributions=a.attributions, inputs=a.inputs))
    for name, maps in a.attributions.items():
        alt = page.images[f"heatmap-{name}"]["alt"]
        for b in range(len(maps)):
            assert f"input {b}: {float(maps[b].sum()):.3g}" in alt


@pytest.mark.slow  # the real audit of the digits CNN, or 11 methods' figures
def test_verdict_table_reads_without_colour(image_page):
    page, report = image_page
    table = page.table("verdict-table")
    assert table.col_headers[:2] == ["Method", "Verdict"]
    assert len(table.col_headers) == 7
    assert table.row_headers == [m["name"] for m in report["methods"]]
    for row, method in zip(table.rows, report["methods"], strict=True):
        verdict_word = {
            "reliable": "✔ reliable",
            "unreliable": "✘ unreliable",
            "inconclusive": "? inconclusive",
        }[method["verdict"]]
        assert row[1] == verdict_word
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


def test_tabular_page_draws_bars_named_by_player_and_says_not_applicable(tabular_page):
    page, report = tabular_page
    assert "heatmap-grad_cam" not in page.images
    assert "Not applicable to this model" in page.text
    for name in _applicable(report):
        alt = page.images[f"heatmap-{name}"]["alt"]
        assert alt.startswith(f"Bar charts of {name} attributions per player (x0, x1, x2, x3, x4, x5)")


def test_groups_are_summed_per_group_when_the_map_is_given():
    a = tabular_audit(True)
    page = parse(render_html(a.report, attributions=a.attributions, player_labels=GROUPS))
    for name in _applicable(a.report):
        alt = page.images[f"heatmap-{name}"]["alt"]
        assert f"({', '.join(GROUP_NAMES)})" in alt
        sums = np.stack([a.attributions[name][:, g == GROUPS].sum(axis=1) for g in range(3)], axis=1)
        for b in range(len(sums)):
            top = int(np.argmax(np.abs(sums[b])))
            assert f"input {b}: largest |attribution| on {GROUP_NAMES[top]} ({sums[b, top]:+.3g})" in alt
    without = parse(render_html(a.report, attributions=a.attributions))
    assert "feature 0" in without.images["heatmap-shapley_value"]["alt"]
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
    assert page.text.count("No attribution maps were supplied") == len(report["methods"])
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


def test_print_css_hides_navigation_and_breaks_pages_per_method():
    a = tabular_audit(False)
    html = render_html(a.report)
    css = re.search(r"@media print \{(.*)\}\s*</style>", html, re.S)
    assert css is not None
    assert re.search(r"nav\.toc \{ display: none; \}", css.group(1))
    assert "section.method, section#interactions, section#provenance { break-before: page;" in css.group(1)
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


def test_long_vectors_are_drawn_as_profiles_not_sixty_named_bars():
    a = tabular_audit(False)
    wide = {"shapley_value": np.random.default_rng(0).normal(size=(2, 60))}
    alt = parse(render_html(a.report, attributions=wide)).images["heatmap-shapley_value"]["alt"]
    assert alt.startswith("Attribution profiles of shapley_value over 60 units for 2 audited inputs")
    top = int(np.argmax(np.abs(wide["shapley_value"][0])))
    assert f"input 0: largest |attribution| on feature {top} " in alt
