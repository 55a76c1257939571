"""`xaudit serve` and `xaudit worker` take --metrics-port; without it nothing is served or recorded."""

from __future__ import annotations

import socket

import pytest
from prometheus_client import CollectorRegistry

from clients.cli.main import build_parser
from service import metrics as sm
from workers import metrics as wm
from xaudit.contract.errors import Unavailable
from xaudit.contract.metrics_http import serve_metrics


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


def test_a_metrics_port_in_use_is_one_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = f"cannot serve metrics on 127.0.0.1:{port}: Address already in use"
        with pytest.raises(Unavailable, match=message):
            serve_metrics(port, CollectorRegistry(), addr="127.0.0.1")
        before = sm.active()
        with pytest.raises(Unavailable, match=message):
            sm.start_service_metrics(port, addr="127.0.0.1")
        assert sm.active() is before  # refused: nothing activated
