"""`xaudit serve` and `xaudit worker` take --metrics-port; without it nothing is served or recorded."""

from __future__ import annotations

import pytest

from clients.cli.main import build_parser
from service import metrics as sm
from workers import metrics as wm


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--metrics-port", "9108"],
        ["worker", "--broker", "redis://h:6379/0", "--server", "h:50051", "--metrics-port", "9108"],
    ],
)
def test_metrics_port_flag(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert args.metrics_port == 9108
    assert (
        build_parser().parse_args([a for a in argv if a not in ("--metrics-port", "9108")]).metrics_port
        is None
    )


def test_no_port_means_no_endpoint_and_no_activation() -> None:
    before = sm.active(), wm.active()
    assert sm.start_service_metrics(None) is None
    assert wm.serve_worker_metrics(None) is None
    assert (sm.active(), wm.active()) == before
