"""Rendered pages in headless Chromium: no console errors (the page's CSP also turns any network load
into one), every method's heatmap decoded and visible, tables captioned; screenshots of the screen and
print layouts and a printed PDF go to tests/_artifacts/render/ for a person to look at.

Needs Debian's chromium and chromium-driver plus PyPI selenium; skips with the reason otherwise.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clients.render import SignatureStatus, render_html
from tests.integration.render._browser import (
    PageResult,
    browser_skip_reason,
    chromium,
    open_page,
    save_full_page,
)
from tests.unit.render._reports import GROUP_NAMES, GROUPS, image_audit, tabular_audit, text_audit

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "tests" / "_artifacts" / "render"
SIGNING = ROOT / "tests" / "assets" / "signing"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    reason = browser_skip_reason()
    if reason is not None:
        pytest.skip(f"headless Chromium unavailable: {reason}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with chromium() as driver:
        yield driver


def _check_page(result: PageResult, report: dict[str, Any], driver: Any) -> None:  # type: ignore[misc]
    """The reviewer's acceptance: the decision table inside the first 1280x900 screen, the method grid
    present, the page under 6,000 px with details collapsed, no console errors."""
    assert result.console_errors == []
    assert driver.execute_script("return window.scrollY") == 0
    bottom = driver.execute_script(
        "return document.querySelector('#decision-table').getBoundingClientRect().bottom"
    )
    assert 0 < bottom <= 900, bottom
    assert driver.execute_script("return document.documentElement.scrollHeight") < 6000
    assert driver.execute_script("return [...document.querySelectorAll('details[open]')].length") == 0
    images = {i["id"]: i for i in result.images}
    text_grid = driver.execute_script("return document.querySelectorAll('table.text-grid').length")
    assert "grid-0" in images or text_grid > 0
    for method in report["methods"]:
        if method["verdict"] != "not_applicable":
            image = images[f"allocation-{method['name']}"]
            assert image["w"] > 100 and image["h"] > 100, image  # decoded, not a broken-image icon
    assert all(i["alt"] for i in result.images)
    for table in result.tables:
        assert table["caption"] and table["col"] > 0 and table["rows"] > 0, table
    assert "✔" in result.text or "✘" in result.text


def _pdf_pages(driver: Any) -> int:
    pdf = driver.execute_cdp_cmd("Page.printToPDF", {"printBackground": True, "preferCSSPageSize": True})
    data = base64.b64decode(pdf["data"])
    assert data.startswith(b"%PDF")
    return data.count(b"/Type /Page") - data.count(b"/Type /Pages")


def _print_views(driver: Any, name: str) -> None:
    """The print layout as Chromium lays it out for a PDF, and the PDF itself."""
    pdf = driver.execute_cdp_cmd("Page.printToPDF", {"printBackground": False, "preferCSSPageSize": True})
    data = base64.b64decode(pdf["data"])
    assert data.startswith(b"%PDF")
    (ARTIFACTS / f"{name}.pdf").write_bytes(data)
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
    try:
        assert (
            driver.execute_script("return getComputedStyle(document.querySelector('nav.toc')).display")
            == "none"
        )
        save_full_page(driver, ARTIFACTS / f"{name}-print.png")
    finally:
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": ""})


def test_image_model_page_in_chromium(browser: Any) -> None:
    a = image_audit()
    page = ARTIFACTS / "image.html"
    page.write_text(render_html(a.report, attributions=a.attributions, inputs=a.inputs), encoding="utf-8")
    result = open_page(browser, page, ARTIFACTS / "image.png")
    browser.save_screenshot(str(ARTIFACTS / "image-first-screen.png"))
    _check_page(result, a.report, browser)
    assert all(
        m["name"] in next(i["alt"] for i in result.images if i["id"] == "grid-0") for m in a.report["methods"]
    )
    _print_views(browser, "image")
    assert 1 <= _pdf_pages(browser) <= 6


def test_the_decision_for_fourteen_methods_fits_the_first_screen(browser: Any) -> None:
    """The demo audits fourteen methods: their decision table must still be on the first screen, with
    the longest reasons the audit writes (several failing criteria, a worst set)."""
    from xaudit.contract.names import FOURTEEN_METHODS

    a = image_audit()
    base = sorted(a.report["methods"], key=lambda m: len(str(m.get("reason", ""))))[-1]
    report = {k: v for k, v in a.report.items() if k != "summary"}  # counts from the methods
    report["methods"] = [dict(base, name=name) for name in FOURTEEN_METHODS]
    page = ARTIFACTS / "fourteen.html"
    page.write_text(render_html(report), encoding="utf-8")
    result = open_page(browser, page)
    browser.save_screenshot(str(ARTIFACTS / "fourteen-first-screen.png"))
    assert result.console_errors == []
    bottom = browser.execute_script(
        "return document.querySelector('#decision-table').getBoundingClientRect().bottom"
    )
    assert 0 < bottom <= 900, bottom


def test_tabular_model_page_in_chromium(browser: Any) -> None:
    a = tabular_audit(True)
    page = ARTIFACTS / "tabular.html"
    html = render_html(a.report, attributions=a.attributions, inputs=a.inputs, player_labels=GROUPS)
    page.write_text(html, encoding="utf-8")
    result = open_page(browser, page, ARTIFACTS / "tabular.png")
    browser.save_screenshot(str(ARTIFACTS / "tabular-first-screen.png"))
    _check_page(result, a.report, browser)
    assert 1 <= _pdf_pages(browser) <= 6
    assert "grad_cam" in [m["name"] for m in a.report["methods"] if m["verdict"] == "not_applicable"]
    for name in GROUP_NAMES:
        assert name in result.text


def test_text_model_page_in_chromium(browser: Any) -> None:
    from tests.unit.multi_input.models import NEGATION_VOCAB

    a = text_audit()
    page = ARTIFACTS / "text.html"
    html = render_html(a.report, attributions=a.attributions, inputs=a.inputs, vocab=NEGATION_VOCAB)
    page.write_text(html, encoding="utf-8")
    result = open_page(browser, page, ARTIFACTS / "text.png")
    browser.save_screenshot(str(ARTIFACTS / "text-first-screen.png"))
    _check_page(result, a.report, browser)
    # The sentences read as words, highlighted per method: "not" and "good" of the negation sentence.
    row = browser.execute_script("return document.querySelector('#grid-text-0 td.text-row').innerText")
    assert row.split() == ["the", "movie", "was", "not", "good", "<pad>"]
    assert 1 <= _pdf_pages(browser) <= 6


def test_verified_envelope_page_in_chromium(browser: Any, tmp_path: Path) -> None:
    from clients.cli.main import main

    page = ARTIFACTS / "envelope.html"
    argv = ["render", str(SIGNING / "envelope-key-1.json"), "--key", str(SIGNING / "key-1.pub.pem")]
    assert main([*argv, "--html", str(page)]) == 0
    result = open_page(browser, page, ARTIFACTS / "envelope.png")
    assert result.console_errors == []
    assert "✔ signature verified" in result.text


def test_a_page_that_loads_from_the_network_is_caught(browser: Any, tmp_path: Path) -> None:
    """The no-console-errors check has teeth: an external image breaks it (CSP refuses the load)."""
    a = tabular_audit(False)
    html = render_html(a.report, signature=SignatureStatus("unsigned")).replace(
        "</body>", '<img alt="x" src="https://example.invalid/x.png"></body>'
    )
    page = tmp_path / "bad.html"
    page.write_text(html, encoding="utf-8")
    assert open_page(browser, page).console_errors


def test_submit_html_against_a_real_server(browser: Any, embedded_service: Any, tmp_path: Path) -> None:
    assets = ROOT / "workers" / "assets"
    out, page = tmp_path / "report.json", ARTIFACTS / "submit.html"
    env = {k: v for k, v in os.environ.items() if k != "XAUDIT_SERVER"}
    argv = [str(Path(sys.executable).with_name("xaudit")), "submit", "--server", embedded_service.address]
    argv += ["--model", str(assets / "digits_cnn.onnx"), "--input", str(assets / "digits_inputs.npy")]
    argv += [
        "--players",
        "grid:2x4",
        "--methods",
        "occlusion_1,shapley_value",
        "--out",
        str(out),
        "--html",
        str(page),
    ]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    result = open_page(browser, page, ARTIFACTS / "submit.png")
    assert result.console_errors == []
    grid = next(i["alt"] for i in result.images if i["id"] == "grid-0")
    assert "occlusion_1" in grid and "shapley_value" in grid
    assert "✔ signature verified" in result.text  # against the key the server publishes
