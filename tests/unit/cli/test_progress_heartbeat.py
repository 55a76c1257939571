"""Off a terminal the progress of long work is one line a minute on stderr, and short work prints
nothing (CI logs stay clean). Before, an audit whose plan said 62 minutes printed nothing at all
until it ended when stderr was not a terminal."""

from __future__ import annotations

import pytest

from clients.cli.progress import heartbeat, progress_bar


def test_a_heartbeat_line_once_a_minute_and_none_before(capsys: pytest.CaptureFixture[str]) -> None:
    now = [100.0]
    update = heartbeat("audit", every=60.0, clock=lambda: now[0])
    for t, fraction in ((110.0, 0.01), (159.0, 0.02), (161.0, 0.1), (200.0, 0.2), (222.0, 0.37)):
        now[0] = t
        update(fraction, "auditing integrated_gradients")
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "xaudit audit: 10% auditing integrated_gradients (1 min)",
        "xaudit audit: 37% auditing integrated_gradients (2 min)",
    ]


def test_off_a_terminal_the_progress_bar_is_the_heartbeat(capsys: pytest.CaptureFixture[str]) -> None:
    with progress_bar("audit") as update:  # pytest's captured stderr is no terminal
        update(0.5, "auditing lrp_epsilon")
    assert capsys.readouterr().err == ""  # short work: nothing
