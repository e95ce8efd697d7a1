"""Certificates for services a test runs with TLS: a CA made for the test, and a server
certificate for 127.0.0.1 and localhost that it signed, in the files servers read (PEM for
Redis, PKCS#12 for Kafka's JVM), plus a second CA that signed nothing (a client that trusts it
must refuse the server). Made with ``cryptography``, valid for a day."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEYSTORE_PASSWORD = "keystore-password"


@dataclass(frozen=True)
class ServerCertificates:
    ca: Path  # PEM: the CA that signed the server's certificate
    certificate: Path  # PEM: the server's certificate
    key: Path  # PEM: its private key (PKCS#8, not encrypted)
    keystore: Path  # PKCS#12: key and chain, KEYSTORE_PASSWORD
    other_ca: Path  # PEM: a CA that signed nothing


def certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None = None,
    issuer_key: ec.EllipticCurvePrivateKey | None = None,
) -> x509.Certificate:
    """A day's certificate: a CA's when self-signed (no ``issuer``), else a server's for
    127.0.0.1 and localhost, signed by ``issuer``."""
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    signer = key if issuer_key is None else issuer_key
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name if issuer is None else issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), False
        )
    )
    if issuer is None:
        usage = x509.KeyUsage(True, False, False, False, False, True, True, False, False)
        builder = builder.add_extension(usage, critical=True)
    else:
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    return builder.sign(signer, hashes.SHA256())


def write_server_certificates(folder: Path) -> ServerCertificates:
    """The files of :class:`ServerCertificates`, written into ``folder``."""
    ca_key, other_key, server_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = certificate("skewer test CA", ca_key)
    server = certificate("127.0.0.1", server_key, ca, ca_key)
    files = ServerCertificates(
        folder / "ca.pem",
        folder / "server.pem",
        folder / "server-key.pem",
        folder / "server.p12",
        folder / "other-ca.pem",
    )
    pem = serialization.Encoding.PEM
    files.ca.write_bytes(ca.public_bytes(pem))
    files.certificate.write_bytes(server.public_bytes(pem))
    files.key.write_bytes(
        server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    files.key.chmod(0o600)
    files.keystore.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"server",
            server_key,
            server,
            [ca],
            serialization.BestAvailableEncryption(KEYSTORE_PASSWORD.encode()),
        )
    )
    files.other_ca.write_bytes(certificate("another CA", other_key).public_bytes(pem))
    return files
