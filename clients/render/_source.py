"""Where the report comes from and what its signature says: a plain report JSON, or a DSSE envelope
verified against given keys (or opened without checking, and labelled so)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["SignatureStatus", "read_report"]

SignatureState = Literal["verified", "not_checked", "unsigned"]


@dataclass(frozen=True)
class SignatureStatus:
    """``key_id``: for ``verified`` the id recomputed from the key that verified; for ``not_checked`` the
    id the envelope claims (a hint only, shown as such)."""

    state: SignatureState
    key_id: str | None = None
    detail: str = ""

    @property
    def headline(self) -> str:
        if self.state == "verified":
            return "✔ signature verified"
        if self.state == "not_checked":
            return "⚠ signature not checked"
        return "⚠ unsigned report"


def _looks_like_envelope(doc: dict[str, Any]) -> bool:
    return "payload" in doc and "payloadType" in doc


def read_report(data: bytes, keys: Sequence[Any] = ()) -> tuple[dict[str, Any], SignatureStatus]:
    """The report in ``data`` and its signature status.

    An envelope with ``keys`` is verified (:class:`~xaudit.contract.errors.VerificationError` if it does not
    verify: an invalid report is never rendered as if it were fine); without keys its payload is read
    unchecked and the status says so. A plain report is ``unsigned``.
    """
    from xaudit.contract.errors import InvalidInput

    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise InvalidInput("the report is not JSON (expected a report or a signed envelope)") from None
    if not isinstance(doc, dict):
        raise InvalidInput("the report is not a JSON object")
    if not _looks_like_envelope(doc):
        if not str(doc.get("schema", "")).startswith("xaudit.report/"):
            raise InvalidInput(f"not an xaudit report (schema {doc.get('schema')!r})")
        return doc, SignatureStatus("unsigned", None, "a plain report: no signature to check")
    if keys:
        from clients.verify import verify_envelope

        verified = verify_envelope(data, keys)
        return dict(verified.report), SignatureStatus(
            "verified", verified.key_id, "DSSE envelope verified against the given public key"
        )
    try:
        statement = json.loads(base64.b64decode(str(doc["payload"]).translate(str.maketrans("-_", "+/"))))
        report = statement["predicate"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise InvalidInput("the envelope's payload is not a readable in-toto statement") from None
    if not isinstance(report, dict):
        raise InvalidInput("the envelope's statement has no report predicate")
    claimed = [str(s.get("keyid", "")) for s in doc.get("signatures") or [] if isinstance(s, dict)]
    return report, SignatureStatus(
        "not_checked",
        claimed[0] if claimed and claimed[0] else None,
        "signed envelope read without a public key; pass --key PUB.pem to verify it",
    )
