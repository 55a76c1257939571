"""``xaudit report JOB --out FILE``: fetch a finished job's result (exact signed report bytes, or an
.npz of attribution maps) and print its verdicts; ``--wait`` follows the job first; ``--html`` also
renders the report as a page."""

from __future__ import annotations

import argparse
from pathlib import Path

from clients.cli._output import add_json_option

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clients._connect import add_server_option
    from clients.cli.render import add_html_option

    parser = sub.add_parser("report", help="write the report (or attributions) of a finished job")
    parser.add_argument("job", help="job id")
    add_server_option(parser)
    parser.add_argument("--out", required=True, type=Path, help="output file")
    parser.add_argument("--wait", action="store_true", help="wait for the job to finish first")
    add_html_option(parser)
    add_json_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clients._connect import client_from_args
    from clients._report import report_document
    from clients.cli._files import check_writable
    from clients.cli._output import print_outcome
    from clients.cli._results import follow, write_result
    from xaudit.contract.errors import FailedPrecondition, InvalidInput

    for path in (args.out, args.html):
        check_writable(path)
    with client_from_args(args) as client:
        job = client.get_job(args.job)
        if args.html is not None and job.kind != "audit":
            raise InvalidInput(f"--html renders an audit report; job {job.id} is an {job.kind} job")
        if args.wait and not job.terminal:
            job = follow(client, job, job.kind)
        if job.state == "failed":
            error = job.error()
            detail = f"{job.error_code}: {job.error_message}" if job.error_code else "no detail"
            raise FailedPrecondition(f"job {job.id} failed, it has no result ({error or detail})")
        if job.state == "cancelled":
            raise FailedPrecondition(f"job {job.id} was cancelled; it has no result")
        if job.state != "succeeded":
            raise FailedPrecondition(
                f"job {job.id} is {job.state}; it has no result yet (use --wait to wait for it)"
            )
        write_result(client, job, args.out)
        written = args.out.read_bytes()
        if args.html is not None:
            from clients.cli.render import html_for_job

            html_for_job(client, job.id, written, {}, args.html)
    report = report_document(written) if job.kind == "audit" else None
    kind = "report" if job.kind == "audit" else "attributions"
    print_outcome(args, report, {kind: args.out, "html": args.html}, extra={"job": job.id})
    return 0
