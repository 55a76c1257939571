"""Why a listen address cannot be bound, asked of the OS before grpc tries.

grpc reports a failed bind as a log line of its own on stderr and an exception without the reason;
a probe bind beforehand gives the operator one line with the OS's reason ("Address already in use",
"Cannot assign requested address", "Permission denied"). grpc's own bind stays the authority: the
probe only words the refusal, and a port taken between the two is still refused by grpc.
"""

from __future__ import annotations

import socket

__all__ = ["host_of", "why_not_listening"]


def host_of(address: str) -> str:
    """The host of grpc's ``host:port`` (an IPv6 host without its brackets; "" for ``:port``)."""
    return address.rpartition(":")[0].strip("[]")


def why_not_listening(address: str) -> str | None:
    """The OS's reason why no TCP socket can listen on ``address`` (grpc's ``host:port``, IPv6 hosts
    in brackets), or None when one can (or the address is not a plain TCP one: grpc decides)."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or host.startswith(("unix", "vsock")):
        return None
    port = int(port_text)
    if port == 0:
        return None  # any free port
    host = host_of(address)
    try:
        resolved = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve {host!r}: {exc.strerror}"
    reasons = []
    for family, kind, proto, _, where in resolved:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc: TIME_WAIT is no conflict
            try:
                probe.bind(where)
            except OSError as exc:
                reasons.append(exc.strerror or str(exc))
                continue
        return None  # grpc listens where at least one resolved address binds
    return reasons[0] if reasons else f"{address} resolves to no address"
