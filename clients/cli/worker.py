"""``xaudit worker``: a Celery worker that fetches jobs and model blobs from the service over gRPC."""

from __future__ import annotations

import argparse
from pathlib import Path

from clients.cli.arg_types import host_port, port_number, positive_int, url
from clients.cli.options import add_threads_option

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("worker", help="run a worker (Celery) for a service")
    parser.add_argument(
        "--broker", required=True, type=url, help="Celery broker URL, e.g. redis://HOST:6379/0"
    )
    parser.add_argument(
        "--server", required=True, type=host_port, help="HOST:PORT of the service (payloads and model blobs)"
    )
    parser.add_argument("--queues", default="xaudit.cpu", help="comma-separated: xaudit.cpu, xaudit.gpu")
    parser.add_argument("--concurrency", type=positive_int, default=1, help="worker processes (one per GPU)")
    parser.add_argument(
        "--metrics-port", type=port_number, help="serve Prometheus metrics on http://0.0.0.0:PORT/metrics"
    )
    parser.add_argument(
        "--time-limit",
        type=positive_int,
        metavar="SECONDS",
        help="job time limit: past it a job fails with DEADLINE_EXCEEDED (default 6 h; killed 30 s later)",
    )
    parser.add_argument(
        "--cache-dir", type=Path, help="model blob cache (default $XAUDIT_WORKER_CACHE or user cache)"
    )
    add_threads_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workers.celery_app import CelerySettings, WorkerConfig, run_worker
    from workers.metrics import serve_worker_metrics

    queues = tuple(q.strip() for q in args.queues.split(",") if q.strip())
    serve_worker_metrics(args.metrics_port)
    limit = args.time_limit
    settings = CelerySettings(limit, limit + 30) if limit else CelerySettings()
    run_worker(
        WorkerConfig(
            args.broker,
            args.server,
            queues,
            args.concurrency,
            args.cache_dir,
            settings=settings,
            loglevel="INFO" if args.verbose else "WARNING",
        )
    )
    return 0
