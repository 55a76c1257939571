"""Golden signed reports: they verify, and no single changed byte, wrong key or relabelling does."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from clients.verify import (
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    PREDICATE_TYPES,
    STATEMENT_TYPE,
    check_inputs_subject,
    check_model_subject,
    key_id,
    load_public_key,
    pae,
    verify_envelope,
)
from tests.unit.signing.signing_golden import ASSETS, asset, generator, pem
from xaudit.contract.errors import InvalidInput, VerificationError, XauditError


def _with(envelope: bytes, *, payload: bytes | None = None, sig: bytes | None = None) -> bytes:
    env = json.loads(envelope)
    if payload is not None:
        env["payload"] = base64.b64encode(payload).decode()
    if sig is not None:
        env["signatures"][0]["sig"] = base64.b64encode(sig).decode()
    return json.dumps(env).encode()


def _decoded(envelope: bytes) -> tuple[bytes, bytes]:
    env = json.loads(envelope)
    return base64.b64decode(env["payload"]), base64.b64decode(env["signatures"][0]["sig"])


def test_golden_envelope_verifies_and_says_what_was_signed() -> None:
    verified = verify_envelope(asset("envelope-key-1.json"), [pem(1)])
    assert verified.key_id == key_id(load_public_key(pem(1)))
    assert verified.statement["_type"] == STATEMENT_TYPE
    # The golden envelope holds a v1 report: it still verifies under the v1 predicate type.
    assert verified.statement["predicateType"] == PREDICATE_TYPES["xaudit.report/v1"]
    assert PREDICATE_TYPES["xaudit.report/v2"] == PREDICATE_TYPE
    model_sha = hashlib.sha256(asset("model.bin")).hexdigest()
    assert verified.statement["subject"][0] == {"name": "relu_cnn.onnx", "digest": {"sha256": model_sha}}
    assert verified.statement["subject"][1]["name"] == "inputs"
    assert verified.report == json.loads(asset("report.json"))
    assert check_model_subject(verified.statement, asset("model.bin")) == model_sha
    check_inputs_subject(verified.statement, generator().inputs_digest())


def test_report_bytes_are_embedded_verbatim() -> None:
    payload, _ = _decoded(asset("envelope-key-1.json"))
    assert payload.endswith(b',"predicate":' + asset("report.json") + b"}")


def test_key_id_is_sha256_of_raw_public_key_bytes() -> None:
    raw = load_public_key(pem(1)).public_bytes_raw()
    assert len(raw) == 32
    assert key_id(load_public_key(pem(1))) == hashlib.sha256(raw).hexdigest()
    assert (
        json.loads(asset("envelope-key-1.json"))["signatures"][0]["keyid"] == hashlib.sha256(raw).hexdigest()
    )


def test_pae_matches_the_dsse_definition() -> None:
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    assert pae("", b"") == b"DSSEv1 0  0 "


def test_generator_reproduces_the_committed_goldens(tmp_path) -> None:  # type: ignore[no-untyped-def]
    generator().main(tmp_path)
    generated = sorted(tmp_path.iterdir())
    assert len(generated) == 12
    for path in generated:
        assert path.read_bytes() == (ASSETS / path.name).read_bytes(), path.name


def test_every_flipped_payload_byte_fails() -> None:
    envelope = asset("envelope-key-1.json")
    payload, _ = _decoded(envelope)
    encoded = json.loads(envelope)["payload"]
    head, tail = envelope.split(encoded.encode())
    keys = [load_public_key(pem(1))]  # the signer's own key: the one that could be fooled
    accepted = []
    for i in range(len(payload)):
        tampered = bytearray(payload)
        tampered[i] ^= 1 << (i % 8)  # one bit per byte, every bit position in turn
        try:
            verify_envelope(head + base64.b64encode(bytes(tampered)) + tail, keys)
            accepted.append(i)
        except VerificationError:
            pass
    assert len(payload) > 1000
    assert accepted == []


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_every_flipped_signature_byte_fails(mask: int) -> None:
    envelope = asset("envelope-key-1.json")
    _, sig = _decoded(envelope)
    assert len(sig) == 64
    keys = [load_public_key(pem(1))]
    for i in range(len(sig)):
        tampered = bytearray(sig)
        tampered[i] ^= mask
        with pytest.raises(VerificationError, match="no signature verifies"):
            verify_envelope(_with(envelope, sig=bytes(tampered)), keys)


@pytest.mark.parametrize(
    "name", ["tampered-verdict.json", "tampered-signature.json", "tampered-payload-type.json"]
)
def test_golden_tampered_files_fail(name: str) -> None:
    with pytest.raises(VerificationError):
        verify_envelope(asset(name), [pem(1), pem(2)])


def test_tampered_verdict_file_really_changes_only_the_verdict() -> None:
    # Guards the golden: it must be a plausible forgery, not garbage that fails for another reason.
    original, sig = _decoded(asset("envelope-key-1.json"))
    forged, forged_sig = _decoded(asset("tampered-verdict.json"))
    assert sig == forged_sig
    a, b = json.loads(original), json.loads(forged)
    [m_a] = [m for m in a["predicate"]["methods"] if m["name"] == "occlusion_1"]
    [m_b] = [m for m in b["predicate"]["methods"] if m["name"] == "occlusion_1"]
    assert (m_a["verdict"], m_b["verdict"]) == ("unreliable", "reliable")


def test_wrong_key_fails() -> None:
    with pytest.raises(VerificationError, match="no signature verifies"):
        verify_envelope(asset("envelope-key-1.json"), [pem(3)])
    with pytest.raises(VerificationError):
        verify_envelope(asset("envelope-key-1.json"), [pem(2)])


def test_key_id_hint_is_not_trusted() -> None:
    # DSSE: the keyid is an unauthenticated hint. A lying keyid neither breaks nor forges verification.
    env = json.loads(asset("envelope-key-1.json"))
    env["signatures"][0]["keyid"] = key_id(load_public_key(pem(3)))
    verified = verify_envelope(json.dumps(env).encode(), [pem(3), pem(1)])
    assert verified.key_id == key_id(load_public_key(pem(1)))


def test_rotation_old_and_new_envelopes_verify_against_the_key_list() -> None:
    keys = [pem(2), pem(1)]
    assert verify_envelope(asset("envelope-key-1.json"), keys).key_id == key_id(load_public_key(pem(1)))
    assert verify_envelope(asset("envelope-key-2.json"), keys).key_id == key_id(load_public_key(pem(2)))


def test_other_model_is_not_the_subject() -> None:
    verified = verify_envelope(asset("envelope-key-1.json"), [pem(1)])
    with pytest.raises(VerificationError, match="not the subject"):
        check_model_subject(verified.statement, asset("model.bin") + b"\0")
    with pytest.raises(VerificationError, match="not the subject"):
        check_inputs_subject(verified.statement, "0" * 64)


@pytest.mark.parametrize(
    ("envelope", "message"),
    [
        (b"not json", "not valid JSON"),
        (b"[]", "not a JSON object"),
        (b'{"payloadType": "x", "payload": "e30=", "signatures": []}', "no signatures"),
        (b'{"payloadType": "x", "payload": "***", "signatures": [{"sig": "AA=="}]}', "not valid base64"),
        (b'{"payload": "e30=", "signatures": [{"sig": "AA=="}]}', "no payloadType"),
    ],
)
def test_malformed_envelopes_fail_with_a_reason(envelope: bytes, message: str) -> None:
    with pytest.raises(VerificationError, match=message):
        verify_envelope(envelope, [pem(1)])


def test_unreadable_key_is_a_usage_error_not_a_verification_failure() -> None:
    with pytest.raises(InvalidInput, match="not a PEM public key"):
        verify_envelope(asset("envelope-key-1.json"), ["garbage"])
    with pytest.raises(InvalidInput, match="no public keys"):
        verify_envelope(asset("envelope-key-1.json"), [])
    # A private key is not a public key.
    with pytest.raises(InvalidInput):
        verify_envelope(asset("envelope-key-1.json"), [asset("TEST-ONLY-key-1.pem")])


def test_errors_are_one_line_xaudit_errors() -> None:
    with pytest.raises(XauditError) as info:
        verify_envelope(asset("tampered-signature.json"), [pem(1)])
    assert "\n" not in str(info.value) and info.value.code == "INVALID_ARGUMENT"


def test_payload_type_is_authenticated() -> None:
    assert json.loads(asset("envelope-key-1.json"))["payloadType"] == PAYLOAD_TYPE
    with pytest.raises(VerificationError):
        verify_envelope(asset("tampered-payload-type.json"), [pem(1)])


def test_golden_report_follows_the_report_schema() -> None:
    # The golden report is synthetic; this keeps it the shape workers.audit really writes.
    import jsonschema

    schema_path = ASSETS.parents[2] / "workers" / "audit" / "report-v1.schema.json"
    schema = json.loads(schema_path.read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads(asset("report.json")))
