"""An MQTT bridge's ``in`` message that a durable queue here refuses, on a fake
transport and ``task.Clock``: refused for good (a message an ``x-overflow
reject-publish`` queue can never take) it is acknowledged and dropped (MQTT 5: with
the refusal's reason code and string), counted and logged once a minute; refused
for now (the queue full) the connection is dropped, so that the remote keeps it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from bridge_remote import TABLE, Remote, remote_received
from core_broker import make_broker
from loglines import LogLines

from mqttamqp.bridge.bridge import Bridge
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.bridge.service import figures
from mqttamqp.core.queues.addresses import UNSPECIFIED_ERROR, Refusal
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.packets import (
    Connack,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
)

QUEUE = {"x-max-length-bytes": 4, "x-overflow": "reject-publish"}


def _connected(level: int, props: Properties | None = None
               ) -> tuple[Bridge, Remote, Any, Any]:
    """A bridge with the rule ``$queue/jobs/# in 2`` whose remote (MQTT ``level``)
    accepted it (CONNACK ``props``) and granted the subscription; ``jobs`` holds
    4 payload bytes at most and refuses more (reject-publish)."""
    broker, clock, _ = make_broker()
    broker.exchanges.declare_queue("jobs", "c1", durable=True, arguments=QUEUE)
    remote = Remote()
    remote.up = True
    table = {**TABLE, "topics": ["$queue/jobs/# in 2"]}
    if level == 5:
        table["protocol"] = "5"
    bridge = Bridge(broker, clock, BridgeSettings.from_table(table), remote)
    bridge.start()
    assert remote.client is not None and remote.transport is not None
    remote.transport.clear()
    remote.client.dataReceived(encode(Connack(False, 0, props), level))
    (sub,) = _sent(remote, level)
    assert isinstance(sub, Subscribe)
    remote.client.dataReceived(encode(Suback(sub.packet_id, (2,)), level))
    return bridge, remote, broker, clock


def _sent(remote: Remote, level: int) -> list[Any]:
    return remote_received(remote, level)


def _publish(remote: Remote, level: int, payload: bytes, packet_id: int, qos: int = 1
             ) -> None:
    assert remote.client is not None
    remote.client.dataReceived(encode(
        Publish("$queue/jobs/a", payload, qos, False, False, packet_id), level))


def test_a_message_a_queue_never_takes_is_acknowledged_and_dropped_at_311() -> None:
    """Review finding: the bridge dropped the connection for it and the remote sent
    it first again on every reconnect, for ever.  Now a 3.1.1 remote gets a plain
    PUBACK (PUBREC, then PUBCOMP on its PUBREL, at QoS 2), the connection stays and
    the next message is taken; counted as dropped (in /api/bridges too), one line."""
    bridge, remote, broker, clock = _connected(4)
    transport = remote.transport
    assert transport is not None
    attempts = bridge.attempts
    with LogLines("refused here for good") as lines:
        _publish(remote, 4, b"x" * 10, 1)
        _publish(remote, 4, b"y" * 10, 2, qos=2)
        assert _sent(remote, 4) == [Puback(1), Pubrec(2)]
        assert remote.client is not None
        remote.client.dataReceived(encode(Pubrel(2), 4))
        assert _sent(remote, 4) == [Pubcomp(2)]
        for _ in range(30):   # 30 × 5 s: past reconnect-max many times
            clock.advance(5)
            for packet in _sent(remote, 4):   # (keepalive: answered, nothing else)
                assert isinstance(packet, Pingreq), packet
                remote.client.dataReceived(encode(Pingresp(), 4))
        _publish(remote, 4, b"ok", 3)
        clock.advance(0)
        assert _sent(remote, 4) == [Puback(3)]
    assert not transport.disconnecting and bridge.attempts == attempts
    assert bridge.state == "connected"
    assert bridge.refused_here == bridge.dropped_in == 2
    assert figures(bridge)["dropped_in"] == 2
    assert [m.payload for m in broker.queues.queues["jobs"].log.values()] == [b"ok"]
    assert len(lines) == 1 and "can never take" in lines[0], lines
    assert "acknowledged to the remote, dropped; 1 dropped so far" in lines[0]


def test_an_mqtt5_remote_gets_the_refusal_code_and_reason_string() -> None:
    """An MQTT 5 remote is told why: PUBACK (PUBREC at QoS 2) 0x97 quota exceeded with
    the refusal's reason string; no PUBREL follows a failed PUBREC."""
    bridge, remote, _, _ = _connected(5)
    _publish(remote, 5, b"x" * 10, 1)
    _publish(remote, 5, b"y" * 10, 2, qos=2)
    ack, rec = _sent(remote, 5)
    assert isinstance(ack, Puback) and isinstance(rec, Pubrec)
    assert (ack.packet_id, ack.reason_code, rec.packet_id, rec.reason_code) == (
        1, 0x97, 2, 0x97)
    for p in (ack, rec):
        assert p.properties is not None and p.properties.reason_string is not None
        assert "can never take a message of 10 bytes" in p.properties.reason_string
    assert remote.transport is not None and not remote.transport.disconnecting
    assert bridge.dropped_in == 2


def test_the_reason_string_is_left_out_above_the_remote_maximum_packet_size() -> None:
    """A remote whose maximum packet size would not take the reason string gets the
    reason code alone (MQTT 5 forbids a packet over it)."""
    bridge, remote, _, _ = _connected(5, Properties(maximum_packet_size=40))
    _publish(remote, 5, b"x" * 10, 1)
    (ack,) = _sent(remote, 5)
    assert isinstance(ack, Puback) and ack.reason_code == 0x97
    assert ack.properties is None or ack.properties.reason_string is None
    assert bridge.dropped_in == 1


def test_a_message_refused_for_now_still_drops_the_connection() -> None:
    """A message that waits for room (the queue full: it may pass later) is not
    acknowledged: the connection is dropped so that the remote keeps it, and it is
    not counted as dropped."""
    bridge, remote, _, clock = _connected(5)
    _publish(remote, 5, b"abc", 1)
    clock.advance(0)
    assert _sent(remote, 5) == [Puback(1)]
    _publish(remote, 5, b"ab", 2)
    assert _sent(remote, 5) == []
    assert remote.transport is not None and remote.transport.disconnecting
    assert bridge.refused_here == 1 and bridge.dropped_in == 0


@pytest.mark.parametrize(("n", "size"), [(124, 134), (125, 136)])
@pytest.mark.parametrize("room", [0, -1])
def test_the_reason_string_fits_the_maximum_packet_size_exactly(
        n: int, size: int, room: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review finding: a reason string of 125 bytes and more (property length past
    127: a longer varint) made a PUBACK one byte over the estimate; now the reason
    string is sent exactly when the whole packet fits the remote's maximum."""
    reason = "r" * n
    assert len(encode(Puback(1, 0x80, Properties(reason_string=reason)), 5)) == size
    bridge, remote, broker, _ = _connected(5, Properties(maximum_packet_size=size + room))
    monkeypatch.setattr(broker, "publish", lambda *a, **k: SimpleNamespace(
        refusal=Refusal(UNSPECIFIED_ERROR, reason), blocked=False, congested=(),
        durable=None))
    assert remote.transport is not None
    remote.transport.clear()
    _publish(remote, 5, b"x", 1)
    raw = remote.transport.value()
    (ack,) = _sent(remote, 5)
    assert isinstance(ack, Puback) and ack.reason_code == 0x80
    assert len(raw) <= size + room
    told = ack.properties is not None and ack.properties.reason_string == reason
    assert told == (room == 0)
    assert bridge.dropped_in == 1
