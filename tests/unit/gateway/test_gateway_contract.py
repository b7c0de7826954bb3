"""The gateway against the core's own Will and Subscription services, in memory on one
``task.Clock`` (``gateway_memory``): what each MQTT step becomes at the core, read from
the core's sessions and wills and from what MQTT clients of the core receive."""

from __future__ import annotations

from amqp_memory import Net
from gateway_memory import Gateway

from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import (
    Connack,
    Disconnect,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Will,
)


def test_connect_opens_a_persistent_session_at_the_core() -> None:
    """CONNECT with clean session 0: AMQP_LIST opens the session at the core, CONNACK
    says no session present the first time and present the second time."""
    net = Net()
    gw = Gateway(net)
    c = gw.client("dev1", clean=False)
    assert c.connack == Connack(False, 0)
    c.send(Subscribe(1, (("a/b", 1),)))
    assert c.take(Suback) == [Suback(1, (1,))]
    assert net.broker.sessions["dev1"].subscriptions == {"a/b": 1}
    c.drop()
    again = gw.client("dev1", clean=False)
    assert again.connack == Connack(True, 0)


def test_the_will_is_set_and_published_only_on_a_brute_end() -> None:
    """AMQP_WILL at CONNECT; a dropped socket publishes it at the core, a DISCONNECT
    deletes it."""
    net = Net()
    gw = Gateway(net)
    watcher = net.mqtt("watch")
    watcher.subscribe(("w/#", 1))
    polite = gw.client("p", will=Will("w/p", b"bye", 1, False))
    rude = gw.client("r", will=Will("w/r", b"lost", 1, False))
    polite.send(Disconnect())
    polite.proto.connectionLost(None)
    rude.drop()
    net.pump()
    got = watcher.publishes()
    assert [(m.topic, m.payload) for m in got] == [("w/r", b"lost")]


def test_publish_qos1_is_acknowledged_after_the_core_routed_it() -> None:
    """A QoS 1 PUBLISH through the gateway reaches a core subscriber; PUBACK follows."""
    net = Net()
    gw = Gateway(net)
    sub = net.mqtt("sub")
    sub.subscribe(("t/#", 1))
    c = gw.client("pub")
    c.send(Publish("t/1", b"hello", 1, packet_id=5))
    assert c.take(Puback) == [Puback(5)]
    (m,) = sub.publishes()
    assert (m.topic, m.payload, m.qos) == ("t/1", b"hello", 1)


def test_delivery_credit_is_the_clients_flow_control() -> None:
    """With credit 4, the core sends a gateway client at most 4 unacknowledged QoS 1
    messages; each PUBACK lets one more come."""
    net = Net()
    gw = Gateway(net, credit=4)
    c = gw.client("slow")
    c.send(Subscribe(1, (("q/#", 1),)))
    c.take(Suback)
    pub = net.mqtt("p")
    for i in range(10):
        pub.publish("q/x", b"%d" % i, qos=1)
    first = c.take(Publish)
    assert [m.payload for m in first] == [b"0", b"1", b"2", b"3"]
    c.send(Puback(first[0].packet_id))
    more = c.take(Publish)
    assert [m.payload for m in more] == [b"4"]


def test_upstream_lost_closes_clients_and_the_core_fires_their_wills() -> None:
    """The upstream connection dies: its clients are closed, and the core publishes
    their wills (the connection's will links ended brute)."""
    net = Net()
    gw = Gateway(net, connections=1)
    watcher = net.mqtt("watch")
    watcher.subscribe(("w/#", 1))
    c = gw.client("held", will=Will("w/held", b"gone", 1, False))
    gw.wires[0].cut()
    net.pump()
    assert c.proto.rules.closed
    (m,) = watcher.publishes()
    assert (m.topic, m.payload) == ("w/held", b"gone")
    assert not gw.pool.up


def test_qos2_delivery_goes_through_the_release_loop() -> None:
    """A QoS 2 message to a gateway client: PUBREC makes the gateway send AMQP_PUBREL,
    the core's release comes back as PUBREL, PUBCOMP ends it; delivered once."""
    net = Net()
    gw = Gateway(net)
    c = gw.client("q2")
    c.send(Subscribe(1, (("x", 2),)))
    c.take(Suback)
    net.mqtt("p").publish("x", b"once", qos=2)
    (m,) = c.take(Publish)
    assert (m.payload, m.qos) == (b"once", 2)
    c.send(Pubrec(m.packet_id))
    assert c.take(Pubrel) == [Pubrel(m.packet_id)]
    c.send(Pubcomp(m.packet_id))
    assert c.take(Publish, Pubrel) == []


def test_connect_without_upstream_is_server_unavailable() -> None:
    """No upstream connection open: CONNACK 3, and nothing reaches the core."""
    net = Net()
    gw = Gateway(net, connections=1)
    gw.up = False
    gw.wires[0].cut()
    net.pump()
    c = gw.client("nobody")
    assert c.connack == Connack(False, 3)
    assert c.transport.disconnecting
    assert "nobody" not in net.broker.sessions


def test_message_in_flight_to_a_client_that_left_stays_in_its_session() -> None:
    """A QoS 1 message the core sent just as the client said DISCONNECT (it crosses
    the gateway's detach) is not lost: the next connection of the client gets it."""
    net = Net()
    gw = Gateway(net)
    c = gw.client("away", clean=False)
    c.send(Subscribe(1, (("q/1", 1),)))
    c.take(Suback)
    pub = net.mqtt("p")
    pub.proto.dataReceived(encode(Publish("q/1", b"kept", 1, packet_id=1)))  # (not pumped)
    c.proto.dataReceived(encode(Disconnect()))
    c.proto.connectionLost(None)
    for wire in gw.wires:   # the core's transfer reaches the gateway before its detach
        wire.conn.dataReceived(wire.server_side.value())
        wire.server_side.clear()
    net.pump()
    again = gw.client("away", clean=False)
    assert again.connack == Connack(True, 0)
    assert [m.payload for m in again.take(Publish)] == [b"kept"]
