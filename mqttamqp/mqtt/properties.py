"""MQTT 5 properties on the wire: variable byte integers, the property table and
the one exception every wire-format error raises.

This module owns which property may appear in which packet (``PROPERTY_TABLE``),
each property's data type and value range, and the duplicate rule (every
property but User Property, and Subscription Identifier on a PUBLISH sent to a
client, appears at most once: a second is a Protocol Error).  It must not do I/O
or make protocol decisions that need connection state (a topic alias beyond the
negotiated maximum, say): those are the protocol layer's.

Every error carries the reason code the spec asks for: 0x81 Malformed Packet
(wrong type, truncated, a property the packet may not carry), 0x82 Protocol
Error (a duplicate, a value out of range), 0x95 Packet Too Large, 0x97 Quota
Exceeded (a block beyond the receiver's ``PropertyLimits``).

The repeatable properties are the only ones whose number the packet size alone
bounds (a 1 MB PUBLISH holds 150,000 user properties, ~4 µs each to decode
here): ``PropertyLimits`` bounds them per block, and ``read_properties`` stops at
the first one beyond a bound, before decoding it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Any

from .fields import MalformedPacket, read_binary, read_string
from .packets import Properties

__all__ = [
    "MAX_VARINT",
    "MalformedPacket",
    "NO_PROPERTY_LIMITS",
    "PropertyContext",
    "PropertyLimits",
    "PROPERTY_TABLE",
    "encode_properties",
    "encode_varint",
    "read_properties",
    "read_varint",
]

MAX_VARINT = 268_435_455  # four 7-bit groups

_Buffer = bytes | bytearray
_pack_u16 = struct.Struct(">H").pack
_pack_u32 = struct.Struct(">I").pack


@dataclass(frozen=True, slots=True)
class PropertyLimits:
    """What one property block may hold of the repeatable properties: user
    properties (how many, and the UTF-8 bytes of their names and values together)
    and subscription identifiers (a server receives at most one, in SUBSCRIBE).
    A CONNECT's will properties are a block of their own.  Also the other repeated
    part of a packet whose count sets its cost: the topic filters of one SUBSCRIBE
    (any protocol level)."""

    user_properties: int = MAX_VARINT
    user_property_bytes: int = MAX_VARINT
    subscription_identifiers: int = MAX_VARINT
    subscribe_filters: int = MAX_VARINT


NO_PROPERTY_LIMITS = PropertyLimits()   # what the packet size allows


class PropertyContext(IntEnum):
    """Where a property block sits: a packet type, or the will (its own block)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    DISCONNECT = 14
    AUTH = 15
    WILL = 16


# -- variable byte integers ------------------------------------------------------


def read_varint(buf: _Buffer, p: int, end: int, what: str) -> tuple[int, int]:
    """A variable byte integer at ``p``: (value, next position)."""
    value = 0
    shift = 0
    while True:
        if p >= end:
            raise MalformedPacket(f"{what}: variable byte integer runs past packet end")
        b = buf[p]
        p += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if shift and b == 0:
                # Not the minimal encoding (section 1.5.5 uses the fewest bytes).
                raise MalformedPacket(f"{what}: variable byte integer is not minimal")
            return value, p
        shift += 7
        if shift == 28:
            raise MalformedPacket(f"{what}: variable byte integer longer than 4 bytes")


_VARINT_1 = tuple(bytes((i,)) for i in range(128))


def encode_varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _VARINT_1[n]
    if n < 0 or n > MAX_VARINT:
        raise ValueError(f"variable byte integer {n} outside 0..{MAX_VARINT}")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# -- typed readers and writers ------------------------------------------------------

_Reader = Callable[[_Buffer, int, int, str], tuple[Any, int]]
_Writer = Callable[[Any, str], bytes]


def _read_byte(buf: _Buffer, p: int, end: int, what: str) -> tuple[int, int]:
    if p + 1 > end:
        raise MalformedPacket(f"{what} runs past packet end")
    return buf[p], p + 1


def _read_u16(buf: _Buffer, p: int, end: int, what: str) -> tuple[int, int]:
    if p + 2 > end:
        raise MalformedPacket(f"{what} runs past packet end")
    return buf[p] << 8 | buf[p + 1], p + 2


def _read_u32(buf: _Buffer, p: int, end: int, what: str) -> tuple[int, int]:
    if p + 4 > end:
        raise MalformedPacket(f"{what} runs past packet end")
    return int.from_bytes(buf[p:p + 4], "big"), p + 4


def _read_str(buf: _Buffer, p: int, end: int, what: str) -> tuple[str, int]:
    return read_string(buf, p, end, True, what)


def _read_pair(buf: _Buffer, p: int, end: int, what: str) -> tuple[tuple[str, str], int]:
    key, p = _read_str(buf, p, end, what + " name")
    value, p = _read_str(buf, p, end, what + " value")
    return (key, value), p


def _read_var(buf: _Buffer, p: int, end: int, what: str) -> tuple[int, int]:
    return read_varint(buf, p, end, what)


def _w_byte(v: Any, what: str) -> bytes:
    if not 0 <= v <= 0xFF:
        raise ValueError(f"{what} {v} outside 0..255")
    return bytes((v,))


def _w_u16(v: Any, what: str) -> bytes:
    if not 0 <= v <= 0xFFFF:
        raise ValueError(f"{what} {v} outside 0..65535")
    return _pack_u16(v)


def _w_u32(v: Any, what: str) -> bytes:
    if not 0 <= v <= 0xFFFFFFFF:
        raise ValueError(f"{what} {v} outside 0..4294967295")
    return _pack_u32(v)


def _w_bin(v: Any, what: str) -> bytes:
    if len(v) > 0xFFFF:
        raise ValueError(f"{what} is {len(v)} bytes, longer than 65535")
    return _pack_u16(len(v)) + bytes(v)


def _w_str(v: Any, what: str) -> bytes:
    return _w_bin(v.encode("utf-8"), what)


def _w_pair(v: Any, what: str) -> bytes:
    return _w_str(v[0], what) + _w_str(v[1], what)


def _w_var(v: Any, what: str) -> bytes:
    return encode_varint(v)


_TYPES: dict[str, tuple[_Reader, _Writer]] = {
    "byte": (_read_byte, _w_byte),
    "u16": (_read_u16, _w_u16),
    "u32": (_read_u32, _w_u32),
    "var": (_read_var, _w_var),
    "bin": (read_binary, _w_bin),
    "str": (_read_str, _w_str),
    "pair": (_read_pair, _w_pair),
}

_C = PropertyContext
_PUB = frozenset({_C.PUBLISH, _C.WILL})
_ACKS = frozenset({_C.PUBACK, _C.PUBREC, _C.PUBREL, _C.PUBCOMP})
_REASON_STRING = frozenset({_C.CONNACK, *_ACKS, _C.SUBACK, _C.UNSUBACK, _C.DISCONNECT,
                            _C.AUTH})


class PropertySpec:
    """One row of the property table."""

    __slots__ = ("contexts", "field", "identifier", "kind", "name", "reader", "valid",
                 "writer")

    def __init__(self, identifier: int, field: str, kind: str,
                 contexts: frozenset[PropertyContext],
                 valid: Callable[[Any], bool] | None = None) -> None:
        self.identifier = identifier
        self.field = field
        self.name = field.replace("_", " ")
        self.kind = kind
        self.contexts = contexts
        self.reader, self.writer = _TYPES[kind]
        self.valid = valid


def _flag(v: int) -> bool:
    return v in (0, 1)


def _nonzero(v: int) -> bool:
    return v != 0


PROPERTY_TABLE: dict[int, PropertySpec] = {spec.identifier: spec for spec in (
    PropertySpec(0x01, "payload_format_indicator", "byte", _PUB, _flag),
    PropertySpec(0x02, "message_expiry_interval", "u32", _PUB),
    PropertySpec(0x03, "content_type", "str", _PUB),
    PropertySpec(0x08, "response_topic", "str", _PUB,
                 lambda v: bool(v) and "+" not in v and "#" not in v),
    PropertySpec(0x09, "correlation_data", "bin", _PUB),
    PropertySpec(0x0B, "subscription_identifiers", "var",
                 frozenset({_C.PUBLISH, _C.SUBSCRIBE}), _nonzero),
    PropertySpec(0x11, "session_expiry_interval", "u32",
                 frozenset({_C.CONNECT, _C.CONNACK, _C.DISCONNECT})),
    PropertySpec(0x12, "assigned_client_identifier", "str", frozenset({_C.CONNACK})),
    PropertySpec(0x13, "server_keep_alive", "u16", frozenset({_C.CONNACK})),
    PropertySpec(0x15, "authentication_method", "str",
                 frozenset({_C.CONNECT, _C.CONNACK, _C.AUTH})),
    PropertySpec(0x16, "authentication_data", "bin",
                 frozenset({_C.CONNECT, _C.CONNACK, _C.AUTH})),
    PropertySpec(0x17, "request_problem_information", "byte", frozenset({_C.CONNECT}),
                 _flag),
    PropertySpec(0x18, "will_delay_interval", "u32", frozenset({_C.WILL})),
    PropertySpec(0x19, "request_response_information", "byte", frozenset({_C.CONNECT}),
                 _flag),
    PropertySpec(0x1A, "response_information", "str", frozenset({_C.CONNACK})),
    PropertySpec(0x1C, "server_reference", "str",
                 frozenset({_C.CONNACK, _C.DISCONNECT})),
    PropertySpec(0x1F, "reason_string", "str", _REASON_STRING),
    PropertySpec(0x21, "receive_maximum", "u16", frozenset({_C.CONNECT, _C.CONNACK}),
                 _nonzero),
    PropertySpec(0x22, "topic_alias_maximum", "u16", frozenset({_C.CONNECT, _C.CONNACK})),
    PropertySpec(0x23, "topic_alias", "u16", frozenset({_C.PUBLISH}), _nonzero),
    PropertySpec(0x24, "maximum_qos", "byte", frozenset({_C.CONNACK}), _flag),
    PropertySpec(0x25, "retain_available", "byte", frozenset({_C.CONNACK}), _flag),
    PropertySpec(0x26, "user_properties", "pair", frozenset(PropertyContext)),
    PropertySpec(0x27, "maximum_packet_size", "u32", frozenset({_C.CONNECT, _C.CONNACK}),
                 _nonzero),
    PropertySpec(0x28, "wildcard_subscription_available", "byte",
                 frozenset({_C.CONNACK}), _flag),
    PropertySpec(0x29, "subscription_identifier_available", "byte",
                 frozenset({_C.CONNACK}), _flag),
    PropertySpec(0x2A, "shared_subscription_available", "byte",
                 frozenset({_C.CONNACK}), _flag),
)}

_BY_FIELD = {spec.field: spec for spec in PROPERTY_TABLE.values()}
_USER_PROPERTY = _BY_FIELD["user_properties"].identifier
_TOPIC_ALIAS = _BY_FIELD["topic_alias"].identifier
_REPEATABLE = frozenset({"user_properties", "subscription_identifiers"})
_FIELD_ORDER = tuple(f.name for f in fields(Properties))
assert set(_FIELD_ORDER) == set(_BY_FIELD), "Properties and PROPERTY_TABLE disagree"


def read_properties(buf: _Buffer, p: int, end: int, context: PropertyContext,
                    what: str, limits: PropertyLimits = NO_PROPERTY_LIMITS
                    ) -> tuple[Properties | None, int]:
    """The property block (length prefix first) at ``p``: (properties, next position).
    An empty block is None, so packets without properties compare equal to 3.1.1's
    defaults.  A block beyond ``limits`` raises 0x97: at the user property one too
    many before it is decoded, at the one whose bytes cross the bound after."""
    length, p = read_varint(buf, p, end, what + " property length")
    stop = p + length
    if stop > end:
        raise MalformedPacket(f"{what} properties run past packet end")
    if length == 0:
        return None, p
    values: dict[str, Any] = {}
    pairs: list[tuple[str, str]] = []
    pair_bytes = 0
    sub_ids: list[int] = []
    while p < stop:
        identifier, p = read_varint(buf, p, stop, what + " property identifier")
        spec = PROPERTY_TABLE.get(identifier)
        if spec is None:
            raise MalformedPacket(f"{what} has unknown property identifier {identifier:#04x}")
        if context not in spec.contexts:
            raise MalformedPacket(f"{what} may not carry property {spec.name!r}")
        label = f"{what} property {spec.name!r}"
        if identifier == _USER_PROPERTY and len(pairs) >= limits.user_properties:
            raise MalformedPacket(
                f"{what} has more than {limits.user_properties} user properties",
                0x97, "user_properties")
        start = p
        value, p = spec.reader(buf, p, stop, label)
        if spec.valid is not None and not spec.valid(value):
            # (topic alias 0: Topic Alias invalid, 0x94 [MQTT-3.3.2-8]; the rest 0x82)
            raise MalformedPacket(f"{label} has an invalid value {value!r}",
                                  0x94 if identifier == _TOPIC_ALIAS else 0x82)
        if spec.field == "user_properties":
            pair_bytes += p - start - 4     # (less the two length prefixes)
            if pair_bytes > limits.user_property_bytes:
                raise MalformedPacket(
                    f"{what} user properties hold more than {limits.user_property_bytes} "
                    "bytes of names and values", 0x97, "user_property_bytes")
            pairs.append(value)
        elif spec.field == "subscription_identifiers":
            if sub_ids and context is not PropertyContext.PUBLISH:
                raise MalformedPacket(f"{label} appears more than once", 0x82)
            most = limits.subscription_identifiers
            if len(sub_ids) >= most:
                raise MalformedPacket(f"{label} appears more than "
                                      f"{'once' if most == 1 else f'{most} times'}", 0x82)
            sub_ids.append(value)
        elif spec.field in values:
            raise MalformedPacket(f"{label} appears more than once", 0x82)
        else:
            values[spec.field] = value
    if pairs:
        values["user_properties"] = tuple(pairs)
    if sub_ids:
        values["subscription_identifiers"] = tuple(sub_ids)
    return Properties(**values), p


_EMPTY_BLOCK = b"\x00"


def encode_properties(props: Properties | None) -> bytes:
    """The wire form of ``props`` with its length prefix (b"\\x00" when absent).
    Properties go out in the table's order, user properties in theirs."""
    if props is None:
        return _EMPTY_BLOCK
    parts: list[bytes] = []
    for name in _FIELD_ORDER:
        value = getattr(props, name)
        if value is None or (name in _REPEATABLE and not value):
            continue
        spec = _BY_FIELD[name]
        head = encode_varint(spec.identifier)
        items = value if name in _REPEATABLE else (value,)
        for item in items:
            parts.append(head)
            parts.append(spec.writer(item, spec.name))
    body = b"".join(parts)
    return encode_varint(len(body)) + body
