"""The environment's on/off switches: off-by-default ones need a yes, on-by-default ones a no."""

from __future__ import annotations

from workers.switches import switch


def test_switches_read_yes_and_no_whatever_the_case() -> None:
    assert not switch("X", False, {}) and switch("X", True, {})
    assert switch("X", False, {"X": " Yes "}) and switch("X", False, {"X": "1"})
    assert not switch("X", False, {"X": "on?"})  # not a yes: stays off
    assert not switch("X", True, {"X": "FALSE"}) and not switch("X", True, {"X": "0"})
    assert switch("X", True, {"X": "off?"})  # not a no: stays on
