"""The Celery task: takes a job id and the service address, and hands both to the worker runtime."""

from __future__ import annotations

from pathlib import Path

from celery import Celery, Task

from workers.celery_app import TASK_NAME

__all__ = ["register"]


def register(app: Celery) -> Task:
    """Register the one task on ``app`` (the worker builds its app from the broker URL at start)."""

    @app.task(name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)  # type: ignore[untyped-decorator]
    def run_job(self: Task, job_id: str, server: str) -> str:
        from workers.runtime import RuntimeConfig, execute

        conf = self.app.conf
        config = RuntimeConfig(
            server=conf.get("xaudit_server") or server, cache_dir=Path(conf["xaudit_cache_dir"])
        )
        return execute(job_id, config)

    return run_job
