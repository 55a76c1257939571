"""The Celery app: built from a broker URL, with the settings long jobs need.

Broker URLs: ``redis://...`` (scale-out), or ``filesystem:///ABS/DIR``, the serverless broker of the
embedded mode (kombu's filesystem transport with its folders under DIR; measured against
``sqla+sqlite://`` in bench/service_overhead.py and README). The job store, not the broker, is the
source of truth: the service re-dispatches jobs whose worker lease expired, and tasks are idempotent.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Celery

from xaudit.contract.names import QUEUE_CPU, QUEUE_GPU, QUEUES, TASK_NAME, queue_for

__all__ = [
    "QUEUES",
    "QUEUE_CPU",
    "QUEUE_GPU",
    "TASK_NAME",
    "CelerySettings",
    "WorkerConfig",
    "broker_options",
    "make_app",
    "queue_for",
    "run_worker",
]

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class CelerySettings:
    soft_time_limit_s: int = 6 * 3600
    hard_time_limit_s: int = 6 * 3600 + 300
    # How often a serverless broker is polled (filesystem transport).
    polling_interval_s: float = 0.1

    @property
    def visibility_timeout_s(self) -> int:
        # Longer than the hard limit, so Redis never redelivers a task that is still running.
        return self.hard_time_limit_s + 3600


def broker_options(url: str, settings: CelerySettings) -> tuple[str, dict[str, Any]]:
    """The kombu URL and transport options for one of our broker URLs."""
    if url.startswith("filesystem://"):
        root = Path(url[len("filesystem://") :] or ".").resolve()
        folders = {
            "data_folder_in": root / "queue",
            "data_folder_out": root / "queue",
            "control_folder": root / "control",
        }
        for folder in folders.values():
            folder.mkdir(parents=True, exist_ok=True)
        options: dict[str, Any] = {k: str(v) for k, v in folders.items()}
        options.update(store_processed=False, polling_interval=settings.polling_interval_s)
        return "filesystem://", options
    if url.startswith(("sqla+", "sqlalchemy+")):
        return url, {}  # kombu hands these options to create_engine: no polling_interval here
    return url, {"visibility_timeout": settings.visibility_timeout_s}


def make_app(broker_url: str, settings: CelerySettings | None = None) -> Celery:
    settings = settings or CelerySettings()
    url, transport_options = broker_options(broker_url, settings)
    app = Celery("xaudit", broker=url, backend=None, set_as_current=False)
    app.conf.update(
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=settings.soft_time_limit_s,
        task_time_limit=settings.hard_time_limit_s,
        task_ignore_result=True,
        task_default_queue=QUEUE_CPU,
        task_serializer="json",
        accept_content=["json"],
        # Cancellation and liveness go through the job store, not Celery's broadcast channel,
        # which the serverless transports do not all support.
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
    )
    return app


@dataclass(frozen=True)
class WorkerConfig:
    broker_url: str
    # Where the worker fetches payloads and blobs; None: the address each task carries.
    server: str | None = None
    queues: Sequence[str] = (QUEUE_CPU,)
    concurrency: int = 1
    cache_dir: Path | None = None
    settings: CelerySettings = CelerySettings()
    loglevel: str = "INFO"


def default_cache_dir() -> Path:
    env = os.environ.get("XAUDIT_WORKER_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("xaudit", appauthor=False)) / "blobs"


def die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies, so a killed service or
    worker main process never leaves orphans computing (their jobs are re-dispatched anyway)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        logger.debug("prctl(PR_SET_PDEATHSIG) unavailable")


def _die_with_parent_in_pool_children() -> None:
    from celery.signals import worker_process_init

    worker_process_init.connect(lambda **_: die_with_parent(), weak=False)


def run_worker(config: WorkerConfig) -> None:
    """Run a Celery worker (prefork pool: time limits only work there) until it is stopped."""
    from workers import tasks
    from workers.threads import CONCURRENCY_ENV

    unknown = sorted(set(config.queues) - set(QUEUES))
    if unknown:
        from xaudit.contract.errors import InvalidInput

        raise InvalidInput(f"unknown queue(s) {', '.join(unknown)} (use {', '.join(QUEUES)})")
    app = make_app(config.broker_url, config.settings)
    app.conf.update(
        xaudit_server=config.server,
        xaudit_cache_dir=str(config.cache_dir or default_cache_dir()),
    )
    tasks.register(app)
    _die_with_parent_in_pool_children()
    # Import the compute core in the parent so each forked child starts warm (CUDA is still
    # initialised in the child, on first use).
    import workers.audit
    import workers.explain
    import workers.jobs
    import workers.models.onnx_model  # noqa: F401

    # Pool children divide the CPUs among themselves (workers.threads).
    os.environ[CONCURRENCY_ENV] = str(config.concurrency)
    argv = [
        "worker",
        f"--queues={','.join(config.queues)}",
        f"--concurrency={config.concurrency}",
        "--pool=prefork",
        f"--loglevel={config.loglevel}",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        f"--hostname=xaudit-{uuid.uuid4().hex[:8]}@%h",
    ]
    if config.loglevel not in ("INFO", "DEBUG"):
        argv.insert(0, "--quiet")  # no start-up banner on stdout unless asked for logs (xaudit -v)
    logger.info("starting worker on %s, queues %s", config.broker_url, ",".join(config.queues))
    app.worker_main(argv)
