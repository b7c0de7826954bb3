"""A small PKI for the TLS tests, made at run time: a CA, a server certificate for
localhost and 127.0.0.1, a client certificate it signed (CN alice) and one from another
CA (CN mallory), as PEM files (``make_pki``)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def issue(subject: str, key: ec.EllipticCurvePrivateKey,
           issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None, *, ca: bool = False,
           san: list[x509.GeneralName] | None = None,
           usage: list[x509.ObjectIdentifier] | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (name(subject), key)
    builder = (x509.CertificateBuilder()
               .subject_name(name(subject)).issuer_name(issuer_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                              critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   issuer_key.public_key()), critical=False))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True,
            crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@dataclass
class Pki:
    """The PKI's files: paths of PEM certificates and keys."""

    ca: str                    # the CA certificate (PEM): trusted by clients and --tls-ca
    server_key: str
    server_crt: str
    alice: tuple[str, str]     # (certificate, key) of a client signed by the CA, CN alice
    mallory: tuple[str, str]   # a client certificate from another CA, CN mallory

    def ssl(self, port: int = 0) -> str:
        return (f"ssl:{port}:privateKey={self.server_key}:certKey={self.server_crt}"
                ":interface=127.0.0.1")


def write(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return path


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def crt_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_pki(d: str) -> Pki:
    """Every certificate and key of the PKI, written in directory ``d``."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = issue("mqttamqp test CA", ca_key, None, ca=True)
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = issue("another CA", other_key, None, ca=True)

    def leaf(name: str, cn: str, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey],
             **kw: Any) -> tuple[str, str]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = issue(cn, key, issuer, **kw)
        return (write(os.path.join(d, f"{name}.crt"), crt_pem(cert)),
                write(os.path.join(d, f"{name}.key"), key_pem(key)))

    server_crt, server_key = leaf(
        "server", "localhost", (ca.subject, ca_key),
        san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        usage=[ExtendedKeyUsageOID.SERVER_AUTH])
    client = [ExtendedKeyUsageOID.CLIENT_AUTH]
    return Pki(ca=write(os.path.join(d, "ca.crt"), crt_pem(ca)),
               server_key=server_key, server_crt=server_crt,
               alice=leaf("alice", "alice", (ca.subject, ca_key), usage=client),
               mallory=leaf("mallory", "mallory", (other.subject, other_key), usage=client))
