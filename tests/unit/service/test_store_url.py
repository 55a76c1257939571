"""A job store URL that cannot be used stops the server in one line that says why, with any password
in it masked: not SQLAlchemy's traceback, not an internal error."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from service.store import JobStore
from xaudit.contract.errors import InvalidInput, Unavailable


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_text_that_is_no_url_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match=r"not a job store URL: expected e\.g\. postgresql"):
        JobStore("nonsense")


def test_an_unknown_dialect_is_named() -> None:
    with pytest.raises(InvalidInput, match="dialect 'foo' is not one SQLAlchemy knows"):
        JobStore("foo://host/db")


def test_a_server_that_does_not_answer_is_unavailable_with_the_password_masked() -> None:
    pytest.importorskip("psycopg")
    port = _closed_port()
    with pytest.raises(Unavailable) as info:
        JobStore(f"postgresql+psycopg://xaudit:s3cret-pw@127.0.0.1:{port}/jobs")
    message = str(info.value)
    assert message.startswith(
        f"cannot open the job store postgresql+psycopg://xaudit:***@127.0.0.1:{port}/jobs: "
    )
    assert "Connection refused" in message and "s3cret" not in message and "\n" not in message


def test_a_sqlite_file_that_cannot_be_opened_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(Unavailable, match="unable to open database file"):
        JobStore(f"sqlite:///{tmp_path / 'missing-dir' / 'jobs.db'}")
