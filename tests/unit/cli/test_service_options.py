"""`xaudit serve`, `worker`, `jobs`, `demo` and `token create` refuse a bad option value where it is parsed, in one
line naming the option: a negative port or count, a NaN lease, a broker without a scheme (which Celery
would read as an AMQP host and retry forever), an address without a port."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.cli.main import build_parser, main

TOKEN = ["token", "create", "--tenant", "a", "--tokens", "t.yaml"]
WORKER = ["worker", "--broker", "redis://127.0.0.1:6379/0", "--server", "127.0.0.1:50051"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["serve", "--concurrency", "0"], "argument --concurrency: must be at least 1, got 0"),
        (["serve", "--upload-cap-mb", "-1"], "argument --upload-cap-mb: must be at least 1, got -1"),
        (["serve", "--lease-seconds", "nan"], "argument --lease-seconds: must be a finite number of seconds above 0, got nan"),
        (["serve", "--lease-seconds", "0"], "argument --lease-seconds: must be a finite number of seconds above 0, got 0"),
        (["serve", "--lease-seconds", "soon"], "argument --lease-seconds: 'soon' is not a number of seconds"),
        (["serve", "--metrics-port", "99999"], "argument --metrics-port: a port is 0 to 65535, got 99999"),
        (["serve", "--metrics-port", "-1"], "argument --metrics-port: a port is 0 to 65535, got -1"),
        (["serve", "--broker", "nonsense"], "argument --broker: expected a URL such as redis://HOST:6379/0, got 'nonsense'"),
        (["serve", "--advertise", "nonsense"], "argument --advertise: expected HOST:PORT with a port of 1 to 65535, got 'nonsense'"),
        (["serve", "--advertise", "host:0"], "argument --advertise: expected HOST:PORT"),
        (["worker", "--broker", "notaurl", "--server", "h:1"], "argument --broker: expected a URL"),
        (["worker", "--broker", "redis://h/0", "--server", "h"], "argument --server: expected HOST:PORT"),
        (["worker", "--broker", "redis://h/0", "--server", ":50051"], "argument --server: expected HOST:PORT"),
        ([*WORKER, "--concurrency", "-3"], "argument --concurrency: must be at least 1, got -3"),
        ([*WORKER, "--time-limit", "0"], "argument --time-limit: must be at least 1, got 0"),
        ([*WORKER, "--metrics-port", "70000"], "argument --metrics-port: a port is 0 to 65535, got 70000"),
        (["jobs", "--limit", "-1"], "argument --limit: must be at least 0, got -1"),
        (["jobs", "--server", "localhost"], "argument --server: expected HOST:PORT with a port of 1 to 65535, or a gRPC target"),
        (["report", "JOB", "--server", "unix:"], "argument --server: expected HOST:PORT"),
        (["demo", "--server", "h:0"], "argument --server: expected HOST:PORT"),
        (["demo", "--startup-timeout", "-5"], "argument --startup-timeout: must be a finite number of seconds above 0"),
        ([*TOKEN, "--expires-in", "90"], "argument --expires-in: expected a duration such as 90d, 12h, 30m or 45s, got '90'"),
        ([*TOKEN, "--expires-in", "0d"], "argument --expires-in: must be a finite duration above 0, got '0d'"),
        ([*TOKEN, "--expires-in", "infh"], "argument --expires-in: must be a finite duration above 0, got 'infh'"),
        ([*TOKEN, "--expires-in", "soon"], "argument --expires-in: expected a duration"),
    ],
)  # fmt: skip
def test_a_bad_value_is_refused_in_one_line(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.count("\n") == 1 and expected in err, err


def test_good_values_parse_as_typed_values() -> None:
    serve = build_parser().parse_args(
        ["serve", "--broker", "filesystem:///tmp/b", "--advertise", "[::1]:50051", "--lease-seconds", "2.5",
         "--metrics-port", "0", "--concurrency", "2", "--upload-cap-mb", "64"]
    )  # fmt: skip
    assert (serve.broker, serve.advertise, serve.lease_seconds) == ("filesystem:///tmp/b", "[::1]:50051", 2.5)
    assert (serve.metrics_port, serve.concurrency, serve.upload_cap_mb) == (0, 2, 64)
    worker = build_parser().parse_args([*WORKER, "--time-limit", "60", "--metrics-port", "9108"])
    assert (worker.server, worker.time_limit, worker.metrics_port) == ("127.0.0.1:50051", 60, 9108)
    assert build_parser().parse_args(["jobs", "--limit", "0"]).limit == 0
    for target in ("[::1]:50051", "unix:/run/xaudit.sock", "dns:///xaudit.internal:50051"):
        assert build_parser().parse_args(["jobs", "--server", target]).server == target
    lifetimes = [
        build_parser().parse_args([*TOKEN, "--expires-in", d]).expires_in
        for d in ("90d", "1.5h", "30m", "45S")
    ]
    assert lifetimes == [90 * 86400.0, 5400.0, 1800.0, 45.0]


def test_a_bad_server_in_the_environment_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """$XAUDIT_SERVER is checked as --server is, before anything dials it (grpc would take a host
    without a port as port 443 and wait out the deadline)."""
    monkeypatch.setenv("XAUDIT_SERVER", "localhost")
    assert main(["jobs"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "$XAUDIT_SERVER: expected HOST:PORT" in err, err


def test_token_create_shows_the_expiry_it_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The expiry printed and the one stored count from one instant: each clock reading here is 0.6 s
    after the last, so two readings would fall in different seconds."""
    import itertools
    import time

    from service.tokens import list_tokens, utc

    clock = itertools.count(1_767_000_000.5, 0.6)
    monkeypatch.setattr(time, "time", lambda: next(clock))
    tokens = tmp_path / "tokens.yaml"
    assert main(["token", "create", "--tenant", "a", "--tokens", str(tokens), "--expires-in", "1h"]) == 0
    (entry,) = list_tokens(tokens)
    assert entry.expires_at is not None
    assert f"it expires at {utc(entry.expires_at)} UTC" in capsys.readouterr().err
