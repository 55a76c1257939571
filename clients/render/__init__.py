"""A self-contained HTML page for an xaudit report: verdicts, attributions, the model's interactions,
each method's allocation, provenance. One file, no network: inline CSS, figures as PNG data URIs.

``render_html(report, attributions=..., inputs=..., signature=...)`` returns the page;
``read_report(bytes, keys)`` opens a report or a signed envelope (verifying it when keys are given);
``write_html(...)`` is the one call the CLI commands make.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from clients.render._source import SignatureStatus, read_report

__all__ = ["SignatureStatus", "read_report", "render_html", "write_html"]


def render_html(
    report: Mapping[str, Any],
    *,
    attributions: Mapping[str, np.ndarray] | None = None,
    inputs: np.ndarray | None = None,
    signature: SignatureStatus | None = None,
    player_labels: np.ndarray | None = None,
    vocab: Sequence[str] | None = None,
) -> str:
    """The page for ``report`` (an ``xaudit.report`` v2 or v1 dict, JSON or straight from ``run_audit``).

    ``attributions``: method name -> (B, *sample_shape) maps of the audited inputs (other keys, such
    as an attribution job's ``target_values``, are ignored). ``inputs``: the audited inputs, drawn
    under image heatmaps. ``player_labels``: sample-shaped map from element to player index, needed to
    sum a tabular model's features into its groups. ``vocab``: token id -> word, to show a text
    model's inputs as text. ``signature``: what is known about the report's
    signature (default: unsigned).
    """
    from clients.render._data import as_floats, normalise_report, players_of
    from clients.render._grid import grid_section
    from clients.render._page import document
    from clients.render._sections import (
        decision_section,
        header,
        interactions_section,
        method_section,
        provenance_section,
    )

    doc = normalise_report(report)
    status = signature or SignatureStatus(
        "unsigned",
        None,
        "this report came without a signature (local audits are unsigned; the service signs its reports)",
    )
    methods = [m for m in doc.get("methods") or [] if isinstance(m, dict)]
    config = doc.get("config") or {}
    game = doc.get("game") or {}
    players = players_of(doc)
    classes = as_floats(game.get("classes"))
    maps = {k: np.asarray(v) for k, v in (attributions or {}).items()}
    tolerances = config.get("tolerances") or {}
    sections = [
        header(doc, status, methods),
        decision_section(doc, methods, config),
        grid_section(methods, maps, inputs, players, player_labels, classes, vocab),
        '<section id="methods"><h2>Method details</h2>'
        '<p class="note">One line per method; open it for its criteria, how it allocates effects of each '
        "order, and the sets where it is furthest off.</p>",
        *(method_section(m, tolerances=tolerances) for m in methods),
        "</section>",
        interactions_section(game),
        provenance_section(doc, status),
    ]
    title = f"xaudit report {str((doc.get('model') or {}).get('sha256', ''))[:12]}"
    return document(title, "".join(sections))


def write_html(
    path: Path,
    report: Mapping[str, Any],
    *,
    attributions: Mapping[str, np.ndarray] | None = None,
    inputs: np.ndarray | None = None,
    signature: SignatureStatus | None = None,
    player_labels: np.ndarray | None = None,
    vocab: Sequence[str] | None = None,
) -> None:
    """Render and write the page (UTF-8): what ``--html`` on audit, submit and render calls."""
    page = render_html(
        report,
        attributions=attributions,
        inputs=inputs,
        signature=signature,
        player_labels=player_labels,
        vocab=vocab,
    )
    from xaudit.contract.errors import InvalidInput

    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot write the HTML page to {path} ({exc.strerror})") from None
