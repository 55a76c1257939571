"""The one error tree of xaudit.

Every error a user can see derives from :class:`XauditError` and carries three things:

* ``code``: the name of the gRPC status the service answers with;
* ``reason_code``: a stable, machine-readable reason (sent by the service as the
  ``xaudit-reason`` trailing metadata, so the client library rebuilds the very class, e.g. a
  :class:`VerificationError` rather than the :class:`InvalidInput` its status code would suggest);
* ``exit_status``: what the CLI exits with when it stops on this error.

Exit statuses (docs/architecture.md): 0 success; 1 a policy violation (``xaudit gate``: the audit
ran and the policy failed it); 2 an error (bad input, unreachable server, failed job...);
3 a signed report that does not verify (bad signature, unknown key, tampered envelope, wrong
subject). The CLI prints ``str(error)`` as one line.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_UNVERIFIED",
    "EXIT_VIOLATION",
    "REASON_METADATA_KEY",
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

EXIT_OK = 0
EXIT_VIOLATION = 1  # the policy failed the audit (the gate's verdict, not an error)
EXIT_ERROR = 2  # usage or runtime error
EXIT_UNVERIFIED = 3  # a signed report failed verification

# Trailing metadata key carrying ``XauditError.reason_code`` from the service to the client.
REASON_METADATA_KEY = "xaudit-reason"


class XauditError(Exception):
    """Base of every error xaudit raises on purpose."""

    code: ClassVar[str] = "INTERNAL"
    reason_code: ClassVar[str] = "INTERNAL"
    exit_status: ClassVar[int] = EXIT_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        # One line, always: the CLI prints it as is.
        return " ".join(self.message.split())


class InvalidInput(XauditError):
    """A request, tensor, spec or file is malformed (bad shape, dtype, NaN, bad player spec...)."""

    code = "INVALID_ARGUMENT"
    reason_code = "INVALID_INPUT"


class InvalidModel(InvalidInput):
    """The model bytes cannot be parsed, checked or loaded, or use refused features (external data)."""

    reason_code = "INVALID_MODEL"


class UnknownMethod(InvalidInput):
    """An attribution method name that is not in the registry."""

    reason_code = "UNKNOWN_METHOD"


class FailedPrecondition(XauditError):
    code = "FAILED_PRECONDITION"
    reason_code = "FAILED_PRECONDITION"


class NotApplicable(FailedPrecondition):
    """A method cannot run on this model (e.g. Grad-CAM without a conv layer). Not a crash: a verdict."""

    reason_code = "NOT_APPLICABLE"

    def __init__(self, method: str, reason: str) -> None:
        super().__init__(f"{method} is not applicable to this model: {reason}")
        self.method = method
        self.reason = reason  # the human explanation (reports show it)


class NotFound(XauditError):
    """Unknown id, or an id that belongs to another tenant (never told apart)."""

    code = "NOT_FOUND"
    reason_code = "NOT_FOUND"


class ResourceExhausted(XauditError):
    """A size cap or quota was hit."""

    code = "RESOURCE_EXHAUSTED"
    reason_code = "RESOURCE_EXHAUSTED"


class Unauthenticated(XauditError):
    code = "UNAUTHENTICATED"
    reason_code = "UNAUTHENTICATED"


class PermissionDenied(XauditError):
    code = "PERMISSION_DENIED"
    reason_code = "PERMISSION_DENIED"


class DeadlineExceeded(XauditError):
    code = "DEADLINE_EXCEEDED"
    reason_code = "DEADLINE_EXCEEDED"


class Unavailable(XauditError):
    """A dependency (broker, server) cannot be reached right now; retrying later may work."""

    code = "UNAVAILABLE"
    reason_code = "UNAVAILABLE"


class Cancelled(XauditError):
    code = "CANCELLED"
    reason_code = "CANCELLED"


class VerificationError(XauditError):
    """A signed report does not verify: bad signature, unknown key, tampered or malformed envelope,
    or a subject that is not the given model. Its own reason and exit status (3), so callers tell a
    failed check from a usage error (2) and from a policy violation (1)."""

    code = "INVALID_ARGUMENT"  # the envelope given is not a valid signed report
    reason_code = "VERIFICATION_FAILED"
    exit_status = EXIT_UNVERIFIED


_CLASSES: tuple[type[XauditError], ...] = (
    InvalidInput,
    InvalidModel,
    UnknownMethod,
    FailedPrecondition,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
    PermissionDenied,
    DeadlineExceeded,
    Unavailable,
    Cancelled,
    VerificationError,
)
# The class a bare status code stands for (the first class declared with that code).
_BY_CODE: dict[str, type[XauditError]] = {}
for cls in reversed(_CLASSES):
    _BY_CODE[cls.code] = cls
del cls
_BY_REASON: dict[str, type[XauditError]] = {cls.reason_code: cls for cls in _CLASSES}


def error_for_code(code: str, message: str, reason: str = "") -> XauditError:
    """The error for a status name and, when the service sent one, its reason (the client turns
    statuses back into errors with this). NotApplicable comes back as FailedPrecondition: its
    method name travels in the message only."""
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code, XauditError)
    return cls(message)
