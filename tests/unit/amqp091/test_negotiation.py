"""What the 0.9.1 handshake decides: header sniff, credentials, tune values, and the
property mapping to the core's message."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands, encode

from mqttamqp.amqp091.negotiation import (
    CAPABILITIES,
    CredentialsError,
    Protocol,
    negotiate,
    read_credentials,
    sniff,
    start_method,
)
from mqttamqp.amqp091.properties import PropertyError, from_core, to_core
from mqttamqp.core.message import Message, MessageProperties


@pytest.mark.parametrize("data, kind", [
    (b"AMQP\x00\x00\x09\x01", Protocol.AMQP091),
    (b"AMQP\x00\x01\x00\x00", Protocol.AMQP10),
    (b"AMQP\x03\x01\x00\x00rest", Protocol.AMQP10),
    (b"AMQP\x01\x01\x00\x0a", Protocol.UNKNOWN),
    (b"GET / HTTP/1.1", Protocol.UNKNOWN),
    (b"GE", Protocol.UNKNOWN),
    (b"AMQ", None),
    (b"AMQP\x00\x00", None),
])
def test_sniff(data: bytes, kind: str | None) -> None:
    """The header decides the protocol; a prefix of AMQP's waits for more bytes."""
    assert sniff(data) == kind


def test_plain_credentials() -> None:
    """PLAIN's response is authzid NUL user NUL password."""
    creds = read_credentials("PLAIN", "\x00guest\x00secret", ["PLAIN", "AMQPLAIN"])
    assert (creds.username, creds.password) == ("guest", b"secret")


def test_amqplain_credentials() -> None:
    """AMQPLAIN's response is a field table without its length: LOGIN and PASSWORD."""
    table = encode.field_table({"LOGIN": "u", "PASSWORD": "p"})[4:]
    creds = read_credentials("AMQPLAIN", table, ["PLAIN", "AMQPLAIN"])
    assert (creds.username, creds.password) == ("u", b"p")


@pytest.mark.parametrize("mechanism, response", [
    ("PLAIN", "no-nuls"), ("AMQPLAIN", b"\x01"), ("CRAM-MD5", "x"),
    ("AMQPLAIN", encode.field_table({"LOGIN": "u"})[4:]),
])
def test_bad_credentials_are_refused(mechanism: str, response: bytes | str) -> None:
    """An unoffered mechanism or a malformed response is a CredentialsError."""
    with pytest.raises(CredentialsError):
        read_credentials(mechanism, response, ["PLAIN", "AMQPLAIN"])


def test_negotiate_takes_the_smaller_and_zero_is_no_limit() -> None:
    """Tune values: the smaller of two, 0 standing for no limit."""
    assert negotiate(2047, 0) == 2047
    assert negotiate(0, 100) == 100
    assert negotiate(2047, 100) == 100


def test_start_announces_product_and_capabilities() -> None:
    """connection.start names the broker and every capability clients look for."""
    start = start_method(["PLAIN", "AMQPLAIN"])
    assert start.server_properties["product"] == "mqttamqp"
    assert start.server_properties["capabilities"] == CAPABILITIES
    assert start.mechanisms == "PLAIN AMQPLAIN"
    assert struct.unpack(">I", start.marshal()[2:6])[0] > 0


def test_properties_map_to_the_core_and_back() -> None:
    """content-type, correlation-id, reply-to, expiration and string headers cross."""
    props = commands.Basic.Properties(
        content_type="application/json", correlation_id="c", reply_to="r",
        expiration="1500", headers={"a": "b", "n": 1}, delivery_mode=2)
    core, qos = to_core(props)
    assert qos == 1
    assert core == MessageProperties(None, 2, "application/json", "r", b"c", (("a", "b"),))
    back, count, redelivered = from_core(Message("t", b"", 1, timestamp=10.0, props=core),
                                         10.0)
    assert (back.content_type, back.correlation_id, back.reply_to) == (
        "application/json", "c", "r")
    assert back.headers == {"a": "b"} and back.expiration == "2000"
    assert (count, redelivered) == (0, False)


def test_delivery_count_header_from_queue_metadata() -> None:
    """A queue's delivery-count becomes x-delivery-count; its other metadata stays out."""
    core = MessageProperties(user_properties=(("delivery-count", "3"), ("queue", "q"),
                                              ("k", "v")))
    back, count, redelivered = from_core(Message("t", b"", 1, props=core), 0.0)
    assert back.headers == {"k": "v", "x-delivery-count": 2}
    assert count == 2 and redelivered


def test_a_malformed_expiration_is_refused() -> None:
    """An expiration that is not milliseconds as digits is a PropertyError."""
    with pytest.raises(PropertyError):
        to_core(commands.Basic.Properties(expiration="soon"))


def test_091_properties_round_trip_through_a_stored_record() -> None:
    """A message's 0.9.1 properties survive the store's record, with or without MQTT 5
    properties, and older records still load."""
    from mqttamqp.store.models import message_to_record, record_to_message

    raw = commands.Basic.Properties(priority=4, headers={"n": 1}).marshal()
    for props in (None, MessageProperties(content_type="a/b")):
        m = Message("$queue/q", b"body", 1, False, "p", 5.0, props=props, amqp091=raw)
        assert record_to_message(message_to_record(m)) == m
    plain = Message("t", b"x", 0, False, None, 1.0)
    assert record_to_message(message_to_record(plain)) == plain


def test_a_091_publishers_properties_go_out_as_sent() -> None:
    """for_consumer hands a 0.9.1 publisher's property bytes, exchange and key over
    unchanged on a first delivery, and adds x-delivery-count on a redelivery."""
    from pamqp.header import ContentHeader

    from mqttamqp.amqp091.properties import envelope, for_consumer

    raw = commands.Basic.Properties(priority=4, headers={"n": 1}).marshal()
    sent = envelope("ex", "key.1", raw)
    first = Message("$queue/q/key.1", b"", 1, props=MessageProperties(
        user_properties=(("delivery-count", "1"),)), amqp091=sent)
    assert for_consumer(first, "q", 0.0) == (raw, False, "ex", "key.1")
    again = Message("$queue/q/key.1", b"", 1, dup=True, props=MessageProperties(
        user_properties=(("delivery-count", "3"),)), amqp091=sent)
    data, redelivered, _, _ = for_consumer(again, "q", 0.0)
    header = ContentHeader()
    header.unmarshal(b"\x00\x3c\x00\x00" + bytes(8) + data)
    assert redelivered and header.properties.headers == {"n": 1, "x-delivery-count": 2}
    assert header.properties.priority == 4


def test_a_message_from_the_topic_space_comes_from_amq_topic() -> None:
    """An MQTT publish queued through amq.topic is delivered from amq.topic with the
    topic as routing key (a/b is a.b); one published to the queue itself from ""."""
    from mqttamqp.amqp091.properties import for_consumer

    _, _, exchange, key = for_consumer(Message("$queue/q/a/b", b""), "q", 0.0)
    assert (exchange, key) == ("amq.topic", "a.b")
    _, _, exchange, key = for_consumer(Message("$queue/q", b""), "q", 0.0)
    assert (exchange, key) == ("", "q")


def test_a_dead_letter_from_mqtt_gets_x_death() -> None:
    """A dead-lettered message without 0.9.1 properties gets x-death from the queue's
    origin metadata, which is not repeated as plain headers."""
    from pamqp.header import ContentHeader

    from mqttamqp.amqp091.properties import for_consumer

    core = MessageProperties(user_properties=(
        ("origin-queue", "work"), ("origin-offset", "4"), ("origin-group", "work"),
        ("reason", "expired"), ("k", "v")))
    data, _, exchange, key = for_consumer(Message("$queue/dlq", b"", 1, props=core,
                                                  timestamp=100.0), "dlq", 0.0)
    header = ContentHeader()
    header.unmarshal(b"\x00\x3c\x00\x00" + bytes(8) + data)
    headers = header.properties.headers
    assert (exchange, key) == ("", "dlq")
    assert set(headers) == {"k", "x-death", "x-first-death-queue", "x-first-death-reason",
                            "x-first-death-exchange", "x-last-death-queue",
                            "x-last-death-reason", "x-last-death-exchange"}
    [death] = headers["x-death"]
    assert (death["queue"], death["reason"], death["routing-keys"]) == (
        "work", "expired", ["work"])


def test_published_form_is_to_core_and_envelope_memoized_by_the_bytes() -> None:
    """published_form gives to_core's properties and QoS, the envelope, the priority
    and the default exchange's queue topic; a second publish with other property
    bytes (same exchange and key) gets its own form, not the first's."""
    from pamqp import commands as c

    from mqttamqp.amqp091.frames import FrameReader
    from mqttamqp.amqp091.properties import envelope, published_form

    def header_of(props: c.Basic.Properties) -> tuple[c.Basic.Properties, bytes]:
        from pamqp import frame, header
        data = frame.marshal(header.ContentHeader(0, 5, props), 1)
        [(_, h)] = FrameReader(1 << 20).feed(data)
        return h.properties, h.raw

    first = c.Basic.Properties(delivery_mode=2, content_type="a/b", priority=3)
    second = c.Basic.Properties(delivery_mode=1, reply_to="r")
    for props in (first, second, first):
        decoded, raw = header_of(props)
        core, qos, sent, priority, topic = published_form(decoded, "", "jobs", raw)
        assert (core, qos) == to_core(decoded)
        assert sent == envelope("", "jobs", raw)
        assert priority == props.priority
        assert topic == "$queue/jobs"
        assert published_form(decoded, "x", "jobs", raw)[4] == ""   # (copies: per queue)
    bad, raw = header_of(c.Basic.Properties(expiration="soon"))
    for _ in range(2):   # (an error is not memoized)
        with pytest.raises(PropertyError):
            published_form(bad, "", "jobs", raw)
