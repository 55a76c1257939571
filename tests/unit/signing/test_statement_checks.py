"""Validly signed envelopes whose statement is not an xaudit report statement are refused too."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from clients.verify import PAYLOAD_TYPE, key_id, load_public_key, pae, verify_envelope
from tests.unit.signing.signing_golden import ASSETS, asset, pem
from xaudit.contract.errors import VerificationError


def _key() -> Ed25519PrivateKey:
    key = load_pem_private_key((ASSETS / "TEST-ONLY-key-1.pem").read_bytes(), None)
    assert isinstance(key, Ed25519PrivateKey)
    return key


def _envelope(
    payload: bytes, payload_type: str = PAYLOAD_TYPE, extra_sigs: Sequence[Mapping[str, str]] = ()
) -> bytes:
    sig = base64.b64encode(_key().sign(pae(payload_type, payload))).decode()
    signatures = [*extra_sigs, {"keyid": "k", "sig": sig}]
    return json.dumps(
        {"payload": base64.b64encode(payload).decode(), "payloadType": payload_type, "signatures": signatures}
    ).encode()


def _statement() -> dict[str, Any]:
    payload = base64.b64decode(json.loads(asset("envelope-key-1.json"))["payload"])
    statement: dict[str, Any] = json.loads(payload)
    return statement


def _edit(path: str, value: Any) -> bytes:
    statement = _statement()
    *parents, last = path.split(".")
    node: Any = statement
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    if value is _DELETE:
        del node[last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return json.dumps(statement).encode()


_DELETE = object()


def test_resigned_unchanged_statement_verifies() -> None:
    assert verify_envelope(_envelope(_edit("_type", "https://in-toto.io/Statement/v1")), [pem(1)]).report


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("_type", "https://in-toto.io/Statement/v0.1", "statement _type"),
        ("predicateType", "https://slsa.dev/provenance/v1", "predicateType"),
        ("subject", [], "no subject"),
        ("subject.0.digest", {"sha1": "00"}, "lacks a sha256"),
        ("subject.0.digest.sha256", "A" * 64, "lacks a sha256"),
        ("predicate", [1], "not a report object"),
        ("predicate.schema", "xaudit.report/v2", "report schema"),
        ("subject.0.digest.sha256", "0" * 64, "model digest is not a subject"),
        ("subject.1.digest.sha256", "0" * 64, "inputs digest is not"),
        ("predicate", _DELETE, "not a report object"),
    ],
)
def test_signed_but_wrong_statements_fail(path: str, value: Any, message: str) -> None:
    with pytest.raises(VerificationError, match=message):
        verify_envelope(_envelope(_edit(path, value)), [pem(1)])


def test_signed_payload_that_is_not_json_fails() -> None:
    with pytest.raises(VerificationError, match="signed statement is not valid JSON"):
        verify_envelope(_envelope(b"\xff\xfe not json"), [pem(1)])
    with pytest.raises(VerificationError, match="signed statement is not valid JSON"):
        verify_envelope(_envelope(b'{"x": NaN}'), [pem(1)])


def test_signed_other_payload_type_fails_after_the_signature_check() -> None:
    with pytest.raises(VerificationError, match="payloadType is 'application/json'"):
        verify_envelope(
            _envelope(_edit("_type", "https://in-toto.io/Statement/v1"), "application/json"), [pem(1)]
        )


def test_one_good_signature_among_several_is_enough_and_names_its_key() -> None:
    bogus = {"keyid": "x", "sig": base64.b64encode(b"\0" * 64).decode()}
    verified = verify_envelope(
        _envelope(_edit("_type", "https://in-toto.io/Statement/v1"), extra_sigs=[bogus]), [pem(1)]
    )
    assert verified.key_id == key_id(load_public_key(pem(1)))


def test_urlsafe_base64_is_accepted_as_dsse_allows() -> None:
    env = json.loads(asset("envelope-key-1.json"))
    env["payload"] = base64.urlsafe_b64encode(base64.b64decode(env["payload"])).decode()
    env["signatures"][0]["sig"] = base64.urlsafe_b64encode(
        base64.b64decode(env["signatures"][0]["sig"])
    ).decode()
    assert verify_envelope(json.dumps(env).encode(), [pem(1)]).report
