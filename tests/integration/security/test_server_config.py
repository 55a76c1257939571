"""A server that cannot start says why in one line, before it binds: TLS files that are not what they
claim to be, a data directory that cannot be created. A tokens file that does not exist yet is
served (tokens created later are read) but warned about: every call would be refused."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from service.auth import Authenticator
from service.config import ServerConfig
from service.server import create_server
from tests.integration.security._certs import write_certs
from xaudit.contract.errors import InvalidInput

pytestmark = pytest.mark.integration


@pytest.fixture
def certs(tmp_path: Path) -> dict[str, Path]:
    files = write_certs(tmp_path)
    (tmp_path / "notes.txt").write_text("not a certificate\n")
    files["notes.txt"] = tmp_path / "notes.txt"
    return files


def _tls(files: dict[str, Path], cert: str, key: str, ca: str | None = None) -> ServerConfig:
    return ServerConfig(
        listen="127.0.0.1:0",
        tls_cert_file=files[cert],
        tls_key_file=files[key],
        tls_client_ca_file=files[ca] if ca else None,
    )


@pytest.mark.parametrize(
    ("cert", "key", "ca", "message"),
    [
        ("notes.txt", "server.key", None, r"the TLS certificate \S+notes.txt holds no PEM certificate"),
        ("server.pem", "notes.txt", None, r"the TLS key \S+notes.txt is not an unencrypted PEM private key"),
        ("server.key", "server.key", None, r"the TLS certificate \S+server.key holds no PEM certificate"),
        ("server.pem", "client.key", None, r"the TLS key \S+client.key does not belong to the certificate"),
        ("server.pem", "server.key", "notes.txt", r"the TLS client CA \S+notes.txt holds no PEM certificate"),
    ],
)
def test_tls_files_that_are_not_what_they_claim_are_refused_by_name(
    certs: dict[str, Path], cert: str, key: str, ca: str | None, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        Authenticator(_tls(certs, cert, key, ca))


def test_a_matching_certificate_and_key_are_taken(certs: dict[str, Path]) -> None:
    assert Authenticator(_tls(certs, "server.pem", "server.key", "ca.pem")).tls is not None


def test_a_data_directory_that_cannot_be_created_is_one_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config = ServerConfig(listen="127.0.0.1:0", home=blocker / "home")
    with pytest.raises(
        InvalidInput, match=f"cannot create the data directory {blocker / 'home'}: Not a directory"
    ):
        create_server(config, sender=lambda job, queue: None)


def test_a_missing_tokens_file_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tokens = tmp_path / "tokens.yaml"
    with caplog.at_level(logging.WARNING, logger="service.auth"):
        Authenticator(ServerConfig(listen="127.0.0.1:0", tokens_file=tokens))
    assert f"tokens file {tokens} does not exist: every call is refused" in caplog.text
    caplog.clear()
    tokens.write_text("tokens: []\n")
    with caplog.at_level(logging.WARNING, logger="service.auth"):
        Authenticator(ServerConfig(listen="127.0.0.1:0", tokens_file=tokens))
    assert "does not exist" not in caplog.text
