"""``xaudit status JOB``: one job's state, progress, timings and error; for a finished audit, its
verdicts too (the same table as ``audit`` and ``submit``)."""

from __future__ import annotations

import argparse

from clients.cli._output import add_json_option

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clients._connect import add_server_option

    parser = sub.add_parser("status", help="show one job on a server (and the verdicts of a finished audit)")
    parser.add_argument("job", help="job id")
    add_server_option(parser)
    add_json_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clients._connect import client_from_args
    from clients._jobview import job_details, job_summary
    from clients._report import report_document
    from clients.cli._output import print_outcome

    report = None
    with client_from_args(args) as client:
        job = client.get_job(args.job)
        if job.kind == "audit" and job.state == "succeeded" and job.report_available:
            report = report_document(client.get_report(job.id))
    if args.json:
        print_outcome(args, report, {}, extra={"job": job_summary(job)})
        return 0
    print(job_details(job))
    if report is not None:
        print()
        print_outcome(args, report, {})
    return 0
