"""Interoperability with an independent DSSE implementation: securesystemslib (secure-systems-lab)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError as SslibVerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey

from clients.verify import PAYLOAD_TYPE, key_id, load_public_key, verify_envelope
from service.signing import ReportSigner
from tests.unit.signing.signing_golden import ASSETS, asset, pem


def _sslib_key(n: int) -> SSlibKey:
    public = load_public_key(pem(n))
    # Our key id, so securesystemslib's keyid matching pairs the signature with this key.
    return SSlibKey.from_crypto(public, keyid=key_id(public))


@pytest.mark.parametrize("n", [1, 2])
def test_golden_envelopes_verify_with_securesystemslib(n: int) -> None:
    envelope = Envelope.from_dict(json.loads(asset(f"envelope-key-{n}.json")))
    assert envelope.payload_type == PAYLOAD_TYPE
    accepted = envelope.verify([_sslib_key(n)], 1)
    assert list(accepted) == [key_id(load_public_key(pem(n)))]
    statement = json.loads(envelope.payload)
    assert statement["predicate"] == json.loads(asset("report.json"))


def test_securesystemslib_computes_the_same_pae() -> None:
    raw = json.loads(asset("envelope-key-1.json"))
    from clients.verify import pae

    envelope = Envelope.from_dict(dict(raw))
    assert envelope.pae() == pae(raw["payloadType"], envelope.payload)


@pytest.mark.parametrize(
    "name", ["tampered-verdict.json", "tampered-signature.json", "tampered-payload-type.json"]
)
def test_tampered_goldens_fail_with_securesystemslib_too(name: str) -> None:
    envelope = Envelope.from_dict(json.loads(asset(name)))
    with pytest.raises(SslibVerificationError):
        envelope.verify([_sslib_key(1)], 1)


def test_wrong_key_fails_with_securesystemslib() -> None:
    public = load_public_key(pem(3))
    # Even labelled with the signer's key id, the wrong key does not verify.
    wrong = SSlibKey.from_crypto(public, keyid=key_id(load_public_key(pem(1))))
    envelope = Envelope.from_dict(json.loads(asset("envelope-key-1.json")))
    with pytest.raises(SslibVerificationError):
        envelope.verify([wrong], 1)


def test_fresh_service_envelope_verifies_with_securesystemslib(tmp_path: Path) -> None:
    signer = ReportSigner(tmp_path)
    report = asset("report.json")
    digests = json.loads(report)
    envelope_bytes = signer.sign(report, digests["model"]["sha256"], "m.onnx", digests["inputs"]["sha256"])
    [(kid, public_pem)] = signer.public_keys()
    key = SSlibKey.from_crypto(load_public_key(public_pem), keyid=kid)
    assert list(Envelope.from_dict(json.loads(envelope_bytes)).verify([key], 1)) == [kid]


def test_envelope_signed_by_securesystemslib_verifies_with_ours() -> None:
    # The other direction: securesystemslib signs our statement; our verifier accepts it.
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    private = load_pem_private_key((ASSETS / "TEST-ONLY-key-2.pem").read_bytes(), None)
    public = load_public_key(pem(2))
    signer = CryptoSigner(private, SSlibKey.from_crypto(public, keyid=key_id(public)))  # type: ignore[arg-type]
    payload = Envelope.from_dict(json.loads(asset("envelope-key-1.json"))).payload
    envelope = Envelope(payload, PAYLOAD_TYPE, {})
    envelope.sign(signer)
    verified = verify_envelope(json.dumps(envelope.to_dict()).encode(), [pem(2)])
    assert verified.key_id == key_id(public)
    assert verified.report == json.loads(asset("report.json"))
