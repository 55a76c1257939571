"""Server addresses as the command line and the environment give them: checked where they are read,
so a bad one is a one-line usage error (argparse's type errors) instead of a wait for a deadline."""

from __future__ import annotations

import argparse

__all__ = ["grpc_target", "host_port"]


def host_port(text: str) -> str:
    """HOST:PORT (an IPv6 host in brackets) with a port of 1 to 65535, as grpc dials it."""
    host, sep, port = text.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port of 1 to 65535, got '{text}'")
    return text


# gRPC's name-resolver schemes, dialled as written (https://grpc.github.io/grpc/core/md_doc_naming.html).
_GRPC_SCHEMES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:")


def grpc_target(text: str) -> str:
    """HOST:PORT (:func:`host_port`), or a gRPC target with its scheme (unix:/run/xaudit.sock,
    dns:///xaudit.internal:50051), which grpc dials as written. Without a port, grpc would dial
    port 443 and the command would wait out its deadline instead of saying so."""
    rest = text.partition(":")[2]
    if text.startswith(_GRPC_SCHEMES) and rest.strip("/"):
        return text
    try:
        return host_port(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected HOST:PORT with a port of 1 to 65535, or a gRPC target such as unix:/path or "
            f"dns:///HOST:PORT, got '{text}'"
        ) from None
