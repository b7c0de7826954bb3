"""The bridge's client on a fake transport and ``task.Clock``: bounded exponential
back-off, CONNECT with Mosquitto's bridge flag, keepalive, and the ``out`` session's
backlog sent in order and resent after a reconnect until the remote's PUBACK."""

from __future__ import annotations

import socket
from typing import Any

from bridge_remote import TABLE, Remote, accept
from core_broker import make_broker, pub
from twisted.internet.defer import Deferred
from twisted.internet.testing import StringTransport

from mqttamqp.bridge.bridge import Bridge
from mqttamqp.bridge.client import Backoff, BridgeClient
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.mqtt.codec import Decoder, encode
from mqttamqp.mqtt.packets import (
    Connack,
    Pingreq,
    Puback,
    Publish,
    Suback,
    Subscribe,
)


def _bridge(**extra: Any) -> tuple[Bridge, Remote, Any, Any]:
    broker, clock, _ = make_broker()
    remote = Remote()
    bridge = Bridge(broker, clock, BridgeSettings.from_table({**TABLE, **extra}), remote)
    return bridge, remote, broker, clock


def test_backoff_doubles_to_its_bound_and_resets() -> None:
    """Delays double from the minimum, stay at the maximum, and start over on reset."""
    b = Backoff(1.0, 8.0)
    assert [b.next() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    b.reset()
    assert b.next() == 1.0


def test_reconnect_waits_with_bounded_backoff_then_resets() -> None:
    """A refused remote is retried after 1, 2, 4, 8, 8 s; a connection that lasted
    max(keepalive, reconnect-max) seconds resets it."""
    bridge, remote, _, clock = _bridge()
    bridge.start()
    assert remote.attempts == 1 and bridge.state == "waiting"
    waits = []
    for _ in range(5):
        before, waited = remote.attempts, 0.0
        while remote.attempts == before:
            clock.advance(0.5)
            waited += 0.5
            assert waited <= 8.0, "no retry within the bound"
        waits.append(waited)
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0]
    remote.up = True
    clock.advance(8.0)
    accept(remote)
    assert bridge.state == "connected"
    clock.advance(10.0)   # (keepalive 10, reconnect-max 8)
    remote.lose()
    assert bridge.state == "waiting"
    before = remote.attempts
    clock.advance(1.0)
    assert remote.attempts == before + 1, "back-off reset after a connection"


def test_connect_carries_the_bridge_flag_and_subscribes_in_rules() -> None:
    """CONNECT is 3.1.1 | 0x80, persistent, client id <hostname>.hq; ``in`` rules are subscribed."""
    bridge, remote, _, _ = _bridge()
    remote.up = True
    bridge.start()
    raw = accept(remote)
    connect = raw[2:]
    # name "MQTT", level 4 | 0x80, flags 0 (clean session 0), keepalive 10, client id
    cid = f"{socket.gethostname()}.hq".encode()
    assert connect == b"\x00\x04MQTT\x84\x00\x00\x0a" + len(cid).to_bytes(2, "big") + cid
    (sub,) = remote.packets()
    assert isinstance(sub, Subscribe) and sub.topics == (("commands/#", 1),)
    remote.send(Suback(sub.packet_id, (1,)))


def test_keepalive_pings_and_drops_a_silent_remote() -> None:
    """PINGREQ every keepalive; a remote silent for 1.5 keepalives is dropped."""
    bridge, remote, _, clock = _bridge(topics=["sensors/# out 1"])
    remote.up = True
    bridge.start()
    accept(remote)
    assert remote.transport is not None
    clock.advance(10)
    assert [type(p) for p in remote.packets()] == [Pingreq]
    clock.advance(10)
    assert remote.transport.disconnecting or remote.transport.disconnected
    remote.lose()
    assert bridge.last_error == "the remote was silent for more than 15 s"


def test_no_connack_is_dropped_after_the_connect_timeout() -> None:
    """A remote that never answers CONNECT is dropped after connect-timeout."""
    bridge, remote, _, clock = _bridge(**{"connect-timeout": 3.0})
    remote.up = True
    bridge.start()
    clock.advance(3.0)
    assert remote.transport is not None and remote.transport.disconnecting


def test_out_backlog_waits_goes_in_order_and_is_resent_until_puback() -> None:
    """Published while the remote is away: sent in order on connect; the unacknowledged
    one goes again (DUP) after a reconnect; a PUBACK removes it."""
    bridge, remote, broker, clock = _bridge(topics=["sensors/# out 1"])
    bridge.start()
    for i in range(3):
        pub(broker, "sensors/t", b"m%d" % i, qos=1)
    session = broker.registry.sessions["$bridge/hq"]
    assert len(session.queue) == 3 and session.connection is None
    remote.up = True
    clock.advance(1.0)
    accept(remote)
    sent = remote.packets()
    assert [(p.topic, p.payload, p.qos, p.dup) for p in sent] == [
        ("sensors/t", b"m%d" % i, 1, False) for i in range(3)]
    remote.send(Puback(sent[0].packet_id))
    remote.send(Puback(sent[1].packet_id))
    remote.lose()
    clock.advance(2.0)   # (the back-off went on: that connection did not last)
    accept(remote)
    (again,) = remote.packets()
    assert isinstance(again, Publish) and (again.payload, again.dup) == (b"m2", True)
    remote.send(Puback(again.packet_id))
    assert not session.inflight and not session.queue


def test_inbound_publish_is_published_here_and_acknowledged() -> None:
    """A QoS 1 message of an ``in`` rule reaches a local subscriber; PUBACK goes back."""
    from core_broker import connect, subscribe

    bridge, remote, broker, _ = _bridge()
    remote.up = True
    bridge.start()
    accept(remote)
    remote.packets()
    local, link, _ = connect(broker, "near")
    subscribe(broker, local, ("commands/#", 1))
    remote.send(Publish("commands/go", b"c1", 1, False, False, 7))
    assert [(t, p) for t, p, *_ in link.sent] == [("commands/go", b"c1")]
    assert [type(p) for p in remote.packets()] == [Puback]



def test_no_client_may_claim_a_bridge_session() -> None:
    """A client connecting as ``$bridge/hq`` may not take the bridge's backlog."""
    from mqttamqp.core.auth import Identity

    _, _, broker, _ = _bridge()
    assert not broker.gate.may_claim(Identity("$bridge/hq"), "$bridge/hq")
    assert broker.gate.may_claim(Identity("other"), "other")


def test_prefixes_map_out_and_in_topics() -> None:
    """With prefixes, ``out`` topics get the remote prefix and ``in`` ones the local."""
    from core_broker import connect, subscribe

    bridge, remote, broker, _ = _bridge(**{
        "topics": ["s/# out 1 site/ hq/", "c/# in 1 site/ hq/"]})
    remote.up = True
    bridge.start()
    accept(remote)
    (sub,) = remote.packets()
    assert sub.topics == (("hq/c/#", 1),)
    pub(broker, "site/s/1", b"x", qos=1)
    (out,) = remote.packets()
    assert out.topic == "hq/s/1"
    local, link, _ = connect(broker, "near")
    subscribe(broker, local, ("site/c/#", 1))
    remote.send(Publish("hq/c/go", b"y", 1, False, False, 9))
    assert [t for t, *_ in link.sent] == ["site/c/go"]


def test_a_refused_puback_is_done_and_counted() -> None:
    """MQTT 5: a PUBACK with a failure code removes the message and is counted."""
    bridge, remote, broker, _ = _bridge(topics=["sensors/# out 1"], protocol="5")
    remote.up = True
    bridge.start()
    assert remote.transport is not None
    remote.transport.clear()
    remote.client.dataReceived(encode(Connack(False, 0), 5))  # type: ignore[union-attr]
    pub(broker, "sensors/t", b"m", qos=1)
    decoder = Decoder(server=True, protocol_level=5)
    decoder.feed(remote.transport.value())
    (sent,) = list(decoder)
    remote.client.dataReceived(encode(Puback(sent.packet_id, 0x87), 5))  # type: ignore[union-attr]
    session = broker.registry.sessions["$bridge/hq"]
    assert bridge.refused == 1 and not session.inflight and not session.queue


def test_stop_while_tcp_connects_cancels_the_attempt() -> None:
    """Stopping while a TCP connect is under way does not raise (stopService went on
    to stop the broker and the store only after it), and a connect that completes
    anyway is dropped: the bridge stays stopped, its session unclaimed."""
    broker, clock, _ = make_broker()
    pending: list[tuple[BridgeClient, Deferred[Any]]] = []

    def connector(client: BridgeClient) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        pending.append((client, d))
        return d

    bridge = Bridge(broker, clock, BridgeSettings.from_table(dict(TABLE)), connector)
    bridge.start()
    bridge.stop()
    client, _ = pending[0]
    client.makeConnection(StringTransport())
    client.dataReceived(encode(Connack(False, 0)))
    assert bridge.state == "stopped" and bridge.session is None
    assert broker.registry.sessions["$bridge/hq"].connection is None


def test_an_expired_out_session_is_subscribed_again_on_connect() -> None:
    """When --session-expiry removed the out session while the remote was away, the
    next connect subscribes it again, so the out direction forwards again."""
    broker, clock, _ = make_broker(session_expiry=60.0)
    remote = Remote()
    bridge = Bridge(broker, clock, BridgeSettings.from_table(dict(TABLE)), remote)
    bridge.start()
    clock.advance(200.0)
    broker.registry.expire()
    remote.up = True
    clock.advance(60.0)
    accept(remote)
    remote.packets()
    assert bridge.session is not None and dict(bridge.session.subscriptions) == {
        "sensors/#": 1}
    pub(broker, "sensors/t", b"again", qos=1)
    assert [p.payload for p in remote.packets() if isinstance(p, Publish)] == [b"again"]


def test_a_live_retained_message_reaches_the_remote_retained() -> None:
    """The out session keeps the retain flag as published (RETAIN_AS_PUBLISHED):
    the remote's retained state follows the local one."""
    bridge, remote, broker, _ = _bridge(topics=["sensors/# out 1"])
    remote.up = True
    bridge.start()
    accept(remote)
    remote.packets()
    pub(broker, "sensors/x", b"v", qos=1, retain=True)
    assert [(p.topic, p.retain) for p in remote.packets() if isinstance(p, Publish)] == [
        ("sensors/x", True)]


def test_an_inbound_message_a_durable_queue_refuses_is_not_acknowledged() -> None:
    """An ``in`` message that a durable queue here refuses (no room for another
    queue) gets no PUBACK: the bridge drops the connection, so the remote keeps it
    and sends it again after the back-off (it was acknowledged and lost before)."""
    broker, clock, _ = make_broker(queue_max_queues=0)
    remote = Remote()
    remote.up = True
    bridge = Bridge(broker, clock, BridgeSettings.from_table(
        {**TABLE, "topics": ["$queue/jobs/# in 1"]}), remote)
    bridge.start()
    accept(remote)
    remote.packets()
    transport = remote.transport
    assert transport is not None
    remote.send(Publish("$queue/jobs/x", b"j1", 1, False, False, 7))
    assert not [p for p in remote.packets() if isinstance(p, Puback)]
    assert transport.disconnecting and bridge.refused_here == 1


def test_sessions_of_removed_bridges_are_held_with_their_backlog() -> None:
    """At start the session of a bridge no longer configured stops queuing but keeps
    its backlog (a forgotten --config must not drop it); one warning names it."""
    from twisted.logger import globalLogPublisher

    from mqttamqp.bridge.service import hold_orphans

    broker, clock, _ = make_broker()
    for name in ("old", "hq"):
        Bridge(broker, clock, BridgeSettings.from_table({**TABLE, "name": name}),
               Remote()).start()
    pub(broker, "sensors/t", b"kept", qos=1)
    assert len(broker.sessions["$bridge/old"].queue) == 1
    lines: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        if "$bridge/old" in str(event.get("c", "")):
            lines.append(str(event["log_format"]))

    globalLogPublisher.addObserver(observe)
    try:
        assert hold_orphans(broker, ["hq"]) == ["$bridge/old"]
    finally:
        globalLogPublisher.removeObserver(observe)
    clock.advance(0)
    old = broker.sessions["$bridge/old"]
    assert not old.subscriptions and len(old.queue) == 1
    assert len(lines) == 1 and "until cleared" in lines[0]
    pub(broker, "sensors/t", b"after", qos=1)
    assert len(old.queue) == 1
    assert len(broker.sessions["$bridge/hq"].queue) == 2


def test_a_bridge_back_under_its_name_resumes_with_its_backlog() -> None:
    """A held session's bridge configured again subscribes anew and sends what was held."""
    from mqttamqp.bridge.service import hold_orphans

    broker, clock, _ = make_broker()
    Bridge(broker, clock, BridgeSettings.from_table(dict(TABLE)), Remote()).start()
    pub(broker, "sensors/t", b"held", qos=1)
    hold_orphans(broker, [])
    remote = Remote()
    remote.up = True
    back = Bridge(broker, clock, BridgeSettings.from_table(dict(TABLE)), remote)
    back.start()
    accept(remote)
    sent = [p for p in remote.packets() if isinstance(p, Publish)]
    assert [p.payload for p in sent] == [b"held"]
    pub(broker, "sensors/t", b"new", qos=1)
    assert [p.payload for p in remote.packets() if isinstance(p, Publish)] == [b"new"]


def test_one_log_line_per_state_change_not_per_attempt() -> None:
    """Attempts failing for the same reason log once ("failing"), counted; a lost
    connection logs "lost"; a new reason logs again."""
    from twisted.logger import formatEvent, globalLogPublisher

    lines: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        text = formatEvent(event)
        if text.startswith("bridge hq to "):
            lines.append(text.split(": ", 1)[1].split(" (", 1)[0])

    globalLogPublisher.addObserver(observe)
    try:
        bridge, remote, _, clock = _bridge()
        bridge.start()
        for _ in range(6):
            before = remote.attempts
            while remote.attempts == before:
                clock.advance(1.0)
        assert lines == ["connecting", "failing"]
        assert bridge.attempts == 7 and bridge.failures == 7
        remote.up = True
        clock.advance(8.0)
        accept(remote)
        remote.lose()
        remote.up = False
        clock.advance(8.0)   # (the back-off at its bound: that connection did not last)
        assert lines == ["connecting", "failing", "connected", "lost", "failing"]
        assert bridge.state == "waiting" and bridge.last_error == "refused"
    finally:
        globalLogPublisher.removeObserver(observe)


def test_bridge_metrics_one_series_per_bridge() -> None:
    """mqttamqp_bridge_* series per bridge: up, messages out, backlog, attempts."""
    from mqttamqp.bridge.service import figures
    from mqttamqp.ops.metrics import BridgeCollector, broker_registry, exposition

    bridge, remote, broker, _ = _bridge(topics=["sensors/# out 1"])
    remote.up = True
    bridge.start()
    accept(remote)
    for i in range(2):
        pub(broker, "sensors/t", b"%d" % i, qos=1)
    registry = broker_registry(broker)
    registry.register(BridgeCollector(lambda: [figures(bridge)]))
    text = exposition(registry).decode()
    for line in ('mqttamqp_bridge_up{bridge="hq"} 1.0',
                 'mqttamqp_bridge_messages_out_total{bridge="hq"} 2.0',
                 'mqttamqp_bridge_backlog_messages{bridge="hq"} 2.0',
                 'mqttamqp_bridge_connect_attempts_total{bridge="hq"} 1.0'):
        assert line in text, line


def test_sys_connection_state_follows_the_bridge() -> None:
    """$SYS/broker/connection/<client id>/state (Mosquitto's notification topic),
    retained: 0 while not connected, 1 once connected, 0 when the connection is lost."""
    from core_broker import connect, subscribe

    bridge, remote, broker, clock = _bridge()
    topic = f"$SYS/broker/connection/{socket.gethostname()}.hq/state"
    bridge.start()
    assert broker.retained.get(topic).payload == b"0"
    local, link, _ = connect(broker, "watcher")
    subscribe(broker, local, ("$SYS/broker/connection/#", 0))
    link.sent.clear()
    remote.up = True
    clock.advance(1.0)
    accept(remote)
    remote.lose()
    assert [(t, p) for t, p, *_ in link.sent] == [(topic, b"1"), (topic, b"0")]
