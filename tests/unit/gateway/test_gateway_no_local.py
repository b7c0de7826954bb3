"""Mosquitto's bridge flag through a gateway (issue #29 §1): a bridge-flagged client's
non-shared subscriptions are no-local at the core, as on a broker.  The gateway
carries the option in AMQP_SUBSCRIBE's ``x-opt-mqtt-subscription-options``
annotation, and names the client its PUBLISH sender acts for (attach property
``x-opt-mqtt-client-id``) so the core knows the message is the client's own; on a
gateway wired to the in-memory core (``gateway_memory``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from amqp_memory import Net
from gateway_memory import Gateway

from mqttamqp.amqp.codec.contract import subscription_options
from mqttamqp.amqp.publisher import acting_for
from mqttamqp.core.sessions.session import NO_LOCAL
from mqttamqp.mqtt.packets import Puback, Publish, Suback, Subscribe


def test_a_bridge_gets_nothing_it_published_itself_back() -> None:
    """A bridge-flagged client subscribed to what it publishes does not receive its
    own messages (QoS 0 and 1); another client's messages it does; a plain client on
    the same gateway still gets its own."""
    net = Net()
    gw = Gateway(net)
    bridge = gw.client("br", bridge=True)
    plain = gw.client("pl")
    bridge.send(Subscribe(1, (("b/#", 1),)))
    plain.send(Subscribe(1, (("b/#", 1),)))
    assert bridge.take(Suback) == [Suback(1, (1,))]
    assert plain.take(Suback) == [Suback(1, (1,))]
    bridge.send(Publish("b/own0", b"zero", 0, False, False, None),
                Publish("b/own1", b"one", 1, False, False, 5))
    assert bridge.take(Puback) == [Puback(5)]
    plain.send(Publish("b/other", b"other", 1, False, False, 6))
    assert [m.payload for m in bridge.take(Publish)] == [b"other"]
    assert [m.payload for m in plain.take(Publish)] == [b"zero", b"one", b"other"]
    assert net.broker.sessions["br"].sub_options == {"b/#": 1 | NO_LOCAL}
    assert "b/#" not in net.broker.sessions["pl"].sub_options


def test_a_bridges_shared_subscription_is_not_no_local() -> None:
    """A bridge's $share/ filter carries no no-local option (MQTT 5 forbids it there),
    as the broker subscribes a bridge."""
    net = Net()
    gw = Gateway(net)
    bridge = gw.client("br2", bridge=True)
    bridge.send(Subscribe(1, (("$share/g/s/#", 0), ("s/#", 0))))
    assert bridge.take(Suback) == [Suback(1, (0, 0))]
    assert net.broker.sessions["br2"].sub_options == {"s/#": NO_LOCAL}


def test_subscription_options_annotation_is_read_per_filter() -> None:
    """The core keeps no local and retain as published of each filter's options
    byte, packed with its QoS; none without the annotation; a malformed one is a
    reason to reject."""
    requests = [("a", 1), ("b", 2)]
    key = "x-opt-mqtt-subscription-options"
    assert subscription_options({}, requests) == []
    assert subscription_options({key: {"a": 0x04 | 0x30 | 0x02}}, requests) == [1 | 0x04, 2]
    assert subscription_options({key: {"b": 0x08}}, requests) == [1, 2 | 0x08]
    for bad in ([1], {"a": 300}, {"a": "4"}, {"a": True}):
        assert isinstance(subscription_options({key: bad}, requests), str)


def _host(allowed: bool) -> Any:
    gate = SimpleNamespace(may_use_session=lambda identity, client_id: allowed)
    return SimpleNamespace(broker=SimpleNamespace(gate=gate), identity=None)


def test_a_sender_acts_for_a_client_only_where_its_connection_may() -> None:
    """The attach property names the publisher only when the connection may act on
    that client's session (as for the Subscription Service); else, or without one
    or with one that is not a string, the container stays the publisher."""
    props = {"x-opt-mqtt-client-id": "dev-1"}
    assert acting_for(_host(True), SimpleNamespace(remote_properties=props)) == "dev-1"
    assert acting_for(_host(False), SimpleNamespace(remote_properties=props)) is None
    assert acting_for(_host(True), SimpleNamespace(remote_properties=None)) is None
    assert acting_for(_host(True), SimpleNamespace(
        remote_properties={"x-opt-mqtt-client-id": 7})) is None
