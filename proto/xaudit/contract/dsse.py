"""The signature format of xaudit reports: a DSSE v1 envelope around an in-toto Statement v1.

Shared by the signer (the service) and every verifier (clients.verify, ``xaudit verify`` and
``xaudit gate``). The format is written out in docs/signing.md:

* Envelope (DSSE v1): ``{"payload": BASE64(STATEMENT), "payloadType": PAYLOAD_TYPE,
  "signatures": [{"keyid": KEYID, "sig": BASE64(SIG)}]}``.
* Signature: Ed25519 over ``PAE(payloadType, payload)``.
* Key id: lowercase hex sha256 of the 32 raw Ed25519 public key bytes.
* Statement: subjects ``model`` (sha256 of the model bytes) and :data:`INPUTS_SUBJECT`
  (:func:`xaudit.contract.spec.tensor_digest` of the inputs); predicate type :data:`PREDICATE_TYPE`.

Needs ``cryptography`` only for the key helpers (imported when first called).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from xaudit.contract.errors import InvalidInput

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "INPUTS_SUBJECT",
    "PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "PREDICATE_TYPES",
    "REPORT_SCHEMA",
    "STATEMENT_TYPE",
    "key_id",
    "load_public_key",
    "pae",
    "public_key_pem",
]

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
# Ours, stable: names "an xaudit.report/vN document is the predicate". Bump only with the report
# schema; every earlier pair still verifies.
PREDICATE_TYPES: Mapping[str, str] = {
    "xaudit.report/v1": "https://xaudit.dev/report/v1",
    "xaudit.report/v2": "https://xaudit.dev/report/v2",
}
REPORT_SCHEMA = "xaudit.report/v2"  # what the audit writes now
PREDICATE_TYPE = PREDICATE_TYPES[REPORT_SCHEMA]
INPUTS_SUBJECT = "inputs"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what the signature covers.

    ``PAE(t, b) = "DSSEv1" SP LEN(t) SP t SP LEN(b) SP b`` (LEN: decimal byte count, no leading zeros).
    """
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(t), t, len(payload), payload)


def key_id(public_key: Ed25519PublicKey) -> str:
    """sha256 hex of the raw 32-byte Ed25519 public key (RFC 8032 encoding), not of its PEM or DER."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return hashlib.sha256(public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()


def public_key_pem(public_key: Ed25519PublicKey) -> str:
    """SubjectPublicKeyInfo PEM, the form GetSigningKeys and ``xaudit keys`` hand out."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return public_key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode("ascii")


def load_public_key(key: Ed25519PublicKey | str | bytes, source: str = "public key") -> Ed25519PublicKey:
    """An Ed25519 public key from PEM text/bytes (or the key itself). :class:`InvalidInput` otherwise:
    a key the caller cannot read is a usage error, not a failed verification."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    if isinstance(key, Ed25519PublicKey):
        return key
    data = key.encode("utf-8") if isinstance(key, str) else key
    try:
        loaded = load_pem_public_key(data)
    except (ValueError, TypeError):
        raise InvalidInput(f"{source} is not a PEM public key") from None
    if not isinstance(loaded, Ed25519PublicKey):
        raise InvalidInput(f"{source} is not an Ed25519 public key ({type(loaded).__name__})")
    return loaded
