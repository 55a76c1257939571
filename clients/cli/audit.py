"""``xaudit audit``: run the criterion audit locally and write the report."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clients.cli.options import add_job_options

    parser = sub.add_parser("audit", help="audit attribution methods locally and write the report JSON")
    add_job_options(parser, audit=True)
    parser.set_defaults(func=lambda args: 2)
