"""``xaudit jobs``: the server's jobs, newest first."""

from __future__ import annotations

import argparse
import itertools

from clients.cli.arg_types import non_negative_int

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clients._connect import add_server_option

    parser = sub.add_parser("jobs", help="list the jobs on a server, newest first")
    add_server_option(parser)
    parser.add_argument(
        "--limit", type=non_negative_int, default=50, help="show at most this many (default 50; 0: all)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clients._connect import client_from_args
    from clients._jobview import job_table

    with client_from_args(args) as client:
        jobs = client.list_jobs(page_size=min(max(args.limit, 1), 500) if args.limit else 500)
        shown = list(itertools.islice(jobs, args.limit) if args.limit else jobs)
    print(job_table(shown) if shown else "no jobs")
    return 0
