"""Bearer tokens and tenant policies, kept in one YAML (or JSON) file that stores token *hashes* only.

    tokens:
      - id: 3f9a0c12                  # first hex digits of the hash: names a token in logs, never the secret
        sha256: <hex sha256 of the token>
        tenant: team-a
        scopes: [submit, read]
        created_at: 1760000000.0
        expires_at: 1767776000.0      # optional: refused from then on (xaudit token create --expires-in)
      - id: 7c01d2e4                  # a worker token may be limited to some queues and tenants' jobs
        sha256: <hex sha256 of the token>
        tenant: gpu-pool
        scopes: [worker]
        queues: [xaudit.gpu]
        job_tenants: [team-a]
    tenants:                          # optional per-tenant policy (service/quotas.py)
      team-a: {max_active_jobs: 20, max_stored_bytes: 1073741824, torchscript: false}
    defaults: {max_active_jobs: 100}  # optional policy for tenants not listed

Tokens are 256 random bits (``xat_`` + urlsafe base64), so an unsalted sha256 cannot be reversed
by guessing; the file is re-read when it changes, so ``xaudit token create`` and ``xaudit token
revoke`` need no restart. An expired token is refused with its id and expiry (it stays in the file
until revoked or pruned, so ``xaudit token list`` still shows it; ``xaudit token prune`` removes the expired ones).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import logging
import math
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from service.file_lock import exclusive
from xaudit.contract.errors import InvalidInput, Unauthenticated

__all__ = [
    "SCOPES",
    "TOKEN_PREFIX",
    "Identity",
    "TenantPolicy",
    "TokenEntry",
    "TokenFile",
    "create_token",
    "hash_token",
    "list_tokens",
    "parse_scopes",
    "prune_tokens",
    "revoke_token",
    "utc",
]

logger = logging.getLogger(__name__)

# submit: upload models, submit and cancel jobs; read: get/list/watch jobs, reports, keys;
# admin: both (and reflection); worker: the internal WorkerService only.
SCOPES = ("submit", "read", "admin", "worker")
TOKEN_PREFIX = "xat_"
_TENANT_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@")


@dataclass(frozen=True)
class Identity:
    """Who is calling: a tenant and what it may do. ``source`` says how it was established."""

    tenant: str
    scopes: frozenset[str]
    source: str  # "token:<id>", "mtls:<subject>", "anonymous", "internal"
    # A worker credential may take only jobs of these queues / these tenants (None: any).
    queues: frozenset[str] | None = None
    job_tenants: frozenset[str] | None = None

    def may_run(self, queue: str, tenant: str) -> bool:
        """Whether this (worker) credential may take a job of ``queue`` submitted by ``tenant``."""
        return (self.queues is None or queue in self.queues) and (
            self.job_tenants is None or tenant in self.job_tenants
        )

    def allows(self, scope: str) -> bool:
        if scope in self.scopes:
            return True
        return scope in ("submit", "read") and "admin" in self.scopes


@dataclass(frozen=True)
class TenantPolicy:
    """Quotas and model rules for one tenant; None means unlimited."""

    max_active_jobs: int | None = None
    max_stored_bytes: int | None = None
    torchscript: bool = True

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], base: TenantPolicy | None = None) -> TenantPolicy:
        base = base or cls()
        unknown = set(data) - {"max_active_jobs", "max_stored_bytes", "torchscript"}
        if unknown:
            raise InvalidInput(f"unknown tenant policy field(s): {', '.join(sorted(unknown))}")

        def limit(name: str, current: int | None) -> int | None:
            value = data.get(name, current)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInput(f"tenant policy {name}={value!r}: must be an integer >= 0")
            return value

        torchscript = data.get("torchscript", base.torchscript)
        if not isinstance(torchscript, bool):
            raise InvalidInput(f"tenant policy torchscript={torchscript!r}: must be true or false")
        return cls(
            limit("max_active_jobs", base.max_active_jobs),
            limit("max_stored_bytes", base.max_stored_bytes),
            torchscript,
        )


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_scopes(text: str | Iterable[str]) -> frozenset[str]:
    items = text.split(",") if isinstance(text, str) else list(text)
    scopes = frozenset(s.strip() for s in items if s.strip())
    unknown = scopes - set(SCOPES)
    if unknown or not scopes:
        raise InvalidInput(
            f"bad scopes {', '.join(sorted(unknown)) or '(none)'} (use a comma-separated list of {', '.join(SCOPES)})"
        )
    return scopes


def check_tenant(tenant: str) -> str:
    if not tenant or len(tenant) > 128 or not set(tenant) <= _TENANT_CHARS:
        raise InvalidInput(f"bad tenant name {tenant!r}: 1-128 characters from letters, digits and . _ - @")
    return tenant


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:  # a directory, no permission
        raise InvalidInput(f"cannot read the tokens file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"cannot read the tokens file {path}: it is not UTF-8 text") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise InvalidInput(f"tokens file {path} is not valid YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"tokens file {path}: expected a mapping with a 'tokens' list")
    return data


class TokenFile:
    """The parsed tokens file, re-read whenever its modification time or size changes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        # sha256 -> the token's identity and when it stops working (epoch seconds; None: never)
        self._by_hash: dict[str, tuple[Identity, float | None]] = {}
        self._tenants: dict[str, TenantPolicy] = {}
        self._default = TenantPolicy()
        self._refresh(strict=True)

    def _refresh(self, strict: bool = False) -> None:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = (0, -1)
        if stamp == self._stamp:
            return
        with self._lock:
            if stamp == self._stamp:
                return
            try:
                self._load(_read(self.path))
            except InvalidInput:
                if strict:
                    raise
                # A half-written or broken edit: keep serving with the last good file.
                logger.exception("tokens file %s is invalid; keeping the previous one", self.path)
            self._stamp = stamp

    def _load(self, data: Mapping[str, Any]) -> None:
        by_hash, tenants, default = _parse(self.path, data)
        self._by_hash, self._tenants, self._default = by_hash, tenants, default
        logger.info("tokens file %s: %d token(s), %d tenant policies", self.path, len(by_hash), len(tenants))

    def lookup(self, token: str) -> Identity | None:
        """The token's identity; None for a token the file does not hold. An expired one raises
        Unauthenticated saying so: its holder knows the token anyway, and learns what to renew."""
        self._refresh()
        identity, expiry = self._by_hash.get(hash_token(token), (None, None))
        if identity is not None and expiry is not None and _is_past(expiry):
            raise Unauthenticated(
                f"token {identity.source.removeprefix('token:')} expired at {utc(expiry)} UTC: "
                "ask for a new one (xaudit token create)"
            )
        return identity

    def policy(self, tenant: str) -> TenantPolicy:
        self._refresh()
        return self._tenants.get(tenant, self._default)


def _parse(
    path: Path, data: Mapping[str, Any]
) -> tuple[dict[str, tuple[Identity, float | None]], dict[str, TenantPolicy], TenantPolicy]:
    """A tokens file's contents as a server uses them (sha256 -> identity and expiry, tenant
    policies, the default policy); InvalidInput naming what is wrong."""
    by_hash: dict[str, tuple[Identity, float | None]] = {}
    for entry in data.get("tokens") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise InvalidInput(f"tokens file {path}: each token needs a sha256 field")
        digest = entry["sha256"].strip().lower()
        if len(digest) != 64:
            raise InvalidInput(f"tokens file {path}: sha256 {digest!r} is not a sha256 hex digest")
        tenant = check_tenant(str(entry.get("tenant", "")))
        scopes = parse_scopes(entry.get("scopes") or [])
        expiry = entry.get("expires_at")
        if expiry is not None and (isinstance(expiry, bool) or not isinstance(expiry, int | float)):
            raise InvalidInput(f"tokens file {path}: expires_at {expiry!r} is not a number of seconds")
        identity = Identity(
            tenant,
            scopes,
            f"token:{entry.get('id') or digest[:8]}",
            _names(entry.get("queues"), "queues", str),
            _names(entry.get("job_tenants"), "job_tenants", check_tenant),
        )
        by_hash[digest] = (identity, None if expiry is None else float(expiry))
    default = TenantPolicy.from_mapping(data.get("defaults") or {})
    tenants = {
        check_tenant(str(name)): TenantPolicy.from_mapping(policy or {}, default)
        for name, policy in (data.get("tenants") or {}).items()
    }
    return by_hash, tenants, default


def _checked(path: Path) -> dict[str, Any]:
    """``path``'s contents, read once and refused as a server would refuse them."""
    data = _read(path)
    _parse(path, data)
    return data


def _names(value: Any, what: str, check: Any) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise InvalidInput(f"tokens file: {what} must be a non-empty list")
    return frozenset(check(str(v)) for v in value)


def create_token(
    path: Path,
    tenant: str,
    scopes: str | Iterable[str],
    queues: Iterable[str] | None = None,
    job_tenants: Iterable[str] | None = None,
    expires_in: float | None = None,
    now: float | None = None,
) -> str:
    """Append a new token's hash to ``path`` (created 0600 if missing); returns the token, once.
    ``queues`` / ``job_tenants`` limit a worker token to those queues' / tenants' jobs;
    ``expires_in`` (seconds) makes it stop working that long from ``now`` (default: the time of the
    call; a caller that shows the expiry passes the time it shows it from)."""
    check_tenant(tenant)
    if expires_in is not None and not (math.isfinite(expires_in) and expires_in > 0):
        raise InvalidInput(f"a token's lifetime must be a finite number of seconds above 0, got {expires_in}")
    scope_set = parse_scopes(scopes)
    limits: dict[str, list[str]] = {}
    for name, values in (("queues", queues), ("job_tenants", job_tenants)):
        if values is not None:
            if "worker" not in scope_set:
                raise InvalidInput(f"{name} limits a worker token: add the worker scope")
            limits[name] = sorted(check_tenant(v) if name == "job_tenants" else v for v in values)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    digest = hash_token(token)
    now = time.time() if now is None else now
    expiry = {} if expires_in is None else {"expires_at": round(now + expires_in, 3)}
    with _editing(path):
        data = _read(path)
        entries = list(data.get("tokens") or [])
        entries.append(
            {
                "id": digest[:8],
                "sha256": digest,
                "tenant": tenant,
                "scopes": sorted(scope_set),
                "created_at": round(now, 3),
                **expiry,
                **limits,
            }
        )
        data["tokens"] = entries
        _write(path, data)
    return token


@dataclass(frozen=True)
class TokenEntry:
    """A token as its file lists it: never the token, only its hash's first digits as its id."""

    id: str
    tenant: str
    scopes: tuple[str, ...]
    created_at: float | None
    queues: tuple[str, ...] | None = None
    job_tenants: tuple[str, ...] | None = None
    expires_at: float | None = None

    def expired(self, now: float | None = None) -> bool:
        return _is_past(self.expires_at, now)


def _is_past(expiry: float | None, now: float | None = None) -> bool:
    """A token's expiry (None: never) has come, at ``now`` (default: the time of the call)."""
    return expiry is not None and (time.time() if now is None else now) >= expiry


def utc(seconds: float) -> str:
    """Epoch seconds as the UTC time the CLI and error messages show."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def list_tokens(path: Path) -> list[TokenEntry]:
    """Every token in ``path``, in file order (an invalid file is refused as a server would)."""
    return [_entry(e) for e in _checked(path).get("tokens") or []]


def revoke_token(path: Path, which: str) -> TokenEntry:
    """Remove one token from ``path``, named by its id (8 or more hex digits of its sha256) or by the
    token itself; a server reading the file refuses it from its next call. Returns what was removed."""
    which = which.strip()
    if which.startswith(TOKEN_PREFIX):
        prefix = hash_token(which)
    elif len(which) >= 8 and all(c in "0123456789abcdef" for c in which.lower()):
        prefix = which.lower()
    else:
        raise InvalidInput(
            "name the token by its id (8 or more hex digits: xaudit token list) or the token itself"
        )
    with _editing(path):
        data = _checked(path)
        entries = list(data.get("tokens") or [])
        matches = [e for e in entries if str(e["sha256"]).strip().lower().startswith(prefix)]
        if not matches:
            raise InvalidInput(f"no token {prefix[:16]} in {path} (xaudit token list shows the ids)")
        if len(matches) > 1:
            raise InvalidInput(
                f"{prefix} names {len(matches)} tokens in {path}: give more digits of the sha256"
            )
        data["tokens"] = [e for e in entries if e is not matches[0]]
        _write(path, data)
    return _entry(matches[0])


def prune_tokens(path: Path, now: float | None = None) -> list[TokenEntry]:
    """Remove every expired token from ``path`` (a server already refuses them); returns those removed."""
    now = time.time() if now is None else now
    with _editing(path):
        data = _checked(path)
        entries = [(raw, _entry(raw)) for raw in data.get("tokens") or []]
        expired = [entry for _, entry in entries if entry.expired(now)]
        if expired:
            data["tokens"] = [raw for raw, entry in entries if not entry.expired(now)]
            _write(path, data)
    return expired


def _entry(raw: Mapping[str, Any]) -> TokenEntry:
    def names(key: str) -> tuple[str, ...] | None:
        return None if raw.get(key) is None else tuple(str(v) for v in raw[key])

    def seconds(key: str) -> float | None:
        value = raw.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    return TokenEntry(
        str(raw.get("id") or str(raw["sha256"])[:8]),
        str(raw.get("tenant", "")),
        tuple(sorted(parse_scopes(raw.get("scopes") or []))),
        seconds("created_at"),
        names("queues"),
        names("job_tenants"),
        seconds("expires_at"),
    )


def _editing(path: Path) -> contextlib.AbstractContextManager[None]:
    """One read-modify-write of ``path`` at a time (service/file_lock.py): two `xaudit token create`
    at once would otherwise both read the old list and one token, already printed, would be lost."""
    return exclusive(path.with_name(f".{path.name}.lock"), f"cannot write the tokens file {path}")


def _write(path: Path, data: Mapping[str, Any]) -> None:
    """Replace ``path`` with ``data`` at once (a server never reads half a file), mode 0600; called
    inside :func:`_editing`, which made the directory."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tokens-", dir=path.parent)
    except OSError as exc:
        raise InvalidInput(f"cannot write the tokens file {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w") as handle:
            yaml.safe_dump(dict(data), handle, sort_keys=False)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
