"""The Celery app: built from a broker URL, with the settings long jobs need.

Broker URLs: ``redis://...`` (scale-out), or ``filesystem:///ABS/DIR``, the serverless broker of the
embedded mode (kombu's filesystem transport with its folders under DIR; measured against
``sqla+sqlite://`` in bench/service_overhead.py and README). The job store, not the broker, is the
source of truth: the service re-dispatches jobs whose worker lease expired, and tasks are idempotent.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from xaudit.contract.broker import CelerySettings, broker_options, make_app
from xaudit.contract.names import QUEUE_CPU, QUEUE_GPU, QUEUES, TASK_NAME, queue_for
from xaudit.contract.process import die_with_parent

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
class WorkerConfig:
    broker_url: str
    # Where the worker fetches payloads and blobs; None: the address each task carries.
    server: str | None = None
    queues: Sequence[str] = (QUEUE_CPU,)
    concurrency: int = 1
    cache_dir: Path | None = None
    settings: CelerySettings = field(default_factory=CelerySettings)
    loglevel: str = "INFO"


def default_cache_dir() -> Path:
    env = os.environ.get("XAUDIT_WORKER_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("xaudit", appauthor=False)) / "blobs"


def _die_with_parent_in_pool_children() -> None:
    from celery.signals import worker_process_init

    worker_process_init.connect(lambda **_: die_with_parent(), weak=False)


def _prewarm_sandbox_in_pool_children() -> None:
    """Each pool process starts its sandbox zygote (or, without it, its first model child) now: a
    job need not wait for the compute core's imports."""
    from celery.signals import worker_process_init

    def start(**_: object) -> None:
        from workers.sandbox import prewarm

        try:
            prewarm()
        except OSError as exc:
            logger.warning("cannot start a sandbox ahead of the first job: %s", exc)

    worker_process_init.connect(start, weak=False)


def check_worker_config(config: WorkerConfig) -> Path:
    """Refuse, before Celery starts, what would fail every job: an unknown queue, a model cache
    directory that cannot be made. Returns the cache directory, made."""
    from xaudit.contract.errors import InvalidInput

    unknown = sorted(set(config.queues) - set(QUEUES))
    if unknown:
        raise InvalidInput(f"unknown queue(s) {', '.join(unknown)} (use {', '.join(QUEUES)})")
    cache = config.cache_dir or default_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InvalidInput(f"cannot use the model cache directory {cache}: it is a file") from None
    except OSError as exc:
        raise InvalidInput(f"cannot use the model cache directory {cache}: {exc.strerror}") from None
    return cache


def run_worker(config: WorkerConfig) -> None:
    """Run a Celery worker (prefork pool: time limits only work there) until it is stopped."""
    from workers import tasks
    from workers.threads import CONCURRENCY_ENV

    cache = check_worker_config(config)
    app = make_app(config.broker_url, config.settings)
    app.conf.update(xaudit_server=config.server, xaudit_cache_dir=str(cache))
    tasks.register(app)
    _die_with_parent_in_pool_children()
    _prewarm_sandbox_in_pool_children()
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
