"""Mosquitto's bridge flag (CONNECT protocol level 0x84, ``try_private``) through a
gateway process in front of a core process, with raw MQTT clients on loopback: the
bridge's subscriptions are no-local at the core, as when it connects to a broker, so
what it publishes is not sent back to it (a bridge configured in both directions
would otherwise loop)."""

from __future__ import annotations

from collections.abc import Callable

from brokerproc import BrokerProcess
from gateway_proc import uid
from rawclient import RawClient

from mqttamqp.mqtt.packets import Connack, Connect


def _client(port: int, client_id: str, bridge: bool) -> RawClient:
    c = RawClient(port)
    c.send(Connect("MQTT", 4, client_id, True, 60, None, bridge=bridge))
    ack = c.expect(Connack)
    assert isinstance(ack, Connack) and ack.return_code == 0, ack
    return c


def test_a_bridge_does_not_get_its_own_messages_back_through_a_gateway(
        core: BrokerProcess, gateways: Callable[..., BrokerProcess]) -> None:
    """A bridge-flagged client subscribed to what it publishes (QoS 1) gets the next
    message of another client, not its own before it; a plain client on the same
    gateway does get its own, and a subscriber on the core gets both."""
    gw = gateways()
    topic = uid("br")
    bridge = _client(gw.mqtt_port, uid("bridge"), bridge=True)
    plain = _client(gw.mqtt_port, uid("plain"), bridge=False)
    watcher = _client(core.mqtt_port, uid("watch"), bridge=False)
    try:
        assert bridge.subscribe((f"{topic}/#", 1)) == (1,)
        assert plain.subscribe((f"{topic}/#", 1)) == (1,)
        assert watcher.subscribe((f"{topic}/#", 1)) == (1,)
        bridge.publish(f"{topic}/own", b"from-bridge", 1)   # (returns on PUBACK: routed)
        plain.publish(f"{topic}/other", b"from-plain", 1)
        # The core queued the bridge's own message first, had it kept it: the next
        # message the bridge gets is the other client's.
        assert bridge.receive_acked().payload == b"from-plain"
        assert [plain.receive_acked().payload for _ in range(2)] == [b"from-bridge",
                                                                      b"from-plain"]
        assert [watcher.receive_acked().payload for _ in range(2)] == [b"from-bridge",
                                                                        b"from-plain"]
    finally:
        for c in (bridge, plain, watcher):
            c.close()
