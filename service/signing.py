"""Sign finished reports: an in-toto Statement v1 in a DSSE envelope, Ed25519 (docs/signing.md).

The envelope format, key id definition and predicate type are specified in :mod:`clients.verify`,
which is also what checks them. The service stores the bytes :meth:`ReportSigner.sign` returns and
hands them out unchanged; nothing re-serialises them.

Keys (in ``key_dir``, the service's data directory unless configured otherwise)::

    key_dir/signing_key.pem         the Ed25519 private key (PKCS#8 PEM, mode 0600), made on first start
    key_dir/trusted/<keyid>.pem     public keys of earlier signing keys: reports they signed still verify

Rotation: ``xaudit keys rotate`` (:meth:`ReportSigner.rotate`; or by hand: copy the old public key
into ``trusted/`` and replace ``signing_key.pem``). A running server notices a replaced key file at
its next signature and signs with the new key from then on. With ``key_file`` set, the key is read
from there and never generated.

Only the server reads the private key: the file is mode 0600 in a 0700 directory, and no worker or
model process is given its path; model processes cannot open it (docs/security.md).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from service.file_lock import exclusive
from xaudit.contract.dsse import (
    INPUTS_SUBJECT,
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    PREDICATE_TYPES,
    STATEMENT_TYPE,
    key_id,
    load_public_key,
    pae,
    public_key_pem,
)
from xaudit.contract.errors import FailedPrecondition, InvalidInput

__all__ = ["KEY_FILE_NAME", "TRUSTED_DIR_NAME", "ReportSigner"]

logger = logging.getLogger(__name__)

KEY_FILE_NAME = "signing_key.pem"
TRUSTED_DIR_NAME = "trusted"

_HEX64 = re.compile(r"[0-9a-f]{64}")


def _private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def _write_private_key(path: Path, key: Ed25519PrivateKey) -> bool:
    """Create ``path`` with mode 0600 from the start (never world-readable, not even briefly).
    False if another process created it first; the caller then loads that one."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(_private_pem(key))
        f.flush()
        os.fsync(f.fileno())
    return True


def _load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidInput(f"signing key file not found: {path}") from None
    except OSError as exc:
        raise InvalidInput(f"signing key file {path} cannot be read ({exc.strerror})") from None
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise InvalidInput(f"signing key file {path} is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InvalidInput(f"signing key file {path} is not an Ed25519 key ({type(key).__name__})")
    if os.name == "posix" and path.stat().st_mode & 0o077:
        logger.warning("signing key file %s is readable by group or others; chmod 600 it", path)
    return key


class ReportSigner:
    """Signs reports with one Ed25519 key and lists every public key that verifies them.

    ``extra_verification_keys``: more public keys (PEM text/bytes, key objects or paths to PEM files)
    published by :meth:`public_keys`, e.g. earlier keys of a deployment whose ``key_dir`` is not shared.
    """

    def __init__(
        self,
        key_dir: Path,
        key_file: Path | None = None,
        extra_verification_keys: Iterable[Ed25519PublicKey | str | bytes | Path] = (),
    ) -> None:
        self._key_dir = Path(key_dir)
        if key_file is not None:
            self._key_path = Path(key_file)
            self._use(_load_private_key(self._key_path))
        else:
            self._key_path = self._key_dir / KEY_FILE_NAME
            self._use(self._load_or_create(self._key_path))
        self._extra: list[Ed25519PublicKey] = []
        for item in extra_verification_keys:
            if isinstance(item, Path):
                self._extra.append(load_public_key(self._read(item), f"verification key {item}"))
            else:
                self._extra.append(load_public_key(item, "configured verification key"))
        self._trusted_keys(strict=True)  # a broken trusted/ file stops the start, not a later call
        logger.info("report signing key %s", self._key_id)

    def _use(self, key: Ed25519PrivateKey) -> None:
        # One attribute, replaced whole: a concurrent signature uses the old or the new key, never a mix.
        self._current = (key, key.public_key(), key_id(key.public_key()))
        self._stamp = self._file_stamp()

    @property
    def _public_key(self) -> Ed25519PublicKey:
        return self._current[1]

    @property
    def _key_id(self) -> str:
        return self._current[2]

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = self._key_path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    def _reload_if_rotated(self) -> None:
        """Sign with the key file's current key: ``xaudit keys rotate`` replaces it under a running
        server. A file that is gone or unreadable keeps the key in memory (and says so)."""
        stamp = self._file_stamp()
        if stamp is None or stamp == self._stamp:
            return
        try:
            key = _load_private_key(self._key_path)
        except InvalidInput as exc:
            logger.error("keeping the current signing key: %s", exc)
            self._stamp = stamp
            return
        previous = self._key_id
        self._use(key)
        if self._key_id != previous:
            logger.info("signing key rotated: %s -> %s", previous, self._key_id)

    @staticmethod
    def _read(path: Path) -> bytes:
        try:
            return path.read_bytes()
        except OSError as exc:
            raise InvalidInput(f"verification key file {path} cannot be read ({exc.strerror})") from None

    @staticmethod
    def _load_or_create(path: Path) -> Ed25519PrivateKey:
        if not path.exists():
            key = Ed25519PrivateKey.generate()
            try:
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                created = _write_private_key(path, key)
            except OSError as exc:
                raise FailedPrecondition(f"cannot create the signing key {path} ({exc.strerror})") from None
            if created:
                logger.info("generated a report signing key in %s", path)
                return key
            # Another replica won the race: use its key so both sign alike.
        return _load_private_key(path)

    @property
    def key_id(self) -> str:
        """sha256 hex of the raw public key of the signing key (see :func:`clients.verify.key_id`)."""
        self._reload_if_rotated()
        return self._key_id

    def _trusted_keys(self, *, strict: bool = False) -> list[Ed25519PublicKey]:
        trusted_dir = self._key_dir / TRUSTED_DIR_NAME
        if not trusted_dir.is_dir():
            return []
        # Read on every call so a key dropped into trusted/ is published without a restart; a file
        # that went bad since the start is skipped (and logged) rather than failing GetSigningKeys.
        keys: list[Ed25519PublicKey] = []
        for path in sorted(trusted_dir.glob("*.pem")):
            try:
                keys.append(load_public_key(self._read(path), f"trusted key {path}"))
            except InvalidInput as exc:
                if strict:
                    raise
                logger.warning("skipping %s", exc)
        return keys

    def public_keys(self) -> list[tuple[str, str]]:
        """(key id, SubjectPublicKeyInfo PEM) of every verification key, the signing key first."""
        self._reload_if_rotated()
        out: dict[str, str] = {}
        for public_key in [self._public_key, *self._trusted_keys(), *self._extra]:
            out.setdefault(key_id(public_key), public_key_pem(public_key))
        return list(out.items())

    def sign(self, report_bytes: bytes, model_sha256: str, model_name: str, inputs_sha256: str) -> bytes:
        """The DSSE envelope's exact JSON bytes for ``report_bytes`` (an ``xaudit.report`` document).

        The report bytes go into the statement verbatim, so the signed predicate is exactly what the
        worker wrote; they must be a JSON object that names the same model and inputs digests.
        """
        for label, digest in (("model_sha256", model_sha256), ("inputs_sha256", inputs_sha256)):
            if not _HEX64.fullmatch(digest):
                raise InvalidInput(f"{label} must be 64 lowercase hex characters")
        report = self._parse_report(report_bytes)
        for section, digest in (("model", model_sha256), ("inputs", inputs_sha256)):
            named = report.get(section)
            if isinstance(named, dict) and named.get("sha256", digest) != digest:
                raise InvalidInput(
                    f"the report's {section} digest differs from the {section} being signed for"
                )
        self._reload_if_rotated()
        name = model_name.strip() or "model"
        if name == INPUTS_SUBJECT:  # the inputs subject is found by this name
            name = "model"
        head = json.dumps(
            {
                "_type": STATEMENT_TYPE,
                "subject": [
                    {"name": name, "digest": {"sha256": model_sha256}},
                    {"name": INPUTS_SUBJECT, "digest": {"sha256": inputs_sha256}},
                ],
                "predicateType": PREDICATE_TYPES.get(str(report.get("schema")), PREDICATE_TYPE),
            },
            separators=(",", ":"),
        )
        # Splice instead of re-serialising the parsed report: no float or key-order drift.
        payload = head[:-1].encode("utf-8") + b',"predicate":' + report_bytes.strip() + b"}"
        private_key, _, kid = self._current
        signature = private_key.sign(pae(PAYLOAD_TYPE, payload))
        envelope = {
            "payload": base64.b64encode(payload).decode("ascii"),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"keyid": kid, "sig": base64.b64encode(signature).decode("ascii")}],
        }
        return json.dumps(envelope, separators=(",", ":")).encode("utf-8")

    @staticmethod
    def _parse_report(report_bytes: bytes) -> dict[str, object]:
        def refuse_constant(name: str) -> None:
            raise ValueError(name)

        try:
            # UTF-8 only: the bytes are spliced into a UTF-8 statement as they are.
            report = json.loads(report_bytes.decode("utf-8"), parse_constant=refuse_constant)
        except (UnicodeDecodeError, ValueError):
            raise InvalidInput(
                "the report to sign is not valid JSON (NaN and Infinity are refused)"
            ) from None
        if not isinstance(report, dict):
            raise InvalidInput("the report to sign is not a JSON object")
        return report

    @classmethod
    def rotate(cls, key_dir: Path) -> ReportSigner:
        """Retire the current key of ``key_dir`` to ``trusted/`` and start signing with a new one.

        The new key replaces the file in one rename: a running server reading it sees the old key or
        the new one, never a partial file. Rotations run one at a time (service/file_lock.py): two at
        once would both retire the same key, and the key the first made, which a server may already
        have signed with, would be replaced without being trusted."""
        key_dir = Path(key_dir)
        path = key_dir / KEY_FILE_NAME
        _load_private_key(path)  # a missing or broken key: nothing to rotate (and nothing to lock)
        with exclusive(key_dir / f".{KEY_FILE_NAME}.lock", f"cannot rotate the signing key in {key_dir}"):
            old = _load_private_key(path).public_key()
            trusted_dir = key_dir / TRUSTED_DIR_NAME
            trusted_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            (trusted_dir / f"{key_id(old)}.pem").write_text(public_key_pem(old))
            # Keep the old private key beside (still 0600) rather than delete it: an operator decides.
            retired = path.with_name(f"{KEY_FILE_NAME}.retired-{key_id(old)[:16]}")
            if not retired.exists():
                os.link(path, retired)
            fresh = path.with_name(f".{KEY_FILE_NAME}.new-{os.getpid()}")
            fresh.unlink(missing_ok=True)
            _write_private_key(fresh, Ed25519PrivateKey.generate())
            os.replace(fresh, path)
            return cls(key_dir)
