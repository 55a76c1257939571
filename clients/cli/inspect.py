"""``xaudit inspect MODEL``: what xaudit reads from a model, which methods can run, and how to audit it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser(
        "inspect",
        help="show a model's inputs (batch axes), outputs, opsets, which methods can run and the audit command",
    )
    parser.add_argument(
        "model", type=Path, help="ONNX (.onnx, side files read from its directory) or TorchScript"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clients.cli.options import read_model
    from workers.inspect_model import inspect_model

    check = inspect_model(read_model(args.model), str(args.model))
    if args.json:
        print(json.dumps(check.__dict__, indent=2, default=str))
    else:
        print(check.text())
    return 0
