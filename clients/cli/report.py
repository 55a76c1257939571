"""``xaudit report JOB --out FILE``: fetch a finished job's result (exact signed report bytes, or an
.npz of attribution maps); ``--wait`` follows the job first."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clients._connect import add_server_option

    parser = sub.add_parser("report", help="write the report (or attributions) of a finished job")
    parser.add_argument("job", help="job id")
    add_server_option(parser)
    parser.add_argument("--out", required=True, type=Path, help="output file")
    parser.add_argument("--wait", action="store_true", help="wait for the job to finish first")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clients._connect import client_from_args
    from clients.cli._results import follow, write_result
    from xaudit.contract.errors import FailedPrecondition

    with client_from_args(args) as client:
        job = client.get_job(args.job)
        if args.wait and not job.terminal:
            job = follow(client, job, job.kind)
        if job.state == "failed":
            raise job.error() or FailedPrecondition(f"job {job.id} failed")
        if job.state != "succeeded":
            raise FailedPrecondition(
                f"job {job.id} is {job.state}; it has no result (use --wait to wait for it)"
            )
        write_result(client, job, args.out)
    print(f"wrote the {job.kind} result of job {job.id} to {args.out}", file=sys.stderr)
    return 0
