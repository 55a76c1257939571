"""``xaudit submit``: upload a model and inputs to a server, run an audit (or attributions) there,
follow its progress and write the result; ``--detach`` prints the job id and returns at once.

The same request again returns the job that already exists (the service keys jobs by a digest of
model, spec and tensors); the command says so, and ``--new`` asks for a fresh run."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli._output import add_json_option

if TYPE_CHECKING:
    from clients._types import Job

__all__ = ["register", "run"]

# A job created this long before our request was not created by it (clocks of client and server
# may differ a little).
_RESUBMIT_MARGIN = timedelta(seconds=5)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clients._connect import add_server_option
    from clients.cli.options import add_job_options

    parser = sub.add_parser("submit", help="run an audit or attribution job on a server and write its result")
    add_server_option(parser)
    add_job_options(parser, audit=True)
    parser.add_argument(
        "--kind",
        choices=("audit", "attribution"),
        default="audit",
        help="audit (default): signed report JSON; attribution: an .npz of attribution maps",
    )
    parser.add_argument(
        "--out", type=Path, help="where to write the report (audit) or the .npz (attribution)"
    )
    parser.add_argument("--detach", action="store_true", help="print the job id and return without waiting")
    parser.add_argument(
        "--idempotency-key",
        default="",
        help="resubmitting with the same key returns the same job (default: a digest of the request)",
    )
    parser.add_argument(
        "--new",
        action="store_true",
        help="run the job again even if the same request ran before (a fresh idempotency key)",
    )
    from clients.cli.render import add_html_option

    add_html_option(parser)
    add_json_option(parser)
    parser.set_defaults(func=run)


def is_existing(job: Job, submitted_at: datetime) -> bool:
    """Whether the service answered with a job that was there before this request."""
    if job.state != "queued":
        return True
    created = job.created_at
    if created is None:
        return False
    if created.tzinfo is None:
        created = created.replace(tzinfo=UTC)
    return created < submitted_at - _RESUBMIT_MARGIN


def run(args: argparse.Namespace) -> int:
    import uuid

    from clients._connect import client_from_args
    from clients._report import report_document, settings_line
    from clients.cli._files import check_writable
    from clients.cli._output import print_outcome
    from clients.cli._results import follow, write_result
    from clients.cli.options import job_from_args
    from xaudit.contract.errors import InvalidInput

    if args.out is None and not args.detach:
        raise InvalidInput("--out is required unless --detach is given")
    if args.html is not None and args.kind != "audit":
        raise InvalidInput("--html renders an audit report: use it with --kind audit")
    if args.new and args.idempotency_key:
        raise InvalidInput("--new and --idempotency-key contradict each other: give one")
    for path in (args.out, args.html):
        check_writable(path)
    spec, tensors = job_from_args(args, args.kind)
    key = f"new-{uuid.uuid4().hex}" if args.new else args.idempotency_key
    with client_from_args(args) as client:
        ref = client.upload_model(args.model)
        submit = client.submit_audit if args.kind == "audit" else client.submit_attribution
        submitted_at = datetime.now(UTC)
        job = submit(ref, spec, tensors, idempotency_key=key)
        if is_existing(job, submitted_at):
            created = job.created_at.strftime("%Y-%m-%d %H:%M:%S UTC") if job.created_at else "earlier"
            print(
                f"returning existing job {job.id} ({job.state}, created {created}) for the same request; "
                "pass --new to run it again",
                file=sys.stderr,
            )
        if args.detach:
            print(job.id)
            return 0
        print(f"job {job.id} ({job.state}) on {client.address}", file=sys.stderr)
        job = follow(client, job, args.kind)
        write_result(client, job, args.out)
        written = args.out.read_bytes()
        if args.html is not None:
            from clients.cli.render import html_for_job

            html_for_job(client, job.id, written, tensors, args.html)
    report = report_document(written) if args.kind == "audit" else None
    background = tensors.get("background")
    settings = (
        settings_line(
            report,
            requested_order=args.audit_order,
            background_given=None if background is None else int(background.shape[0]),
        )
        if report is not None
        else ""
    )
    kind = "report" if args.kind == "audit" else "attributions"
    print_outcome(args, report, {kind: args.out, "html": args.html}, settings=settings, extra={"job": job.id})
    return 0
