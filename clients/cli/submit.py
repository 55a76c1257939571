"""``xaudit submit``: upload a model and inputs to a server, run an audit (or attributions) there,
follow its progress and write the result; ``--detach`` prints the job id and returns at once."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["register", "run"]


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
        "--idempotency-key", default="", help="resubmitting with the same key returns the same job"
    )
    from clients.cli.render import add_html_option

    add_html_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clients._connect import client_from_args
    from clients.cli._results import follow, write_result
    from clients.cli.options import job_from_args
    from xaudit.contract.errors import InvalidInput

    if args.out is None and not args.detach:
        raise InvalidInput("--out is required unless --detach is given")
    if args.html is not None and args.kind != "audit":
        raise InvalidInput("--html renders an audit report: use it with --kind audit")
    spec, tensors = job_from_args(args, args.kind)
    with client_from_args(args) as client:
        ref = client.upload_model(args.model)
        submit = client.submit_audit if args.kind == "audit" else client.submit_attribution
        job = submit(ref, spec, tensors, idempotency_key=args.idempotency_key)
        if args.detach:
            print(job.id)
            return 0
        print(f"job {job.id} ({job.state}) on {client.address}", file=sys.stderr)
        job = follow(client, job, args.kind)
        write_result(client, job, args.out)
        if args.html is not None:
            from clients.cli.render import html_for_job

            html_for_job(client, job.id, args.out.read_bytes(), tensors, args.html)
    print(f"wrote the {args.kind} result of job {job.id} to {args.out}", file=sys.stderr)
    return 0
