"""MQTT 5 subscription identifiers of a persistent session's queued message across a
restart of the real broker (its FileStorage data directory): the redelivery carries
the identifiers the message was routed with, not those of the subscriptions the
session has when the broker starts again."""

from __future__ import annotations

from pathlib import Path

from brokerproc import BrokerProcess
from rawclient import RawClient

from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Properties,
    Publish,
    Suback,
    Subscribe,
)

_SESSION = Properties(session_expiry_interval=300)


def _connect(port: int, client_id: str, clean: bool) -> RawClient:
    c = RawClient(port, level=5)
    c.send(Connect("MQTT", 5, client_id, clean, 60, properties=_SESSION))
    ack = c.recv()
    assert isinstance(ack, Connack) and ack.return_code == 0, ack
    return c


def _subscribe(c: RawClient, pid: int, topic_filter: str, sid: int) -> None:
    c.send(Subscribe(pid, ((topic_filter, 1),),
                     properties=Properties(subscription_identifiers=(sid,))))
    c.expect(Suback, pid)


def _ids(p: Publish) -> list[int]:
    return sorted(p.properties.subscription_identifiers) if p.properties else []


def test_redelivery_after_a_restart_keeps_the_identifiers_it_was_routed_with(
        tmp_path: Path) -> None:
    """Routed through a/# (id 1) and sent unacknowledged; the session then
    subscribes a/b (id 2) and the broker restarts: the DUP redelivery carries [1]."""
    broker = BrokerProcess(str(tmp_path / "data")).start()
    clients: list[RawClient] = []
    try:
        sub = _connect(broker.mqtt_port, "sid-sub", clean=True)
        clients.append(sub)
        _subscribe(sub, 1, "a/#", 1)
        pub = _connect(broker.mqtt_port, "sid-pub", clean=True)
        clients.append(pub)
        pub.publish("a/b", b"m", qos=1)   # PUBACK: the queued entry is stored
        first = sub.receive()
        assert (first.payload, first.dup, _ids(first)) == (b"m", False, [1])
        _subscribe(sub, 2, "a/b", 2)
        sub.send(Disconnect())
        sub.wait_closed()
        broker.stop()
        broker = BrokerProcess(str(tmp_path / "data")).start()
        again = _connect(broker.mqtt_port, "sid-sub", clean=False)
        clients.append(again)
        back = again.receive()
        assert (back.payload, back.dup, _ids(back)) == (b"m", True, [1])
    finally:
        for c in clients:
            c.close()
        broker.stop()
