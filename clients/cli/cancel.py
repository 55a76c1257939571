"""``xaudit cancel JOB``: cancel a queued or running job (a finished job stays as it is)."""

from __future__ import annotations

import argparse

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clients._connect import add_server_option

    parser = sub.add_parser("cancel", help="cancel a job on a server")
    parser.add_argument("job", help="job id")
    add_server_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clients._connect import client_from_args

    with client_from_args(args) as client:
        job = client.cancel(args.job)
    # Running jobs stop at the worker's next progress step, so "running" here is expected.
    note = (
        ""
        if job.state == "cancelled"
        else " (running jobs stop at their next step)"
        if job.state == "running"
        else ""
    )
    print(f"job {job.id}: {job.state}{note}")
    return 0
