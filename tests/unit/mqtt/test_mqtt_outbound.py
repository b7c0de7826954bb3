"""The MQTT 5 PUBLISH built for one subscriber (``mqtt.outbound``), with no
transport: the subscription identifiers it is handed, the outbound alias and the client's maximum
packet size."""

from __future__ import annotations

from typing import Any

from mqttamqp.core.message import Message
from mqttamqp.mqtt import outbound
from mqttamqp.mqtt.codec import Decoder
from mqttamqp.mqtt.packets import Connect, Properties, Publish
from mqttamqp.mqtt.v5 import Negotiated


def _v5(**props: Any) -> Negotiated:
    return Negotiated(Connect("MQTT", 5, "c", True, 0, properties=Properties(**props)))


def _decoded(frame: bytes) -> Publish:
    decoder = Decoder(protocol_level=5)
    decoder.feed(frame)
    packet = decoder.next_packet()
    assert isinstance(packet, Publish)
    return packet


def test_identifiers_are_written_as_handed_over() -> None:
    """The subscription identifiers the core found are written as they are, with and
    without an alias; none handed over, none written."""
    message = Message("a/b", b"x", 1, False, "p", 0.0)
    frame, fits = outbound.publish5(_v5(), message, 1, 7, False, False, 0.0, (3, 9))
    got = _decoded(frame)
    assert fits and got.properties is not None
    assert got.properties.subscription_identifiers == (3, 9)
    aliased = _decoded(outbound.publish5(_v5(topic_alias_maximum=2), message, 1, 7, False,
                                         False, 0.0, (4,))[0])
    assert aliased.properties is not None and aliased.properties.topic_alias == 1
    assert aliased.properties.subscription_identifiers == (4,)
    bare = _decoded(outbound.publish5(_v5(), message, 1, 7, False, False, 0.0)[0])
    assert bare.properties is None or not bare.properties.subscription_identifiers


def test_too_large_is_not_sent_and_a_new_alias_is_taken_back_when_it_would_not_fit() -> None:
    """Above the client's maximum packet size the frame does not fit (counted);
    an alias whose topic costs the 3 bytes that break the limit is taken back."""
    message = Message("t/1", b"x" * 20, 1, False, "p", 0.0)
    small = _v5(maximum_packet_size=10)
    frame, fits = outbound.publish5(small, message, 1, 7, False, False, 0.0)
    assert not fits and small.too_large == 1 and len(frame) > 10
    plain, _ = outbound.publish5(_v5(), message, 1, 7, False, False, 0.0)
    tight = _v5(maximum_packet_size=len(plain), topic_alias_maximum=5)
    frame, fits = outbound.publish5(tight, message, 1, 7, False, False, 0.0)
    assert fits and frame == plain and tight.outbound_alias("t/1") == (1, True)


def test_alias_is_sent_with_the_topic_once_then_alone() -> None:
    """The first PUBLISH on a topic sets its alias; the next ones carry the alias
    and an empty topic."""
    v5 = _v5(topic_alias_maximum=2)
    message = Message("t/1", b"x", 0, False, "p", 0.0)
    first = _decoded(outbound.publish5(v5, message, 0, None, False, False, 0.0)[0])
    again = _decoded(outbound.publish5(v5, message, 0, None, False, False, 0.0)[0])
    assert first.topic == "t/1" and first.properties is not None
    assert first.properties.topic_alias == 1
    assert again.topic == "" and again.properties is not None
    assert again.properties.topic_alias == 1
