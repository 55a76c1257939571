"""The signing key stays with the server: a private file only the server reads, rotated in place.

The model-side half (a model cannot read it) is in test_model_attacks.py and test_bombs.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from clients.verify import key_id, load_public_key, verify_envelope
from service.signing import KEY_FILE_NAME, ReportSigner

ROOT = Path(__file__).resolve().parents[2]
REPORT = json.dumps({"schema": "xaudit.report/v1", "model": {"sha256": "a" * 64}}).encode()


def _signer_key_id(envelope: bytes) -> str:
    return str(json.loads(envelope)["signatures"][0]["keyid"])


def test_the_key_file_is_private_to_the_server(tmp_path: Path) -> None:
    signer = ReportSigner(tmp_path / "keys")
    path = tmp_path / "keys" / KEY_FILE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert signer.key_id == key_id(load_public_key(signer.public_keys()[0][1], "signing key"))


def test_keys_rotate_switches_a_running_signer_and_keeps_the_old_key_published(tmp_path: Path) -> None:
    home = tmp_path / "home"
    running = ReportSigner(home / "keys")  # a server's signer, created before the rotation
    old = running.key_id
    first = running.sign(REPORT, "a" * 64, "m", "b" * 64)
    env = dict(os.environ, XAUDIT_HOME=str(tmp_path / "elsewhere"))
    done = subprocess.run(
        [sys.executable, "-m", "clients.cli.main", "keys", "rotate", "--home", str(home)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    new = done.stdout.split()[2]
    assert new != old and f"still published: {old}" in done.stdout
    second = running.sign(REPORT, "a" * 64, "m", "b" * 64)  # no restart
    assert _signer_key_id(first) == old and _signer_key_id(second) == new
    published = dict(running.public_keys())
    assert set(published) == {old, new}
    assert stat.S_IMODE((home / "keys" / KEY_FILE_NAME).stat().st_mode) == 0o600
    # Both envelopes verify with the keys the server publishes.
    for envelope in (first, second):
        verify_envelope(envelope, [load_public_key(pem, kid) for kid, pem in published.items()])


def test_keys_rotate_without_a_key_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "clients.cli.main", "keys", "rotate", "--key-dir", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode != 0 and "signing key file not found" in done.stderr
    assert not (tmp_path / "none" / KEY_FILE_NAME).exists()
