"""What a command that produced a report prints: the verdict table on stdout (or, with ``--json``,
one JSON object), the settings the audit used once, and the paths it wrote. Progress and logs go to
stderr, so that ``xaudit audit ... > verdicts.txt`` holds just the verdicts."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["add_json_option", "print_outcome"]


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="print a machine-readable JSON summary on stdout instead of the table",
    )


def print_outcome(
    args: argparse.Namespace,
    report: Mapping[str, Any] | None,
    paths: Mapping[str, Path | None],
    *,
    settings: str = "",
    extra: Mapping[str, Any] | None = None,
) -> None:
    """``paths``: what was written, by role (report, html, attributions...); None entries are skipped."""
    from clients._report import report_summary, verdict_table

    written = {k: str(v.resolve()) for k, v in paths.items() if v is not None}
    if getattr(args, "json", False):
        out: dict[str, Any] = dict(extra or {})
        if report is not None:
            out.update(report_summary(report))
        if settings:
            out["settings"] = settings.removeprefix("settings: ")
        out["written"] = written
        print(json.dumps(out, indent=2, sort_keys=True))
        return
    if report is not None:
        print(verdict_table(report))
    if settings:
        print(settings)
    for role, path in written.items():
        print(f"{role}: {path}")
    sys.stdout.flush()
