"""Celery settings for long jobs, broker URL translation and queue routing."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.celery_app import (
    QUEUE_CPU,
    QUEUE_GPU,
    CelerySettings,
    WorkerConfig,
    check_worker_config,
    make_app,
    queue_for,
)
from xaudit.contract.errors import InvalidInput


def test_long_job_settings() -> None:
    settings = CelerySettings(soft_time_limit_s=100, hard_time_limit_s=160)
    conf = make_app("redis://127.0.0.1:6379/0", settings).conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    assert (conf.task_soft_time_limit, conf.task_time_limit) == (100, 160)
    assert conf.broker_transport_options["visibility_timeout"] > conf.task_time_limit


def test_filesystem_broker_lives_under_the_given_directory(tmp_path: Path) -> None:
    app = make_app(f"filesystem://{tmp_path / 'broker'}")
    options = app.conf.broker_transport_options
    assert app.conf.broker_url == "filesystem://"
    assert options["data_folder_in"] == options["data_folder_out"] == str(tmp_path / "broker" / "queue")
    assert (tmp_path / "broker" / "queue").is_dir() and (tmp_path / "broker" / "control").is_dir()


def test_cuda_jobs_go_to_the_gpu_queue() -> None:
    assert queue_for("cuda") == queue_for("cuda:1") == QUEUE_GPU
    assert queue_for("cpu") == queue_for("auto") == QUEUE_CPU


def test_a_worker_refuses_bad_queues_and_a_cache_it_cannot_use_before_it_starts(tmp_path: Path) -> None:
    assert (
        check_worker_config(WorkerConfig("redis://h/0", cache_dir=tmp_path / "c" / "d"))
        == tmp_path / "c" / "d"
    )
    assert (tmp_path / "c" / "d").is_dir()
    broker = "redis://127.0.0.1:1/0"  # never reached: run_worker checks before Celery starts
    with pytest.raises(InvalidInput, match=r"unknown queue\(s\) xaudit\.gpux"):
        check_worker_config(WorkerConfig(broker, queues=("xaudit.gpux",), cache_dir=tmp_path / "cache"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(InvalidInput, match=f"cannot use the model cache directory {blocker}: it is a file"):
        check_worker_config(WorkerConfig(broker, cache_dir=blocker))
    with pytest.raises(
        InvalidInput, match=f"cannot use the model cache directory {blocker / 'c'}: Not a directory"
    ):
        check_worker_config(WorkerConfig(broker, cache_dir=blocker / "c"))
