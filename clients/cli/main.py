"""Entry point of the ``xaudit`` command: dispatches to one module per subcommand.

Errors print as one line on stderr (``xaudit: error: ...``), argument errors included, with the exit
status their class declares (xaudit.contract.errors: 2, or 3 for a report that does not verify);
nothing prints a traceback unless XAUDIT_DEBUG is set. Known harmless third-party warnings are
filtered unless ``-v`` asks for them; a closed pipe (``xaudit jobs | head``) ends the command
quietly, as it does any Unix tool.

Nothing heavy is imported here: arguments are checked before torch (or grpc) is loaded.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import re
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

from xaudit.contract.errors import EXIT_ERROR, XauditError

__all__ = ["EXIT_ERROR", "OneLineParser", "main"]

EXIT_PIPE = 141  # 128 + SIGPIPE: what a tool killed by a closed pipe exits with

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


class OneLineParser(argparse.ArgumentParser):
    """Argument errors in one line (the README promises it), with a near-miss suggestion."""

    def error(self, message: str) -> NoReturn:
        hint = ""
        choice = _INVALID_CHOICE.match(message)
        if choice is not None:  # any argument with choices: the suggestion comes from its own choices
            wrong = choice["wrong"]
            close = difflib.get_close_matches(wrong, re.findall(r"'([^']*)'", choice["choices"]), n=1)
            if close:
                hint = f"; did you mean '{close[0]}'?"
            if choice["argument"] == "COMMAND":
                message = f"unknown command '{wrong}'"
        print(f"{self.prog}: error: {message}{hint} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_ERROR)


# argparse's "argument X: invalid choice: 'y' (choose from 'a', 'b')".
_INVALID_CHOICE = re.compile(
    r"argument (?P<argument>[^:]+): invalid choice: '(?P<wrong>[^']*)' \(choose from (?P<choices>.*)\)"
)


# (category, message regex, module regex): warnings that say nothing actionable to an xaudit user.
_QUIET_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (UserWarning, "", r"captum(\.|$)"),
    (UserWarning, ".*(Captum|captum|attribution).*", ""),
    (FutureWarning, "", r"torch\.jit(\.|$)"),
    (FutureWarning, ".*torch\\.jit.*", ""),
    (DeprecationWarning, ".*torch\\.jit.*", ""),
    (UserWarning, ".*(TracerWarning|Converting a tensor to a Python).*", ""),
    (UserWarning, "", r"onnx2torch(\.|$)"),
)


def quiet_third_party(verbose: bool) -> None:
    """Filter the known harmless warnings of Captum, torch.jit, Celery and gRPC (shown with -v)."""
    if verbose:
        return
    for category, message, module in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    # Celery's "running the worker with superuser privileges" root warning (a container runs as root)
    # and gRPC core's "fork_posix.cc ... skipping fork() handlers" info line; children inherit both.
    warnings.filterwarnings("ignore", message=".*superuser privileges.*")
    # kombu's "No hostname was supplied" for the filesystem broker, which has no host by design.
    logging.getLogger("kombu.connection").setLevel(logging.ERROR)
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning:torch.jit,ignore::UserWarning:captum")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="xaudit", description="Audit which attribution methods allocate a model's effects correctly."
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log progress details and third-party warnings on stderr"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=OneLineParser)
    for name in COMMANDS:
        importlib.import_module(f"clients.cli.{name}").register(sub)
    return parser


def _pipe_closed() -> int:
    # Further writes (and the interpreter's final flush) go nowhere instead of raising again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    quiet_third_party(args.verbose)
    try:
        from clients.cli.options import apply_threads_option

        apply_threads_option(args)
        code: int = args.func(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _pipe_closed()
    except XauditError as exc:
        print(f"xaudit: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("xaudit: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: still one line unless debugging
        if os.environ.get("XAUDIT_DEBUG"):
            raise
        print(
            f"xaudit: internal error: {type(exc).__name__}: {exc} (set XAUDIT_DEBUG=1 for a traceback)",
            file=sys.stderr,
        )
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
