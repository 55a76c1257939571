"""``xaudit verify``: check a signed report offline and print its verdicts.

Exit 0: valid (and about the given model). 3: invalid, with one line why. 2: usage error (a missing
file, an unreadable key).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xaudit.contract.errors import EXIT_UNVERIFIED

__all__ = ["EXIT_INVALID", "register", "run"]

EXIT_INVALID = EXIT_UNVERIFIED  # 3: the report does not verify (xaudit.contract.errors)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("verify", help="verify a signed report (DSSE envelope) against public keys")
    parser.add_argument(
        "envelope", type=Path, help="the signed report, as GetReport / xaudit submit wrote it"
    )
    parser.add_argument(
        "--key",
        action="append",
        required=True,
        type=Path,
        metavar="PUB.pem",
        help="an Ed25519 public key (PEM) to accept; repeat for rotated keys",
    )
    parser.add_argument("--model", type=Path, help="also check that this model file is the report's subject")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: `xaudit --help` must not pay for cryptography.
    from clients.cli.options import read_file, read_model
    from clients.summary import verdict_summary
    from clients.verify import check_model_subject, load_public_key_file, verify_envelope
    from xaudit.contract.errors import VerificationError

    keys = [load_public_key_file(path) for path in args.key]
    envelope = read_file(args.envelope, "envelope")
    model = read_model(args.model, sniff=False) if args.model is not None else None
    try:
        _refuse_unsigned(envelope)
        verified = verify_envelope(envelope, keys)
        if model is not None:
            check_model_subject(verified.statement, model)
    except VerificationError as exc:
        print(f"xaudit: invalid: {exc}", file=sys.stderr)
        return EXIT_INVALID
    print(
        f"valid: signed by key {verified.key_id}"
        + (" and about the given model" if model is not None else "")
    )
    print(verdict_summary(verified.report))
    return 0


def _refuse_unsigned(data: bytes) -> None:
    from clients.verify import looks_unsigned
    from xaudit.contract.errors import VerificationError

    if looks_unsigned(data):
        raise VerificationError(
            "this is an unsigned report (plain JSON, as `xaudit audit` writes locally); only reports from a "
            "server are signed: run the audit with `xaudit submit` to get one, or read this one with `xaudit render`"
        )
