"""Body decoders of the MQTT 3.1 and 3.1.1 packets (and the CONNECT of every
version: its own protocol name picks the rules, and an MQTT 5 one goes on in
``bodies5``).  ``codec.Decoder`` reads the fixed header and calls these by packet
type; PUBLISH, the hot one, it decodes inline.  Pure, like the rest of the codec.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from .bodies5 import (
    decode5_auth,
    decode5_connack,
    decode5_connect,
    decode5_disconnect,
    decode5_puback,
    decode5_pubcomp,
    decode5_pubrec,
    decode5_pubrel,
    decode5_suback,
    decode5_subscribe,
    decode5_unsuback,
    decode5_unsubscribe,
)
from .fields import (
    Buffer,
    MalformedPacket,
    check_length,
    check_topic_name,
    read_binary,
    read_filter,
    read_packet_id,
    read_string,
    too_many_filters,
)
from .packets import (
    PROTOCOL_31,
    PROTOCOL_311,
    SUBACK_FAILURE,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
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
from .properties import PropertyLimits

_KNOWN_PROTOCOLS = frozenset({PROTOCOL_31, PROTOCOL_311})
_SUBACK_CODES = frozenset({0, 1, 2, SUBACK_FAILURE})

_MQISDP_HEADER = b"\x00\x06MQIsdp\x03"  # protocol name and level of MQTT 3.1
_MQTT_NAME = b"\x00\x04MQTT"   # the protocol name of MQTT 3.1.1 and 5, length first


def decode_connect(buf: Buffer, first: int, start: int, end: int, level: int,
                    limits: PropertyLimits) -> Connect:
    # MQTT 3.1 left the fixed-header flags of CONNECT unused; 3.1.1 (and anything
    # that is not 3.1) reserves them as 0000.
    if first & 0x0F and buf[start:start + 9] != _MQISDP_HEADER:
        raise MalformedPacket(f"CONNECT reserved flag bits must be 0000, got {first & 0x0F:04b}")
    if buf[start:start + 6] == _MQTT_NAME and start + 6 <= end:   # (3.1.1, 5: no decode)
        name, p, strict = "MQTT", start + 6, True
    else:
        name, p = read_string(buf, start, end, False, "CONNECT protocol name")
        # The CONNECT's own protocol name picks the rules: only 'MQIsdp' gets 3.1's.
        strict = name != PROTOCOL_31[0]
        if strict and "\x00" in name:
            raise MalformedPacket("CONNECT protocol name contains U+0000")
    if p + 4 > end:
        raise MalformedPacket("CONNECT variable header runs past packet end")
    if buf[p] == 5 and name == "MQTT":   # (PROTOCOL_5, without a tuple)
        try:
            return decode5_connect(buf, p, end, limits)
        except MalformedPacket as exc:
            exc.in_connect5 = True
            raise
    protocol_level = buf[p]
    bridge = protocol_level > 0x7F and (name, protocol_level & 0x7F) in _KNOWN_PROTOCOLS
    if bridge:   # (Mosquitto's bridge flag, try_private: level | 0x80)
        protocol_level &= 0x7F
    flags = buf[p + 1]
    keepalive = buf[p + 2] << 8 | buf[p + 3]
    p += 4
    if strict and flags & 0x01:
        raise MalformedPacket("CONNECT reserved connect-flag bit 0 is set")
    clean_session = (flags & 0x02) != 0
    if (name, protocol_level) not in _KNOWN_PROTOCOLS:
        # The payload layout of an unknown protocol (e.g. MQTT 5's properties) is
        # not ours to parse; the protocol layer must still be able to answer
        # CONNACK 1 (MQTT-3.1.2-2), so return the header without the payload.
        return Connect(name, protocol_level, "", clean_session, keepalive)
    will_flag = flags & 0x04
    will_qos = (flags >> 3) & 0x03
    will_retain = (flags & 0x20) != 0
    password_flag = flags & 0x40
    username_flag = flags & 0x80
    if will_flag:
        if will_qos == 3:
            raise MalformedPacket("CONNECT will QoS 3 is invalid")
    elif strict and (will_qos or will_retain):
        raise MalformedPacket("CONNECT will QoS/retain set without the will flag")
    if strict and password_flag and not username_flag:
        raise MalformedPacket("CONNECT password flag set without the username flag")

    client_id, p = read_string(buf, p, end, strict, "CONNECT client identifier")
    will = None
    if will_flag:
        # Topics are strings of both versions: U+0000 is refused under 3.1 too.
        will_topic, p = read_string(buf, p, end, True, "CONNECT will topic")
        check_topic_name(will_topic, "CONNECT will topic")
        will_payload, p = read_binary(buf, p, end, "CONNECT will message")
        will = Will(will_topic, will_payload, will_qos, will_retain)
    # MQTT 3.1: the remaining length takes precedence over the username and
    # password flags, so a flagged but absent field is simply missing.
    username = None
    if username_flag and (strict or p < end):
        username, p = read_string(buf, p, end, strict, "CONNECT username")
    password = None
    if password_flag and (strict or p < end):
        password, p = read_binary(buf, p, end, "CONNECT password")
    if p != end:
        raise MalformedPacket(f"CONNECT has {end - p} trailing bytes after the payload")
    return Connect(   # (positional: a call without keywords)
        name, protocol_level, client_id, clean_session, keepalive, will, username, password,
        None, bridge,
    )


def decode_connack(buf: Buffer, first: int, start: int, end: int, level: int,
                    limits: PropertyLimits) -> Connack:
    check_length("CONNACK", start, end, 2)
    ack_flags = buf[start]
    if level != 3 and ack_flags & 0xFE:
        raise MalformedPacket(f"CONNACK reserved acknowledge flag bits set: {ack_flags:#04x}")
    return Connack(bool(ack_flags & 0x01), buf[start + 1])


def decode_puback(buf: Buffer, first: int, start: int, end: int, level: int,
                   limits: PropertyLimits) -> Puback:
    check_length("PUBACK", start, end, 2)
    return Puback(read_packet_id(buf, start, end, "PUBACK"))


def decode_pubrec(buf: Buffer, first: int, start: int, end: int, level: int,
                   limits: PropertyLimits) -> Pubrec:
    check_length("PUBREC", start, end, 2)
    return Pubrec(read_packet_id(buf, start, end, "PUBREC"))


def decode_pubrel(buf: Buffer, first: int, start: int, end: int, level: int,
                   limits: PropertyLimits) -> Pubrel:
    check_length("PUBREL", start, end, 2)
    return Pubrel(read_packet_id(buf, start, end, "PUBREL"), bool(first & 0x08))


def decode_pubcomp(buf: Buffer, first: int, start: int, end: int, level: int,
                    limits: PropertyLimits) -> Pubcomp:
    check_length("PUBCOMP", start, end, 2)
    return Pubcomp(read_packet_id(buf, start, end, "PUBCOMP"))


def decode_subscribe(buf: Buffer, first: int, start: int, end: int, level: int,
                      limits: PropertyLimits) -> Subscribe:
    packet_id = read_packet_id(buf, start, end, "SUBSCRIBE")
    topics: list[tuple[str, int]] = []
    p = start + 2
    while p < end:
        if len(topics) >= limits.subscribe_filters:
            raise too_many_filters(limits.subscribe_filters)
        topic_filter, p = read_filter(buf, p, end, "SUBSCRIBE")
        if p >= end:
            raise MalformedPacket("SUBSCRIBE topic filter without a requested QoS byte")
        qos = buf[p]
        p += 1
        if qos & 0xFC:
            raise MalformedPacket(f"SUBSCRIBE requested QoS byte has reserved bits set: {qos:#04x}")
        if qos == 3:
            raise MalformedPacket("SUBSCRIBE requested QoS 3 is invalid")
        topics.append((topic_filter, qos))
    if not topics:
        raise MalformedPacket("SUBSCRIBE with no topic filters")
    return Subscribe(packet_id, tuple(topics))


def decode_suback(buf: Buffer, first: int, start: int, end: int, level: int,
                   limits: PropertyLimits) -> Suback:
    packet_id = read_packet_id(buf, start, end, "SUBACK")
    codes = tuple(buf[start + 2:end])
    if not codes:
        raise MalformedPacket("SUBACK with no return codes")
    if not _SUBACK_CODES.issuperset(codes):
        bad = next(c for c in codes if c not in _SUBACK_CODES)
        raise MalformedPacket(f"SUBACK return code {bad:#04x} is invalid")
    return Suback(packet_id, codes)


def decode_unsubscribe(
    buf: Buffer, first: int, start: int, end: int, level: int,
    limits: PropertyLimits,
) -> Unsubscribe:
    packet_id = read_packet_id(buf, start, end, "UNSUBSCRIBE")
    topics: list[str] = []
    p = start + 2
    while p < end:
        topic_filter, p = read_filter(buf, p, end, "UNSUBSCRIBE")
        topics.append(topic_filter)
    if not topics:
        raise MalformedPacket("UNSUBSCRIBE with no topic filters")
    return Unsubscribe(packet_id, tuple(topics))


def decode_unsuback(buf: Buffer, first: int, start: int, end: int, level: int,
                     limits: PropertyLimits) -> Unsuback:
    check_length("UNSUBACK", start, end, 2)
    return Unsuback(read_packet_id(buf, start, end, "UNSUBACK"))


def decode_pingreq(buf: Buffer, first: int, start: int, end: int, level: int,
                    limits: PropertyLimits) -> Pingreq:
    check_length("PINGREQ", start, end, 0)
    return Pingreq()


def decode_pingresp(buf: Buffer, first: int, start: int, end: int, level: int,
                     limits: PropertyLimits) -> Pingresp:
    check_length("PINGRESP", start, end, 0)
    return Pingresp()


def decode_disconnect(
    buf: Buffer, first: int, start: int, end: int, level: int,
    limits: PropertyLimits,
) -> Disconnect:
    check_length("DISCONNECT", start, end, 0)
    return Disconnect()


def unreachable(buf: Buffer, first: int, start: int, end: int, level: int,
                 limits: PropertyLimits) -> Packet:
    # Types 0, 3 (PUBLISH, inline) and 15 never get here: the header table
    # rejects 0 and 15 before the body is looked at.
    raise AssertionError(f"no body decoder for packet type {first >> 4}")


# A body decoder: (buf, first byte, body start, body end, decoder protocol level,
# the decoder's property limits) -> the packet.
BodyDecoder = Callable[[Buffer, int, int, int, int, PropertyLimits], Packet]


# --------------------------------------------------------------------------
# The body decoders by packet type, for ``codec.Decoder`` (PUBLISH, 3, it decodes
# inline in ``Decoder.next_packet``).

BODY_DECODERS: Final[tuple[BodyDecoder, ...]] = (
    unreachable,
    decode_connect,
    decode_connack,
    unreachable,
    decode_puback,
    decode_pubrec,
    decode_pubrel,
    decode_pubcomp,
    decode_subscribe,
    decode_suback,
    decode_unsubscribe,
    decode_unsuback,
    decode_pingreq,
    decode_pingresp,
    decode_disconnect,
    unreachable,
)

BODY_DECODERS_5: Final[tuple[BodyDecoder, ...]] = (
    unreachable,
    decode_connect,
    decode5_connack,
    unreachable,
    decode5_puback,
    decode5_pubrec,
    decode5_pubrel,
    decode5_pubcomp,
    decode5_subscribe,
    decode5_suback,
    decode5_unsubscribe,
    decode5_unsuback,
    decode_pingreq,
    decode_pingresp,
    decode5_disconnect,
    decode5_auth,
)
