"""Tests for the sans-IO MQTT codec: round-trips, incremental feeding, fuzzing and
one test per validation rule."""

from __future__ import annotations

import functools
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mqtt_strategies import packet_ids, s, small_binary, texts, topic_filters, topic_names, u16

from mqttamqp.mqtt.codec import (
    MAX_REMAINING_LENGTH,
    Decoder,
    MalformedPacket,
    encode,
    encode_publish,
    encode_remaining_length,
    one_packet,
)
from mqttamqp.mqtt.packets import (
    SUBACK_FAILURE,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)

LEVELS = (3, 4)

# --------------------------------------------------------------------------
# helpers


def frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_remaining_length(len(body)) + body


def decode_one(data: bytes, level: int = 4, max_packet_size: int = MAX_REMAINING_LENGTH) -> Packet:
    decoder = Decoder(max_packet_size=max_packet_size, protocol_level=level)
    decoder.feed(data)
    packet = decoder.next_packet()
    assert packet is not None
    assert decoder.next_packet() is None
    return packet


def malformed(data: bytes, level: int = 4, max_packet_size: int = MAX_REMAINING_LENGTH) -> str:
    decoder = Decoder(max_packet_size=max_packet_size, protocol_level=level)
    decoder.feed(data)
    with pytest.raises(MalformedPacket) as info:
        decoder.next_packet()
    assert info.value.reason == str(info.value)
    return info.value.reason


def connect_bytes(
    name: str = "MQTT",
    level: int = 4,
    flags: int = 0x02,
    keepalive: int = 60,
    payload: bytes | None = None,
) -> bytes:
    if payload is None:
        payload = s("client")
    return frame(0x10, s(name) + bytes((level, flags)) + u16(keepalive) + payload)


# --------------------------------------------------------------------------
# hypothesis strategies for packets with valid fields at a given level


def connects(level: int) -> st.SearchStrategy[Connect]:
    wills = st.none() | st.builds(
        Will, topic_names(level), small_binary, st.integers(0, 2), st.booleans()
    )
    name, protocol_level = ("MQIsdp", 3) if level == 3 else ("MQTT", 4)

    def build(
        client_id: str,
        clean: bool,
        keepalive: int,
        will: Will | None,
        username: str | None,
        password: bytes | None,
    ) -> Connect:
        if level == 4 and username is None:
            password = None  # 3.1.1 forbids a password without a username
        return Connect(name, protocol_level, client_id, clean, keepalive, will, username, password)

    return st.builds(
        build,
        texts(level),
        st.booleans(),
        st.integers(0, 0xFFFF),
        wills,
        st.none() | texts(level),
        st.none() | small_binary,
    )


def publishes(level: int) -> st.SearchStrategy[Publish]:
    def build(topic: str, payload: bytes, qos: int, retain: bool, dup: bool, pid: int) -> Publish:
        if qos == 0 and level == 4:
            dup = False
        return Publish(topic, payload, qos, retain, dup, pid if qos else None)

    return st.builds(
        build,
        topic_names(level),
        st.binary(max_size=300),
        st.integers(0, 2),
        st.booleans(),
        st.booleans(),
        packet_ids,
    )


# (built once per kind and level: the properties draw from them in every example, and
# building the 14 strategies again for each draw was most of their run time)
@functools.cache
def strategy_for(kind: str, level: int) -> st.SearchStrategy[Packet]:
    strategies: dict[str, st.SearchStrategy[Packet]] = {
        "connect": connects(level),
        "connack": st.builds(Connack, st.booleans(), st.integers(0, 5)),
        "publish": publishes(level),
        "puback": st.builds(Puback, packet_ids),
        "pubrec": st.builds(Pubrec, packet_ids),
        "pubrel": st.builds(Pubrel, packet_ids, st.booleans() if level == 3 else st.just(False)),
        "pubcomp": st.builds(Pubcomp, packet_ids),
        "subscribe": st.builds(
            Subscribe,
            packet_ids,
            st.lists(st.tuples(topic_filters(level), st.integers(0, 2)), min_size=1, max_size=5)
            .map(tuple),
        ),
        "suback": st.builds(
            Suback,
            packet_ids,
            st.lists(st.sampled_from([0, 1, 2, SUBACK_FAILURE]), min_size=1, max_size=5).map(tuple),
        ),
        "unsubscribe": st.builds(
            Unsubscribe,
            packet_ids,
            st.lists(topic_filters(level), min_size=1, max_size=5).map(tuple),
        ),
        "unsuback": st.builds(Unsuback, packet_ids),
        "pingreq": st.just(Pingreq()),
        "pingresp": st.just(Pingresp()),
        "disconnect": st.just(Disconnect()),
    }
    return strategies[kind]


KINDS = (
    "connect", "connack", "publish", "puback", "pubrec", "pubrel", "pubcomp", "subscribe",
    "suback", "unsubscribe", "unsuback", "pingreq", "pingresp", "disconnect",
)


@functools.cache
def any_packet(level: int) -> st.SearchStrategy[Packet]:
    return st.one_of([strategy_for(kind, level) for kind in KINDS])


# --------------------------------------------------------------------------
# round-trips and incremental feeding


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_round_trip(kind: str, level: int, data: st.DataObject) -> None:
    """encode then decode gives back the same packet, for every type at both levels."""
    packet = data.draw(strategy_for(kind, level))
    assert decode_one(encode(packet), level) == packet


@pytest.mark.parametrize("level", LEVELS)
@given(data=st.data())
def test_one_packet_says_whether_bytes_are_exactly_one_packet(level: int,
                                                              data: st.DataObject) -> None:
    """``one_packet`` is true for exactly one whole packet (any remaining length), false
    for two packets, a packet cut short, or one with bytes after it."""
    first = encode(data.draw(any_packet(level)))
    second = encode(data.draw(any_packet(level)))
    assert one_packet(first)
    assert not one_packet(first + second)
    assert not one_packet(first[:-1])
    assert not one_packet(first + b"\x00")
    assert not one_packet(first[:1])


def test_one_packet_with_a_four_byte_remaining_length() -> None:
    """A PUBLISH whose remaining length takes three bytes is one packet; a fifth length
    byte (malformed) is not."""
    frame = encode_publish(b"t", b"x" * 20_000, 0, False, False, None)
    assert frame[2] & 0x80 and not frame[3] & 0x80 and one_packet(frame)
    assert not one_packet(b"\x30\xff\xff\xff\xff\x01")


@pytest.mark.parametrize("level", LEVELS)
@given(data=st.data())
def test_byte_at_a_time_feeding(level: int, data: st.DataObject) -> None:
    """Feeding a stream one byte at a time yields the same packets as one feed."""
    packets = data.draw(st.lists(any_packet(level), max_size=8))
    stream = b"".join(encode(p) for p in packets)
    decoder = Decoder(protocol_level=level)
    out: list[Packet] = []
    for i in range(len(stream)):
        decoder.feed(stream[i:i + 1])
        out.extend(decoder)
    assert out == packets


@pytest.mark.parametrize("level", LEVELS)
@given(data=st.data())
def test_random_chunk_sizes(level: int, data: st.DataObject) -> None:
    """A stream of many packets fed in random chunk sizes decodes completely, in order."""
    packets = data.draw(st.lists(any_packet(level), min_size=1, max_size=60))
    stream = b"".join(encode(p) for p in packets)
    decoder = Decoder(protocol_level=level)
    out: list[Packet] = []
    i = 0
    while i < len(stream):
        size = data.draw(st.integers(1, 300))
        decoder.feed(stream[i:i + size])
        i += size
        out.extend(decoder)
    assert out == packets
    assert decoder.next_packet() is None


def test_large_packet_in_small_chunks() -> None:
    """A 1 MiB PUBLISH arriving in 1000-byte reads, followed by more packets, decodes."""
    big = Publish("big/one", bytes(range(256)) * 4096, 1, False, False, 9)
    stream = encode(big) + encode(Puback(9)) + encode(Pingreq())
    decoder = Decoder()
    out: list[Packet] = []
    for i in range(0, len(stream), 1000):
        decoder.feed(stream[i:i + 1000])
        out.extend(decoder)
    assert out == [big, Puback(9), Pingreq()]


def test_decoder_lets_go_of_a_read_once_all_of_it_is_taken() -> None:
    """An idle connection's decoder holds no copy of its last read (its CONNECT)."""
    decoder = Decoder()
    decoder.feed(encode(Connect("MQTT", 4, "idle-1", True, 600)) + encode(Pingreq()))
    assert list(decoder) == [Connect("MQTT", 4, "idle-1", True, 600), Pingreq()]
    assert decoder._buf == b"" and decoder.buffered == 0
    decoder.feed(encode(Pingreq()))
    assert list(decoder) == [Pingreq()]


def test_feed_empty_read() -> None:
    """An empty read changes nothing, before, between and after packets."""
    decoder = Decoder()
    decoder.feed(b"")
    assert decoder.next_packet() is None
    decoder.feed(encode(Publish("a", b"xyz"))[:3])
    decoder.feed(b"")
    decoder.feed(encode(Publish("a", b"xyz"))[3:])
    decoder.feed(b"")
    assert list(decoder) == [Publish("a", b"xyz")]


def test_iter_applies_level_change_between_packets() -> None:
    """A protocol_level set after one packet governs the next one from the same feed."""
    stream = connect_bytes() + frame(0x38, s("a/b") + b"payload")  # DUP with QoS 0
    decoder = Decoder(protocol_level=4)
    decoder.feed(stream)
    packets = iter(decoder)
    assert isinstance(next(packets), Connect)
    decoder.protocol_level = 3
    assert next(packets) == Publish("a/b", b"payload", 0, False, True, None)


@pytest.mark.parametrize("level", LEVELS)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=600), chunk=st.integers(1, 64))
def test_any_bytes_decode_or_raise_malformed(level: int, data: bytes, chunk: int) -> None:
    """Arbitrary bytes either decode to packets or raise MalformedPacket, nothing else."""
    decoder = Decoder(max_packet_size=1024, protocol_level=level)
    for i in range(0, len(data), chunk):
        decoder.feed(data[i:i + chunk])
        try:
            for _ in range(len(data) + 1):  # every packet consumes >= 2 bytes
                if decoder.next_packet() is None:
                    break
            else:
                pytest.fail("decoder did not stop")
        except MalformedPacket as exc:
            assert exc.reason
            return


@pytest.mark.parametrize("level", LEVELS)
@given(data=st.data())
def test_mutated_packets_decode_or_raise_malformed(level: int, data: st.DataObject) -> None:
    """Valid encodings with corrupted, dropped or added bytes decode or raise MalformedPacket."""
    raw = bytearray(encode(data.draw(any_packet(level))))
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "drop", "insert"]))
        where = data.draw(st.integers(0, len(raw)))
        if action == "flip" and where < len(raw):
            raw[where] = data.draw(st.integers(0, 255))
        elif action == "drop" and where < len(raw):
            del raw[where]
        else:
            raw.insert(where, data.draw(st.integers(0, 255)))
    decoder = Decoder(protocol_level=level)
    decoder.feed(bytes(raw))
    try:
        for _ in range(len(raw) + 1):
            if decoder.next_packet() is None:
                break
    except MalformedPacket as exc:
        assert exc.reason


# --------------------------------------------------------------------------
# remaining length and maximum packet size


@pytest.mark.parametrize(
    ("n", "encoded"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16_383, b"\xff\x7f"),
        (16_384, b"\x80\x80\x01"),
        (2_097_151, b"\xff\xff\x7f"),
        (2_097_152, b"\x80\x80\x80\x01"),
        (268_435_455, b"\xff\xff\xff\x7f"),
    ],
)
def test_remaining_length_boundaries(n: int, encoded: bytes) -> None:
    """Remaining length encodes to the spec's 1-4 byte forms at every boundary."""
    assert encode_remaining_length(n) == encoded


@pytest.mark.parametrize("n", [-1, MAX_REMAINING_LENGTH + 1])
def test_remaining_length_out_of_range(n: int) -> None:
    """Remaining lengths outside 0..268435455 cannot be encoded."""
    with pytest.raises(ValueError):
        encode_remaining_length(n)


def test_five_byte_remaining_length_rejected() -> None:
    """A remaining length whose 4th byte has the continuation bit is rejected at once."""
    decoder = Decoder()
    decoder.feed(b"\x30\x80\x80\x80")
    assert decoder.next_packet() is None  # three bytes: could still be valid
    decoder.feed(b"\x80")
    with pytest.raises(MalformedPacket) as info:
        decoder.next_packet()
    assert "remaining length" in info.value.reason and "4 bytes" in info.value.reason


def test_oversize_packet_rejected_before_body() -> None:
    """A packet larger than max_packet_size is rejected from its header alone."""
    decoder = Decoder(max_packet_size=100)
    decoder.feed(b"\x30" + encode_remaining_length(99) + b"\x00")  # 101 bytes in all
    with pytest.raises(MalformedPacket) as info:
        decoder.next_packet()
    assert "exceeds maximum packet size" in info.value.reason


def test_packet_exactly_max_size_accepted() -> None:
    """max_packet_size counts fixed header plus body and is inclusive."""
    packet = Publish("t", b"x" * 95)  # 2 + 2 + 1 + 95 = 100 bytes
    assert len(encode(packet)) == 100
    assert decode_one(encode(packet), max_packet_size=100) == packet
    assert "exceeds" in malformed(encode(packet), max_packet_size=99)


def test_incomplete_packet_returns_none() -> None:
    """Every strict prefix of a packet yields None, never an error."""
    raw = encode(Publish("a/b", b"hello", 2, True, False, 77))
    for i in range(len(raw)):
        decoder = Decoder()
        decoder.feed(raw[:i])
        assert decoder.next_packet() is None


# --------------------------------------------------------------------------
# fixed header flags and packet types


@pytest.mark.parametrize("ptype", [0, 15])
def test_reserved_packet_type(ptype: int) -> None:
    """Packet types 0 and 15 are reserved and malformed."""
    assert f"reserved packet type {ptype}" in malformed(bytes((ptype << 4, 0)))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("ptype", [6, 8, 10])
def test_pubrel_subscribe_unsubscribe_need_flags_0010(ptype: int, level: int) -> None:
    """PUBREL, SUBSCRIBE and UNSUBSCRIBE with flags other than 0010 are malformed."""
    for flags in (0b0000, 0b0011, 0b0110):
        assert "must be 0010" in malformed(bytes(((ptype << 4) | flags, 2, 0, 1)), level)


def test_level3_accepts_dup_on_pubrel_subscribe_unsubscribe() -> None:
    """MQTT 3.1 clients may set DUP (flags 1010) on PUBREL, SUBSCRIBE and UNSUBSCRIBE."""
    assert decode_one(b"\x6a\x02\x00\x05", level=3) == Pubrel(5, dup=True)
    assert decode_one(frame(0x8A, u16(5) + s("a/#") + b"\x01"), level=3) == Subscribe(
        5, (("a/#", 1),)
    )
    assert decode_one(frame(0xAA, u16(5) + s("a/#")), level=3) == Unsubscribe(5, ("a/#",))


@pytest.mark.parametrize("first", [0x6A, 0x8A, 0xAA])
def test_level4_rejects_dup_on_pubrel_subscribe_unsubscribe(first: int) -> None:
    """MQTT 3.1.1 requires exactly 0010 on PUBREL, SUBSCRIBE and UNSUBSCRIBE."""
    assert "must be 0010, got 1010" in malformed(bytes((first, 2, 0, 1)), level=4)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("ptype", [1, 2, 4, 5, 7, 9, 11, 12, 13, 14])
def test_other_types_need_flags_0000(ptype: int, level: int) -> None:
    """Every non-PUBLISH type other than PUBREL/SUBSCRIBE/UNSUBSCRIBE needs flags 0000."""
    assert "must be 0000" in malformed(bytes(((ptype << 4) | 0b0001, 0)), level)


@pytest.mark.parametrize("level", LEVELS)
def test_publish_qos3(level: int) -> None:
    """PUBLISH with both QoS bits set is malformed."""
    assert "QoS 3" in malformed(frame(0x36, s("a") + u16(1)), level)


def test_publish_dup_with_qos0_level4() -> None:
    """PUBLISH with DUP set and QoS 0 is malformed in MQTT 3.1.1."""
    assert "DUP" in malformed(frame(0x38, s("a") + b"x"), level=4)


def test_publish_dup_with_qos0_allowed_level3() -> None:
    """MQTT 3.1 tolerates DUP on a QoS 0 PUBLISH."""
    assert decode_one(frame(0x38, s("a") + b"x"), level=3) == Publish("a", b"x", dup=True)


# --------------------------------------------------------------------------
# packet identifiers


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("PUBLISH", frame(0x32, s("a") + u16(0) + b"x")),
        ("PUBLISH", frame(0x34, s("a") + u16(0))),
        ("PUBACK", b"\x40\x02\x00\x00"),
        ("PUBREC", b"\x50\x02\x00\x00"),
        ("PUBREL", b"\x62\x02\x00\x00"),
        ("PUBCOMP", b"\x70\x02\x00\x00"),
        ("SUBSCRIBE", frame(0x82, u16(0) + s("a") + b"\x00")),
        ("UNSUBSCRIBE", frame(0xA2, u16(0) + s("a"))),
        ("SUBACK", frame(0x90, u16(0) + b"\x00")),
        ("UNSUBACK", b"\xb0\x02\x00\x00"),
    ],
)
def test_packet_id_zero(name: str, raw: bytes) -> None:
    """Packet identifier 0 is malformed wherever an identifier is required."""
    assert malformed(raw) == f"{name} packet identifier is 0"


def test_publish_qos1_missing_packet_id() -> None:
    """A QoS 1 PUBLISH that ends right after its topic is malformed."""
    assert "packet identifier" in malformed(frame(0x32, s("a") + b"\x01"))


# --------------------------------------------------------------------------
# topic names and strings


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("wildcard", ["+", "#"])
def test_publish_topic_wildcard(wildcard: str, level: int) -> None:
    """A PUBLISH topic containing '+' or '#' is malformed."""
    reason = malformed(frame(0x30, s(f"a/{wildcard}/b") + b"x"), level)
    assert reason == f"PUBLISH topic contains wildcard '{wildcard}'"


@pytest.mark.parametrize("level", [3, 4])
@pytest.mark.parametrize("topic", ["$queue/jobs/+", "$queue/+/a", "$dlq/jobs/#"])
def test_queue_topic_wildcard_reaches_the_core(topic: str, level: int) -> None:
    """Under ``$queue/`` and ``$dlq/`` a wildcard is the core's to refuse (with a
    reason the client is told), so the packet decodes."""
    packet = decode_one(frame(0x30, s(topic) + b"x"), level)
    assert isinstance(packet, Publish) and packet.topic == topic


@pytest.mark.parametrize("level", LEVELS)
def test_publish_empty_topic(level: int) -> None:
    """A PUBLISH with a zero-length topic is malformed."""
    assert malformed(frame(0x30, s("") + b"x"), level) == "PUBLISH topic is empty"


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("bad", [b"\xff", b"a\xc3", b"\xed\xa0\x80", b"\xc0\x80"])
def test_invalid_utf8_topic(bad: bytes, level: int) -> None:
    """Invalid UTF-8 (including encoded surrogates and overlong NUL) is malformed at both levels."""
    assert "not valid UTF-8" in malformed(frame(0x30, s(bad) + b"x"), level)


@pytest.mark.parametrize("level", LEVELS)
def test_invalid_utf8_in_subscribe_filter(level: int) -> None:
    """Invalid UTF-8 in a SUBSCRIBE filter is malformed."""
    reason = malformed(frame(0x82, u16(1) + s(b"a\xff") + b"\x00"), level)
    assert "SUBSCRIBE topic filter is not valid UTF-8" == reason


def test_nul_in_topic_level4() -> None:
    """U+0000 in a string is malformed in MQTT 3.1.1."""
    assert "U+0000" in malformed(frame(0x30, s("a\x00b") + b"x"), level=4)
    assert "U+0000" in malformed(frame(0xA2, u16(1) + s("a\x00b")), level=4)


def test_nul_in_topic_filter_and_will_topic_level3() -> None:
    """Issue 16, item 3: 3.1 topics, filters and will topics are UTF-8 strings too;
    U+0000 in them is malformed (3.1 client ids and user names are left to the
    protocol layer's control-character rule)."""
    assert "U+0000" in malformed(frame(0x30, s("a\x00b") + b"x"), level=3)
    assert "U+0000" in malformed(frame(0x82, u16(1) + s("a\x00b") + b"\x00"), level=3)
    assert "U+0000" in malformed(frame(0xA2, u16(1) + s("a\x00b")), level=3)
    will = s("c") + s("w\x00t") + s(b"x")
    assert "CONNECT will topic contains U+0000" == malformed(
        connect_bytes("MQIsdp", 3, flags=0x06, payload=will))
    packet = decode_one(connect_bytes("MQIsdp", 3, payload=s("a\x00b")))
    assert isinstance(packet, Connect) and packet.client_id == "a\x00b"


@pytest.mark.parametrize("flags", [0b0001, 0b0100, 0b1111])
def test_connect_fixed_header_flags_ignored_for_mqisdp(flags: int) -> None:
    """Issue 16, item 2: MQTT 3.1 did not reserve CONNECT's fixed-header flags."""
    raw = bytes((0x10 | flags,)) + connect_bytes("MQIsdp", 3)[1:]
    assert decode_one(raw) == Connect("MQIsdp", 3, "client", True, 60)


@pytest.mark.parametrize(("name", "level"), [("MQTT", 4), ("MQTT", 5), ("MQIsdp", 4)])
def test_connect_fixed_header_flags_reserved_otherwise(name: str, level: int) -> None:
    """3.1.1 (and anything that is not 3.1) needs CONNECT flags 0000."""
    raw = bytes((0x14,)) + connect_bytes(name, level)[1:]
    assert malformed(raw) == "CONNECT reserved flag bits must be 0000, got 0100"


@pytest.mark.parametrize("level", LEVELS)
def test_string_past_packet_end(level: int) -> None:
    """A string whose length prefix runs past the packet end is malformed."""
    assert "runs past packet end" in malformed(frame(0x30, u16(10) + b"abc"), level)
    assert "runs past packet end" in malformed(frame(0xA2, u16(1) + u16(5) + b"ab"), level)
    assert "runs past packet end" in malformed(frame(0x82, u16(1) + b"\x00"), level)


def test_publish_too_short_for_topic_length() -> None:
    """A PUBLISH with fewer than two body bytes is malformed."""
    assert "topic length" in malformed(b"\x30\x01\x00")
    assert "topic length" in malformed(b"\x30\x00")


# --------------------------------------------------------------------------
# CONNECT


@pytest.mark.parametrize(("name", "level"), [("MQTT", 6), ("MQTT", 3), ("MQIsdp", 4), ("HTTP", 1)])
def test_connect_unknown_protocol_decodes(name: str, level: int) -> None:
    """An unknown protocol name/level still decodes so the protocol layer can send CONNACK 1."""
    raw = connect_bytes(name, level, payload=b"\x00\x00\x05whatever-format")
    assert decode_one(raw) == Connect(name, level, "", True, 60)


def test_connect_known_protocols_decode() -> None:
    """CONNECT for 'MQIsdp'/3 and 'MQTT'/4 decodes fully."""
    assert decode_one(connect_bytes("MQIsdp", 3)) == Connect("MQIsdp", 3, "client", True, 60)
    assert decode_one(connect_bytes("MQTT", 4)) == Connect("MQTT", 4, "client", True, 60)


@pytest.mark.parametrize(("name", "level"), [("MQTT", 4), ("MQTT", 5), ("XYZ", 9)])
def test_connect_reserved_flag_bit0(name: str, level: int) -> None:
    """CONNECT reserved flag bit 0 is malformed for 3.1.1 and for unknown protocols."""
    assert "reserved connect-flag bit 0" in malformed(connect_bytes(name, level, flags=0x03))


def test_connect_reserved_flag_bit0_ignored_for_mqisdp() -> None:
    """MQTT 3.1 left connect-flag bit 0 unused; it is ignored."""
    assert decode_one(connect_bytes("MQIsdp", 3, flags=0x03)) == Connect(
        "MQIsdp", 3, "client", True, 60
    )


@pytest.mark.parametrize("flags", [0x08, 0x10, 0x18, 0x20])
def test_connect_will_bits_without_will_flag(flags: int) -> None:
    """3.1.1: will QoS or will retain set while the will flag is 0 is malformed."""
    reason = malformed(connect_bytes(flags=0x02 | flags))
    assert "will QoS/retain set without the will flag" in reason


def test_connect_will_bits_without_will_flag_ignored_level3() -> None:
    """MQTT 3.1 disregards will QoS/retain when the will flag is 0."""
    assert decode_one(connect_bytes("MQIsdp", 3, flags=0x3A)) == Connect(
        "MQIsdp", 3, "client", True, 60, will=None
    )


@pytest.mark.parametrize(("name", "level"), [("MQTT", 4), ("MQIsdp", 3)])
def test_connect_will_qos3(name: str, level: int) -> None:
    """A will with QoS 3 is malformed at both levels."""
    payload = s("c") + s("will/t") + s(b"bye")
    assert "will QoS 3" in malformed(connect_bytes(name, level, flags=0x1E, payload=payload))


def test_connect_will_decodes() -> None:
    """Will topic, message, QoS and retain are decoded; the message is raw bytes."""
    payload = s("c") + s("will/t") + s(b"\xff\x00bye")
    packet = decode_one(connect_bytes(flags=0x36, payload=payload))
    assert isinstance(packet, Connect)
    assert packet.will == Will("will/t", b"\xff\x00bye", 2, True)


@pytest.mark.parametrize(("topic", "problem"), [("", "empty"), ("a/+", "'+'"), ("#", "'#'")])
def test_connect_will_topic_must_be_topic_name(topic: str, problem: str) -> None:
    """A will topic must be a valid topic name: non-empty and without wildcards."""
    payload = s("c") + s(topic) + s(b"bye")
    reason = malformed(connect_bytes(flags=0x06, payload=payload))
    assert "CONNECT will topic" in reason and problem in reason


def test_connect_password_without_username_level4() -> None:
    """3.1.1: the password flag without the username flag is malformed."""
    reason = malformed(connect_bytes(flags=0x42, payload=s("c") + s(b"pw")))
    assert "password flag set without the username flag" in reason


def test_connect_password_without_username_level3() -> None:
    """3.1: a password flagged without a username is read if present, else left out."""
    with_password = decode_one(connect_bytes("MQIsdp", 3, flags=0x42, payload=s("c") + s(b"pw")))
    assert isinstance(with_password, Connect)
    assert (with_password.username, with_password.password) == (None, b"pw")
    without = decode_one(connect_bytes("MQIsdp", 3, flags=0x42, payload=s("c")))
    assert isinstance(without, Connect) and without.password is None


def test_connect_missing_username_level3() -> None:
    """3.1: the remaining length takes precedence over a username flag with no username."""
    packet = decode_one(connect_bytes("MQIsdp", 3, flags=0xC2, payload=s("c")))
    assert isinstance(packet, Connect) and packet.username is None and packet.password is None


def test_connect_missing_username_level4() -> None:
    """3.1.1: a flagged username that is absent is malformed."""
    assert "CONNECT username" in malformed(connect_bytes(flags=0x82, payload=s("c")))


@pytest.mark.parametrize(("name", "level"), [("MQTT", 4), ("MQIsdp", 3)])
def test_connect_trailing_bytes(name: str, level: int) -> None:
    """Bytes after the CONNECT payload are malformed."""
    reason = malformed(connect_bytes(name, level, payload=s("c") + b"\x00\x01\x02"))
    assert "3 trailing bytes" in reason


def test_connect_truncated_variable_header() -> None:
    """A CONNECT ending inside the variable header is malformed."""
    assert "variable header" in malformed(frame(0x10, s("MQTT") + b"\x04\x02"))


def test_connect_string_rules_follow_packet_protocol() -> None:
    """CONNECT strings follow the packet's own protocol name, not the decoder's level."""
    nul_client = s("a\x00b")
    packet = decode_one(connect_bytes("MQIsdp", 3, payload=nul_client), level=4)
    assert isinstance(packet, Connect) and packet.client_id == "a\x00b"
    reason = malformed(connect_bytes("MQTT", 4, payload=nul_client), level=3)
    assert "CONNECT client identifier contains U+0000" == reason


def test_connect_invalid_utf8_client_id() -> None:
    """Invalid UTF-8 in the client identifier is malformed, for 3.1 too."""
    reason = malformed(connect_bytes("MQIsdp", 3, payload=s(b"\xfe")))
    assert reason == "CONNECT client identifier is not valid UTF-8"


def test_connect_client_id_length_not_checked() -> None:
    """The codec leaves client-id length rules (3.1's 23 characters) to the protocol layer."""
    packet = decode_one(connect_bytes("MQIsdp", 3, payload=s("x" * 100)))
    assert isinstance(packet, Connect) and packet.client_id == "x" * 100


# --------------------------------------------------------------------------
# SUBSCRIBE / UNSUBSCRIBE / SUBACK


@pytest.mark.parametrize(("first", "name"), [(0x82, "SUBSCRIBE"), (0xA2, "UNSUBSCRIBE")])
def test_subscribe_unsubscribe_without_topics(first: int, name: str) -> None:
    """SUBSCRIBE and UNSUBSCRIBE must carry at least one topic filter."""
    assert malformed(frame(first, u16(1))) == f"{name} with no topic filters"


def test_subscribe_qos3() -> None:
    """A requested QoS of 3 is malformed."""
    assert "requested QoS 3" in malformed(frame(0x82, u16(1) + s("a") + b"\x03"))


@pytest.mark.parametrize("qos_byte", [0x04, 0x81, 0xFC])
def test_subscribe_qos_reserved_bits(qos_byte: int) -> None:
    """Reserved upper bits in the requested-QoS byte are malformed."""
    reason = malformed(frame(0x82, u16(1) + s("a") + bytes((qos_byte,))))
    assert "reserved bits" in reason


def test_subscribe_missing_qos_byte() -> None:
    """A SUBSCRIBE filter not followed by its QoS byte is malformed."""
    assert "requested QoS byte" in malformed(frame(0x82, u16(1) + s("a")))


@pytest.mark.parametrize(
    ("first", "name", "tail"), [(0x82, "SUBSCRIBE", b"\x00"), (0xA2, "UNSUBSCRIBE", b"")]
)
def test_empty_topic_filter(first: int, name: str, tail: bytes) -> None:
    """A zero-length topic filter is malformed."""
    assert malformed(frame(first, u16(1) + s("") + tail)) == f"{name} topic filter is empty"


def test_subscribe_wildcard_placement_not_checked() -> None:
    """Filter wildcard placement is the core's business; the codec passes it through."""
    packet = decode_one(frame(0x82, u16(1) + s("a/#/b+") + b"\x00"))
    assert packet == Subscribe(1, (("a/#/b+", 0),))


@pytest.mark.parametrize("code", [3, 0x7F, 0x81, 0xFF])
def test_suback_invalid_return_code(code: int) -> None:
    """SUBACK return codes other than 0, 1, 2 and 0x80 are malformed."""
    assert "SUBACK return code" in malformed(frame(0x90, u16(1) + bytes((0, code))))


def test_suback_without_return_codes() -> None:
    """A SUBACK with no return codes is malformed."""
    assert "no return codes" in malformed(frame(0x90, u16(1)))


# --------------------------------------------------------------------------
# fixed-size packets


@pytest.mark.parametrize(
    ("first", "name", "size"),
    [
        (0x20, "CONNACK", 2),
        (0x40, "PUBACK", 2),
        (0x50, "PUBREC", 2),
        (0x62, "PUBREL", 2),
        (0x70, "PUBCOMP", 2),
        (0xB0, "UNSUBACK", 2),
        (0xC0, "PINGREQ", 0),
        (0xD0, "PINGRESP", 0),
        (0xE0, "DISCONNECT", 0),
    ],
)
def test_fixed_size_packets_wrong_length(first: int, name: str, size: int) -> None:
    """Fixed-size packets with any other remaining length are malformed."""
    for wrong in {0, 1, 3} - {size}:
        reason = malformed(frame(first, b"\x01" * wrong))
        assert reason == f"{name} remaining length must be {size}, got {wrong}"


def test_connack_reserved_flags_level4() -> None:
    """3.1.1: CONNACK acknowledge-flag bits 7-1 are reserved; 3.1 ignores them."""
    assert "reserved acknowledge flag" in malformed(b"\x20\x02\x02\x00", level=4)
    assert decode_one(b"\x20\x02\x02\x00", level=3) == Connack(False, 0)


# --------------------------------------------------------------------------
# error behaviour and encoder details


def test_malformed_packet_carries_reason() -> None:
    """MalformedPacket exposes its reason as an attribute and as str()."""
    exc = MalformedPacket("PUBLISH topic contains wildcard '+'")
    assert exc.reason == str(exc) == "PUBLISH topic contains wildcard '+'"


def test_header_error_raised_before_body_arrives() -> None:
    """A bad fixed-header byte is rejected as soon as it arrives."""
    decoder = Decoder()
    decoder.feed(b"\x00")
    with pytest.raises(MalformedPacket):
        decoder.next_packet()


def test_decoder_keeps_failing_after_malformed() -> None:
    """After MalformedPacket the decoder does not skip ahead to later packets."""
    decoder = Decoder()
    decoder.feed(frame(0x30, s("a/+") + b"x") + encode(Pingreq()))
    for _ in range(2):
        with pytest.raises(MalformedPacket):
            decoder.next_packet()


@pytest.mark.parametrize("level", LEVELS)
@given(data=st.data())
def test_encode_publish_matches_encode(level: int, data: st.DataObject) -> None:
    """encode_publish on a pre-encoded topic gives the same bytes as encode(Publish)."""
    p = data.draw(publishes(level))
    assert encode_publish(
        p.topic.encode("utf-8"), p.payload, p.qos, p.retain, p.dup, p.packet_id
    ) == encode(p)


def test_encode_publish_long_remaining_length() -> None:
    """A PUBLISH over 127 bytes gets a multi-byte remaining length."""
    raw = encode_publish(b"t", b"x" * 200, 0, False, False, None)
    assert raw[:3] == b"\x30" + encode_remaining_length(203)
    assert decode_one(raw) == Publish("t", b"x" * 200)


@pytest.mark.parametrize(
    ("qos", "packet_id"), [(1, None), (2, 0), (1, 65536), (0, 5), (3, 1), (-1, 1)]
)
def test_encode_publish_rejects_bad_arguments(qos: int, packet_id: int | None) -> None:
    """encode_publish refuses QoS/packet-id combinations that cannot go on the wire."""
    with pytest.raises(ValueError):
        encode_publish(b"t", b"", qos, False, False, packet_id)


@pytest.mark.parametrize(
    "packet",
    [
        Publish("x" * 65536, b""),
        Puback(0),
        Subscribe(1, (("a", 3),)),
        Suback(1, (5,)),
        Connect("MQTT", 4, "c", True, 70000),
    ],
)
def test_encode_rejects_unrepresentable_packets(packet: Packet) -> None:
    """encode raises ValueError for fields the wire format cannot carry."""
    with pytest.raises(ValueError):
        encode(packet)


def test_known_wire_bytes() -> None:
    """Encodings match hand-assembled bytes from the spec."""
    assert encode(Connect("MQTT", 4, "c", True, 60)) == (
        b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c"
    )
    assert encode(Connack(True, 0)) == b"\x20\x02\x01\x00"
    assert encode(Publish("a/b", b"hi", 1, True, True, 10)) == b"\x3b\x09\x00\x03a/b\x00\x0ahi"
    assert encode(Pubrel(3)) == b"\x62\x02\x00\x03"
    assert encode(Subscribe(2, (("a/#", 1),))) == b"\x82\x08\x00\x02\x00\x03a/#\x01"
    assert encode(Suback(2, (1, SUBACK_FAILURE))) == b"\x90\x04\x00\x02\x01\x80"
    assert encode(Unsubscribe(2, ("a/#",))) == b"\xa2\x07\x00\x02\x00\x03a/#"
    assert encode(Pingreq()) == b"\xc0\x00"
    assert encode(Pingresp()) == b"\xd0\x00"
    assert encode(Disconnect()) == b"\xe0\x00"


def test_malformed_packet_survives_pickling_with_every_field() -> None:
    """A ``MalformedPacket`` pickled and loaded again (a worker process's error, a
    Failure kept) keeps its reason, code, limit, CONNECT flag and notes. In the
    compiled build Exception's own reduce rebuilt it from its message alone, with code
    0x81 and no limit (it hands over the C struct's dict, which mypyc does not use)."""
    error = MalformedPacket("too big", 0x97, limit="user_property_pairs")
    error.in_connect5 = True
    error.add_note("read from 127.0.0.1:50000")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is MalformedPacket
    assert (again.reason, again.code, again.limit, again.in_connect5) == (
        "too big", 0x97, "user_property_pairs", True)
    assert again.args == ("too big",)
    assert again.__notes__ == ["read from 127.0.0.1:50000"]
