"""The ``--server`` option of the remote commands and the client built from it."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from clients._defaults import DEFAULT_SERVER

if TYPE_CHECKING:
    from clients.client import XauditClient

__all__ = ["add_server_option", "client_from_args"]


def add_server_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=None,
        metavar="HOST:PORT",
        help=f"address of the xaudit server (default: $XAUDIT_SERVER or {DEFAULT_SERVER})",
    )


def client_from_args(args: argparse.Namespace) -> XauditClient:
    # $XAUDIT_TOKEN rather than a flag: tokens on command lines end up in shell history and `ps`.
    from clients.client import XauditClient  # grpc: loaded once a command needs a server, not for --help
    from xaudit.contract.channel import tls_credentials_from_env  # $XAUDIT_TLS_CA / _CERT / _KEY

    return XauditClient(
        args.server, token=os.environ.get("XAUDIT_TOKEN") or None, credentials=tls_credentials_from_env()
    )
