"""``xaudit keys``: fetch the service's report verification keys into ``DIR/<keyid>.pem``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clients.client import XauditClient

__all__ = ["fetch_keys", "register", "run"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clients._connect import add_server_option

    parser = sub.add_parser("keys", help="fetch the public keys that verify the server's signed reports")
    add_server_option(parser)
    parser.add_argument("--out", required=True, type=Path, help="directory for the <keyid>.pem files")
    parser.set_defaults(func=run)


def fetch_keys(client: XauditClient) -> list[tuple[str, str]]:
    """(key id, PEM) pairs from ``client.signing_keys()``, each id recomputed from its key: the server's
    id is a label, and a key whose label does not match is refused rather than filed under it."""
    from clients.verify import key_id, load_public_key
    from xaudit.contract.errors import VerificationError

    out: list[tuple[str, str]] = []
    for entry in client.signing_keys():
        claimed, pem = entry.key_id, entry.public_key_pem
        actual = key_id(load_public_key(pem, f"server key {claimed}"))
        if actual != claimed:
            raise VerificationError(
                f"the server's key {claimed[:16]}... is really {actual[:16]}...; refusing it"
            )
        out.append((actual, pem))
    if not out:
        raise VerificationError("the server published no signing keys")
    return out


def run(args: argparse.Namespace) -> int:
    from clients._connect import client_from_args
    from xaudit.contract.errors import InvalidInput

    with client_from_args(args) as client:
        keys = fetch_keys(client)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        for kid, pem in keys:
            (args.out / f"{kid}.pem").write_text(pem)
    except OSError as exc:
        raise InvalidInput(f"cannot write keys to {args.out} ({exc.strerror})") from None
    for kid, _ in keys:
        print(args.out / f"{kid}.pem")
    return 0
