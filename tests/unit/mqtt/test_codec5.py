"""Tests for the MQTT 5 side of the sans-IO codec: properties, reason codes, AUTH,
round-trips, incremental feeding, garbage, and one test per property rule."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mqtt_strategies import (
    STRATEGIES,
    C,
    any_packet5,
    s,
    u16,
)

from mqttamqp.mqtt.codec import Decoder, MalformedPacket, encode, encode_remaining_length
from mqttamqp.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Properties,
    Puback,
    Publish,
    Subscribe,
)
from mqttamqp.mqtt.properties import (
    PROPERTY_TABLE,
    encode_properties,
    encode_varint,
    read_varint,
)

# --------------------------------------------------------------------------
# helpers


def frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_remaining_length(len(body)) + body


def decode5(data: bytes, max_packet_size: int = 1 << 20) -> Packet:
    decoder = Decoder(max_packet_size=max_packet_size, protocol_level=5)
    decoder.feed(data)
    packet = decoder.next_packet()
    assert packet is not None
    assert decoder.next_packet() is None
    return packet


def refused(data: bytes, max_packet_size: int = 1 << 20) -> MalformedPacket:
    decoder = Decoder(max_packet_size=max_packet_size, protocol_level=5)
    decoder.feed(data)
    with pytest.raises(MalformedPacket) as info:
        decoder.next_packet()
    return info.value


def props_block(*items: bytes) -> bytes:
    body = b"".join(items)
    return encode_varint(len(body)) + body


def prop(identifier: int, value: bytes) -> bytes:
    return encode_varint(identifier) + value


def publish_with(props: bytes, qos: int = 0) -> bytes:
    pid = u16(7) if qos else b""
    return frame(0x30 | qos << 1, s("a/b") + pid + props + b"payload")


# --------------------------------------------------------------------------
# strategies: properties valid for a context, packets with them

# --------------------------------------------------------------------------
# round-trips, feeding, garbage


@pytest.mark.parametrize("kind", sorted(STRATEGIES))
@given(data=st.data())
def test_round_trip(kind: str, data: st.DataObject) -> None:
    """encode then decode gives back the same MQTT 5 packet, properties included."""
    packet = data.draw(STRATEGIES[kind])
    assert decode5(encode(packet, 5)) == packet


@given(packets=st.lists(any_packet5, max_size=6))
def test_byte_at_a_time_feeding(packets: list[Packet]) -> None:
    """A level 5 stream fed one byte at a time yields the same packets."""
    stream = b"".join(encode(p, 5) for p in packets)
    decoder = Decoder(protocol_level=5)
    out: list[Packet] = []
    for i in range(len(stream)):
        decoder.feed(stream[i:i + 1])
        out.extend(decoder)
    assert out == packets


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=600), chunk=st.integers(1, 64))
def test_any_bytes_decode_or_raise_malformed(data: bytes, chunk: int) -> None:
    """Arbitrary bytes at level 5 decode or raise MalformedPacket with a reason code."""
    decoder = Decoder(max_packet_size=1024, protocol_level=5)
    for i in range(0, len(data), chunk):
        decoder.feed(data[i:i + chunk])
        try:
            for _ in range(len(data) + 1):
                if decoder.next_packet() is None:
                    break
            else:
                pytest.fail("decoder did not stop")
        except MalformedPacket as exc:
            assert exc.reason and exc.code in (0x81, 0x82, 0x95)
            return


@given(data=st.data())
def test_garbage_properties_decode_or_raise_malformed(data: st.DataObject) -> None:
    """A PUBLISH or CONNACK whose property block is random bytes decodes or raises."""
    block = data.draw(st.binary(max_size=60))
    kind = data.draw(st.sampled_from(["publish", "connack", "disconnect", "puback"]))
    body = {
        "publish": s("t") + encode_varint(len(block)) + block,
        "connack": b"\x00\x00" + encode_varint(len(block)) + block,
        "disconnect": b"\x00" + encode_varint(len(block)) + block,
        "puback": u16(1) + b"\x00" + encode_varint(len(block)) + block,
    }[kind]
    first = {"publish": 0x30, "connack": 0x20, "disconnect": 0xE0, "puback": 0x40}[kind]
    decoder = Decoder(protocol_level=5)
    decoder.feed(frame(first, body))
    try:
        decoder.next_packet()
    except MalformedPacket as exc:
        assert exc.code in (0x81, 0x82)


@given(data=st.data())
def test_mutated_packets_decode_or_raise_malformed(data: st.DataObject) -> None:
    """Valid level 5 encodings with corrupted bytes decode or raise MalformedPacket."""
    raw = bytearray(encode(data.draw(any_packet5), 5))
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.integers(0, len(raw) - 1))
        raw[where] = data.draw(st.integers(0, 255))
    decoder = Decoder(protocol_level=5)
    decoder.feed(bytes(raw))
    try:
        for _ in range(len(raw) + 1):
            if decoder.next_packet() is None:
                break
    except MalformedPacket as exc:
        assert exc.reason


# --------------------------------------------------------------------------
# variable byte integers


@pytest.mark.parametrize(("n", "raw"), [
    (0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16_383, b"\xff\x7f"),
    (16_384, b"\x80\x80\x01"), (2_097_151, b"\xff\xff\x7f"),
    (2_097_152, b"\x80\x80\x80\x01"), (268_435_455, b"\xff\xff\xff\x7f")])
def test_varint_boundaries(n: int, raw: bytes) -> None:
    """The spec's table of variable byte integer boundaries, both ways."""
    assert encode_varint(n) == raw
    assert read_varint(raw, 0, len(raw), "x") == (n, len(raw))


def test_varint_five_bytes_and_non_minimal_refused() -> None:
    """Five bytes, and a non-minimal encoding, are malformed."""
    with pytest.raises(MalformedPacket, match="longer than 4"):
        read_varint(b"\x80\x80\x80\x80\x01", 0, 5, "x")
    with pytest.raises(MalformedPacket, match="not minimal"):
        read_varint(b"\x80\x00", 0, 2, "x")


# --------------------------------------------------------------------------
# property rules


def test_every_property_has_a_context_and_round_trips_alone() -> None:
    """Each row of the table encodes and decodes in each packet it may appear in."""
    samples = {"byte": 1, "u16": 5, "u32": 70000, "var": 300, "bin": b"\x00\x01",
               "str": "text", "pair": ("k", "v")}
    for spec in PROPERTY_TABLE.values():
        value = samples[spec.kind]
        if spec.field in ("user_properties", "subscription_identifiers"):
            value = (value,)
        props = Properties(**{spec.field: value})
        if C.PUBLISH in spec.contexts:
            packet = Publish("t", b"x", 0, properties=props)
            assert decode5(encode(packet, 5)) == packet


def test_user_properties_keep_order_and_repeats() -> None:
    """User properties come out in the order sent, repeated names included."""
    pairs = (("b", "1"), ("a", "2"), ("b", "3"))
    packet = Publish("t", b"", properties=Properties(user_properties=pairs))
    decoded = decode5(encode(packet, 5))
    assert isinstance(decoded, Publish) and decoded.properties is not None
    assert decoded.properties.user_properties == pairs


@pytest.mark.parametrize(("identifier", "value"), [
    (0x01, b"\x01"), (0x02, b"\x00\x00\x00\x05"), (0x03, s("text/plain")),
    (0x08, s("reply")), (0x09, s(b"id")), (0x23, u16(3))])
def test_duplicate_property_is_protocol_error(identifier: int, value: bytes) -> None:
    """A property other than User Property given twice is a Protocol Error (0x82)."""
    exc = refused(publish_with(props_block(prop(identifier, value), prop(identifier, value))))
    assert exc.code == 0x82 and "more than once" in exc.reason


def test_duplicate_subscription_identifier_in_subscribe_is_protocol_error() -> None:
    """SUBSCRIBE may carry one Subscription Identifier."""
    raw = frame(0x82, u16(1) + props_block(prop(0x0B, b"\x01"), prop(0x0B, b"\x02"))
                + s("a") + b"\x00")
    assert refused(raw).code == 0x82


def test_property_not_allowed_in_packet_is_malformed() -> None:
    """Session Expiry Interval may not appear in a PUBLISH (0x81)."""
    exc = refused(publish_with(props_block(prop(0x11, b"\x00\x00\x00\x01"))))
    assert exc.code == 0x81 and "may not carry" in exc.reason


def test_unknown_property_identifier_is_malformed() -> None:
    """Identifier 0x7F is no property."""
    exc = refused(publish_with(props_block(prop(0x7F, b"\x00"))))
    assert exc.code == 0x81 and "unknown property" in exc.reason


@pytest.mark.parametrize(("identifier", "value"), [
    (0x01, b"\x02"),          # payload format indicator 0 or 1
    (0x08, s("a/+")),         # response topic with a wildcard
    (0x0B, b"\x00"),          # subscription identifier 0
])
def test_property_value_out_of_range_is_protocol_error(identifier: int, value: bytes) -> None:
    """Values the spec calls a Protocol Error are refused with 0x82."""
    assert refused(publish_with(props_block(prop(identifier, value)))).code == 0x82


def test_topic_alias_0_is_topic_alias_invalid() -> None:
    """Topic alias 0 is refused with 0x94 Topic Alias invalid [MQTT-3.3.2-8]."""
    assert refused(publish_with(props_block(prop(0x23, u16(0))))).code == 0x94


@pytest.mark.parametrize(("identifier", "value"), [(0x21, u16(0)), (0x27, b"\x00" * 4),
                                                   (0x17, b"\x02"), (0x19, b"\x05")])
def test_connect_property_values_out_of_range(identifier: int, value: bytes) -> None:
    """Receive Maximum 0, Maximum Packet Size 0, request flags other than 0/1: 0x82."""
    raw = frame(0x10, s("MQTT") + b"\x05\x02\x00\x3c" + props_block(prop(identifier, value))
                + s("c"))
    assert refused(raw).code == 0x82


def test_truncated_property_and_block_past_end_are_malformed() -> None:
    """A property value cut short, and a block longer than the packet: 0x81."""
    assert refused(publish_with(b"\x03" + prop(0x02, b"\x00\x00"))).code == 0x81
    assert refused(frame(0x30, s("a") + b"\x10")).code == 0x81


def test_invalid_utf8_in_string_property_is_malformed() -> None:
    """Content Type that is not UTF-8: 0x81."""
    assert refused(publish_with(props_block(prop(0x03, s(b"\xff"))))).code == 0x81


def test_packet_too_large_code() -> None:
    """A packet over the decoder's maximum carries 0x95."""
    assert refused(publish_with(b"\x00"), max_packet_size=8).code == 0x95


# --------------------------------------------------------------------------
# packet layouts


def test_short_acknowledgements() -> None:
    """PUBACK of length 2 is Success; of length 3 has a reason code and no properties."""
    assert decode5(b"\x40\x02\x00\x05") == Puback(5)
    assert decode5(b"\x40\x03\x00\x05\x10") == Puback(5, 0x10)
    assert encode(Puback(5), 5) == b"\x40\x02\x00\x05"
    assert encode(Puback(5, 0x87), 5) == b"\x40\x03\x00\x05\x87"


@pytest.mark.parametrize("raw", [b"\x40\x03\x00\x05\x05", b"\x62\x03\x00\x05\x10",
                                 b"\xe0\x01\x05", b"\xf0\x01\x01"])
def test_invalid_reason_codes_are_malformed(raw: bytes) -> None:
    """A reason code the packet type does not define is malformed."""
    assert "reason code" in refused(raw).reason


def test_disconnect_and_auth_short_forms() -> None:
    """DISCONNECT and AUTH of length 0 are Normal disconnection / Success."""
    assert decode5(b"\xe0\x00") == Disconnect()
    assert decode5(b"\xf0\x00") == Auth()
    assert encode(Disconnect(0x8E), 5) == b"\xe0\x01\x8e"


def test_auth_is_reserved_below_level_5() -> None:
    """Packet type 15 is AUTH only at level 5."""
    decoder = Decoder(protocol_level=4)
    decoder.feed(b"\xf0\x00")
    with pytest.raises(MalformedPacket, match="reserved packet type 15"):
        decoder.next_packet()


def test_subscribe_options() -> None:
    """No local, retain as published, retain handling travel in ``options``; retain
    handling 3 is a Protocol Error and the reserved bits are malformed."""
    raw = frame(0x82, u16(1) + b"\x00" + s("a/#") + b"\x2d")
    assert decode5(raw) == Subscribe(1, (("a/#", 1),), (0x2C,))
    assert refused(frame(0x82, u16(1) + b"\x00" + s("a") + b"\x30")).code == 0x82
    assert refused(frame(0x82, u16(1) + b"\x00" + s("a") + b"\x40")).code == 0x81


def test_connect5_password_without_username() -> None:
    """MQTT 5 allows a password without a user name (3.1.1 does not)."""
    packet = Connect("MQTT", 5, "c", True, 10, None, None, b"pw")
    assert decode5(encode(packet)) == packet


def test_connect5_decodes_at_any_decoder_level() -> None:
    """A CONNECT is judged by its own protocol level: level 5 properties decode even
    before the decoder is switched."""
    packet = Connect("MQTT", 5, "c", True, 10,
                     properties=Properties(session_expiry_interval=60, receive_maximum=10))
    decoder = Decoder(protocol_level=4)
    decoder.feed(encode(packet))
    assert decoder.next_packet() == packet


def test_encode_properties_absent_is_one_zero_byte() -> None:
    """No properties encode as a zero length."""
    assert encode_properties(None) == b"\x00"
    assert encode(Connack(False, 0), 5) == b"\x20\x03\x00\x00\x00"
