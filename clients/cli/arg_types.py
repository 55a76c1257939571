"""argparse types: a value is refused where it is parsed (one usage line naming the option), never
clamped, and never reaches a server, a worker or Celery as something they would fail on later."""

from __future__ import annotations

import argparse
import math

from clients._addresses import grpc_target, host_port

__all__ = [
    "duration",
    "grpc_target",
    "host_port",
    "non_negative_int",
    "port_number",
    "positive_int",
    "positive_seconds",
    "url",
]


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None


def positive_int(text: str) -> int:
    """An integer of at least 1."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer of at least 0."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def port_number(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    value = _integer(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {value}")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds above 0, got {text}")
    return value


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """A lifetime such as 90d, 12h, 30m or 45s (a number above 0 and a unit), in seconds: a bare
    number would leave a reader guessing the unit."""
    number, unit = text[:-1], text[-1:].lower()
    try:
        value = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 90d, 12h, 30m or 45s, got '{text}'"
        ) from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite duration above 0, got '{text}'")
    return value


def url(text: str) -> str:
    """A URL with its scheme (redis://HOST:6379/0): without one, Celery would read a host name as an
    AMQP server and retry it forever."""
    scheme, sep, _ = text.partition("://")
    if not sep or not scheme or not scheme.replace("+", "").isalnum():
        raise argparse.ArgumentTypeError(f"expected a URL such as redis://HOST:6379/0, got '{text}'")
    return text
