"""Body decoders of the MQTT 5 packets: properties (read by ``properties``), and
the reason codes a receiver may get in each packet (any other is malformed).
``codec.Decoder`` calls these by packet type on a level 5 connection.  Pure, like
the rest of the codec.
"""

from __future__ import annotations

from typing import Any

from .fields import (
    Buffer,
    MalformedPacket,
    check_topic_name,
    read_binary,
    read_filter,
    read_packet_id,
    read_string,
    too_many_filters,
)
from .packets import (
    PROTOCOL_5,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Properties,
    Puback,
    Pubcomp,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)
from .properties import PropertyContext, PropertyLimits, read_properties

_PUBACK_CODES = frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})
_PUBREL_CODES = frozenset({0x00, 0x92})
_SUBACK_CODES_5 = frozenset({0, 1, 2, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2})
_UNSUBACK_CODES = frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91})
_CONNACK_CODES = frozenset({0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88,
                            0x89, 0x8A, 0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C,
                            0x9D, 0x9F})
_DISCONNECT_CODES = frozenset({0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D,
                               0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99,
                               0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2})
_AUTH_CODES = frozenset({0x00, 0x18, 0x19})
_PC = PropertyContext


def _reason(code: int, allowed: frozenset[int], name: str) -> int:
    if code not in allowed:
        raise MalformedPacket(f"{name} reason code {code:#04x} is invalid")
    return code


def _trailing(name: str, p: int, end: int) -> None:
    if p != end:
        raise MalformedPacket(f"{name} has {end - p} trailing bytes after its properties")


def decode5_connect(buf: Buffer, p: int, end: int, limits: PropertyLimits) -> Connect:
    """MQTT 5 CONNECT from its protocol level byte on (section 3.1)."""
    flags = buf[p + 1]
    keepalive = buf[p + 2] << 8 | buf[p + 3]
    p += 4
    if flags & 0x01:
        raise MalformedPacket("CONNECT reserved connect-flag bit 0 is set")
    will_flag = flags & 0x04
    will_qos = (flags >> 3) & 0x03
    will_retain = bool(flags & 0x20)
    if will_flag:
        if will_qos == 3:
            raise MalformedPacket("CONNECT will QoS 3 is invalid")
    elif will_qos or will_retain:
        raise MalformedPacket("CONNECT will QoS/retain set without the will flag")
    props, p = read_properties(buf, p, end, _PC.CONNECT, "CONNECT", limits)
    client_id, p = read_string(buf, p, end, True, "CONNECT client identifier")
    will = None
    if will_flag:
        will_props, p = read_properties(buf, p, end, _PC.WILL, "CONNECT will", limits)
        will_topic, p = read_string(buf, p, end, True, "CONNECT will topic")
        check_topic_name(will_topic, "CONNECT will topic")
        will_payload, p = read_binary(buf, p, end, "CONNECT will message")
        will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = None
    if flags & 0x80:
        username, p = read_string(buf, p, end, True, "CONNECT username")
    password = None
    if flags & 0x40:   # MQTT 5 allows a password without a user name
        password, p = read_binary(buf, p, end, "CONNECT password")
    if p != end:
        raise MalformedPacket(f"CONNECT has {end - p} trailing bytes after the payload")
    return Connect(PROTOCOL_5[0], 5, client_id, bool(flags & 0x02), keepalive, will,
                   username, password, props)


def decode5_connack(buf: Buffer, first: int, start: int, end: int, level: int,
                     limits: PropertyLimits) -> Connack:
    if end - start < 2:
        raise MalformedPacket("CONNACK too short")
    ack_flags = buf[start]
    if ack_flags & 0xFE:
        raise MalformedPacket(f"CONNACK reserved acknowledge flag bits set: {ack_flags:#04x}")
    code = _reason(buf[start + 1], _CONNACK_CODES, "CONNACK")
    props: Properties | None = None
    p = start + 2
    if p < end:
        props, p = read_properties(buf, p, end, _PC.CONNACK, "CONNACK", limits)
    _trailing("CONNACK", p, end)
    return Connack(bool(ack_flags & 0x01), code, props)


def _decode5_ack(name: str, context: PropertyContext, allowed: frozenset[int],
                 buf: Buffer, start: int, end: int, limits: PropertyLimits
                 ) -> tuple[int, int, Properties | None]:
    """Packet id, reason code and properties of PUBACK/PUBREC/PUBREL/PUBCOMP: the
    reason code may be left out when 0, the properties when there are none."""
    packet_id = read_packet_id(buf, start, end, name)
    code = 0
    props = None
    p = start + 2
    if p < end:
        code = _reason(buf[p], allowed, name)
        p += 1
        if p < end:
            props, p = read_properties(buf, p, end, context, name, limits)
    _trailing(name, p, end)
    return packet_id, code, props


def decode5_puback(buf: Buffer, first: int, start: int, end: int, level: int,
                    limits: PropertyLimits) -> Puback:
    return Puback(*_decode5_ack("PUBACK", _PC.PUBACK, _PUBACK_CODES, buf, start, end,
                                limits))


def decode5_pubrec(buf: Buffer, first: int, start: int, end: int, level: int,
                    limits: PropertyLimits) -> Pubrec:
    return Pubrec(*_decode5_ack("PUBREC", _PC.PUBREC, _PUBACK_CODES, buf, start, end,
                                limits))


def decode5_pubrel(buf: Buffer, first: int, start: int, end: int, level: int,
                    limits: PropertyLimits) -> Pubrel:
    pid, code, props = _decode5_ack("PUBREL", _PC.PUBREL, _PUBREL_CODES, buf, start, end,
                                    limits)
    return Pubrel(pid, False, code, props)


def decode5_pubcomp(buf: Buffer, first: int, start: int, end: int, level: int,
                     limits: PropertyLimits) -> Pubcomp:
    return Pubcomp(*_decode5_ack("PUBCOMP", _PC.PUBCOMP, _PUBREL_CODES, buf, start, end,
                                 limits))


def decode5_subscribe(buf: Buffer, first: int, start: int, end: int, level: int,
                       limits: PropertyLimits) -> Subscribe:
    packet_id = read_packet_id(buf, start, end, "SUBSCRIBE")
    props, p = read_properties(buf, start + 2, end, _PC.SUBSCRIBE, "SUBSCRIBE", limits)
    topics: list[tuple[str, int]] = []
    options: list[int] = []
    while p < end:
        if len(topics) >= limits.subscribe_filters:
            raise too_many_filters(limits.subscribe_filters)
        topic_filter, p = read_filter(buf, p, end, "SUBSCRIBE")
        if p >= end:
            raise MalformedPacket("SUBSCRIBE topic filter without subscription options")
        byte = buf[p]
        p += 1
        if byte & 0xC0:
            raise MalformedPacket(
                f"SUBSCRIBE subscription options have reserved bits set: {byte:#04x}")
        if byte & 0x03 == 3:
            raise MalformedPacket("SUBSCRIBE requested QoS 3 is invalid")
        if byte & 0x30 == 0x30:
            raise MalformedPacket("SUBSCRIBE retain handling 3 is invalid", 0x82)
        topics.append((topic_filter, byte & 0x03))
        options.append(byte & 0xFC)
    if not topics:
        raise MalformedPacket("SUBSCRIBE with no topic filters", 0x82)
    return Subscribe(packet_id, tuple(topics), tuple(options), props)


def _decode5_ack_codes(buf: Buffer, start: int, end: int, context: PropertyContext,
                       allowed: Any, name: str, limits: PropertyLimits
                       ) -> tuple[int, tuple[int, ...], Any]:
    """Packet id, reason codes (at least one) and properties of SUBACK / UNSUBACK."""
    packet_id = read_packet_id(buf, start, end, name)
    props, p = read_properties(buf, start + 2, end, context, name, limits)
    codes = tuple(_reason(c, allowed, name) for c in buf[p:end])
    if not codes:
        raise MalformedPacket(f"{name} with no reason codes")
    return packet_id, codes, props


def decode5_suback(buf: Buffer, first: int, start: int, end: int, level: int,
                    limits: PropertyLimits) -> Suback:
    return Suback(*_decode5_ack_codes(buf, start, end, _PC.SUBACK, _SUBACK_CODES_5, "SUBACK",
                                      limits))


def decode5_unsubscribe(buf: Buffer, first: int, start: int, end: int, level: int,
                         limits: PropertyLimits) -> Unsubscribe:
    packet_id = read_packet_id(buf, start, end, "UNSUBSCRIBE")
    props, p = read_properties(buf, start + 2, end, _PC.UNSUBSCRIBE, "UNSUBSCRIBE", limits)
    topics: list[str] = []
    while p < end:
        topic_filter, p = read_filter(buf, p, end, "UNSUBSCRIBE")
        topics.append(topic_filter)
    if not topics:
        raise MalformedPacket("UNSUBSCRIBE with no topic filters", 0x82)
    return Unsubscribe(packet_id, tuple(topics), props)


def decode5_unsuback(buf: Buffer, first: int, start: int, end: int, level: int,
                      limits: PropertyLimits) -> Unsuback:
    return Unsuback(*_decode5_ack_codes(buf, start, end, _PC.UNSUBACK, _UNSUBACK_CODES,
                                        "UNSUBACK", limits))


def _decode5_code_and_props(buf: Buffer, start: int, end: int, allowed: Any,
                            context: PropertyContext, name: str, limits: PropertyLimits
                            ) -> tuple[int, Any]:
    """DISCONNECT / AUTH: a reason code, then optional properties (the caller handles
    the empty body, which means success with none)."""
    code = _reason(buf[start], allowed, name)
    props = None
    p = start + 1
    if p < end:
        props, p = read_properties(buf, p, end, context, name, limits)
    _trailing(name, p, end)
    return code, props


def decode5_disconnect(buf: Buffer, first: int, start: int, end: int, level: int,
                        limits: PropertyLimits) -> Disconnect:
    if start == end:
        return Disconnect()
    return Disconnect(*_decode5_code_and_props(buf, start, end, _DISCONNECT_CODES,
                                               _PC.DISCONNECT, "DISCONNECT", limits))


def decode5_auth(buf: Buffer, first: int, start: int, end: int, level: int,
                  limits: PropertyLimits) -> Auth:
    if start == end:
        return Auth()
    return Auth(*_decode5_code_and_props(buf, start, end, _AUTH_CODES, _PC.AUTH, "AUTH",
                                         limits))
