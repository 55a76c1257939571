"""The ``--server`` option of the remote commands and the client built from it."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from clients._addresses import grpc_target
from clients._defaults import DEFAULT_SERVER
from xaudit.contract.errors import InvalidInput

if TYPE_CHECKING:
    from clients.client import XauditClient

__all__ = ["add_server_option", "client_from_args"]


def add_server_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=None,
        type=grpc_target,
        metavar="HOST:PORT",
        help=f"address of the xaudit server, or a gRPC target such as unix:/path (default: $XAUDIT_SERVER "
        f"or {DEFAULT_SERVER})",
    )


def client_from_args(args: argparse.Namespace) -> XauditClient:
    # $XAUDIT_TOKEN rather than a flag: tokens on command lines end up in shell history and `ps`.
    from clients.client import XauditClient  # grpc: loaded once a command needs a server, not for --help
    from xaudit.contract.channel import tls_credentials_from_env  # $XAUDIT_TLS_CA / _CERT / _KEY

    return XauditClient(
        args.server or _server_from_env(),
        token=os.environ.get("XAUDIT_TOKEN") or None,
        credentials=tls_credentials_from_env(),
    )


def _server_from_env() -> str | None:
    """$XAUDIT_SERVER, checked as --server is (one line naming the variable); None: the default."""
    value = os.environ.get("XAUDIT_SERVER")
    if not value:
        return None
    try:
        return grpc_target(value)
    except argparse.ArgumentTypeError as exc:
        raise InvalidInput(f"$XAUDIT_SERVER: {exc}") from None
