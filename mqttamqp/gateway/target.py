"""What ``--upstream`` names: the core a gateway speaks the MQTT-over-AMQP contract to.

What it owns: parsing ``amqp://[user[:password]@]host[:port]`` and ``amqps://...``
(default ports 5672 and 5671; ``?server-name=NAME`` checks the core's TLS certificate
against NAME instead of the host; ``?ca=FILE`` trusts FILE's CAs instead of the
platform's) into an ``Upstream`` value, and the TLS client options that check the
core's certificate with service-identity, as the bridges do for ``mqtts://``.

What it must not do: connect (``pool``), or log the password (``Upstream.display``
leaves it out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["Upstream", "parse_upstream", "tls_options"]

_PORTS = {"amqp": 5672, "amqps": 5671}


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where the core is and how to reach it."""

    host: str
    port: int
    tls: bool
    username: str | None = None
    password: str | None = None
    server_name: str | None = None   # the name its TLS certificate must carry
    ca_file: str | None = None       # PEM CAs trusted for it (None: the platform's)

    @property
    def display(self) -> str:
        """For log lines: scheme, user, host and port, never the password."""
        user = f"{self.username}@" if self.username else ""
        return f"{'amqps' if self.tls else 'amqp'}://{user}{self.host}:{self.port}"


def parse_upstream(url: str) -> Upstream:
    """``url`` as an ``Upstream``, or ``ValueError`` saying what is wrong with it."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"--upstream {url!r} is not a URL: {e}") from None
    scheme = parts.scheme.lower()
    if scheme not in _PORTS:
        raise ValueError(f"--upstream must be amqp://HOST[:PORT] or amqps://HOST[:PORT], "
                         f"got {url!r}")
    if not parts.hostname:
        raise ValueError(f"--upstream {url!r} names no host")
    if parts.path not in ("", "/"):
        raise ValueError(f"--upstream {url!r}: a path means nothing here")
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = set(query) - {"server-name", "ca"}
    if unknown:
        raise ValueError(f"--upstream {url!r}: unknown parameter "
                         f"{', '.join(sorted(unknown))} (known: server-name, ca)")
    if scheme == "amqp" and query:
        raise ValueError(f"--upstream {url!r}: server-name and ca are for amqps:// only")

    def one(name: str) -> str | None:
        values = query.get(name)
        if not values:
            return None
        if len(values) > 1 or not values[0]:
            raise ValueError(f"--upstream {url!r}: give {name} once, with a value")
        return values[0]

    return Upstream(parts.hostname, port if port is not None else _PORTS[scheme],
                    scheme == "amqps",
                    unquote(parts.username) if parts.username else None,
                    unquote(parts.password) if parts.password is not None else None,
                    one("server-name"), one("ca"))


def tls_options(upstream: Upstream) -> Any:
    """TLS toward an amqps:// core: its certificate checked against ``ca`` (else the
    platform's CAs) and its name (``server-name``, else the host) through
    service-identity (Twisted's ``optionsForClientTLS``)."""
    from twisted.internet import ssl

    from mqttamqp.net.tls import load_ca_bundle

    roots: Any = (ssl.trustRootFromCertificates(
        [ssl.Certificate(c) for c in load_ca_bundle(upstream.ca_file)])
        if upstream.ca_file is not None else ssl.platformTrust())
    return ssl.optionsForClientTLS(upstream.server_name or upstream.host, trustRoot=roots)
