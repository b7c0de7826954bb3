"""The MQTT 5 PUBLISH built for one subscriber (``mqtt.outbound``), with no
transport: subscription identifiers, the outbound alias and the client's maximum
packet size."""

from __future__ import annotations

from typing import Any

from mqttamqp.core.message import Message
from mqttamqp.mqtt import outbound
from mqttamqp.mqtt.codec import Decoder
from mqttamqp.mqtt.packets import Connect, Properties, Publish
from mqttamqp.mqtt.v5 import Negotiated


class _Session:
    """The two maps of a session that identifiers are read from."""

    def __init__(self, options: dict[str, int], subscriptions: dict[str, int]) -> None:
        self.sub_options = options
        self.subscriptions = subscriptions


def _v5(**props: Any) -> Negotiated:
    return Negotiated(Connect("MQTT", 5, "c", True, 0, properties=Properties(**props)))


def _decoded(frame: bytes) -> Publish:
    decoder = Decoder(protocol_level=5)
    decoder.feed(frame)
    packet = decoder.next_packet()
    assert isinstance(packet, Publish)
    return packet


def test_identifiers_of_plain_filters_and_of_a_shared_one_only_alone() -> None:
    """Every matching plain filter's identifier; a shared filter's only when no
    plain filter of the session matches (the message came through its group)."""
    both = _Session({"a/+": 1 << 8, "a/#": 2 << 8, "$share/g/a/b": 3 << 8},
                    {"a/+": 0, "a/#": 0, "$share/g/a/b": 0})
    assert sorted(outbound.subscription_ids(both, "a/b")) == [1, 2]  # type: ignore[arg-type]
    shared = _Session({"$share/g/a/b": 3 << 8}, {"$share/g/a/b": 0, "x": 0})
    assert outbound.subscription_ids(shared, "a/b") == (3,)  # type: ignore[arg-type]
    assert outbound.subscription_ids(shared, "z") == ()  # type: ignore[arg-type]


def test_too_large_is_not_sent_and_a_new_alias_is_taken_back_when_it_would_not_fit() -> None:
    """Above the client's maximum packet size the frame does not fit (counted);
    an alias whose topic costs the 3 bytes that break the limit is taken back."""
    message = Message("t/1", b"x" * 20, 1, False, "p", 0.0)
    small = _v5(maximum_packet_size=10)
    frame, fits = outbound.publish5(small, message, 1, 7, False, False, 0.0, None)
    assert not fits and small.too_large == 1 and len(frame) > 10
    plain, _ = outbound.publish5(_v5(), message, 1, 7, False, False, 0.0, None)
    tight = _v5(maximum_packet_size=len(plain), topic_alias_maximum=5)
    frame, fits = outbound.publish5(tight, message, 1, 7, False, False, 0.0, None)
    assert fits and frame == plain and tight.outbound_alias("t/1") == (1, True)


def test_alias_is_sent_with_the_topic_once_then_alone() -> None:
    """The first PUBLISH on a topic sets its alias; the next ones carry the alias
    and an empty topic."""
    v5 = _v5(topic_alias_maximum=2)
    message = Message("t/1", b"x", 0, False, "p", 0.0)
    first = _decoded(outbound.publish5(v5, message, 0, None, False, False, 0.0, None)[0])
    again = _decoded(outbound.publish5(v5, message, 0, None, False, False, 0.0, None)[0])
    assert first.topic == "t/1" and first.properties is not None
    assert first.properties.topic_alias == 1
    assert again.topic == "" and again.properties is not None
    assert again.properties.topic_alias == 1
