"""What the AMQP 0.9.1 handshake decides, as pure functions.

What it owns: which protocol an 8-byte header asks for (``sniff``), the
``connection.start`` the broker sends (its product, version and the capabilities
RabbitMQ announces that clients look at), reading the client's credentials from
``connection.start-ok`` (PLAIN, AMQPLAIN, EXTERNAL), and the tune values both
sides end with (``negotiate``).

What it must not do: check passwords (the broker's gate does), touch sockets or
clocks.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pamqp import commands, decode

from mqttamqp import __version__

__all__ = [
    "HEADER_091", "HEADER_10", "HEADER_10_SASL", "Protocol", "sniff", "start_method",
    "Credentials091", "read_credentials", "negotiate", "CAPABILITIES",
]

HEADER_091 = b"AMQP\x00\x00\x09\x01"
HEADER_10 = b"AMQP\x00\x01\x00\x00"
HEADER_10_SASL = b"AMQP\x03\x01\x00\x00"


class Protocol:
    """What the header sniff decided (strings: cheap to compare, easy to log)."""

    AMQP091 = "amqp0-9-1"
    AMQP10 = "amqp1.0"
    UNKNOWN = "unknown"


def sniff(data: bytes) -> str | None:
    """The protocol the first bytes of a connection ask for; None while fewer than
    8 bytes have come and they may still be an AMQP header."""
    if len(data) < 8:
        return None if b"AMQP".startswith(data[:4]) else Protocol.UNKNOWN
    header = data[:8]
    if header == HEADER_091:
        return Protocol.AMQP091
    if header == HEADER_10 or header == HEADER_10_SASL:
        return Protocol.AMQP10
    return Protocol.UNKNOWN


# The capabilities RabbitMQ announces that clients look at (some refuse to open a
# channel without publisher_confirms).
CAPABILITIES = {
    "publisher_confirms": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "exchange_exchange_bindings": True,
    "connection.blocked": True,
    "per_consumer_qos": True,
    "authentication_failure_close": True,
}


def start_method(mechanisms: list[str]) -> commands.Connection.Start:
    return commands.Connection.Start(
        version_major=0, version_minor=9,
        server_properties={
            "product": "mqttamqp", "version": __version__,
            "platform": "Python/Twisted",
            "information": "MQTT, AMQP 1.0 and AMQP 0.9.1 broker",
            "capabilities": dict(CAPABILITIES),
        },
        mechanisms=" ".join(mechanisms), locales="en_US")


@dataclass(frozen=True, slots=True)
class Credentials091:
    """What ``connection.start-ok`` said: the mechanism and, for PLAIN and
    AMQPLAIN, a user name and password (EXTERNAL: the authorization identity,
    if any)."""

    mechanism: str
    username: str | None
    password: bytes | None


class CredentialsError(ValueError):
    pass


def _raw(response: str | bytes) -> bytes:
    return response.encode("utf-8", "surrogateescape") if isinstance(response, str) \
        else bytes(response)


def read_credentials(mechanism: str, response: str | bytes,
                     offered: list[str]) -> Credentials091:
    """The credentials of ``start-ok``; ``CredentialsError`` says why they cannot be
    read (an unoffered mechanism, a malformed response)."""
    if mechanism not in offered:
        raise CredentialsError(f"mechanism {mechanism!r} was not offered")
    raw = _raw(response)
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            raise CredentialsError("PLAIN response is not authzid NUL user NUL password")
        return Credentials091(mechanism, _text(parts[1]), parts[2])
    if mechanism == "AMQPLAIN":
        # A field table without its length prefix: LOGIN and PASSWORD.
        try:
            _, table = decode.field_table(struct.pack(">I", len(raw)) + raw)
        except (ValueError, struct.error, TypeError) as exc:
            raise CredentialsError(f"AMQPLAIN response is not a table: {exc}") from None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if not isinstance(login, (str, bytes)) or not isinstance(password, (str, bytes)):
            raise CredentialsError("AMQPLAIN response lacks LOGIN or PASSWORD")
        return Credentials091(mechanism, _text(_raw(login)), _raw(password))
    if mechanism == "EXTERNAL":
        return Credentials091(mechanism, _text(raw) or None, None)
    raise CredentialsError(f"mechanism {mechanism!r} is not supported")


def _text(value: bytes) -> str:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        raise CredentialsError("user name is not UTF-8") from None
    return text


def negotiate(ours: int, theirs: int) -> int:
    """A tune value both sides keep: the smaller, where 0 means "no limit"."""
    if ours == 0:
        return theirs
    if theirs == 0:
        return ours
    return min(ours, theirs)
