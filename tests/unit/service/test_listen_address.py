"""The host of a listen address, read once for the probe bind, the loopback check and the address
the service advertises to its embedded worker: IPv6 hosts in brackets, wildcards advertised as
loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.config import ServerConfig
from service.listen import host_of
from service.server import _advertised


@pytest.mark.parametrize(
    ("listen", "host", "advertised"),
    [
        ("127.0.0.1:50051", "127.0.0.1", "127.0.0.1:7"),
        ("[::1]:0", "::1", "[::1]:7"),
        ("0.0.0.0:0", "0.0.0.0", "127.0.0.1:7"),
        ("[::]:50051", "::", "127.0.0.1:7"),
        (":50051", "", "127.0.0.1:7"),
        ("xaudit.internal:50051", "xaudit.internal", "xaudit.internal:7"),
    ],
)
def test_host_and_advertised_address(listen: str, host: str, advertised: str, tmp_path: Path) -> None:
    assert host_of(listen) == host
    assert _advertised(ServerConfig(listen=listen, home=tmp_path), 7) == advertised
