"""``xaudit methods``: the registered attribution methods with capabilities, parameters and defaults."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("methods", help="list the attribution methods, their parameters and defaults")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workers.methods.catalogue import methods_markdown

    print(methods_markdown(), end="")
    return 0
