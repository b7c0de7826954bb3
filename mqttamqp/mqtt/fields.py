"""Field readers of the MQTT wire format, shared by every packet body decoder and
the property reader, and the codec's one error, ``MalformedPacket``.

Each reader takes the buffer, a read position and the packet end, and returns the
value with the next position; none reads past ``end``, and every problem is a
``MalformedPacket`` with its reason.  Pure: no I/O, no Twisted, no protocol
decisions (those are ``connection``'s and ``decisions``').
"""

from __future__ import annotations

from mqttamqp.native import mypyc_attr

Buffer = bytes | bytearray


@mypyc_attr(native_class=False)   # (as the other compiled exceptions: an ordinary
class MalformedPacket(Exception):   # class, whose fields pickle; its methods compiled)
    """The peer sent bytes that are not a valid MQTT packet; ``reason`` says why and
    ``code`` is the MQTT 5 reason code to close with (0x81 malformed, 0x82
    protocol error, 0x95 packet too large)."""

    reason: str
    code: int
    in_connect5: bool   # raised by an MQTT 5 CONNECT: the answer is a CONNACK
    limit: str | None   # the ``PropertyLimits`` bound it is beyond (code 0x97)

    def __init__(self, reason: str, code: int = 0x81, limit: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.in_connect5 = False
        self.limit = limit


def read_string(buf: Buffer, p: int, end: int, strict: bool, what: str) -> tuple[str, int]:
    if p + 2 > end:
        raise MalformedPacket(f"{what}: length prefix runs past packet end")
    q = p + 2 + (buf[p] << 8 | buf[p + 1])
    if q > end:
        raise MalformedPacket(f"{what} runs past packet end")
    try:
        s: str | None = buf[p + 2:q].decode("utf-8")
    except UnicodeDecodeError:
        s = None
    if s is None:   # (raised outside the handler: compiled, ``from None`` keeps the context)
        raise MalformedPacket(f"{what} is not valid UTF-8")
    if strict and "\x00" in s:
        raise MalformedPacket(f"{what} contains U+0000")
    return s, q


def read_binary(buf: Buffer, p: int, end: int, what: str) -> tuple[bytes, int]:
    if p + 2 > end:
        raise MalformedPacket(f"{what}: length prefix runs past packet end")
    q = p + 2 + (buf[p] << 8 | buf[p + 1])
    if q > end:
        raise MalformedPacket(f"{what} runs past packet end")
    return bytes(buf[p + 2:q]), q


def read_packet_id(buf: Buffer, p: int, end: int, name: str) -> int:
    if p + 2 > end:
        raise MalformedPacket(f"{name} too short for a packet identifier")
    packet_id = buf[p] << 8 | buf[p + 1]
    if packet_id == 0:
        raise MalformedPacket(f"{name} packet identifier is 0")
    return packet_id


# Durable queue topics (``$queue/``, ``$dlq/``): a wildcard in one is refused by the
# core with a reason (PUBACK 0x90 in MQTT 5), not a malformed packet that closes
# the connection, so that a client learns why its queue publish was not taken.
QUEUE_NAMESPACES = ("$queue/", "$dlq/")


def check_topic_name(topic: str, what: str) -> None:
    if not topic:
        raise MalformedPacket(f"{what} is empty")
    if "+" in topic:
        raise MalformedPacket(f"{what} contains wildcard '+'")
    if "#" in topic:
        raise MalformedPacket(f"{what} contains wildcard '#'")


def check_length(name: str, start: int, end: int, expected: int) -> None:
    if end - start != expected:
        raise MalformedPacket(f"{name} remaining length must be {expected}, got {end - start}")


def long_remaining_length(buf: Buffer, pos: int, n: int) -> tuple[int, int]:
    """Return (remaining length, body start), or (-1, -1) if more bytes are needed."""
    value = 0
    shift = 0
    i = pos + 1
    while i < n:
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7
        if shift == 28:
            raise MalformedPacket("remaining length field longer than 4 bytes")
    return -1, -1


def read_filter(buf: Buffer, p: int, end: int, packet: str) -> tuple[str, int]:
    """A (non-empty) topic filter of SUBSCRIBE or UNSUBSCRIBE, and where it ends."""
    topic_filter, p = read_string(buf, p, end, True, packet + " topic filter")
    if not topic_filter:
        raise MalformedPacket(packet + " topic filter is empty")
    return topic_filter, p


def too_many_filters(limit: int) -> MalformedPacket:
    """One SUBSCRIBE naming more than ``limit`` filters (raised at the first
    filter too many, before it is read: a 100,000-filter SUBSCRIBE held the reactor
    for a second)."""
    return MalformedPacket(f"SUBSCRIBE with more than {limit} topic "
                           "filters (--max-subscribe-filters)", 0x97, "subscribe_filters")
