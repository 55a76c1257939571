"""``xaudit explain``: attributions of every requested method, written to one .npz."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from clients.cli._files import check_writable, write_npz
from clients.cli.options import add_job_options, add_threads_option, job_from_args, read_model
from clients.cli.progress import progress_bar

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("explain", help="compute attributions locally and write them to an .npz")
    add_job_options(parser, audit=False)
    add_threads_option(parser)
    parser.add_argument(
        "--out", required=True, type=Path, help="output .npz: one array per method, plus targets"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec, tensors = job_from_args(args, "attribution")
    check_writable(args.out)  # checked, like the arguments, before torch is loaded
    from workers.denormals import flushing
    from workers.explain import explain
    from workers.prepare import prepare

    with flushing():  # subnormal floats flushed while the job computes, as run_job does
        prep = prepare(spec, read_model(args.model), None, tensors)
        with progress_bar("explain") as update:
            result = explain(prep, spec.methods, update)
    arrays: dict[str, np.ndarray] = dict(result.attributions)
    arrays["target_values"] = prep.target_values.astype(np.float32)
    arrays["target_classes"] = prep.classes
    write_npz(args.out, arrays)
    for name, reason in result.not_applicable.items():
        print(f"{name}: not applicable: {reason}", file=sys.stderr)
    print(f"wrote {len(result.attributions)} attribution arrays to {args.out}", file=sys.stderr)
    return 0
