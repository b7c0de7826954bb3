"""Loops of bridges, on a fake transport and ``task.Clock``: the ``bridge-hops`` user
property an MQTT 5 bridge adds, the ``max-hops`` bound (not sent, counted, entry
settled), and Mosquitto's bridge flag decoded by this broker's codec (a bridge
connecting here subscribes no-local)."""

from __future__ import annotations

from typing import Any

from bridge_remote import TABLE, Remote, remote_received
from core_broker import make_broker

from mqttamqp.bridge.bridge import Bridge
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.bridge.link import HOPS, hops_of
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import Connack, Connect, Properties, Publish


def _connected(max_hops: int = 4) -> tuple[Bridge, Remote, Any, Any]:
    broker, clock, _ = make_broker()
    remote = Remote()
    remote.up = True
    bridge = Bridge(broker, clock, BridgeSettings.from_table(
        {**TABLE, "protocol": "5", "topics": ["sensors/# out 1"], "max-hops": max_hops}),
        remote)
    bridge.start()
    assert remote.client is not None and remote.transport is not None
    remote.transport.clear()
    remote.client.dataReceived(encode(Connack(False, 0, None), 5))
    return bridge, remote, broker, clock


def _sent(remote: Remote) -> list[Publish]:
    return [p for p in remote_received(remote) if isinstance(p, Publish)]


def _publish(broker: Any, payload: bytes, hops: str | None,
             users: tuple[tuple[str, str], ...] = ()) -> None:
    props = (MessageProperties(user_properties=(*users, (HOPS, hops)))
             if hops is not None else None)
    broker.publish(Message("sensors/t", payload, 1, False, "p", 0.0, props=props))


def test_each_message_out_carries_one_more_hop() -> None:
    """A message without a count goes with bridge-hops 1; one that crossed 2 with 3,
    its other user properties kept."""
    _bridge, remote, broker, _ = _connected()
    _publish(broker, b"a", None)
    _publish(broker, b"b", "2", (("k", "v"),))
    first, second = _sent(remote)
    assert first.properties is not None and second.properties is not None
    assert first.properties.user_properties == ((HOPS, "1"),)
    assert second.properties.user_properties == (("k", "v"), (HOPS, "3"))


def test_a_message_at_max_hops_is_not_sent_counted_and_settled() -> None:
    """At max-hops the message is not forwarded: counted, its session entry settled
    (the backlog does not keep it), the next one goes."""
    bridge, remote, broker, clock = _connected(max_hops=2)
    _publish(broker, b"looped", "2")
    _publish(broker, b"fresh", "1")
    assert [p.payload for p in _sent(remote)] == [b"fresh"]
    assert bridge.link.too_many_hops == 1
    clock.advance(0)
    session = broker.registry.sessions["$bridge/hq"]
    assert [e.message.payload for e in session.inflight.values()] == [b"fresh"]


def test_hops_of_reads_only_a_count() -> None:
    """A missing or non-numeric bridge-hops counts 0."""
    def message(users: tuple[tuple[str, str], ...]) -> Message:
        return Message("t", b"", 0, False, None, 0.0,
                       props=MessageProperties(user_properties=users))
    assert hops_of(message(())) == 0
    assert hops_of(message(((HOPS, "x"),))) == 0
    assert hops_of(message(((HOPS, "7"),))) == 7
    assert hops_of(message(((HOPS, "\u00b2"),))) == 0   # (a digit to isdigit, not to int)


def test_the_bridge_flag_is_decoded_and_encoded_back() -> None:
    """CONNECT at level 4 | 0x80 decodes as a 3.1.1 CONNECT from a bridge, and encodes
    back to the same bytes."""
    raw = encode(Connect("MQTT", 4, "c", False, 30, bridge=True))
    assert raw[8] == 0x84
    decoder = Decoder(server=True)
    decoder.feed(raw)
    (packet,) = list(decoder)
    assert isinstance(packet, Connect)
    assert (packet.protocol_level, packet.bridge) == (4, True)
    assert encode(packet) == raw


def test_an_unknown_level_with_the_flag_is_still_unknown() -> None:
    """Level 0x85 (5 | 0x80) is not a bridge flag: the CONNECT keeps its level."""
    raw = bytearray(encode(Connect("MQTT", 4, "c", False, 30)))
    raw[8] = 0x85
    decoder = Decoder(server=True)
    decoder.feed(bytes(raw))
    (packet,) = list(decoder)
    assert (packet.protocol_level, packet.bridge) == (0x85, False)


def test_props_unchanged_for_a_plain_message() -> None:
    """(guard) Properties of an MQTT 5 message without user properties get only the
    count."""
    _bridge, remote, broker, _ = _connected()
    broker.publish(Message("sensors/t", b"c", 1, False, "p", 0.0,
                           props=MessageProperties(content_type="text/plain")))
    (sent,) = _sent(remote)
    assert sent.properties is not None
    assert sent.properties.content_type == "text/plain"
    assert sent.properties.user_properties == ((HOPS, "1"),)
    assert isinstance(sent.properties, Properties)


def test_a_bridge_gets_no_local_but_not_on_a_shared_subscription() -> None:
    """A client with the bridge flag subscribes: its plain filters are no-local, a
    ``$share/`` one is not (no-local is not allowed there, and the router would have
    skipped that copy for the whole group)."""
    from mqtt_memory import Harness

    from mqttamqp.core.sessions.session import NO_LOCAL
    from mqttamqp.mqtt.packets import Subscribe

    h = Harness()
    c = h.client()
    c.send(Connect("MQTT", 4, "br", True, 0, bridge=True))
    c.send(Subscribe(1, (("plant/#", 1), ("$share/g/plant/#", 1))))
    session = h.broker.sessions["br"]
    assert session.sub_options.get("plant/#", 0) & NO_LOCAL
    assert not session.sub_options.get("$share/g/plant/#", 0) & NO_LOCAL
