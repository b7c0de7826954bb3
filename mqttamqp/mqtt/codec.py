"""Sans-IO encoder and decoder for MQTT 3.1 ('MQIsdp', level 3), 3.1.1 (level 4)
and 5 (level 5).

This module owns the wire format: turning bytes into the packets of ``packets``
and back, and rejecting every malformed packet with one exception,
``MalformedPacket``, that carries a human-readable reason.  It must not do I/O,
keep time, import Twisted, or make protocol decisions (which packet may come
when, client-id length, topic-filter wildcard placement, CONNACK codes): those
belong to the protocol layer and the core.

Where MQTT 3.1 is vague the normative rules of MQTT 3.1.1 apply.  The decoder's
``protocol_level`` (3 or 4) selects the few rules that differ; a CONNECT packet
(its fixed-header flags included) is always judged by the protocol name it
carries itself.  Topic names, filters and will topics are UTF-8 without U+0000
under every version.

Here: the fixed header and the ``Decoder`` loop (PUBLISH decoded inline), and
the encoders.  The other packets' bodies are decoded in ``bodies`` (3.1, 3.1.1,
and every CONNECT) and ``bodies5`` (MQTT 5), with the field readers of
``fields``.  MQTT 5 (level 5) adds properties (``properties``: the table and its
rules), reason codes on acknowledgements and the AUTH packet; its encoders are
``_encode5``.  ``MalformedPacket.code`` says which reason code a level 5
connection is closed with.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final

from .bodies import BODY_DECODERS, BODY_DECODERS_5
from .fields import QUEUE_NAMESPACES, Buffer, MalformedPacket, long_remaining_length
from .packets import (
    PROTOCOL_5,
    SUBACK_FAILURE,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from .properties import (
    MAX_VARINT,
    NO_PROPERTY_LIMITS,
    PropertyContext,
    PropertyLimits,
    encode_properties,
    encode_varint,
    read_properties,
)

__all__ = [
    "MAX_REMAINING_LENGTH",
    "Decoder",
    "MalformedPacket",
    "PropertyLimits",
    "encode",
    "encode_publish",
    "encode_properties",
    "encode_remaining_length",
    "one_packet",
]

MAX_REMAINING_LENGTH = MAX_VARINT  # four 7-bit groups

_pack_u16 = struct.Struct(">H").pack
_pack_header_u16 = struct.Struct(">BBH").pack  # first byte, 1-byte length, u16
_SUBACK_CODES = frozenset({0, 1, 2, SUBACK_FAILURE})


def one_packet(data: bytes) -> bool:
    """``data`` is exactly one packet by its fixed header: the remaining length (at
    most four bytes) covers the rest of it, no more and no less.  Nothing decoded."""
    size = len(data)
    length = shift = 0
    for i in range(1, min(5, size)):
        byte = data[i]
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return i + 1 + length == size
        shift += 7
    return False


# --------------------------------------------------------------------------
# Fixed-header validation, precomputed for all 256 first bytes so the hot path
# pays one tuple index per packet.


def _header_error(first: int, level: int) -> str | None:
    ptype = first >> 4
    flags = first & 0x0F
    if ptype == 15 and level == 5:
        return f"AUTH reserved flag bits must be 0000, got {flags:04b}" if flags else None
    if ptype == 0 or ptype == 15:
        return f"reserved packet type {ptype}"
    name = PacketType(ptype).name
    if ptype == PacketType.PUBLISH:
        qos = (flags >> 1) & 3
        if qos == 3:
            return "PUBLISH with QoS 3 (both QoS bits set)"
        if qos == 0 and flags & 0x08 and level != 3:
            return "PUBLISH with DUP set and QoS 0"
        return None
    if ptype in (PacketType.PUBREL, PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE):
        # MQTT 3.1 clients sent these as QoS 1 messages and some set DUP on resend.
        if flags == 0b0010 or (level == 3 and flags == 0b1010):
            return None
        return f"{name} reserved flag bits must be 0010, got {flags:04b}"
    if ptype == PacketType.CONNECT:
        # Judged by the CONNECT's own protocol name (``_decode_connect``): MQTT 3.1
        # did not reserve these bits.
        return None
    if flags:
        return f"{name} reserved flag bits must be 0000, got {flags:04b}"
    return None


_HEADER_ERRORS_31 = tuple(_header_error(b, 3) for b in range(256))
_HEADER_ERRORS_311 = tuple(_header_error(b, 4) for b in range(256))
_HEADER_ERRORS_5 = tuple(_header_error(b, 5) for b in range(256))
# Packet types only a server sends: CONNACK, SUBACK, UNSUBACK, PINGRESP.
_SERVER_SENT: Final = frozenset({2, 9, 11, 13})


def _header_errors(level: int) -> tuple[str | None, ...]:
    if level == 3:
        return _HEADER_ERRORS_31
    return _HEADER_ERRORS_5 if level == 5 else _HEADER_ERRORS_311


class Decoder:
    """Incremental decoder: ``feed`` bytes, then take packets until ``None``.

    ``protocol_level`` may be changed between packets (the protocol layer sets it
    once it has accepted a CONNECT); 3 selects MQTT 3.1 rules, anything else the
    MQTT 3.1.1 rules.  ``property_limits`` bounds each MQTT 5 property block (a
    block beyond it raises with 0x97).  After ``MalformedPacket`` the decoder
    keeps failing on the same packet; the connection is expected to be closed.
    """

    __slots__ = ("_buf", "_header_errors", "_level", "_pos", "max_packet_size",
                 "property_limits", "server")

    def __init__(
        self, max_packet_size: int = MAX_REMAINING_LENGTH, protocol_level: int = 4,
        property_limits: PropertyLimits = NO_PROPERTY_LIMITS, server: bool = False,
    ) -> None:
        """``server``: this decoder reads a client, so a packet only servers send is
        refused at its fixed header, before its body is waited for or read (a 1 MB
        SUBACK took 0.1–0.25 s to decode before it was refused)."""
        if max_packet_size < 2:
            raise ValueError(f"max_packet_size must be at least 2, got {max_packet_size}")
        self.max_packet_size = max_packet_size
        self.property_limits = property_limits
        self.server = server
        self._level = protocol_level
        self._header_errors = _header_errors(protocol_level)
        # Unconsumed input is _buf[_pos:].  _buf is an immutable bytes object in the
        # common case (slices of it are bytes, so a payload is copied once) and
        # becomes a bytearray only while a packet much larger than one read
        # accumulates, so that growth stays linear.
        self._buf: Buffer = b""
        self._pos = 0

    @property
    def protocol_level(self) -> int:
        return self._level

    @protocol_level.setter
    def protocol_level(self, level: int) -> None:
        self._level = level
        self._header_errors = _header_errors(level)

    @property
    def buffered(self) -> int:
        """Bytes fed but not yet taken as packets."""
        return len(self._buf) - self._pos

    def feed(self, data: Buffer) -> None:
        """Append received bytes (a ``bytearray`` too: a transport may hand one);
        never decodes or raises."""
        if not data:
            return
        buf = self._buf
        pos = self._pos
        rest = len(buf) - pos
        if rest == 0:
            self._buf = bytes(data)  # no copy when data is already bytes
            self._pos = 0
        elif rest <= len(data):
            # Small leftover (a packet split across reads): one flat copy, bounded
            # by twice this read, keeps the buffer an immutable bytes object.
            self._buf = b"".join((buf[pos:], data))
            self._pos = 0
        else:
            if isinstance(buf, bytes):
                buf = bytearray(memoryview(buf)[pos:])
                self._pos = 0
            elif pos > len(buf) >> 1:
                del buf[:pos]
                self._pos = 0
            buf += data
            self._buf = buf

    def next_packet(self) -> Packet | None:
        """Return the next complete packet, or None if more bytes are needed."""
        buf = self._buf
        pos = self._pos
        n = len(buf)
        if pos >= n:
            if n:
                # All taken: let go of the last read (an idle connection kept its
                # CONNECT, ~55 bytes, until its next packet).
                self._buf = b""
                self._pos = 0
            return None
        first = buf[pos]
        if first == 0x40 and pos + 4 <= n and buf[pos + 1] == 2 \
                and self.max_packet_size >= 4:
            # A whole plain PUBACK (every 3.1.1 one; MQTT 5 with reason 0, no properties):
            # passes every fixed-header check; ``decode_puback``'s lines (per QoS 1 delivery).
            pid = buf[pos + 2] << 8 | buf[pos + 3]
            if pid == 0:
                raise MalformedPacket("PUBACK packet identifier is 0")
            self._pos = pos + 4
            return Puback(pid)
        error = self._header_errors[first]
        if error is not None:
            raise MalformedPacket(error)
        if self.server and first >> 4 in _SERVER_SENT:
            raise MalformedPacket(
                f"a client may not send {PacketType(first >> 4).name}", 0x82)
        if pos + 1 >= n:
            return None
        length = buf[pos + 1]
        if length < 0x80:
            start = pos + 2
        else:
            length, start = long_remaining_length(buf, pos, n)
            if start < 0:
                return None
        end = start + length
        if end - pos > self.max_packet_size:
            raise MalformedPacket(
                f"packet of {end - pos} bytes exceeds maximum packet size {self.max_packet_size}",
                0x95,
            )
        if end > n:
            return None

        packet: Packet
        if first >> 4 == 3:
            if length < 2:
                raise MalformedPacket("PUBLISH too short for a topic length")
            p = start + 2 + (buf[start] << 8 | buf[start + 1])
            if p > end:
                raise MalformedPacket("PUBLISH topic runs past packet end")
            try:
                topic = buf[start + 2:p].decode()   # (UTF-8: unnamed, no codec lookup)
            except UnicodeDecodeError:
                raise MalformedPacket("PUBLISH topic is not valid UTF-8") from None
            if not topic and self._level != 5:   # MQTT 5: a topic alias stands in
                raise MalformedPacket("PUBLISH topic is empty")
            if ("+" in topic or "#" in topic) and not topic.startswith(QUEUE_NAMESPACES):
                raise MalformedPacket(
                    f"PUBLISH topic contains wildcard '{'+' if '+' in topic else '#'}'")
            if "\x00" in topic:
                raise MalformedPacket("PUBLISH topic contains U+0000")
            qos = (first >> 1) & 3
            packet_id: int | None
            if qos:
                if p + 2 > end:
                    raise MalformedPacket("PUBLISH too short for a packet identifier")
                packet_id = buf[p] << 8 | buf[p + 1]
                if packet_id == 0:
                    raise MalformedPacket("PUBLISH packet identifier is 0")
                p += 2
            else:
                packet_id = None
            if self._level == 5:
                props, p = read_properties(buf, p, end, PropertyContext.PUBLISH, "PUBLISH",
                                           self.property_limits)
                packet = Publish(topic, bytes(buf[p:end]), qos, bool(first & 0x01),
                                 bool(first & 0x08), packet_id, props)
            elif first == 0x30 and (start == pos + 2 or buf[start - 1]) \
                    and type(buf) is bytes:
                # QoS 0, no flags, its length in the fewest bytes (a longer form ends
                # in a 0 byte): these bytes are the frame a 3.1/3.1.1 subscriber gets
                # of it (``encode_publish``'s), kept as ``wire``.
                packet = Publish(topic, buf[p:end], 0, False, False, None, None,
                                 buf[pos:end])
            else:
                # (a slice of bytes is bytes: no ``bytes()``; flags compared, no ``bool()``)
                payload = buf[p:end]
                if type(payload) is not bytes:
                    payload = bytes(payload)
                packet = Publish(topic, payload, qos, (first & 0x01) == 0x01,
                                 (first & 0x08) == 0x08, packet_id)
        elif self._level == 5:
            packet = BODY_DECODERS_5[first >> 4](buf, first, start, end, 5,
                                                  self.property_limits)
        else:
            packet = BODY_DECODERS[first >> 4](buf, first, start, end, self._level,
                                                self.property_limits)
        self._pos = end
        return packet

    def take_rest(self) -> bytes:
        """The bytes fed but not taken as packets, removed from the decoder (a
        client that reads past a packet above its maximum size takes them)."""
        rest = bytes(self._buf[self._pos:])
        self._buf = b""
        self._pos = 0
        return rest

    def __iter__(self) -> Iterator[Packet]:
        """Yield packets until more bytes are needed (lazily, so a level change
        made after one packet applies to the next)."""
        while (packet := self.next_packet()) is not None:
            yield packet


# --------------------------------------------------------------------------
# Encoding.  Packets built by our own code are trusted; violations of what the
# wire can carry (lengths, ranges) raise ValueError, never MalformedPacket.

# The remaining length is encoded as MQTT 5's variable byte integers are (1-4 bytes).
encode_remaining_length = encode_varint


def _u16(value: int, what: str) -> bytes:
    if not 0 <= value <= 0xFFFF:
        raise ValueError(f"{what} {value} outside 0..65535")
    return _pack_u16(value)


def _packet_id(value: int, what: str) -> bytes:
    if not 0 < value <= 0xFFFF:
        raise ValueError(f"{what} packet identifier {value} outside 1..65535")
    return _pack_u16(value)


def _string(value: str, what: str) -> bytes:
    return _binary(value.encode("utf-8"), what)


def _binary(value: bytes, what: str) -> bytes:
    if len(value) > 0xFFFF:
        raise ValueError(f"{what} is {len(value)} bytes, longer than 65535")
    return _pack_u16(len(value)) + value


def _frame(first: int, body: bytes) -> bytes:
    return b"".join((bytes((first,)), encode_remaining_length(len(body)), body))


def encode_publish(
    topic: bytes,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    properties: bytes | None = None,
) -> bytes:
    """Encode a PUBLISH from an already UTF-8-encoded topic (the hot path).
    ``properties``: an MQTT 5 property block, already encoded (``encode_properties``);
    None for 3.1/3.1.1."""
    if properties is not None:
        payload = properties + payload
    topic_length = len(topic)
    if topic_length > 0xFFFF:
        raise ValueError(f"PUBLISH topic is {topic_length} bytes, longer than 65535")
    first = 0x30 | (qos << 1) | (0x01 if retain else 0) | (0x08 if dup else 0)
    if qos:
        if qos > 2 or qos < 0:
            raise ValueError(f"PUBLISH QoS {qos} outside 0..2")
        if packet_id is None or not 0 < packet_id <= 0xFFFF:
            raise ValueError(f"PUBLISH QoS {qos} needs a packet identifier in 1..65535")
        tail = _pack_u16(packet_id)
        length = topic_length + len(payload) + 4
    else:
        if packet_id is not None:
            raise ValueError("PUBLISH QoS 0 must not carry a packet identifier")
        tail = b""
        length = topic_length + len(payload) + 2
    if length < 0x80:
        head = _pack_header_u16(first, length, topic_length)
    else:
        head = b"".join(
            (bytes((first,)), encode_remaining_length(length), _pack_u16(topic_length))
        )
    return b"".join((head, topic, tail, payload))


def _encode_connect(packet: Connect) -> bytes:
    flags = 0x02 if packet.clean_session else 0
    parts = [
        _string(packet.protocol_name, "CONNECT protocol name"),
        b"",  # level and flags, filled in below
        _u16(packet.keepalive, "CONNECT keepalive"),
        _string(packet.client_id, "CONNECT client identifier"),
    ]
    flags = _connect_payload(packet, parts, flags, False)
    if not 0 <= packet.protocol_level <= 0xFF:
        raise ValueError(f"CONNECT protocol level {packet.protocol_level} outside 0..255")
    parts[1] = bytes((packet.protocol_level | (0x80 if packet.bridge else 0), flags))
    return _frame(0x10, b"".join(parts))


def _connect_payload(packet: Connect, parts: list[bytes], flags: int, v5: bool) -> int:
    """Append CONNECT's will, user name and password (MQTT 5: the will's properties
    first) to ``parts``; returns the connect flags with theirs set."""
    will = packet.will
    if will is not None:
        if not 0 <= will.qos <= 2:
            raise ValueError(f"CONNECT will QoS {will.qos} outside 0..2")
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
        if v5:
            parts.append(encode_properties(will.properties))
        parts.append(_string(will.topic, "CONNECT will topic"))
        parts.append(_binary(will.payload, "CONNECT will message"))
    if packet.username is not None:
        flags |= 0x80
        parts.append(_string(packet.username, "CONNECT username"))
    if packet.password is not None:
        flags |= 0x40
        parts.append(_binary(packet.password, "CONNECT password"))
    return flags


def _encode_subscribe(packet: Subscribe) -> bytes:
    parts = [_packet_id(packet.packet_id, "SUBSCRIBE")]
    for topic_filter, qos in packet.topics:
        if not 0 <= qos <= 2:
            raise ValueError(f"SUBSCRIBE requested QoS {qos} outside 0..2")
        parts.append(_string(topic_filter, "SUBSCRIBE topic filter"))
        parts.append(bytes((qos,)))
    return _frame(0x82, b"".join(parts))


def _encode_suback(packet: Suback) -> bytes:
    for code in packet.return_codes:
        if code not in _SUBACK_CODES:
            raise ValueError(f"SUBACK return code {code} is invalid")
    return _frame(0x90, _packet_id(packet.packet_id, "SUBACK") + bytes(packet.return_codes))


def _encode_unsubscribe(packet: Unsubscribe) -> bytes:
    parts = [_packet_id(packet.packet_id, "UNSUBSCRIBE")]
    parts.extend(_string(t, "UNSUBSCRIBE topic filter") for t in packet.topics)
    return _frame(0xA2, b"".join(parts))


def _encode5_connect(packet: Connect) -> bytes:
    flags = 0x02 if packet.clean_session else 0
    parts = [
        _string(PROTOCOL_5[0], "CONNECT protocol name"),
        b"",  # level and flags, filled in below
        _u16(packet.keepalive, "CONNECT keepalive"),
        encode_properties(packet.properties),
        _string(packet.client_id, "CONNECT client identifier"),
    ]
    flags = _connect_payload(packet, parts, flags, True)
    parts[1] = bytes((5, flags))
    return _frame(0x10, b"".join(parts))


def _encode5_ack(first: int, packet_id: int, code: int, props: Properties | None,
                 name: str) -> bytes:
    head = _packet_id(packet_id, name)
    if props is None:
        if code == 0:
            return _frame(first, head)
        return _frame(first, head + bytes((code,)))
    return _frame(first, b"".join((head, bytes((code,)), encode_properties(props))))


def _encode5_reason(first: int, code: int, props: Properties | None) -> bytes:
    if props is None:
        return bytes((first, 0)) if code == 0 else bytes((first, 1, code))
    return _frame(first, bytes((code,)) + encode_properties(props))


def _encode5(packet: Packet) -> bytes:
    """MQTT 5 forms of the packets whose layout differs from 3.1.1's."""
    if isinstance(packet, Publish):
        return encode_publish(packet.topic.encode(), packet.payload, packet.qos,
                              packet.retain, packet.dup, packet.packet_id,
                              encode_properties(packet.properties))
    if isinstance(packet, Puback):
        return _encode5_ack(0x40, packet.packet_id, packet.reason_code, packet.properties,
                            "PUBACK")
    if isinstance(packet, Pubrec):
        return _encode5_ack(0x50, packet.packet_id, packet.reason_code, packet.properties,
                            "PUBREC")
    if isinstance(packet, Pubrel):
        return _encode5_ack(0x62, packet.packet_id, packet.reason_code, packet.properties,
                            "PUBREL")
    if isinstance(packet, Pubcomp):
        return _encode5_ack(0x70, packet.packet_id, packet.reason_code, packet.properties,
                            "PUBCOMP")
    if isinstance(packet, Connect):
        return _encode5_connect(packet)
    if isinstance(packet, Connack):
        if not 0 <= packet.return_code <= 0xFF:
            raise ValueError(f"CONNACK reason code {packet.return_code} outside 0..255")
        return _frame(0x20, bytes((0x01 if packet.session_present else 0, packet.return_code))
                      + encode_properties(packet.properties))
    if isinstance(packet, Subscribe):
        parts = [_packet_id(packet.packet_id, "SUBSCRIBE"), encode_properties(packet.properties)]
        options = packet.options or (0,) * len(packet.topics)
        for (topic_filter, qos), option in zip(packet.topics, options, strict=True):
            if not 0 <= qos <= 2:
                raise ValueError(f"SUBSCRIBE requested QoS {qos} outside 0..2")
            parts.append(_string(topic_filter, "SUBSCRIBE topic filter"))
            parts.append(bytes((qos | option,)))
        return _frame(0x82, b"".join(parts))
    if isinstance(packet, Suback):
        return _frame(0x90, b"".join((_packet_id(packet.packet_id, "SUBACK"),
                                      encode_properties(packet.properties),
                                      bytes(packet.return_codes))))
    if isinstance(packet, Unsubscribe):
        parts = [_packet_id(packet.packet_id, "UNSUBSCRIBE"),
                 encode_properties(packet.properties)]
        parts.extend(_string(t, "UNSUBSCRIBE topic filter") for t in packet.topics)
        return _frame(0xA2, b"".join(parts))
    if isinstance(packet, Unsuback):
        return _frame(0xB0, b"".join((_packet_id(packet.packet_id, "UNSUBACK"),
                                      encode_properties(packet.properties),
                                      bytes(packet.reason_codes))))
    if isinstance(packet, Disconnect):
        return _encode5_reason(0xE0, packet.reason_code, packet.properties)
    if isinstance(packet, Auth):
        return _encode5_reason(0xF0, packet.reason_code, packet.properties)
    return encode(packet)   # PINGREQ, PINGRESP: as in 3.1.1


def encode(packet: Packet, level: int = 4) -> bytes:
    """Encode any packet to its wire form; ``level`` 5 selects MQTT 5 layouts (a
    CONNECT is encoded by its own ``protocol_level``)."""
    if level == 5 or (isinstance(packet, Connect) and packet.protocol_level == 5
                      and packet.protocol_name == PROTOCOL_5[0]):
        return _encode5(packet)
    if isinstance(packet, Publish):
        return encode_publish(
            packet.topic.encode(),
            packet.payload,
            packet.qos,
            packet.retain,
            packet.dup,
            packet.packet_id,
        )
    if isinstance(packet, Puback):
        return b"\x40\x02" + _packet_id(packet.packet_id, "PUBACK")
    if isinstance(packet, Pubrec):
        return b"\x50\x02" + _packet_id(packet.packet_id, "PUBREC")
    if isinstance(packet, Pubrel):
        return (b"\x6a\x02" if packet.dup else b"\x62\x02") + _packet_id(
            packet.packet_id, "PUBREL"
        )
    if isinstance(packet, Pubcomp):
        return b"\x70\x02" + _packet_id(packet.packet_id, "PUBCOMP")
    if isinstance(packet, Pingreq):
        return b"\xc0\x00"
    if isinstance(packet, Pingresp):
        return b"\xd0\x00"
    if isinstance(packet, Connect):
        return _encode_connect(packet)
    if isinstance(packet, Connack):
        if not 0 <= packet.return_code <= 0xFF:
            raise ValueError(f"CONNACK return code {packet.return_code} outside 0..255")
        return bytes((0x20, 0x02, 0x01 if packet.session_present else 0, packet.return_code))
    if isinstance(packet, Subscribe):
        return _encode_subscribe(packet)
    if isinstance(packet, Suback):
        return _encode_suback(packet)
    if isinstance(packet, Unsubscribe):
        return _encode_unsubscribe(packet)
    if isinstance(packet, Unsuback):
        return b"\xb0\x02" + _packet_id(packet.packet_id, "UNSUBACK")
    if isinstance(packet, Disconnect):
        return b"\xe0\x00"
    raise TypeError(f"not an MQTT packet: {packet!r}")
