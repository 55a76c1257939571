"""``xaudit status JOB``: one job's state, progress, timings and error."""

from __future__ import annotations

import argparse

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clients._connect import add_server_option

    parser = sub.add_parser("status", help="show one job on a server")
    parser.add_argument("job", help="job id")
    add_server_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clients._connect import client_from_args
    from clients._jobview import job_details

    with client_from_args(args) as client:
        job = client.get_job(args.job)
    print(job_details(job))
    return 0
