"""MQTT 5 properties across protocols, in memory (``amqp_memory.Net``, a
``task.Clock``): each field of the mapping (docs/amqp.md) from an AMQP peer's
proton ``Message`` to an MQTT 5 subscriber's PUBLISH properties, and from an MQTT 5
PUBLISH to what an AMQP receiver reads; expiry enforced on a queued message; a
3.1.1 subscriber gets none of it.  The same with real clients over sockets:
``test_amqp_mqtt5_interop``.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from amqp_memory import ACCEPTED, REJECTED, MqttPeer, Net, annotation, outcome, will_message
from proton import Message, symbol, timestamp, ubyte, ulong

from mqttamqp.amqp.codec.contract import mqtt5_props
from mqttamqp.amqp.codec.sections import decode_message
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import Properties, Publish

FORMAT = "x-opt-mqtt-payload-format"


def sub5(net: Net, topic_filter: str, client_id: str = "sub5") -> MqttPeer:
    sub = net.mqtt(client_id, level=5)
    assert sub.subscribe((topic_filter, 1)) == (1,)
    return sub


def amqp_message(**fields: Any) -> Message:
    """A message as a native AMQP application sends it: a Data body, unsettled."""
    msg = Message(body=fields.pop("body", b"text"), **fields)
    msg.inferred = True
    return msg


def publish5(peer: MqttPeer, topic: str, payload: bytes, props: Properties,
             qos: int = 1, retain: bool = False) -> None:
    peer.packet_ids += 1
    peer.send(Publish(topic, payload, qos, retain, False, peer.packet_ids if qos else None,
                      props))
    peer.take()   # the PUBACK


# -- AMQP -> MQTT 5 -----------------------------------------------------------------------

def test_each_amqp_field_becomes_its_mqtt5_property() -> None:
    """content-type, correlation-id (binary), reply-to, application-properties, ttl and
    the payload format annotation arrive as MQTT 5 PUBLISH properties."""
    net = Net()
    sub = sub5(net, "m/#")
    app = net.amqp()
    snd = app.sender("m/in")
    msg = amqp_message(content_type="text/plain", correlation_id=b"\x00c1",
                       reply_to="m/reply", ttl=30.0,
                       properties={"site": "plant-2", "line": 4, "ok": True},
                       annotations={symbol(FORMAT): ubyte(1)})
    assert outcome(app.send(snd, msg)) == (ACCEPTED, None)
    [got] = sub.publishes()
    p = got.properties
    assert (got.topic, got.payload) == ("m/in", b"text")
    assert p is not None
    assert p.content_type == "text/plain"
    assert p.correlation_data == b"\x00c1"
    assert p.response_topic == "m/reply"
    assert p.user_properties == (("site", "plant-2"), ("line", "4"), ("ok", "true"))
    assert p.message_expiry_interval == 30
    assert p.payload_format_indicator == 1


def test_non_binary_correlation_ids_and_non_string_values() -> None:
    """A string correlation-id becomes its UTF-8 bytes; a ttl in milliseconds is rounded
    up to whole seconds; application-property values that are null or binary are left
    out."""
    net = Net()
    sub = sub5(net, "m/#")
    app = net.amqp()
    snd = app.sender("m/in")
    msg = amqp_message(correlation_id="req-7", ttl=1.2,
                       properties={"a": None, "b": b"\x01", "c": "kept", "d": 2.5})
    app.send(snd, msg)
    [got] = sub.publishes()
    p = got.properties
    assert p is not None
    assert p.correlation_data == b"req-7"
    assert p.message_expiry_interval == 2
    assert p.user_properties == (("c", "kept"), ("d", "2.5"))
    assert p.content_type is None and p.response_topic is None


@pytest.mark.parametrize("correlation_id, expected", [
    (uuid.UUID(int=5), uuid.UUID(int=5).bytes), (ulong(42), b"42"), ("é", "é".encode()),
    (b"x" * 70_000, None)])
def test_correlation_id_kinds(correlation_id: Any, expected: bytes | None) -> None:
    """A UUID correlation-id becomes its 16 bytes, a ulong its decimal digits, a string
    its UTF-8; binary longer than an MQTT property can hold is left out."""
    msg = amqp_message(correlation_id=correlation_id)
    props = mqtt5_props(decode_message(bytes(msg.encode())))
    assert (props.correlation_data if props is not None else None) == expected


def test_strings_mqtt_cannot_carry_are_left_out() -> None:
    """Strings holding U+0000 or longer than 65535 bytes are left out of the MQTT form;
    a timestamp value becomes its milliseconds."""
    msg = amqp_message(reply_to="r" * 70_000, content_type="t" * 70_000,
                       properties={"nul": "x\x00", "big": "y" * 70_000, "at": timestamp(1500),
                                   "ok": "fine"})
    props = mqtt5_props(decode_message(bytes(msg.encode())))
    assert props is not None
    assert (props.response_topic, props.content_type) == (None, None)
    assert props.user_properties == (("at", "1500"), ("ok", "fine"))


def test_plain_amqp_message_carries_no_properties_and_311_gets_none() -> None:
    """Without any mapped field an MQTT 5 subscriber gets no message properties; an
    MQTT 3.1.1 subscriber gets the message with properties exactly as a plain one."""
    net = Net()
    five = sub5(net, "m/#")
    old = net.mqtt("old")
    assert old.subscribe(("m/#", 0)) == (0,)
    app = net.amqp()
    snd = app.sender("m/in")
    app.send(snd, amqp_message(body=b"plain"))
    app.send(snd, amqp_message(body=b"rich", content_type="a/b", reply_to="r"))
    plain, rich = five.publishes()
    assert plain.properties is None
    assert rich.properties is not None and rich.properties.content_type == "a/b"
    old.net.pump()
    raw = old.transport.value()
    assert raw == encode(Publish("m/in", b"plain")) + encode(Publish("m/in", b"rich"))


def test_bad_payload_format_is_rejected() -> None:
    """A payload format annotation that is not 0 or 1, or format 1 with a payload that
    is not UTF-8, is Rejected with amqp:decode-error; nothing is routed."""
    net = Net()
    sub = sub5(net, "m/#")
    app = net.amqp()
    snd = app.sender("m/in")
    bad_value = amqp_message(annotations={symbol(FORMAT): ubyte(7)})
    not_utf8 = amqp_message(body=b"\xff\xfe", annotations={symbol(FORMAT): ubyte(1)})
    assert outcome(app.send(snd, bad_value)) == (REJECTED, "amqp:decode-error")
    assert outcome(app.send(snd, not_utf8)) == (REJECTED, "amqp:decode-error")
    assert sub.publishes() == []


def test_amqp_ttl_is_a_message_expiry_the_core_enforces() -> None:
    """A message with a ttl, queued for an offline persistent session, is not
    delivered once its ttl has passed; one without a ttl is."""
    net = Net()
    sub = net.mqtt("away", clean=False)
    assert sub.subscribe(("e/#", 1)) == (1,)
    sub.disconnect()
    app = net.amqp()
    snd = app.sender("e/x")
    app.send(snd, amqp_message(body=b"short", ttl=5.0))
    app.send(snd, amqp_message(body=b"long", ttl=60.0))
    app.send(snd, amqp_message(body=b"forever"))
    net.advance(6)
    back = net.mqtt("away", clean=False)
    assert [p.payload for p in back.publishes()] == [b"long", b"forever"]


def test_amqp_will_carries_properties() -> None:
    """An AMQP_WILL with mapped fields is published with them as MQTT 5 properties."""
    net = Net()
    sub = sub5(net, "w/#")
    fe = net.fe("dev1")
    will = will_message("w/dev1", b"gone", qos=1)
    will.content_type = "text/plain"
    will.properties = {"why": "lost"}
    assert outcome(fe.peer.send(fe.will, will)) == (ACCEPTED, None)
    fe.peer.kill()
    net.pump()
    [got] = sub.publishes()
    assert got.payload == b"gone"
    assert got.properties is not None
    assert got.properties.content_type == "text/plain"
    assert got.properties.user_properties == (("why", "lost"),)


# -- MQTT 5 -> AMQP -----------------------------------------------------------------------

def test_each_mqtt5_property_becomes_its_amqp_field() -> None:
    """An AMQP receiver reads the MQTT 5 properties in their AMQP places; of a repeated
    user property key it gets the first value."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("m/#")
    pub = net.mqtt("pub5", level=5)
    props = Properties(payload_format_indicator=1, message_expiry_interval=120,
                       content_type="application/json", response_topic="m/reply",
                       correlation_data=b"\x01\x02",
                       user_properties=(("k", "first"), ("j", "x"), ("k", "second")))
    publish5(pub, "m/out", b'{"t": 1}', props)
    [(m, _)] = rcv.new()
    assert (m.address, bytes(m.body)) == ("m/out", b'{"t": 1}')
    assert m.content_type == "application/json"
    assert isinstance(m.content_type, symbol)
    assert m.correlation_id == b"\x01\x02"
    assert m.reply_to == "m/reply"
    assert m.properties == {"k": "first", "j": "x"}
    assert m.ttl == 120.0
    assert annotation(m, FORMAT) == 1
    # the contract's annotations are still there
    assert annotation(m, "x-opt-mqtt-qos") == 1 and annotation(m, "x-opt-mqtt-client-id") == "pub5"


def test_outbound_ttl_is_the_remaining_interval() -> None:
    """A retained message with an expiry of 60 s, read by a receiver 20 s later, has a
    ttl of 40 s; a non-ASCII content type (no AMQP symbol can hold it) is left out."""
    net = Net()
    pub = net.mqtt("pub5", level=5)
    publish5(pub, "r/t", b"v", Properties(message_expiry_interval=60, content_type="text/é"),
             retain=True)
    net.advance(20)
    app = net.amqp()
    rcv = app.receiver("r/t")
    [(m, _)] = rcv.new()
    assert m.ttl == 40.0
    assert decode_message(rcv.raw[0]).content_type is None   # proton would say 'None'
    assert annotation(m, "x-opt-retain-message") is True


def test_mqtt_without_properties_reaches_amqp_as_before() -> None:
    """An MQTT message without properties has no ttl, content type, reply-to,
    correlation id, application properties or payload format annotation."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("m/#")
    pub = net.mqtt("pub5", level=5)
    publish5(pub, "m/p", b"x", Properties())
    [(m, _)] = rcv.new()
    wire = decode_message(rcv.raw[0])
    assert (wire.ttl, wire.content_type, wire.reply_to, wire.correlation_id,
            wire.app_properties) == (None, None, None, None, None)
    assert annotation(m, FORMAT) is None


def test_amqp_to_amqp_keeps_the_remaining_ttl() -> None:
    """Between AMQP peers a message keeps its sections and gets what is left of its
    ttl (a retained one, read 10 s after it was sent)."""
    net = Net()
    app = net.amqp()
    snd = app.sender("n/t")
    app.send(snd, amqp_message(body=b"x", ttl=50.0, correlation_id="c", reply_to="r",
                               annotations={symbol("x-opt-retain-message"): True}))
    net.advance(10)
    rcv = app.receiver("n/t")
    [(m, _)] = rcv.new()
    assert (m.ttl, m.correlation_id, m.reply_to) == (40.0, "c", "r")


def test_an_amqp091_correlation_id_reaches_amqp_receivers_as_a_string() -> None:
    """A correlation-id an AMQP 0.9.1 publisher sent (a short string, kept as UTF-8
    correlation data) goes to AMQP receivers as a string; MQTT's binary correlation
    data stays binary."""
    from mqttamqp.amqp.codec.contract import Mqtt5Props
    from mqttamqp.amqp.codec.encode import encode_publish5

    wire = Mqtt5Props(None, None, None, None, b"c-091", ())
    for text, expected in ((True, "c-091"), (False, b"c-091")):
        data = encode_publish5("t", b"x", 0, False, 0, None, None, wire,
                               correlation_text=text)
        got = decode_message(data).correlation_id
        assert got == expected and type(got) is type(expected)


def test_a_priority_goes_in_the_header_and_none_leaves_it_out() -> None:
    """A publisher's priority (a 0.9.1 basic property) is header.priority of the
    AMQP_PUBLISH, with MQTT 5 properties or without; without one the header has
    none (proton reads the default 4)."""
    from mqttamqp.amqp.codec.contract import Mqtt5Props
    from mqttamqp.amqp.codec.encode import encode_publish, encode_publish5

    wire = Mqtt5Props(None, None, "text/plain", None, None, ())
    for priority, expected in ((7, 7), (None, 4)):
        plain = Message()
        plain.decode(encode_publish("t", b"x", 1, False, 0, None, 5, False, priority))
        rich = Message()
        rich.decode(encode_publish5("t", b"x", 1, False, 0, None, 5, wire,
                                    priority=priority))
        assert (plain.priority, rich.priority) == (expected, expected)
