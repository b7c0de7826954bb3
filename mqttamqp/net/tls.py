"""TLS for the listeners: ``ssl:`` endpoints with TLS 1.2+ and client certificates.

What it owns: turning a listener's endpoint description into the endpoint to
listen on.  For an ``ssl:`` description Twisted parses the key and certificate
files (``privateKey=``, ``certKey=``, ``extraCertChain=``, ``dhParameters=``); the
context factory it built is then replaced by one with the same key and
certificates, TLS 1.2 as the lowest version whatever Twisted's default or an
``sslmethod=`` says, TLS 1.2 limited to AEAD suites with forward secrecy (ECDHE with
AES-GCM or ChaCha20-Poly1305; TLS 1.3's suites are all AEAD and stay OpenSSL's),
and, with ``--tls-ca``, client certificates verified against
that CA bundle (required with ``--tls-require-client-cert``).  It also reads the
common name of a client's verified certificate (``--tls-cert-as-user``).

What it must not do: know any protocol.  The adapters ask ``verified_common_name``
about their transport; whether a common name stands for a user is theirs to say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID
from OpenSSL import crypto
from twisted.internet import endpoints, ssl
from twisted.internet.interfaces import ISSLTransport

__all__ = ["MINIMUM_VERSION", "TLS12_CIPHERS", "TLSSettings", "is_tls", "load_ca_bundle",
           "server_endpoint", "server_options", "verified_common_name"]

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
#: TLS 1.2 cipher suites (an OpenSSL cipher string): ECDHE key exchange with an AEAD
#: cipher only, as Mozilla's "intermediate" configuration. Twisted's default also
#: takes CBC suites (four ECDHE-ECDSA ones with an EC key, two of them with SHA-1),
#: DHE and static RSA. (It does not touch TLS 1.3, whose suites are all AEAD.)
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
_ACCEPTABLE = ssl.AcceptableCiphers.fromOpenSSLCipherString(TLS12_CIPHERS)


@dataclass(frozen=True)
class TLSSettings:
    """Client certificate verification for every ``ssl:`` listener.

    ``ca_file``: PEM bundle of the CAs that sign client certificates (None: no client
    certificate is asked for).  ``require_client_cert``: a TLS client without a valid
    certificate is refused during the handshake.  ``cert_as_user``: a verified
    certificate's common name is the client's user name (MQTT)."""

    ca_file: str | None = None
    require_client_cert: bool = False
    cert_as_user: bool = False


def load_ca_bundle(path: str) -> list[crypto.X509]:
    """The certificates of the PEM file ``path``; ``ValueError`` saying why not."""
    try:
        with open(path, "rb") as f:
            pem = f.read()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise ValueError(f"{path} holds no PEM certificate") from None
    return [crypto.X509.from_cryptography(c) for c in certificates]


def server_options(parsed: Any, settings: TLSSettings | None) -> ssl.CertificateOptions:
    """A context factory with the key and certificates of ``parsed`` (the
    ``CertificateOptions`` Twisted built from an ``ssl:`` description), TLS 1.2+
    with ``TLS12_CIPHERS``, and client certificates per ``settings``."""
    verify: dict[str, Any] = {}
    if settings is not None and settings.ca_file is not None:
        verify = {"verify": True, "caCerts": load_ca_bundle(settings.ca_file),
                  "requireCertificate": settings.require_client_cert}
    return ssl.CertificateOptions(
        privateKey=parsed.privateKey,
        certificate=parsed.certificate,
        extraCertChain=list(parsed.extraCertChain or ()) or None,
        dhParameters=getattr(parsed, "dhParameters", None),
        raiseMinimumTo=MINIMUM_VERSION,
        acceptableCiphers=_ACCEPTABLE,
        **verify)


def server_endpoint(reactor: Any, description: str,
                    settings: TLSSettings | None = None) -> Any:
    """The endpoint (an ``IStreamServerEndpoint``) for ``description``; an ``ssl:``
    one gets ``server_options``."""
    endpoint = endpoints.serverFromString(reactor, description)
    if isinstance(endpoint, endpoints.SSL4ServerEndpoint):
        # Twisted keeps the context factory it parsed here (no public accessor).
        parsed = endpoint._sslContextFactory
        endpoint._sslContextFactory = server_options(parsed, settings)
    return endpoint


def is_tls(description: str) -> bool:
    return description.strip().lower().startswith("ssl:")


def verified_common_name(transport: Any) -> str | None:
    """The common name of the client certificate ``transport`` presented, or None
    (no TLS, no certificate, no common name).  A certificate is only ever asked for
    with ``--tls-ca``, and a handshake with one that does not verify fails, so any
    certificate seen here is verified."""
    if not ISSLTransport.providedBy(transport):
        return None
    try:
        certificate = transport.getPeerCertificate()
    except Exception:  # the handshake is not done, or the connection is gone
        return None
    if certificate is None:
        return None
    names = certificate.to_cryptography().subject.get_attributes_for_oid(
        NameOID.COMMON_NAME)
    if not names:
        return None
    value = names[0].value
    name = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return name or None
