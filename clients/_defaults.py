"""Defaults shared by the client library and the command line, in a module that imports only the
contract's names (the CLI's ``--help`` reads them without loading grpc)."""

from __future__ import annotations

from xaudit.contract.names import DEFAULT_ADDRESS as DEFAULT_SERVER

__all__ = ["DEFAULT_SERVER"]
