"""grpc.RpcError -> the project's error tree, so client callers catch XauditError only."""

from __future__ import annotations

import grpc

from xaudit.contract.errors import REASON_METADATA_KEY, Unavailable, XauditError, error_for_code

__all__ = ["translate_rpc_error"]

# Substrings grpc-core puts in UNAVAILABLE details when no connection could be made at all.
_CONNECT_FAILURES = (
    "failed to connect",
    "connection refused",
    "connect failed",
    "dns resolution failed",
    "name resolution",
    "no route to host",
    "socket closed",
    "connection reset",
    "failed to pick subchannel",
    "errors resolving",
)


def translate_rpc_error(exc: grpc.RpcError, address: str) -> XauditError:
    """The XauditError for a failed call; an unreachable server names the address it tried."""
    code_obj = exc.code() if isinstance(exc, grpc.Call) else None
    code = code_obj.name if code_obj is not None else "UNKNOWN"
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or ""
    details = " ".join(details.split())
    if code == "UNAVAILABLE":
        lowered = details.lower()
        if "failed parsing http/2" in lowered:  # an HTTP/1 server, Redis, ... answered on that port
            return Unavailable(
                f"cannot reach the xaudit server at {address}: what answers there is not a gRPC server"
            )
        if not details or any(s in lowered for s in _CONNECT_FAILURES):
            return Unavailable(
                f"cannot reach the xaudit server at {address} ({_short(details) or 'unavailable'})"
            )
        return Unavailable(details)
    if code == "DEADLINE_EXCEEDED" and details.lower() in ("", "deadline exceeded"):
        # grpc's own text for a client-side timeout says nothing about where or what.
        details = f"the xaudit server at {address} did not answer in time"
    if code in ("UNKNOWN", "INTERNAL") and not details:
        details = f"the xaudit server at {address} failed the call ({code})"
    return error_for_code(code, details or code, _reason(exc))


def _reason(exc: grpc.RpcError) -> str:
    if not isinstance(exc, grpc.Call):
        return ""
    for key, value in exc.trailing_metadata() or ():
        if key == REASON_METADATA_KEY:
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return ""


def _short(details: str) -> str:
    # grpc-core details carry a long chain ("failed to connect to all addresses; last error: UNKNOWN:
    # ipv4:...: Connection refused"); the innermost reason is the one a user can act on.
    reason = details.rsplit(": ", 1)[-1].strip(" []")
    return reason[:200]
