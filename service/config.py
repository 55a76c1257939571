"""Server configuration: one frozen dataclass, built by the CLI or by tests."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from xaudit.contract.names import DEFAULT_ADDRESS
from xaudit.contract.units import MiB

__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_TENANT",
    "ServerConfig",
    "default_home",
    "embedded_broker_url",
]

DEFAULT_LISTEN = DEFAULT_ADDRESS
DEFAULT_TENANT = "default"


def default_home() -> Path:
    """$XAUDIT_HOME, else the user's data directory (platformdirs)."""
    env = os.environ.get("XAUDIT_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("xaudit", appauthor=False))


def embedded_broker_url(home: Path) -> str:
    """The serverless broker of the embedded mode: kombu's filesystem transport under the data dir."""
    return f"filesystem://{(home / 'broker').resolve()}"


@dataclass(frozen=True)
class ServerConfig:
    listen: str = DEFAULT_LISTEN
    home: Path = field(default_factory=default_home)
    # None: the embedded filesystem broker under `home`.
    broker_url: str | None = None
    # None: SQLite at <home>/jobs.db.
    store_url: str | None = None
    # The address workers use to reach this server; None: derived from the bound port (loopback).
    advertise: str | None = None
    upload_cap_bytes: int = 256 * MiB
    # Largest gRPC message either way (submit tensors, results); uploads stream in chunks below it.
    max_message_bytes: int = 64 * MiB
    max_tensor_elements: int = 64 * MiB
    max_tensor_dims: int = 8
    # Client calls (AuditService) in progress at once; up to client_queue more wait for a slot.
    grpc_threads: int = 16
    client_queue: int = 64
    # Long-lived streams (WatchJob, health Watch, reflection) open at once, in all and per tenant.
    max_streams: int = 64
    max_streams_per_tenant: int = 32
    # Threads kept for the WorkerService beyond the two caps above: clients can never starve workers.
    worker_threads: int = 16
    reflection: bool = True
    # A running job whose worker sent no heartbeat for this long goes back to the queue.
    lease_seconds: float = 60.0
    # A job whose worker was lost this many times fails instead of being queued again.
    max_attempts: int = 3
    # How often the dispatcher looks for jobs to (re-)dispatch.
    sweep_seconds: float = 2.0
    # A queued job dispatched this long ago and still unclaimed is sent again (a broker may lose it).
    requeue_after_seconds: float = 300.0
    # WatchJob wakes on every change made through this server, and re-reads the store at least this
    # often (changes made through another replica).
    watch_poll_seconds: float = 1.0
    # Blob files no model record needs (what a crash leaves) are removed this often, once this old.
    orphan_sweep_seconds: float = 600.0
    orphan_grace_seconds: float = 3600.0
    # Report signing keys: None means <home>/keys; a key file, when given, is used and never generated.
    signing_key_dir: Path | None = None
    signing_key_file: Path | None = None
    # Seconds to drain in-flight RPCs at shutdown.
    grace_seconds: float = 5.0
    # Authentication (service/auth.py): a tokens file (service/tokens.py) and/or mTLS client certificates.
    tokens_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    tls_client_scopes: str = "submit,read"
    # Serve without authentication on a non-loopback address (refused otherwise).
    allow_unauthenticated: bool = False

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or embedded_broker_url(self.home)

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or f"sqlite:///{(self.home / 'jobs.db').resolve()}"

    @property
    def resolved_signing_key_dir(self) -> Path:
        return self.signing_key_dir or self.home / "keys"

    @property
    def blob_dir(self) -> Path:
        return self.home / "blobs"

    def with_(self, **changes: object) -> ServerConfig:
        return replace(self, **changes)  # type: ignore[arg-type]
