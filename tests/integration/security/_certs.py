"""A test CA, a server certificate for 127.0.0.1/localhost and a client certificate (CN team-cert),
written as PEM files: ca.pem/.key, server.pem/.key, client.pem/.key."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

__all__ = ["write_certs"]


def write_certs(directory: Path) -> dict[str, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def issue(subject: str, key, issuer_name, issuer_key, *, ca: bool = False, ip: bool = False):  # type: ignore[no-untyped-def]
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(issuer_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ip:
            san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    def write(stem: str, cert, key) -> None:  # type: ignore[no-untyped-def]
        (directory / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (directory / f"{stem}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = issue("xaudit test CA", ca_key, name("xaudit test CA"), ca_key, ca=True)
    write("ca", ca, ca_key)
    for stem, cn, ip in (("server", "localhost", True), ("client", "team-cert", False)):
        key = ec.generate_private_key(ec.SECP256R1())
        write(stem, issue(cn, key, ca.subject, ca_key, ip=ip), key)
    return {p.stem + p.suffix: p for p in directory.iterdir()}
