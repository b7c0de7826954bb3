"""An AMQP 1.0 bridge's settlement of its out session, on a fake remote, an in-memory
broker and ``task.Clock``: accepted ends an entry, rejected drops it (counted, logged
once a minute per cause), released sends it again after ``reconnect-min``; no credit
from the remote holds the session, a flow lets it go on; the ``amqp://`` table."""

from __future__ import annotations

from typing import Any

import pytest
from core_broker import make_broker
from twisted.internet.defer import Deferred
from twisted.logger import globalLogPublisher

from mqttamqp.bridge.amqp import ACCEPTED, REJECTED, RELEASED, AmqpBridge, AmqpLink
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.core.message import Message
from mqttamqp.ops.config import TableKeyError

TABLE = {"name": "hq", "address": "amqp://127.0.0.1:5672", "topics": ["out/# out 1"],
         "reconnect-min": 2.0}


class FakeRemote:
    """What the bridge uses of an ``AmqpRemote``: what was sent, and the credit."""

    container = "fake"

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, int | None, bool]] = []
        self.no_credit = False
        self.paused_for: set[str] = set()
        self.dropped: str | None = None
        self.answers: list[tuple[Any, int]] = []

    def send(self, address: str, message: Message, qos: int, retain: bool, dup: bool,
             hops: int, packet_id: int | None, now: float) -> None:
        self.sent.append((address, message.payload, packet_id, dup))

    def drop(self, reason: str) -> None:
        self.dropped = reason

    def answer(self, dlv: Any, impl: Any, state: int) -> None:
        self.answers.append((dlv, state))

    def disconnect(self) -> None:
        pass


def _connected(limits: dict[str, Any] | None = None, **table: Any
               ) -> tuple[AmqpBridge, FakeRemote, Any, Any]:
    broker, clock, _ = make_broker(**(limits or {}))
    settings = BridgeSettings.from_table({**TABLE, **table})
    bridge = AmqpBridge(broker, clock, settings, lambda client: Deferred())
    bridge.start()
    remote = FakeRemote()
    bridge._client = remote
    bridge.links_ready(remote)
    return bridge, remote, broker, clock


def _publish(broker: Any, n: int) -> None:
    for i in range(n):
        broker.publish(Message(f"out/{i}", str(i).encode(), 1, False, "p", 0.0))


def test_accepted_ends_the_entry_and_the_remote_address_is_mapped() -> None:
    """A QoS 1 message goes unsettled to remote-prefix + topic; the remote's accepted
    takes it out of the session."""
    bridge, remote, broker, _ = _connected(topics=['out/# out 1 "" far/'])
    _publish(broker, 1)
    assert [(a, p) for a, p, _, _ in remote.sent] == [("far/out/0", b"0")]
    packet_id = remote.sent[0][2]
    assert packet_id is not None and bridge.session is not None
    assert packet_id in bridge.session.inflight
    bridge.outcome(remote, packet_id, ACCEPTED, "")
    assert not bridge.session.inflight and bridge.sent == 1


def test_rejected_drops_counts_and_logs_once_per_cause() -> None:
    """Two messages rejected for the same cause: both leave the session, both are
    counted, one line is logged."""
    bridge, remote, broker, _ = _connected()
    lines: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        if "the remote rejected a message" in str(event.get("log_format", "")):
            lines.append(str(event["log_format"]))

    globalLogPublisher.addObserver(observe)
    try:
        _publish(broker, 2)
        for _, _, packet_id, _ in list(remote.sent):
            bridge.outcome(remote, packet_id, REJECTED,
                           "amqp:unauthorized-access: no")
    finally:
        globalLogPublisher.removeObserver(observe)
    assert bridge.session is not None and not bridge.session.inflight
    assert bridge.refused == 2 and len(lines) == 1


def test_released_is_sent_again_after_reconnect_min() -> None:
    """Released: the entry stays in flight and goes again (DUP) once reconnect-min has
    passed, not before."""
    bridge, remote, broker, clock = _connected()
    _publish(broker, 1)
    packet_id = remote.sent[0][2]
    bridge.outcome(remote, packet_id, RELEASED, "")
    assert len(remote.sent) == 1
    clock.advance(1.9)
    assert len(remote.sent) == 1
    clock.advance(0.2)
    assert remote.sent[1] == ("out/0", b"0", packet_id, True)
    assert isinstance(bridge.link, AmqpLink) and bridge.link.released == 1
    assert bridge.session is not None and packet_id in bridge.session.inflight


def test_no_credit_holds_the_session_until_a_flow() -> None:
    """Without credit from the remote nothing more is sent; the remote's flow (drained)
    lets the queued messages go, in order."""
    bridge, remote, broker, _ = _connected()
    remote.no_credit = True
    _publish(broker, 3)
    held = len(remote.sent)
    assert held == 0, remote.sent
    remote.no_credit = False
    bridge.client_drained(remote)
    assert [p for _, p, _, _ in remote.sent] == [b"0", b"1", b"2"]


def test_the_amqp_table() -> None:
    """amqp:// and amqps:// are read (default ports 5672 and 5671; TLS keys only with
    amqps://; ``credit`` 1 to 10000, 100 by default); a path is refused."""
    plain = BridgeSettings.from_table(TABLE)
    assert plain.amqp and not plain.tls and plain.port == 5672 and plain.credit == 100
    with pytest.raises(TableKeyError, match="credit"):
        BridgeSettings.from_table({**TABLE, "credit": 0})
    tls = BridgeSettings.from_table({**TABLE, "address": "amqps://core.example",
                                     "server-name": "core"})
    assert tls.amqp and tls.tls and tls.port == 5671
    with pytest.raises(TableKeyError, match="server-name"):
        BridgeSettings.from_table({**TABLE, "server-name": "core"})
    with pytest.raises(TableKeyError, match="address"):
        BridgeSettings.from_table({**TABLE, "address": "amqp://h/queue"})


def test_figures_name_the_amqp_remote() -> None:
    """The Bridges page's figures say AMQP 1.0 (not an MQTT version) and count what
    the remote released."""
    from mqttamqp.bridge.service import figures

    bridge, remote, broker, _ = _connected()
    _publish(broker, 1)
    bridge.outcome(remote, remote.sent[0][2], RELEASED, "")
    f = figures(bridge)
    assert f["protocol"] == "AMQP 1.0" and f["released"] == 1 and f["state"] == "connected"


def test_an_in_message_above_max_packet_size_is_rejected_and_counted() -> None:
    """An in message larger than --max-packet-size is rejected to the remote (not
    published here), counted as too large."""
    bridge, remote, _, _ = _connected({"max_packet_size": 64}, topics=["in/# in 1"])
    bridge.remote_message(remote, bridge.in_rules[0], "dlv", "impl", b"x" * 65)
    assert remote.answers == [("dlv", REJECTED)]
    assert bridge.too_large_in == 1 and bridge.received == 0
