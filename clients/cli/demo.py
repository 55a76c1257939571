"""``xaudit demo``: start the embedded service, audit the shipped digits CNN, print the verdicts.

The model (workers/assets/digits_cnn.onnx) was trained on scikit-learn's bundled digits by
workers/assets/build_demo.py; nothing is downloaded. The service runs as a child ``xaudit serve`` on a
free loopback port with a temporary data directory (``--home`` keeps one), and stops at the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.arg_types import grpc_target, positive_seconds

if TYPE_CHECKING:
    from clients.client import XauditClient

__all__ = ["register", "run"]

DEMO_PLAYERS = "grid:2x4"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("demo", help="start the embedded service and audit a small example model")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("xaudit-demo-report.json"),
        help="where to write the report (default: ./xaudit-demo-report.json)",
    )
    parser.add_argument("--methods", default="all", help="methods to audit (default: all, the fourteen)")
    parser.add_argument("--home", type=Path, help="data directory for the service (default: a temporary one)")
    parser.add_argument(
        "--server", type=grpc_target, help="audit on this running server (HOST:PORT) instead of starting one"
    )
    parser.add_argument(
        "--startup-timeout",
        type=positive_seconds,
        default=120.0,
        help="seconds to wait for the service to come up",
    )
    from clients.cli.options import add_threads_option

    add_threads_option(parser)
    from clients.cli._output import add_json_option

    add_json_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clients._embedded import embedded_service
    from clients.cli._files import check_writable
    from clients.client import XauditClient

    check_writable(args.out)  # before the service starts, not after the audit
    if args.server:
        with XauditClient(args.server, timeout=60.0) as client:
            return _audit(client, args)
    with embedded_service(args.home, args.startup_timeout) as address:
        print(f"embedded xaudit service on {address}", file=sys.stderr)
        with XauditClient(address, timeout=60.0) as client:
            return _audit(client, args)


def _audit(client: XauditClient, args: argparse.Namespace) -> int:
    import json

    import numpy as np

    from clients._report import report_document, settings_line
    from clients.cli._output import print_outcome
    from clients.cli._results import follow

    model_path = _asset("digits_cnn.onnx")
    inputs = np.load(_asset("digits_inputs.npy"))
    background = np.load(_asset("digits_background.npy"))
    about = json.loads(_asset("digits_cnn.json").read_text())
    print(
        f"model: a small ReLU CNN trained on scikit-learn's bundled digits ({about['test_accuracy']:.1%} test "
        "accuracy; workers/assets/build_demo.py)",
        file=sys.stderr,
    )
    ref = client.upload_model(model_path)
    print(f"uploaded {model_path.name} (sha256 {ref.sha256[:16]}..., {ref.size} bytes)", file=sys.stderr)
    job = client.submit_audit(
        ref,
        inputs=inputs,
        background=background,
        players=DEMO_PLAYERS,
        methods=args.methods,
        device="auto",
    )
    print(f"auditing: job {job.id}, {inputs.shape[0]} digit images, players {DEMO_PLAYERS}", file=sys.stderr)
    job = follow(client, job, "audit")
    data = client.get_report(job.id)
    args.out.write_bytes(data)
    report = report_document(data)
    note = _signature_note(client, data, args.out, model_path)
    settings = settings_line(report, background_given=int(background.shape[0]))
    print_outcome(
        args, report, {"report": args.out}, settings=settings, extra={"job": job.id, "signature": note}
    )
    if not args.json:
        print(note)
    return 0


def _asset(name: str) -> Path:
    from importlib.resources import files

    # Package data of `workers` (pyproject ships workers/assets/*); installs are unpacked, never zipped.
    return Path(str(files("workers").joinpath("assets", name)))


def _signature_note(client: XauditClient, data: bytes, out: Path, model_path: Path) -> str:
    """Verify an enveloped report with the service's keys and say how to check it again offline."""
    import json

    from clients.cli.keys import fetch_keys
    from clients.verify import verify_envelope

    try:
        envelope = json.loads(data)
    except ValueError:
        envelope = None
    if not (isinstance(envelope, dict) and "signatures" in envelope):
        return "the report is not signed by this service (unsigned JSON)"
    keys = fetch_keys(client)
    verified = verify_envelope(data, [pem for _, pem in keys])
    key_file = out.with_name(f"{out.stem}.key.pem")
    key_file.write_text(dict(keys)[verified.key_id])
    return (
        f"signed by key {verified.key_id[:16]}... (verified); check it offline:\n"
        f"  xaudit verify {out} --key {key_file} --model {model_path}"
    )
