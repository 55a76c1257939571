"""Verify xaudit's signed reports: a DSSE envelope around an in-toto Statement v1.

The format's names and encodings live in :mod:`xaudit.contract.dsse`; :mod:`service.signing` produces
what this module checks. It imports neither torch nor numpy, so a compliance machine can verify with ``cryptography``
alone.

Format (see also ``deploy/ci/README.md``):

* Envelope (DSSE v1, https://github.com/secure-systems-lab/dsse): the JSON object
  ``{"payload": BASE64(STATEMENT), "payloadType": "application/vnd.in-toto+json",
  "signatures": [{"keyid": KEYID, "sig": BASE64(SIG)}]}``.
* Signature: Ed25519 over ``PAE(payloadType, payload)`` where
  ``PAE(t, b) = "DSSEv1" SP LEN(t) SP t SP LEN(b) SP b`` (LEN: decimal byte count, no leading zeros).
* Key id: lowercase hex sha256 of the 32 raw Ed25519 public key bytes (RFC 8032 encoding, i.e.
  ``public_bytes(Encoding.Raw, PublicFormat.Raw)``), not of the PEM or DER text. The key id in the
  envelope is only a hint: every given key is tried, and the id reported is recomputed from the key
  that verified.
* Statement (https://in-toto.io/Statement/v1): ``subject`` lists the model (name: the model's name or
  ``"model"``; digest: sha256 of the model file's bytes) and the input set (name ``"inputs"``; digest:
  :func:`xaudit.contract.spec.tensor_digest` of the inputs); ``predicateType`` is :data:`PREDICATE_TYPE`;
  ``predicate`` is the ``xaudit.report/v2`` report (v1 envelopes still verify), whose bytes the service embeds verbatim.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from xaudit.contract.dsse import (
    INPUTS_SUBJECT,
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    PREDICATE_TYPES,
    REPORT_SCHEMA,
    STATEMENT_TYPE,
    key_id,
    load_public_key,
    pae,
    public_key_pem,
)
from xaudit.contract.errors import InvalidInput, VerificationError

__all__ = [
    "INPUTS_SUBJECT",
    "PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "PREDICATE_TYPES",
    "REPORT_SCHEMA",
    "STATEMENT_TYPE",
    "PublicKeyLike",
    "VerifiedReport",
    "check_inputs_subject",
    "check_model_subject",
    "key_id",
    "load_public_key",
    "load_public_key_file",
    "looks_unsigned",
    "pae",
    "public_key_pem",
    "verify_envelope",
]

PublicKeyLike = Ed25519PublicKey | str | bytes

_HEX64 = re.compile(r"[0-9a-f]{64}")
_URLSAFE = str.maketrans("-_", "+/")


def looks_unsigned(data: bytes) -> bool:
    """A plain report (``xaudit audit`` writes them locally), not a signed envelope: it has nothing
    to verify, which callers should say rather than that an envelope field is missing."""
    try:
        doc = json.loads(data)
    except ValueError:
        return False
    return (
        isinstance(doc, dict)
        and "payload" not in doc
        and str(doc.get("schema", "")).startswith("xaudit.report/")
    )


def load_public_key_file(path: Path) -> Ed25519PublicKey:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidInput(f"key file not found: {path}") from None
    except OSError as exc:
        raise InvalidInput(f"key file {path} cannot be read ({exc.strerror})") from None
    return load_public_key(data, f"key file {path}")


@dataclass(frozen=True)
class VerifiedReport:
    """What a verified envelope says. ``payload`` is the exact signed statement bytes."""

    statement: Mapping[str, Any]
    report: Mapping[str, Any]
    key_id: str
    payload: bytes

    def subject_digest(self, name: str) -> str | None:
        for entry in self.statement["subject"]:
            if entry.get("name") == name:
                digest: str = entry["digest"]["sha256"]
                return digest
        return None


def _b64decode(text: Any, field: str) -> bytes:
    if not isinstance(text, str):
        raise VerificationError(f"envelope field '{field}' must be a base64 string")
    try:
        # DSSE allows standard or URL-safe base64; anything else (stray characters) is refused.
        return base64.b64decode(text.translate(_URLSAFE).encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise VerificationError(f"envelope field '{field}' is not valid base64") from None


def _parse_json_object(data: bytes, what: str) -> dict[str, Any]:
    def refuse_constant(name: str) -> None:
        raise ValueError(f"non-JSON constant {name}")

    try:
        obj = json.loads(data, parse_constant=refuse_constant)
    except (UnicodeDecodeError, ValueError):
        raise VerificationError(f"{what} is not valid JSON") from None
    if not isinstance(obj, dict):
        raise VerificationError(f"{what} is not a JSON object")
    return obj


def _check_statement(statement: Mapping[str, Any]) -> Mapping[str, Any]:
    if statement.get("_type") != STATEMENT_TYPE:
        raise VerificationError(f"statement _type is {statement.get('_type')!r}, expected {STATEMENT_TYPE}")
    if statement.get("predicateType") not in PREDICATE_TYPES.values():
        raise VerificationError(
            f"predicateType is {statement.get('predicateType')!r}, expected one of "
            + ", ".join(PREDICATE_TYPES.values())
        )
    subject = statement.get("subject")
    if not isinstance(subject, list) or not subject:
        raise VerificationError("statement has no subject")
    for entry in subject:
        digest = entry.get("digest") if isinstance(entry, dict) else None
        if not isinstance(digest, dict) or not _HEX64.fullmatch(str(digest.get("sha256", ""))):
            raise VerificationError("a statement subject lacks a sha256 digest")
    report = statement.get("predicate")
    if not isinstance(report, dict):
        raise VerificationError("statement predicate is not a report object")
    if PREDICATE_TYPES.get(str(report.get("schema"))) != statement.get("predicateType"):
        raise VerificationError(
            f"report schema is {report.get('schema')!r}, which does not match predicateType "
            f"{statement.get('predicateType')!r}"
        )
    # The report names its model and inputs too; a statement whose subjects disagree is not ours.
    names = {e.get("name"): e["digest"]["sha256"] for e in subject}
    model = report.get("model")
    if isinstance(model, dict) and "sha256" in model:
        model_digests = [d for n, d in names.items() if n != INPUTS_SUBJECT]
        if model["sha256"] not in model_digests:
            raise VerificationError("the report's model digest is not a subject of the statement")
    inputs = report.get("inputs")
    if isinstance(inputs, dict) and "sha256" in inputs and names.get(INPUTS_SUBJECT) != inputs["sha256"]:
        raise VerificationError("the report's inputs digest is not the statement's inputs subject")
    return report


def verify_envelope(envelope_bytes: bytes, keys: Sequence[PublicKeyLike]) -> VerifiedReport:
    """Check that ``envelope_bytes`` is a DSSE envelope signed by one of ``keys`` around an xaudit
    report statement, and return what it says.

    Raises :class:`VerificationError` on any failure of the envelope, signature or statement, and
    :class:`InvalidInput` when a given key cannot be read (the caller's mistake, not the envelope's).
    """
    public_keys = [load_public_key(k, f"public key #{i + 1}") for i, k in enumerate(keys)]
    if not public_keys:
        raise InvalidInput("no public keys given to verify with")
    envelope = _parse_json_object(envelope_bytes, "envelope")
    payload_type = envelope.get("payloadType")
    if not isinstance(payload_type, str):
        raise VerificationError("envelope has no payloadType")
    payload = _b64decode(envelope.get("payload"), "payload")
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        raise VerificationError("envelope has no signatures")
    message = pae(payload_type, payload)
    verified_by: str | None = None
    for entry in signatures:
        if not isinstance(entry, dict):
            raise VerificationError("envelope signature entry is not an object")
        sig = _b64decode(entry.get("sig"), "signatures[].sig")
        for public_key in public_keys:
            try:
                public_key.verify(sig, message)
            except InvalidSignature:
                continue
            verified_by = key_id(public_key)
            break
        if verified_by is not None:
            break
    if verified_by is None:
        hints = ", ".join(str(e.get("keyid", "?"))[:16] for e in signatures if isinstance(e, dict))
        raise VerificationError(f"no signature verifies with the given keys (signed by key id {hints})")
    # Only now is the payload trusted enough to interpret; the type is authenticated by the PAE.
    if payload_type != PAYLOAD_TYPE:
        raise VerificationError(f"payloadType is {payload_type!r}, expected {PAYLOAD_TYPE}")
    statement = _parse_json_object(payload, "signed statement")
    report = _check_statement(statement)
    return VerifiedReport(statement=statement, report=report, key_id=verified_by, payload=payload)


def _model_subjects(statement: Mapping[str, Any]) -> Iterable[str]:
    for entry in statement.get("subject", []):
        if entry.get("name") != INPUTS_SUBJECT:
            yield str(entry["digest"]["sha256"])


def check_model_subject(statement: Mapping[str, Any], model_bytes: bytes) -> str:
    """The model file's sha256 if it is the statement's model subject; :class:`VerificationError` else."""
    digest = hashlib.sha256(model_bytes).hexdigest()
    if digest not in set(_model_subjects(statement)):
        raise VerificationError(f"the model (sha256 {digest[:16]}...) is not the subject of this report")
    return digest


def check_inputs_subject(statement: Mapping[str, Any], inputs_sha256: str) -> None:
    """:class:`VerificationError` unless ``inputs_sha256`` (a :func:`xaudit.contract.spec.tensor_digest`) is the
    statement's inputs subject."""
    for entry in statement.get("subject", []):
        if entry.get("name") == INPUTS_SUBJECT and entry["digest"]["sha256"] == inputs_sha256:
            return
    raise VerificationError(f"the inputs (digest {inputs_sha256[:16]}...) are not the subject of this report")
