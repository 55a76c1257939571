"""Defaults shared by the client library and the command line, in a module that imports nothing (the
CLI's ``--help`` reads them without loading grpc)."""

from __future__ import annotations

__all__ = ["DEFAULT_SERVER"]

DEFAULT_SERVER = "127.0.0.1:50051"
