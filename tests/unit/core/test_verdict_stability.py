"""Verdicts of the deterministic methods on the 8-player digits CNN and a 10-feature MLP do not move.

The expected verdicts were measured before confidence intervals, the unaudited-mass split and the
exact background averages were introduced (bench/verdicts_check.py wrote them); none of those may
change a deterministic method's verdict on these models.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.verdicts_check import measure

EXPECTED = Path(__file__).resolve().parents[2] / "assets" / "verdicts" / "deterministic_verdicts.json"


@pytest.mark.slow
def test_deterministic_verdicts_do_not_change() -> None:
    expected = json.loads(EXPECTED.read_text())
    got = {key: value["verdict"] for key, value in measure().items()}
    assert got == expected
