"""The ``out`` direction fitted to an MQTT 5 remote's CONNACK limits, on a fake
transport and ``task.Clock``: maximum packet size (dropped here, counted, no
reconnect), maximum QoS (downgraded, settled here), retain available, topic alias
maximum, receive maximum; and the bridge's own maximum packet size in CONNECT."""

from __future__ import annotations

from typing import Any

from bridge_remote import TABLE, Remote, remote_received
from core_broker import make_broker, pub

from mqttamqp.bridge.bridge import Bridge
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import Connack, Connect, Properties, Puback, Publish, Pubrel


def _connected(props: Properties, topics: list[str] | None = None
               ) -> tuple[Bridge, Remote, Any, Any]:
    """A protocol-5 bridge whose remote accepted it with CONNACK ``props``."""
    broker, clock, _ = make_broker()
    remote = Remote()
    remote.up = True
    bridge = Bridge(broker, clock, BridgeSettings.from_table(
        {**TABLE, "protocol": "5", "topics": topics or ["sensors/# out 1"]}), remote)
    bridge.start()
    assert remote.client is not None and remote.transport is not None
    remote.transport.clear()
    remote.client.dataReceived(encode(Connack(False, 0, props), 5))
    return bridge, remote, broker, clock


def test_connect_announces_the_bridge_maximum_packet_size() -> None:
    """MQTT 5 CONNECT carries this broker's maximum packet size (the remote keeps
    what it could not send, instead of a close and resend loop)."""
    broker, clock, _ = make_broker(max_packet_size=4096)
    remote = Remote()
    remote.up = True
    Bridge(broker, clock, BridgeSettings.from_table({**TABLE, "protocol": "5"}),
           remote).start()
    assert remote.transport is not None
    decoder = Decoder(server=True, protocol_level=5)
    decoder.feed(remote.transport.value())
    (connect,) = list(decoder)
    assert isinstance(connect, Connect) and connect.properties is not None
    assert connect.properties.maximum_packet_size == 4096


def test_a_message_above_the_remote_maximum_packet_size_is_dropped_not_looped() -> None:
    """Too large for the remote: not sent, counted, its entry settled; the next one
    goes and the connection stays up."""
    bridge, remote, broker, clock = _connected(Properties(maximum_packet_size=100))
    pub(broker, "sensors/t", b"x" * 200, qos=1)
    pub(broker, "sensors/t", b"small", qos=1)
    sent = remote_received(remote)
    assert [p.payload for p in sent if isinstance(p, Publish)] == [b"small"]
    assert bridge.link.too_large == 1
    assert remote.transport is not None and not remote.transport.disconnecting
    clock.advance(0)
    session = broker.registry.sessions["$bridge/hq"]
    assert [e.message.payload for e in session.inflight.values()] == [b"small"]


def test_above_the_remote_maximum_qos_is_downgraded_and_settled_here() -> None:
    """Maximum QoS 0 and no retain: a retained QoS 1 message goes at QoS 0 without
    retain, and leaves the session here once written."""
    bridge, remote, broker, clock = _connected(Properties(maximum_qos=0, retain_available=0))
    pub(broker, "sensors/t", b"m", qos=1, retain=True)
    (sent,) = remote_received(remote)
    assert (sent.qos, sent.retain, sent.packet_id) == (0, False, None)
    clock.advance(0)
    session = broker.registry.sessions["$bridge/hq"]
    assert not session.inflight and bridge.link.downgraded == 1 and bridge.link.unretained == 1


def test_qos2_sent_at_qos1_completes_on_the_remote_puback() -> None:
    """Maximum QoS 1: a QoS 2 message goes at QoS 1; the remote's PUBACK completes
    it here, and no PUBREL goes to the remote."""
    _, remote, broker, clock = _connected(Properties(maximum_qos=1),
                                               ["sensors/# out 2"])
    pub(broker, "sensors/t", b"two", qos=2)
    clock.advance(0)   # (the QoS 2 delivery waits for its commit)
    (sent,) = remote_received(remote)
    assert isinstance(sent, Publish) and sent.qos == 1
    assert remote.client is not None
    remote.client.dataReceived(encode(Puback(sent.packet_id), 5))
    clock.advance(0)
    session = broker.registry.sessions["$bridge/hq"]
    assert not session.inflight
    assert not [p for p in remote_received(remote) if isinstance(p, Pubrel)]


def test_topic_aliases_up_to_the_remote_maximum() -> None:
    """Topic alias maximum 1: the first topic gets alias 1 and later goes with an
    empty topic; another topic goes without an alias."""
    _, remote, broker, _ = _connected(Properties(topic_alias_maximum=1))
    for topic in ("sensors/a", "sensors/a", "sensors/b"):
        pub(broker, topic, b"v", qos=0)
    sent = remote_received(remote)
    assert [(p.topic, p.properties.topic_alias if p.properties else None)
            for p in sent] == [("sensors/a", 1), ("", 1), ("sensors/b", None)]


def test_the_remote_receive_maximum_bounds_what_is_in_flight() -> None:
    """Receive maximum 2: two QoS 1 messages in flight, the third after a PUBACK."""
    _, remote, broker, _ = _connected(Properties(receive_maximum=2))
    for i in range(3):
        pub(broker, "sensors/t", b"%d" % i, qos=1)
    first = remote_received(remote)
    assert [p.payload for p in first] == [b"0", b"1"]
    assert remote.client is not None
    remote.client.dataReceived(encode(Puback(first[0].packet_id), 5))
    assert [p.payload for p in remote_received(remote)] == [b"2"]


def test_a_topic_alias_from_the_remote_closes_the_connection() -> None:
    """CONNECT allows the remote no topic alias: a PUBLISH with an empty topic (an
    alias) is a protocol error; nothing is published here."""
    bridge, remote, _, _ = _connected(Properties(), ["cmd/# in 1"])
    assert remote.client is not None and remote.transport is not None
    remote.client.dataReceived(encode(Publish("", b"x", 1, False, False, 5,
                                              Properties(topic_alias=1)), 5))
    assert remote.transport.disconnecting and bridge.received == 0
