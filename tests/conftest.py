"""Suite-wide settings for parallel runs (pytest-xdist, ``-n`` in pyproject.toml's addopts).

Each xdist worker is one more process on the same CPUs, so each takes its share of them for torch's
and onnxruntime's threads (``XAUDIT_THREADS``, inherited by the servers and workers the tests
start): never more threads than cores in all. Each also gets a Redis database of its own
(``XAUDIT_TEST_REDIS``), because the integration fixtures empty theirs before every test.
"""

from __future__ import annotations

import os

import pytest

from workers.threads import THREADS_ENV, available_cpus

_FIRST_REDIS_DB = 11  # databases 11-14: at most four workers (--maxprocesses in pyproject.toml)


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... in a worker; unset when serial
    if worker is None:
        return
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault(THREADS_ENV, str(max(1, available_cpus()[0] // workers)))
    db = _FIRST_REDIS_DB + int(worker.removeprefix("gw"))
    os.environ.setdefault("XAUDIT_TEST_REDIS", f"redis://127.0.0.1:6379/{db}")
