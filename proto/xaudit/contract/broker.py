"""The queue between the service and its workers: Celery settings and the broker's options.

Both sides build their Celery app here, so a sender and a worker always agree on the transport
options (visibility timeout, the serverless broker's folders), acknowledgement and serialisation.
Task name and queues: :mod:`xaudit.contract.names`. Celery is imported only when an app is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xaudit.contract.names import QUEUE_CPU

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["FILE_TRANSPORT", "CelerySettings", "broker_options", "make_app"]

# The serverless broker's transport: kombu's filesystem transport writing whole messages, in order.
FILE_TRANSPORT = "xaudit.contract.file_broker:Transport"


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
    """The Celery app both sides use: the service sends with it, workers consume with it."""
    from celery import Celery

    settings = settings or CelerySettings()
    url, transport_options = broker_options(broker_url, settings)
    app = Celery("xaudit", broker=url, backend=None, set_as_current=False)
    if url == "filesystem://":
        app.conf.broker_transport = FILE_TRANSPORT
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
