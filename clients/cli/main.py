"""Entry point of the ``xaudit`` command: dispatches to one module per subcommand.

Errors from the project's tree print as one line on stderr (``xaudit: error: ...``) with the exit
status their class declares (xaudit.contract.errors: 2, or 3 for a report that does not verify); nothing prints a traceback unless XAUDIT_DEBUG is set.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from xaudit.contract.errors import EXIT_ERROR, XauditError

__all__ = ["EXIT_ERROR", "main"]


# Subcommand modules under clients.cli; each defines register(subparsers) and sets `func` on its parser.
COMMANDS: tuple[str, ...] = (
    "explain",
    "audit",
    "inspect",
    "methods",
    "verify",
    "keys",
    "gate",
    "submit",
    "jobs",
    "status",
    "cancel",
    "report",
    "serve",
    "worker",
    "token",
    "demo",
    "render",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xaudit", description="Audit which attribution methods allocate a model's effects correctly."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"clients.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        from clients.cli.options import apply_threads_option

        apply_threads_option(args)
        code: int = args.func(args)
        return code
    except XauditError as exc:
        print(f"xaudit: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("xaudit: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: still one line unless debugging
        if os.environ.get("XAUDIT_DEBUG"):
            raise
        print(f"xaudit: internal error: {type(exc).__name__}: {exc} (set XAUDIT_DEBUG=1 for a traceback)", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
