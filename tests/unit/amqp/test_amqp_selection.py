"""What a selector reads of a message (``amqp.selection``): an AMQP sender's
header, properties and application properties under their JMS names, an MQTT 5
publisher's user properties, and the source filter maps a receiver may attach
with."""

from __future__ import annotations

from typing import Any

from proton import Described, Message, symbol

from mqttamqp.amqp.codec.native import native_sections
from mqttamqp.amqp.codec.publish import decode_publish
from mqttamqp.amqp.selection import (
    SELECTOR_CODE,
    SELECTOR_FILTER,
    message_fields,
    message_predicate,
    source_selector,
)
from mqttamqp.core.message import Message as CoreMessage
from mqttamqp.core.message import MessageProperties
from mqttamqp.core.selectors import compile_selector


def _native(**kw: Any) -> CoreMessage:
    data = bytes(Message(**kw).encode())
    f = decode_publish(data, False)
    native = native_sections(data, f.bare_start, f.props_end, f.to, "t/x", f.durable,
                             f.priority)
    return CoreMessage("t/x", f.payload or b"", 1, native=native)


def test_native_fields() -> None:
    """Header and properties under their JMS names, application properties typed
    as sent; the body is not among them."""
    msg = _native(body={"colour": "body"}, id="m-1", subject="car", correlation_id=7,
                  durable=True, priority=8, creation_time=12.5,
                  properties={"colour": "red", "weight": 2600, "ratio": 0.5, "ok": True})
    fields = message_fields(msg)
    assert fields["colour"] == "red" and fields["weight"] == 2600
    assert fields["ratio"] == 0.5 and fields["ok"] is True
    assert fields["JMSMessageID"] == "m-1" and fields["JMSType"] == "car"
    assert fields["JMSCorrelationID"] == "7"
    assert fields["JMSPriority"] == 8 and fields["JMSDeliveryMode"] == "PERSISTENT"
    assert fields["JMSTimestamp"] == 12500


def test_native_defaults() -> None:
    """Without a header: priority 4, not persistent; no properties, no ids."""
    fields = message_fields(_native(body="x"))
    assert fields == {"JMSPriority": 4, "JMSDeliveryMode": "NON_PERSISTENT"}


def test_mqtt_fields() -> None:
    """An MQTT 5 message: user properties (the first of a name), correlation data as
    JMSCorrelationID, QoS > 0 as persistent."""
    props = MessageProperties(correlation_data=b"abc",
                              user_properties=(("colour", "red"), ("colour", "blue")))
    fields = message_fields(CoreMessage("t", b"x", 1, timestamp=2.0, props=props))
    assert fields["colour"] == "red" and fields["JMSCorrelationID"] == "abc"
    assert fields["JMSDeliveryMode"] == "PERSISTENT" and fields["JMSTimestamp"] == 2000
    assert message_fields(CoreMessage("t", b"x"))["JMSDeliveryMode"] == "NON_PERSISTENT"


def test_predicate() -> None:
    """The predicate answers per message, and twice for the same message alike."""
    predicate = message_predicate(compile_selector("colour = 'red' AND JMSPriority > 4"))
    red = _native(body="a", priority=9, properties={"colour": "red"})
    assert predicate(red) and predicate(red)
    assert not predicate(_native(body="b", properties={"colour": "red"}))
    assert not predicate(_native(body="c", priority=9, properties={"colour": "blue"}))


def test_source_selector() -> None:
    """A selector filter by symbol or by code is compiled; other filters, two
    selectors, a non-string or one that does not parse are refused with why."""
    text = "colour = 'red'"
    key, selector = source_selector({symbol("s"): Described(symbol(SELECTOR_FILTER), text)})
    assert key == "s" and selector.text == text
    assert not isinstance(source_selector({"s": Described(SELECTOR_CODE, text)}), str)
    assert source_selector({}) is None
    assert "not supported" in str(source_selector({"t": Described(symbol("x:y"), "a")}))
    assert "not supported" in str(source_selector({"t": "plain"}))
    assert "not a string" in str(source_selector({"s": Described(SELECTOR_CODE, 3)}))
    assert "does not parse" in str(source_selector({"s": Described(SELECTOR_CODE, "a =")}))
    two = {"a": Described(SELECTOR_CODE, text), "b": Described(SELECTOR_CODE, text)}
    assert "more than one" in str(source_selector(two))


def test_selector_length_bound() -> None:
    """A selector longer than the bound (--amqp-max-selector-length) is refused
    with why."""
    text = "colour = 'red'"
    assert not isinstance(source_selector({"s": Described(SELECTOR_CODE, text)}, len(text)),
                          str)
    refused = source_selector({"s": Described(SELECTOR_CODE, text)}, len(text) - 1)
    assert isinstance(refused, str) and "--amqp-max-selector-length" in refused


def test_jms_priority_of_a_message_without_one_is_the_level_it_is_ranked_at() -> None:
    """Without a priority, an AMQP 0.9.1 publisher's message selects as JMSPriority 0
    (its level in a priority queue, as RabbitMQ), an MQTT one as 4; a given one as
    given."""
    from091 = CoreMessage("", b"x", 1, amqp091=b"\x00\x00\x00\x00")
    assert message_fields(from091)["JMSPriority"] == 0
    assert message_fields(CoreMessage("t", b"x", 1))["JMSPriority"] == 4
    assert message_fields(CoreMessage("", b"x", 1, amqp091=b"\x00", priority=7)
                          )["JMSPriority"] == 7
