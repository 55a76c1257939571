"""``xaudit keys``: fetch the service's report verification keys into ``DIR/<keyid>.pem``;
``xaudit keys rotate``: on the server's machine, start signing with a new key (the old one stays
published, so the reports it signed still verify)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clients.client import XauditClient

__all__ = ["fetch_keys", "register", "run"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clients._connect import add_server_option

    parser = sub.add_parser(
        "keys",
        help="fetch the public keys that verify the server's signed reports; 'keys rotate': new signing key",
        description="xaudit keys --out DIR: fetch the verification keys from a server. "
        "xaudit keys rotate [--home DIR | --key-dir DIR]: on the server's machine, retire the signing "
        "key (still published, so earlier reports verify) and sign with a new one; a running server "
        "switches at its next signature.",
    )
    parser.add_argument("action", nargs="?", choices=("fetch", "rotate"), default="fetch")
    add_server_option(parser)
    parser.add_argument("--out", type=Path, help="fetch: directory for the <keyid>.pem files")
    parser.add_argument(
        "--home",
        type=Path,
        help="rotate: the server's data directory (default $XAUDIT_HOME, else the user data directory)",
    )
    parser.add_argument("--key-dir", type=Path, help="rotate: the signing key directory (default HOME/keys)")
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


def rotate(args: argparse.Namespace) -> int:
    from service.config import ServerConfig
    from service.signing import ReportSigner

    key_dir = args.key_dir
    if key_dir is None:
        config = ServerConfig(home=args.home) if args.home is not None else ServerConfig()
        key_dir = config.resolved_signing_key_dir
    signer = ReportSigner.rotate(key_dir)  # refuses a missing or broken key: nothing to rotate
    print(f"signing with {signer.key_id}")
    for kid, _ in signer.public_keys()[1:]:
        print(f"still published: {kid}")
    return 0


def run(args: argparse.Namespace) -> int:
    from clients._connect import client_from_args
    from xaudit.contract.errors import InvalidInput

    if args.action == "rotate":
        return rotate(args)
    if args.out is None:
        raise InvalidInput("xaudit keys: --out DIR is required to fetch keys")
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
