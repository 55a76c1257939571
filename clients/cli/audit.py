"""``xaudit audit``: run the criterion audit locally and write the report.

Exit 0 when the audit ran, whatever the verdicts (a policy decides what fails: ``xaudit gate``);
exit 2 on errors. Every argument, file and option is checked before torch is imported.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from clients.cli._files import check_writable, write_npz
from clients.cli._output import add_json_option, print_outcome
from clients.cli.options import (
    add_job_options,
    add_threads_option,
    job_from_args,
    read_model,
)
from clients.cli.progress import progress_bar

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("audit", help="audit attribution methods locally and write the report JSON")
    add_job_options(parser, audit=True)
    add_threads_option(parser)
    parser.add_argument("--out", type=Path, help="where to write the report (xaudit.report/v2 JSON)")
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print what the audit would cost (sub-inputs, forward and backward passes per method, estimated "
        "time on this device) and exit without auditing",
    )
    parser.add_argument(
        "--attributions-out",
        type=Path,
        help="also write the attribution maps of the inputs (.npz, one array per method)",
    )
    from clients.cli.render import add_html_option

    add_html_option(parser)
    add_json_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clients._report import settings_line

    # Everything the user typed is checked here, in well under a second; only then is torch loaded.
    from xaudit.contract.errors import InvalidInput

    spec, tensors = job_from_args(args, "audit")
    if args.out is None and not args.plan:
        raise InvalidInput("--out is required (or --plan to print the cost only)")
    model = read_model(args.model)
    for path in (args.out, args.attributions_out, args.html):
        check_writable(path)

    from workers.audit import run_audit
    from workers.denormals import flushing
    from workers.prepare import prepare

    with flushing():  # subnormal floats flushed while the job computes, as run_job does
        prep = prepare(spec, model, None, tensors)
        if args.plan:
            from clients.cli.plan import plan_text
            from workers.audit.plan import audit_plan

            print(plan_text(audit_plan(prep, measure=True).section()))
            return 0
        with progress_bar("audit") as update:
            result = run_audit(prep, update)
    args.out.write_bytes(result.report_bytes)
    if args.attributions_out is not None:
        write_npz(args.attributions_out, result.attributions)
    if args.html is not None:
        from clients.cli.options import read_vocab
        from clients.render import write_html

        # Read again only here: job_from_args checked it before torch was loaded.
        vocab = read_vocab(args.vocab) if getattr(args, "vocab", None) is not None else None
        maps, labels = result.attributions, prep.players.labels
        write_html(
            args.html, result.report, attributions=maps, inputs=prep.inputs, player_labels=labels, vocab=vocab
        )
    background = tensors.get("background")
    settings = settings_line(
        result.report,
        requested_order=args.audit_order,
        background_given=None if background is None else int(background.shape[0]),
    )
    paths = {"report": args.out, "attributions": args.attributions_out, "html": args.html}
    print_outcome(args, result.report, paths, settings=settings)
    return 0
