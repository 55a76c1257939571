"""Fixtures of the security tests: a private redis-server that a test may kill and restart."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.integration.security._infra import RedisServer


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    try:
        server = RedisServer.start_new()
    except (RuntimeError, FileNotFoundError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot start a private redis-server: {exc}")
    try:
        yield server
    finally:
        server.close()
