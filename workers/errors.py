"""The one error tree of xaudit.

Every error a user can see derives from :class:`XauditError` and carries a ``code``: the name of the
gRPC status the service answers with. The CLI prints ``str(error)`` as one line; the service's
interceptor maps ``code`` to a status; the client library maps statuses back to these classes.
"""

from __future__ import annotations

__all__ = [
    "Cancelled",
    "DeadlineExceeded",
    "FailedPrecondition",
    "InvalidInput",
    "InvalidModel",
    "NotApplicable",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "UnknownMethod",
    "VerificationError",
    "XauditError",
    "error_for_code",
]


class XauditError(Exception):
    """Base of every error xaudit raises on purpose. ``code`` names the gRPC status."""

    code = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        # One line, always: the CLI prints it as is.
        return " ".join(self.message.split())


class InvalidInput(XauditError):
    """A request, tensor, spec or file is malformed (bad shape, dtype, NaN, bad player spec...)."""

    code = "INVALID_ARGUMENT"


class InvalidModel(InvalidInput):
    """The model bytes cannot be parsed, checked or loaded, or use refused features (external data)."""


class UnknownMethod(InvalidInput):
    """An attribution method name that is not in the registry."""


class NotApplicable(XauditError):
    """A method cannot run on this model (e.g. Grad-CAM without a conv layer). Not a crash: a verdict."""

    code = "FAILED_PRECONDITION"

    def __init__(self, method: str, reason: str) -> None:
        super().__init__(f"{method} is not applicable to this model: {reason}")
        self.method = method
        self.reason = reason


class FailedPrecondition(XauditError):
    code = "FAILED_PRECONDITION"


class NotFound(XauditError):
    """Unknown id, or an id that belongs to another tenant (never told apart)."""

    code = "NOT_FOUND"


class ResourceExhausted(XauditError):
    """A size cap or quota was hit."""

    code = "RESOURCE_EXHAUSTED"


class Unauthenticated(XauditError):
    code = "UNAUTHENTICATED"


class PermissionDenied(XauditError):
    code = "PERMISSION_DENIED"


class DeadlineExceeded(XauditError):
    code = "DEADLINE_EXCEEDED"


class Unavailable(XauditError):
    """A dependency (broker, server) cannot be reached right now; retrying later may work."""

    code = "UNAVAILABLE"


class Cancelled(XauditError):
    code = "CANCELLED"


class VerificationError(XauditError):
    """A signed report does not verify: bad signature, unknown key, tampered or malformed envelope,
    or a subject that is not the given model. Kept apart from InvalidInput so callers can tell a
    failed check (exit 1) from a usage error (exit 2)."""

    code = "INVALID_ARGUMENT"


_BY_CODE: dict[str, type[XauditError]] = {
    cls.code: cls
    for cls in (
        InvalidInput,
        FailedPrecondition,
        NotFound,
        ResourceExhausted,
        Unauthenticated,
        PermissionDenied,
        DeadlineExceeded,
        Unavailable,
        Cancelled,
    )
}


def error_for_code(code: str, message: str) -> XauditError:
    """The error class for a status name (used by the client to turn statuses back into errors)."""
    cls = _BY_CODE.get(code, XauditError)
    err = XauditError(message) if cls is XauditError else cls(message)
    return err
