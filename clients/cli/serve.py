"""``xaudit serve``: the gRPC service; with no options, the zero-setup embedded mode."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.arg_types import host_port, port_number, positive_int, positive_seconds, url

if TYPE_CHECKING:
    from service.plans import Planner

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from xaudit.contract.names import DEFAULT_ADDRESS as DEFAULT_LISTEN

    parser = sub.add_parser(
        "serve",
        help="run the gRPC service (embedded: local worker, serverless broker, SQLite, data dir)",
        description="With no options: gRPC server + a local worker + a broker that needs no server + SQLite, "
        "all under $XAUDIT_HOME. --broker redis://... uses Redis and starts no local worker unless "
        "--local-worker is given.",
    )
    parser.add_argument(
        "--listen", default=DEFAULT_LISTEN, help=f"HOST:PORT to listen on (default {DEFAULT_LISTEN})"
    )
    parser.add_argument(
        "--home", type=Path, help="data directory (default $XAUDIT_HOME or the user data dir)"
    )
    parser.add_argument(
        "--broker", type=url, help="Celery broker URL, e.g. redis://127.0.0.1:6379/0 (default: embedded)"
    )
    parser.add_argument(
        "--store", help="job store URL, e.g. postgresql+psycopg://user@host/db (default: SQLite)"
    )
    parser.add_argument(
        "--advertise",
        type=host_port,
        help="HOST:PORT workers use to reach this server (default: from --listen)",
    )
    parser.add_argument("--local-worker", action="store_true", help="also run a local worker with --broker")
    parser.add_argument(
        "--concurrency", type=positive_int, default=1, help="local worker processes (default 1)"
    )
    parser.add_argument(
        "--upload-cap-mb", type=positive_int, help="largest model upload in MiB (default 256)"
    )
    parser.add_argument(
        "--lease-seconds",
        type=positive_seconds,
        help="worker lease; a silent worker's job is re-queued after it",
    )
    parser.add_argument("--no-reflection", action="store_true", help="turn gRPC server reflection off")
    parser.add_argument(
        "--tokens", type=Path, help="tokens file (xaudit token create): turns bearer-token authentication on"
    )
    parser.add_argument("--tls-cert", type=Path, help="server certificate (PEM): serve TLS")
    parser.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    parser.add_argument(
        "--tls-client-ca",
        type=Path,
        help="CA of client certificates: mTLS, the certificate's CN is the tenant",
    )
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve without authentication on a non-loopback address (refused otherwise)",
    )
    parser.add_argument(
        "--metrics-port", type=port_number, help="serve Prometheus metrics on http://0.0.0.0:PORT/metrics"
    )
    from clients.cli.options import add_threads_option

    add_threads_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from service.config import ServerConfig
    from service.metrics import start_service_metrics
    from service.run import ServeOptions, serve
    from xaudit.contract.units import MiB

    changes: dict[str, object] = {"listen": args.listen, "reflection": not args.no_reflection}
    for key, value in (
        ("home", args.home),
        ("broker_url", args.broker),
        ("store_url", args.store),
        ("advertise", args.advertise),
        ("lease_seconds", args.lease_seconds),
        ("tokens_file", args.tokens),
        ("tls_cert_file", args.tls_cert),
        ("tls_key_file", args.tls_key),
        ("tls_client_ca_file", args.tls_client_ca),
    ):
        if value is not None:
            changes[key] = value
    if args.upload_cap_mb is not None:
        changes["upload_cap_bytes"] = args.upload_cap_mb * MiB
    changes["allow_unauthenticated"] = args.allow_unauthenticated
    config = ServerConfig(**changes)  # type: ignore[arg-type]
    local = args.broker is None or args.local_worker
    start_service_metrics(args.metrics_port)
    options = ServeOptions(local_worker=local, worker_concurrency=args.concurrency)
    return serve(config, options, planner=_engine_planner())


def _engine_planner() -> Planner:
    """The engine prices PlanAudit; a server installed without it refuses plans instead (service.plans)."""
    from service.plans import no_planner

    try:
        from workers.audit.plan_request import plan_request
    except ImportError:
        return no_planner
    return plan_request
