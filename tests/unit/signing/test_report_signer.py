"""ReportSigner: key generation and permissions, key files, rotation, and what it refuses to sign."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from clients.verify import key_id, load_public_key, verify_envelope
from service.signing import KEY_FILE_NAME, TRUSTED_DIR_NAME, ReportSigner
from tests.unit.signing.signing_golden import ASSETS, asset, pem
from xaudit.contract.errors import InvalidInput, VerificationError

MODEL = "a" * 64
INPUTS = "b" * 64
REPORT = json.dumps(
    {"schema": "xaudit.report/v1", "model": {"sha256": MODEL, "format": "onnx"}, "inputs": {"sha256": INPUTS}}
).encode()


def _keys(signer: ReportSigner) -> list[str]:
    return [p for _, p in signer.public_keys()]


def test_first_start_generates_a_0600_key_and_a_second_start_reuses_it(tmp_path: Path) -> None:
    key_dir = tmp_path / "data" / "keys"
    first = ReportSigner(key_dir)
    path = key_dir / KEY_FILE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_dir.stat().st_mode) & 0o077 == 0
    second = ReportSigner(key_dir)
    assert first.key_id == second.key_id
    envelope = first.sign(REPORT, MODEL, "m.onnx", INPUTS)
    assert verify_envelope(envelope, _keys(second)).key_id == first.key_id


def test_key_id_is_the_documented_sha256_of_the_raw_public_key(tmp_path: Path) -> None:
    signer = ReportSigner(tmp_path)
    private = load_pem_private_key((tmp_path / KEY_FILE_NAME).read_bytes(), None)
    raw = private.public_key().public_bytes_raw()  # type: ignore[union-attr]
    assert signer.key_id == hashlib.sha256(raw).hexdigest()
    [(kid, pub)] = signer.public_keys()
    assert kid == signer.key_id == key_id(load_public_key(pub))


def test_configured_key_file_is_used_and_nothing_is_generated(tmp_path: Path) -> None:
    signer = ReportSigner(tmp_path / "keys", key_file=ASSETS / "TEST-ONLY-key-1.pem")
    assert not (tmp_path / "keys" / KEY_FILE_NAME).exists()
    assert signer.key_id == key_id(load_public_key(pem(1)))


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "not found"), (b"junk", "not an unencrypted PEM private key")],
)
def test_bad_key_file_is_a_clear_error(tmp_path: Path, content: bytes | None, message: str) -> None:
    key_file = tmp_path / "k.pem"
    if content is not None:
        key_file.write_bytes(content)
    with pytest.raises(InvalidInput, match=message):
        ReportSigner(tmp_path, key_file=key_file)


def test_non_ed25519_key_file_is_refused(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    key = ec.generate_private_key(ec.SECP256R1())
    key_file = tmp_path / "ec.pem"
    key_file.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    with pytest.raises(InvalidInput, match="not an Ed25519 key"):
        ReportSigner(tmp_path, key_file=key_file)


def test_rotation_keeps_old_reports_verifiable(tmp_path: Path) -> None:
    signer = ReportSigner(tmp_path)
    old = SimpleNamespace(key_id=signer.key_id)  # the live signer follows the key file: keep its id
    old_envelope = signer.sign(REPORT, MODEL, "m", INPUTS)
    new = ReportSigner.rotate(tmp_path)
    assert new.key_id != old.key_id
    assert (tmp_path / TRUSTED_DIR_NAME / f"{old.key_id}.pem").is_file()
    assert stat.S_IMODE((tmp_path / KEY_FILE_NAME).stat().st_mode) == 0o600
    # Signing key first, then the retired one.
    assert [kid for kid, _ in new.public_keys()] == [new.key_id, old.key_id]
    restarted = ReportSigner(tmp_path)
    assert restarted.key_id == new.key_id
    assert verify_envelope(old_envelope, _keys(restarted)).key_id == old.key_id
    new_envelope = restarted.sign(REPORT, MODEL, "m", INPUTS)
    assert verify_envelope(new_envelope, _keys(restarted)).key_id == new.key_id
    # The old key alone does not accept what the new one signed.
    with pytest.raises(VerificationError):
        verify_envelope(new_envelope, [pem for kid, pem in restarted.public_keys() if kid == old.key_id])


def _rotate_after(key_dir: Path, barrier: Any) -> None:
    barrier.wait()
    ReportSigner.rotate(key_dir)


def test_rotations_at_once_each_retire_a_key_that_stays_trusted(tmp_path: Path) -> None:
    # Without the lock, 8 rotations at once left 1 to 3 keys trusted (the others, which a server may
    # have signed with, were replaced untrusted) and half of the commands failed.
    ctx = multiprocessing.get_context("fork")
    ReportSigner(tmp_path)
    barrier = ctx.Barrier(8)
    runs = [ctx.Process(target=_rotate_after, args=(tmp_path, barrier)) for _ in range(8)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(60)
    assert [run.exitcode for run in runs] == [0] * 8
    signer = ReportSigner(tmp_path)
    assert len(list((tmp_path / TRUSTED_DIR_NAME).glob("*.pem"))) == 8
    assert len({kid for kid, _ in signer.public_keys()}) == 9


def test_extra_verification_keys_are_published(tmp_path: Path) -> None:
    signer = ReportSigner(tmp_path, extra_verification_keys=[pem(1), ASSETS / "key-2.pub.pem"])
    ids = [kid for kid, _ in signer.public_keys()]
    assert ids == [signer.key_id, key_id(load_public_key(pem(1))), key_id(load_public_key(pem(2)))]
    assert verify_envelope(asset("envelope-key-2.json"), _keys(signer)).key_id == ids[2]
    with pytest.raises(InvalidInput):
        ReportSigner(tmp_path, extra_verification_keys=["not a key"])


def test_key_created_by_a_concurrent_replica_is_loaded_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    winner = ReportSigner(tmp_path / "other")
    # The race: we saw no key file, then another replica wrote one before our O_EXCL create.
    (tmp_path / KEY_FILE_NAME).write_bytes((tmp_path / "other" / KEY_FILE_NAME).read_bytes())
    os.chmod(tmp_path / KEY_FILE_NAME, 0o600)
    real_exists = Path.exists
    monkeypatch.setattr(Path, "exists", lambda self: self.name != KEY_FILE_NAME and real_exists(self))
    assert ReportSigner(tmp_path).key_id == winner.key_id


@pytest.mark.parametrize(
    ("report", "model", "inputs", "message"),
    [
        (b"not json", MODEL, INPUTS, "not valid JSON"),
        (b"[1, 2]", MODEL, INPUTS, "not a JSON object"),
        (b'{"x": NaN}', MODEL, INPUTS, "NaN"),
        (REPORT, "A" * 64, INPUTS, "model_sha256"),
        (REPORT, MODEL, "short", "inputs_sha256"),
        (REPORT, "c" * 64, INPUTS, "model digest differs"),
        (REPORT, MODEL, "c" * 64, "inputs digest differs"),
    ],
)
def test_sign_refuses_what_would_not_be_a_truthful_statement(
    tmp_path: Path, report: bytes, model: str, inputs: str, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        ReportSigner(tmp_path).sign(report, model, "m", inputs)


def test_model_name_defaults_and_never_collides_with_the_inputs_subject(tmp_path: Path) -> None:
    signer = ReportSigner(tmp_path)
    for given, expected in (("", "model"), ("  ", "model"), ("inputs", "model"), ("net.onnx", "net.onnx")):
        verified = verify_envelope(signer.sign(REPORT, MODEL, given, INPUTS), _keys(signer))
        assert [s["name"] for s in verified.statement["subject"]] == [expected, "inputs"]


def test_envelope_bytes_are_stable_for_the_same_input(tmp_path: Path) -> None:
    signer = ReportSigner(tmp_path)
    assert signer.sign(REPORT, MODEL, "m", INPUTS) == signer.sign(REPORT, MODEL, "m", INPUTS)


def test_broken_trusted_key_stops_the_start_but_not_a_running_service(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    signer = ReportSigner(tmp_path)
    trusted = tmp_path / TRUSTED_DIR_NAME
    trusted.mkdir()
    (trusted / "good.pem").write_text(pem(1))
    (trusted / "bad.pem").write_text("not a key")
    # Running: the bad file is skipped and logged, the good one still published.
    assert [kid for kid, _ in signer.public_keys()] == [signer.key_id, key_id(load_public_key(pem(1)))]
    assert "bad.pem" in caplog.text
    # Starting: refused, naming the file.
    with pytest.raises(InvalidInput, match=r"bad\.pem"):
        ReportSigner(tmp_path)


def test_unwritable_key_dir_is_a_clear_error(tmp_path: Path) -> None:
    from xaudit.contract.errors import FailedPrecondition

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(FailedPrecondition, match="cannot create the signing key"):
        ReportSigner(blocker / "keys")
