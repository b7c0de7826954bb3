"""MQTT 5 with real clients against the real broker: paho-mqtt 2.x (protocol=MQTTv5)
and mosquitto_pub/sub -V mqttv5 with -D properties, plus raw sockets for the reason
codes a library would not provoke.

Waits are event waits with timeouts (``pahoclient``); mosquitto processes are bounded
by -C/-W and a subprocess timeout.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from brokerproc import BrokerProcess
from mosquitto import Sub, pub
from paho.mqtt.packettypes import PacketTypes
from pahoclient import Paho5, props
from rawclient import RawClient, uid

from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
)

# Against a broker and through a gateway in front of one (the folder conftest).
pytestmark = [pytest.mark.timeout(60), pytest.mark.through_gateway]

TIMEOUT = 5.0


@pytest.fixture
def paho5(broker: BrokerProcess) -> Iterator[Any]:
    made: list[Paho5] = []

    def open_client(client_id: str, clean: bool = True, **kw: Any) -> Paho5:
        c = Paho5(broker.mqtt_port, client_id, clean, **kw)
        made.append(c)
        return c

    yield open_client
    for c in made:
        c.stop()


def test_paho_connack_properties_and_assigned_id(paho5: Any) -> None:
    """paho sees the broker's CONNACK properties and an assigned client id."""
    c = paho5("", properties=props(PacketTypes.CONNECT, SessionExpiryInterval=30))
    assert c.rc == 0
    cp = c.connack_properties
    assert cp.AssignedClientIdentifier.startswith("auto-")
    assert cp.ReceiveMaximum >= 1 and cp.TopicAliasMaximum >= 1
    assert not hasattr(cp, "SharedSubscriptionAvailable")   # absent: available


def test_paho_properties_pass_through(paho5: Any) -> None:
    """Content type, response topic, correlation data, payload format, expiry and user
    properties (order and repeats kept) arrive at an MQTT 5 subscriber unchanged."""
    topic = "p5/" + uid()
    sub = paho5(uid("s"))
    assert sub.subscribe((topic, 1)) == [1]
    pub = paho5(uid("p"))
    p = props(PacketTypes.PUBLISH, ContentType="application/json",
              ResponseTopic="reply/" + topic, CorrelationData=b"\x01\x02",
              PayloadFormatIndicator=1, MessageExpiryInterval=300,
              UserProperty=[("b", "1"), ("a", "2"), ("b", "3")])
    pub.publish(topic, b'{"x": 1}', 1, properties=p)
    got = sub.get()
    gp = got.properties
    assert got.payload == b'{"x": 1}'
    assert gp.ContentType == "application/json"
    assert gp.ResponseTopic == "reply/" + topic
    assert gp.CorrelationData == b"\x01\x02"
    assert gp.PayloadFormatIndicator == 1
    assert 0 < gp.MessageExpiryInterval <= 300
    assert gp.UserProperty == [("b", "1"), ("a", "2"), ("b", "3")]


def test_paho_request_response(paho5: Any) -> None:
    """A responder answers on the response topic with the request's correlation data."""
    base = "rr/" + uid()
    responder = paho5(uid("r"))
    responder.subscribe((base + "/req", 1))
    requester = paho5(uid("q"))
    requester.subscribe((base + "/resp", 1))
    requester.publish(base + "/req", b"ping", 1, properties=props(
        PacketTypes.PUBLISH, ResponseTopic=base + "/resp", CorrelationData=b"42"))
    req = responder.get()
    responder.publish(req.properties.ResponseTopic, b"pong", 1, properties=props(
        PacketTypes.PUBLISH, CorrelationData=req.properties.CorrelationData))
    resp = requester.get()
    assert resp.payload == b"pong" and resp.properties.CorrelationData == b"42"


def test_paho_topic_alias(paho5: Any) -> None:
    """paho publishing with a topic alias: the alias alone reaches the right topic."""
    topic = "alias/" + uid()
    sub = paho5(uid("s"))
    sub.subscribe((topic, 0))
    pub = paho5(uid("p"))
    pub.publish(topic, b"1", 1, properties=props(PacketTypes.PUBLISH, TopicAlias=1))
    pub.publish("", b"2", 1, properties=props(PacketTypes.PUBLISH, TopicAlias=1))
    assert [(m.topic, m.payload) for m in (sub.get(), sub.get())] == [
        (topic, b"1"), (topic, b"2")]


def test_paho_session_expiry_resumes_with_queued_message(paho5: Any) -> None:
    """Clean start 0 with a session expiry interval: the session and a QoS 1 message
    queued while away are there on return."""
    cid, topic = uid("x"), "exp/" + uid()
    connect_props = props(PacketTypes.CONNECT, SessionExpiryInterval=60)
    sub = paho5(cid, clean=False, properties=connect_props)
    sub.subscribe((topic, 1))
    sub.disconnect()
    paho5(uid("p")).publish(topic, b"while away", 1)
    back = paho5(cid, clean=False, properties=connect_props)
    assert back.session_present
    assert back.get().payload == b"while away"


# Direct only: restarts the broker (and identifiers do not cross a gateway).
def test_paho_subscription_identifiers_live_and_after_a_restart(
        fresh_broker: BrokerProcess) -> None:
    """paho gets the identifier of each overlapping subscription on a live message,
    and on a message queued while it was away across a restart of the broker."""
    cid, topic = uid("i"), "ids/" + uid()
    connect_props = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    sub = Paho5(fresh_broker.mqtt_port, cid, False, properties=connect_props)
    pub = Paho5(fresh_broker.mqtt_port, uid("p"))
    try:
        sub.subscribe(("ids/#", 1), properties=props(PacketTypes.SUBSCRIBE,
                                                     SubscriptionIdentifier=3))
        sub.subscribe((topic, 1), properties=props(PacketTypes.SUBSCRIBE,
                                                   SubscriptionIdentifier=4))
        pub.publish(topic, b"live", 1)
        live = sub.get()
        assert live.payload == b"live"
        assert sorted(live.properties.SubscriptionIdentifier) == [3, 4]
        sub.disconnect()
        pub.publish(topic, b"queued", 1)    # (its PUBACK waits for the stored copy)
    finally:
        sub.stop()
        pub.stop()
    fresh_broker.stop()
    with BrokerProcess(fresh_broker.data_dir) as restarted:   # (the same data)
        back = Paho5(restarted.mqtt_port, cid, False, properties=connect_props)
        try:
            assert back.session_present
            queued = back.get()
            assert queued.payload == b"queued"
            assert sorted(queued.properties.SubscriptionIdentifier) == [3, 4]
        finally:
            back.stop()


def test_paho_will_with_properties(paho5: Any) -> None:
    """A will's properties are on the published will."""
    topic = "will/" + uid()
    sub = paho5(uid("s"))
    sub.subscribe((topic, 1))
    dying = paho5(uid("d"), will=(topic, b"bye", 1, False), will_properties=props(
        PacketTypes.WILLMESSAGE, ContentType="text/plain", UserProperty=[("why", "test")]))
    dying.lose_socket()
    got = sub.get()
    assert got.payload == b"bye"
    assert got.properties.ContentType == "text/plain"
    assert got.properties.UserProperty == [("why", "test")]


def test_paho_takeover_reason(paho5: Any) -> None:
    """The client taken over is told 0x8E (Session taken over)."""
    cid = uid("t")
    first = paho5(cid)
    paho5(cid)
    assert first.disconnected.wait(TIMEOUT)
    assert first.disconnect_reason.value == 0x8E


def test_paho_shared_subscription(paho5: Any) -> None:
    """MQTT 5 shared subscriptions: each message goes to one member of the group."""
    topic = uid("sh")
    a, b = paho5(uid("sa")), paho5(uid("sb"))
    for c in (a, b):
        assert c.subscribe(("$share/g/" + topic, 1)) == [1]
    p = paho5(uid("sp"))
    for i in range(4):
        p.publish(topic, b"%d" % i, qos=1)
    got = sorted([a.get().payload, a.get().payload, b.get().payload, b.get().payload])
    assert got == [b"0", b"1", b"2", b"3"]


def test_mosquitto_v5_properties(broker: BrokerProcess, subs) -> None:
    """mosquitto_pub -V mqttv5 -D properties reach mosquitto_sub -V mqttv5."""
    topic = "mq5/" + uid()
    s: Sub = subs("mqttv5", "-t", topic, "-C", "1", "-F", "MSG|%t|%C|%R|%P|%p")
    s.wait_subscribed()
    pub(broker, "mqttv5", topic, "-q", "1", "-D", "publish", "content-type", "text/plain",
        "-D", "publish", "response-topic", "r/t", "-D", "publish", "user-property", "k", "v",
        message="hello")
    line = s._line(TIMEOUT)
    while not line.startswith("MSG|"):
        line = s._line(TIMEOUT)
    assert line == f"MSG|{topic}|text/plain|r/t|k:v|hello"
    assert s.finish() == 0


def test_raw_alias_error(sockets) -> None:
    """A topic alias above the maximum closes with DISCONNECT 0x94, after the reason."""
    c: RawClient = sockets(level=5)
    c.send(Connect("MQTT", 5, uid("a"), True, 60))
    assert isinstance(c.recv(), Connack)
    c.send(Publish("t", b"x", properties=Properties(topic_alias=65000)))
    got = c.wait_closed()
    assert isinstance(got[-1], Disconnect) and got[-1].reason_code == 0x94


def test_raw_suback_codes(sockets) -> None:
    """SUBACK codes per filter: granted, 0x8F invalid filter, a shared one granted."""
    c: RawClient = sockets(level=5)
    c.send(Connect("MQTT", 5, uid("b"), True, 60))
    assert isinstance(c.recv(), Connack)
    c.send(Subscribe(3, (("ok/#", 1), ("bad/#/x", 1), ("$share/g/t", 0))))
    assert c.expect(Suback, 3) == Suback(3, (1, 0x8F, 0))


def test_raw_retain_handling(sockets) -> None:
    """Retain handling: 2 sends no retained message, 1 only on a new subscription, 0 on
    every SUBSCRIBE (the next PUBLISH after each SUBACK is the retained one, or the
    client's own live marker when none was sent)."""
    base = "rh/" + uid()
    c: RawClient = sockets(level=5)
    c.send(Connect("MQTT", 5, uid("h"), True, 60))
    assert isinstance(c.recv(), Connack)
    c.send(Publish(base + "/kept", b"kept", 1, True, False, 1))
    c.expect(Puback, 1)
    for pid, (topic_filter, handling, retained) in enumerate([
            (base + "/#", 2, False), (base + "/+", 1, True), (base + "/+", 1, False),
            (base + "/kept", 0, True), (base + "/kept", 0, True)], start=2):
        c.send(Subscribe(pid, ((topic_filter, 0),), options=(handling << 4,)))
        assert isinstance(c.expect(Suback, pid), Suback)
        marker = b"marker %d" % pid
        c.send(Publish(base + "/live", marker, 0, False, False, None))
        got: list[bytes] = []
        while marker not in got:   # (bounded: expect times out)
            packet = c.expect(Publish)
            assert isinstance(packet, Publish)
            got.append(packet.payload)
        assert (b"kept" in got) is retained, (topic_filter, handling, got)


def _subscribe_sees_retained(c: RawClient, pid: int, topic_filter: str, handling: int,
                             live: str) -> bool:
    """SUBSCRIBE ``topic_filter`` with retain handling ``handling``; whether the
    retained ``kept`` came before the client's own live marker on ``live``."""
    c.send(Subscribe(pid, ((topic_filter, 1),), options=(1 | handling << 4,)))
    assert isinstance(c.expect(Suback, pid), Suback)
    marker = b"marker %d" % pid
    c.send(Publish(live, marker, 0, False, False, None))
    got: list[bytes] = []
    while marker not in got:   # (bounded: expect times out)
        packet = c.expect(Publish)
        assert isinstance(packet, Publish)
        got.append(packet.payload)
        if packet.qos:
            c.send(Puback(packet.packet_id))
    return b"kept" in got


def test_raw_retain_handling_1_in_a_resumed_persistent_session(sockets) -> None:
    """Retain handling 1 ("only if the subscription did not exist") in a persistent
    session resumed after a reconnect: the subscription the session kept exists, so
    subscribing to it again sends no retained message; a filter new to the session
    gets it."""
    base = "rh1/" + uid()
    cid = uid("r")
    keep = Properties(session_expiry_interval=300)
    c: RawClient = sockets(level=5)
    c.send(Connect("MQTT", 5, cid, True, 60, properties=keep))
    assert isinstance(c.recv(), Connack)
    c.send(Publish(base + "/kept", b"kept", 1, True, False, 1))
    c.expect(Puback, 1)
    assert _subscribe_sees_retained(c, 2, base + "/+", 1, base + "/live")
    c.send(Disconnect(0))
    c.wait_closed()
    again: RawClient = sockets(level=5)
    again.send(Connect("MQTT", 5, cid, False, 60, properties=keep))
    connack = again.recv()
    assert isinstance(connack, Connack) and connack.session_present
    assert not _subscribe_sees_retained(again, 3, base + "/+", 1, base + "/live")
    assert _subscribe_sees_retained(again, 4, base + "/#", 1, base + "/live")
    again.send(Disconnect(0, Properties(session_expiry_interval=0)))
    again.wait_closed()


def test_raw_takeover_then_disconnect_expires_on_the_new_interval(
        broker: BrokerProcess, sockets) -> None:
    """Issue #24 item 7 on the real broker: CONNECT (expiry 1), an immediate reconnect
    takes over, DISCONNECT (expiry 3): the session expires 3 s after that DISCONNECT,
    not 1 s after the takeover."""
    cid = uid("e")
    expiry_1 = Properties(session_expiry_interval=1)
    old: RawClient = sockets(level=5)
    old.send(Connect("MQTT", 5, cid, False, 60, properties=expiry_1))
    first = old.recv()
    assert isinstance(first, Connack) and not first.session_present
    new: RawClient = sockets(level=5)
    new.send(Connect("MQTT", 5, cid, False, 60, properties=expiry_1))
    second = new.recv()
    assert isinstance(second, Connack) and second.session_present
    got = old.wait_closed()
    assert isinstance(got[-1], Disconnect) and got[-1].reason_code == 0x8E
    start = time.monotonic()
    new.send(Disconnect(0, Properties(session_expiry_interval=3)))
    new.wait_closed()
    line = broker.wait_for_line(rf"session {re.escape(cid)} expired", timeout=15)
    # A lower bound, not a speed: the timer is armed after ``start``.
    assert time.monotonic() - start >= 3.0, line
    assert "session expiry interval 3s" in line


# Direct only: about the core's own shutdown.
def test_paho_told_of_shutdown(fresh_broker: BrokerProcess) -> None:
    """Stopping the broker tells a connected MQTT 5 client 0x8B (Server shutting down)."""
    c = Paho5(fresh_broker.mqtt_port, uid("z"))
    try:
        fresh_broker.stop()
        assert c.disconnected.wait(TIMEOUT)
        assert c.disconnect_reason.value == 0x8B
    finally:
        c.stop()
