"""Headless Chromium (Debian's chromium + chromium-driver) driven by selenium, for the rendered pages.

``browser_skip_reason()`` says why the browser tests cannot run here (None when they can), so they
skip with a reason rather than fail on a machine without Chromium.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PageResult", "browser_skip_reason", "chromium", "open_page", "save_full_page"]

CHROMIUM = ("/usr/bin/chromium", "/usr/lib/chromium/chromium")
DRIVER = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
)


def _first(paths: tuple[str, ...]) -> str | None:
    return next((p for p in paths if Path(p).exists()), None)


def browser_skip_reason() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium)"
    if _first(CHROMIUM) is None:
        return "no system Chromium (apt-get install chromium chromium-driver)"
    if _first(DRIVER) is None:
        return "no chromedriver (apt-get install chromium-driver)"
    return None


@contextmanager
def chromium(width: int = 1200, height: int = 900) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="xaudit-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = _first(CHROMIUM) or ""
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: selenium-manager must not try to download one.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=_first(DRIVER)))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@dataclass
class PageResult:
    console_errors: list[str]
    images: list[dict[str, Any]]  # id, alt, natural width/height of every <img>
    tables: list[dict[str, Any]]  # caption, scoped header count of every <table>
    text: str


def save_full_page(driver: Any, path: Path) -> None:
    """The whole page, not just the window (whose height Chromium caps), through the DevTools protocol."""
    import base64

    path.parent.mkdir(parents=True, exist_ok=True)
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 30000), "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(shot["data"]))


def open_page(driver: Any, page: Path, screenshot: Path | None = None) -> PageResult:
    driver.get(page.resolve().as_uri())
    # Wait until every image has decoded (data URIs, but decoding is still asynchronous).
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "Promise.all([...document.images].map(i => i.decode().catch(() => null))).then(() => done(true));"
    )
    images = driver.execute_script(
        "return [...document.images].map(i => ({id: i.id, alt: i.alt, w: i.naturalWidth, h: i.naturalHeight,"
        " src: i.src.slice(0, 22)}));"
    )
    tables = driver.execute_script(
        "return [...document.querySelectorAll('table')].map(t => ({id: t.id,"
        " caption: t.caption ? t.caption.textContent : '', col: t.querySelectorAll('thead th[scope=col]').length,"
        " row: t.querySelectorAll('tbody th[scope=row]').length, rows: t.tBodies[0].rows.length}));"
    )
    text = driver.execute_script("return document.body.innerText;")
    if screenshot is not None:
        save_full_page(driver, screenshot)
    errors = [
        f"{entry.get('level')}: {entry.get('message')}"
        for entry in driver.get_log("browser")
        if entry.get("level") in ("SEVERE", "ERROR")
    ]
    return PageResult(errors, images, tables, text)
