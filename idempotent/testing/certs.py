"""Throw-away certificates for tests: a CA, a server certificate and a client certificate.

Generated with the ``cryptography`` package (EC P-256 keys, or RSA 2048 for servers that
read only RSA keys such as Pulsar's, SHA-256 signatures), valid from one hour before ``now``
for one day (or ``days``). Never use them outside tests: the keys are written
unencrypted next to the certificates.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

import attrs


@attrs.frozen
class CertFiles:
    """PEM files written by :func:`make_certs`."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_certs(
    directory: str | Path,
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    client_name: str = "test-client",
    now: datetime.datetime | None = None,
    rsa: bool = False,
    days: int = 1,
) -> CertFiles:
    """Write a CA, a server certificate for ``hosts`` (IP addresses or DNS names) and a client
    certificate (common name ``client_name``), both signed by the CA, into ``directory``
    (keys in PKCS#8 PEM: EC P-256, or RSA 2048 with ``rsa``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric import rsa as rsa_keys
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    start = (now or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(hours=1)
    end = start + datetime.timedelta(days=days)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def new_key() -> ec.EllipticCurvePrivateKey | rsa_keys.RSAPrivateKey:
        if rsa:
            return rsa_keys.generate_private_key(public_exponent=65537, key_size=2048)
        return ec.generate_private_key(ec.SECP256R1())

    def write_key(key: ec.EllipticCurvePrivateKey | rsa_keys.RSAPrivateKey, path: Path) -> Path:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        path.chmod(0o600)
        return path

    def write_cert(cert: x509.Certificate, path: Path) -> Path:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    ca_key = new_key()
    ca_name = name("idempotent test CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign, crl_sign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        common: str, usage: x509.ObjectIdentifier, alt: list[x509.GeneralName]
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey | rsa_keys.RSAPrivateKey]:
        key = new_key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(common))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    alt: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    server, server_key = leaf(hosts[0] if hosts else "server", ExtendedKeyUsageOID.SERVER_AUTH, alt)
    client, client_key = leaf(client_name, ExtendedKeyUsageOID.CLIENT_AUTH, [])
    return CertFiles(
        write_cert(ca, out / "ca.pem"),
        write_cert(server, out / "server.pem"),
        write_key(server_key, out / "server.key"),
        write_cert(client, out / "client.pem"),
        write_key(client_key, out / "client.key"),
    )


__all__ = ["CertFiles", "make_certs"]
