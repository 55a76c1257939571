"""Tokens file, scopes, policies and the start-up exposure rule (no network)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest
import yaml

from service.auth import METHOD_SCOPES, Authenticator, check_exposure
from service.config import ServerConfig
from service.tokens import (
    Identity,
    TenantPolicy,
    TokenFile,
    create_token,
    list_tokens,
    parse_scopes,
    prune_tokens,
    revoke_token,
)
from xaudit.contract.errors import InvalidInput, Unauthenticated


class _Context:
    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


def test_created_token_is_stored_hashed_and_found(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    token = create_token(path, "team-a", "read,submit")
    text = path.read_text()
    assert token not in text and hashlib.sha256(token.encode()).hexdigest() in text
    assert os.stat(path).st_mode & 0o777 == 0o600
    identity = TokenFile(path).lookup(token)
    assert identity is not None and identity.tenant == "team-a"
    assert identity.scopes == frozenset({"read", "submit"})
    assert TokenFile(path).lookup(token + "x") is None


def test_file_is_reread_when_it_changes_and_a_broken_edit_keeps_the_last_good_one(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    first = create_token(path, "a", "read")
    tokens = TokenFile(path)
    assert tokens.lookup(first) is not None
    time.sleep(0.01)
    second = create_token(path, "b", "submit")
    assert tokens.lookup(second) is not None  # no restart needed
    path.write_text("tokens: [ {sha256: 12} ]\n")
    assert tokens.lookup(first) is not None  # invalid edit: previous contents still serve
    with pytest.raises(InvalidInput):
        TokenFile(path)  # but a server does not start on it


def test_a_tokens_path_that_is_no_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=f"cannot read the tokens file {tmp_path}: Is a directory"):
        create_token(tmp_path, "a", "read")
    with pytest.raises(InvalidInput, match=f"cannot read the tokens file {tmp_path}: Is a directory"):
        TokenFile(tmp_path)
    binary = tmp_path / "tokens.yaml"
    binary.write_bytes(b"\x93NUMPY")
    with pytest.raises(InvalidInput, match="it is not UTF-8 text"):
        TokenFile(binary)
    if Path("/proc/self").exists():  # a directory nothing may be created in, even by root
        with pytest.raises(InvalidInput, match=r"cannot write the tokens file /proc/xaudit/t\.yaml: "):
            create_token(Path("/proc/xaudit/t.yaml"), "a", "read")


def test_a_tokens_file_that_becomes_unreadable_keeps_the_last_good_one(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    first = create_token(path, "a", "read")
    tokens = TokenFile(path)
    path.unlink()
    path.mkdir()  # read again on the change: a directory now
    assert tokens.lookup(first) is not None


def test_tokens_are_listed_by_id_and_revoked_by_id_or_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    reader = create_token(path, "team-a", "read")
    worker = create_token(path, "gpu", "worker", ["xaudit.gpu"], ["team-a"])
    entries = list_tokens(path)
    assert [(e.id, e.tenant, e.scopes) for e in entries] == [
        (hashlib.sha256(reader.encode()).hexdigest()[:8], "team-a", ("read",)),
        (hashlib.sha256(worker.encode()).hexdigest()[:8], "gpu", ("worker",)),
    ]
    assert (entries[1].queues, entries[1].job_tenants) == (("xaudit.gpu",), ("team-a",))
    running = TokenFile(path)  # a server that has the file loaded
    assert revoke_token(path, entries[0].id) == entries[0]
    assert running.lookup(reader) is None and running.lookup(worker) is not None
    with pytest.raises(InvalidInput, match="no token"):
        revoke_token(path, entries[0].id)
    assert revoke_token(path, worker).tenant == "gpu"  # by the token itself
    assert list_tokens(path) == []
    with pytest.raises(InvalidInput, match="8 or more hex digits"):
        revoke_token(path, "abc")


def test_a_token_stops_working_when_it_expires(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tokens.yaml"
    lasting = create_token(path, "team-a", "read")
    brief = create_token(path, "team-a", "read", expires_in=3600.0)
    running = TokenFile(path)
    now = time.time()
    assert running.lookup(brief) is not None
    [kept, expiring] = list_tokens(path)
    assert kept.expires_at is None and not kept.expired()
    assert expiring.expires_at == pytest.approx(now + 3600.0, abs=5) and not expiring.expired()
    monkeypatch.setattr(time, "time", lambda: now + 3601.0)
    assert expiring.expired()
    with pytest.raises(Unauthenticated, match=rf"token {expiring.id} expired at .* UTC: ask for a new one"):
        running.lookup(brief)
    assert running.lookup(lasting) is not None
    with pytest.raises(InvalidInput, match="lifetime must be a finite number of seconds above 0"):
        create_token(path, "team-a", "read", expires_in=0.0)


def test_prune_removes_only_the_expired_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from clients.cli.main import main

    path = tmp_path / "tokens.yaml"
    lasting = create_token(path, "team-a", "read")
    soon = create_token(path, "team-a", "read", expires_in=60.0)
    later = create_token(path, "team-b", "read", expires_in=3600.0)
    [_, soon_entry, _] = list_tokens(path)
    assert prune_tokens(path) == []  # nothing expired yet: the file is left as it is
    removed = prune_tokens(path, now=time.time() + 120.0)
    assert removed == [soon_entry]
    running = TokenFile(path)
    assert running.lookup(soon) is None and running.lookup(lasting) and running.lookup(later)
    assert main(["token", "prune", "--tokens", str(path)]) == 0
    assert "0 expired token(s) removed" in capsys.readouterr().err
    create_token(path, "team-c", "read", expires_in=0.01)
    time.sleep(0.05)
    assert main(["token", "prune", "--tokens", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "of tenant 'team-c', expired at" in out and "1 expired token(s) removed" in err
    assert [e.tenant for e in list_tokens(path)] == ["team-a", "team-b"]


def test_an_expiry_that_is_not_a_number_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    create_token(path, "team-a", "read", expires_in=60.0)
    data = yaml.safe_load(path.read_text())
    data["tokens"][0]["expires_at"] = "tomorrow"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidInput, match="expires_at 'tomorrow' is not a number of seconds"):
        TokenFile(path)


def test_tokens_created_at_once_are_all_kept(tmp_path: Path) -> None:
    # Each create reads, appends and rewrites the file: without a lock, concurrent ones lost 11 to
    # 13 of 20 tokens here, each already printed to its caller.
    path = tmp_path / "tokens.yaml"
    made: list[str] = []
    threads = [
        threading.Thread(target=lambda: made.append(create_token(path, "a", "read"))) for _ in range(20)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tokens = TokenFile(path)
    assert len(list_tokens(path)) == 20 and all(tokens.lookup(t) is not None for t in made)


def test_an_id_that_names_two_tokens_revokes_neither(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    twins = [{"sha256": "ab12cd34" + c * 56, "tenant": "a", "scopes": ["read"]} for c in "01"]
    path.write_text(yaml.safe_dump({"tokens": twins}))
    with pytest.raises(InvalidInput, match="names 2 tokens"):
        revoke_token(path, "ab12cd34")
    assert revoke_token(path, "ab12cd34" + "1" * 4).tenant == "a"
    assert [e.id for e in list_tokens(path)] == ["ab12cd34"]


@pytest.mark.parametrize("scopes", ["", "root", "read,write", " , "])
def test_bad_scopes_are_refused(scopes: str) -> None:
    with pytest.raises(InvalidInput):
        parse_scopes(scopes)


@pytest.mark.parametrize("tenant", ["", "a b", "x" * 129, "../etc", "tenant\n"])
def test_bad_tenant_names_are_refused(tmp_path: Path, tenant: str) -> None:
    with pytest.raises(InvalidInput):
        create_token(tmp_path / "t.yaml", tenant, "read")


def test_admin_implies_submit_and_read_but_not_worker() -> None:
    admin = Identity("t", frozenset({"admin"}), "test")
    assert admin.allows("submit") and admin.allows("read") and not admin.allows("worker")
    worker = Identity("t", frozenset({"worker"}), "test")
    assert not worker.allows("read")


def test_policies_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "defaults": {"max_active_jobs": 5},
                "tenants": {"a": {"torchscript": False, "max_stored_bytes": 10}},
            }
        )
    )
    tokens = TokenFile(path)
    assert tokens.policy("a") == TenantPolicy(5, 10, False)
    assert tokens.policy("other") == TenantPolicy(5, None, True)
    path.write_text(yaml.safe_dump({"tenants": {"a": {"max_active_jobs": -1}}}))
    with pytest.raises(InvalidInput):
        TokenFile(path)


def test_every_public_method_needs_a_scope_and_health_none() -> None:
    from xaudit.v1 import audit_pb2

    for method in audit_pb2.DESCRIPTOR.services_by_name["AuditService"].methods:
        assert METHOD_SCOPES[f"/xaudit.v1.AuditService/{method.name}"] in ("submit", "read")
    assert METHOD_SCOPES["/grpc.health.v1.Health/Check"] is None


def test_authenticator_bearer_rules(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    token = create_token(path, "a", "read")
    auth = Authenticator(ServerConfig(listen="127.0.0.1:0", home=tmp_path, tokens_file=path))
    assert auth.authenticate(_Context([("authorization", f"Bearer {token}")])).tenant == "a"
    assert auth.authenticate(_Context([("authorization", f"bearer  {token} ")])).tenant == "a"
    for metadata in (
        [],
        [("authorization", "Bearer")],
        [("authorization", "Token abc")],
        [("authorization", "Bearer nope")],
    ):
        with pytest.raises(Unauthenticated):
            auth.authenticate(_Context(metadata))
    internal = auth.internal_worker_token
    assert internal is not None
    assert auth.authenticate(_Context([("authorization", f"Bearer {internal}")])).scopes == frozenset(
        {"worker"}
    )


@pytest.mark.parametrize("listen", ["0.0.0.0:50051", "[::]:50051", "10.1.2.3:1", "example.org:1", ":50051"])
def test_public_address_without_auth_is_refused_unless_allowed(tmp_path: Path, listen: str) -> None:
    config = ServerConfig(listen=listen, home=tmp_path)
    with pytest.raises(InvalidInput, match="refusing to listen"):
        check_exposure(config, Authenticator(config))
    allowed = config.with_(allow_unauthenticated=True)
    check_exposure(allowed, Authenticator(allowed))


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "localhost:50051", "[::1]:50051", "127.0.0.2:1"])
def test_loopback_without_auth_is_allowed_and_logged(
    tmp_path: Path, listen: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = ServerConfig(listen=listen, home=tmp_path)
    check_exposure(config, Authenticator(config))
    assert "authentication is OFF" in caplog.text
