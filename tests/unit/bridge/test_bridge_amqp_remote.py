"""An AMQP 1.0 bridge's connection to the remote (``AmqpRemote``) holding the remote
by its credit, on a fake engine (proton's delivery and link calls recorded): paused,
an answered delivery gives no credit back and the socket is not paused (heartbeats
go on); resumed, the withheld credit goes at once; once dropped, nothing is answered.
The QoS 0 backlog's count against two real in-memory proton engines."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
from amqp_messages import pump_transports

import mqttamqp.bridge.amqp as amqp
from mqttamqp.bridge.amqp import ACCEPTED, AmqpRemote


class FakeConn:
    """The ``UpstreamConnection`` parts ``answer`` uses; a transport that records a
    pause."""

    def __init__(self) -> None:
        self.ptrans = object()
        self.flushed = 0
        self.transport = self
        self.paused = False

    def flush(self) -> None:
        self.flushed += 1

    def pauseProducing(self) -> None:
        self.paused = True


@pytest.fixture
def remote(monkeypatch: pytest.MonkeyPatch) -> tuple[AmqpRemote, list[tuple[str, Any]]]:
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(amqp, "delivery_settled", lambda dlv: False)
    monkeypatch.setattr(amqp, "delivery_update", lambda dlv, s: calls.append(("update", dlv)))
    monkeypatch.setattr(amqp, "delivery_settle", lambda dlv: calls.append(("settle", dlv)))
    monkeypatch.setattr(amqp, "link_flow", lambda impl, n: calls.append(("flow", (impl, n))))
    r = AmqpRemote.__new__(AmqpRemote)
    r.conn = FakeConn()  # type: ignore[assignment]
    r.paused_for = set()
    r.owed = {}
    r.detached = False
    return r, calls


def test_paused_the_credit_is_withheld_and_given_back_on_resume(
        remote: tuple[AmqpRemote, list[tuple[str, Any]]]) -> None:
    """While paused the deliveries are settled but no credit goes back, and the socket
    is still read; on resume the withheld credit goes per receiver."""
    r, calls = remote
    r.pause_reading("congestion")
    r.answer("d1", "rx", ACCEPTED)
    r.answer("d2", "rx", ACCEPTED)
    assert ("settle", "d2") in calls and not [c for c in calls if c[0] == "flow"]
    assert not r.conn.paused  # type: ignore[attr-defined]
    r.resume_reading("congestion")
    assert [c for c in calls if c[0] == "flow"] == [("flow", ("rx", 2))]


def test_after_a_drop_nothing_is_answered(
        remote: tuple[AmqpRemote, list[tuple[str, Any]]]) -> None:
    """Once the connection is dropped (or a link detached) ``answer`` touches no
    delivery or link: proton may have freed them."""
    r, calls = remote
    r.conn.reason = "connection lost"  # type: ignore[attr-defined]
    r.conn.transport = None  # type: ignore[assignment]
    r.drop("the remote detached x")
    r.answer("d1", "rx", ACCEPTED)
    assert calls == []


def test_a_failed_connect_leaves_no_timer() -> None:
    """A connect that fails leaves only the bridge's next attempt on the clock (the
    remote's open timer is cancelled with it)."""
    from core_broker import make_broker
    from twisted.internet.defer import fail

    from mqttamqp.bridge.amqp import AmqpBridge
    from mqttamqp.bridge.config import BridgeSettings

    broker, clock, _ = make_broker()
    settings = BridgeSettings.from_table({"name": "hq", "address": "amqp://127.0.0.1:1",
                                          "topics": ["out/# out 1"]})
    bridge = AmqpBridge(broker, clock, settings,
                        lambda client: fail(ConnectionRefusedError("refused")))
    bridge.start()
    assert bridge.state == "waiting"
    calls = [c for c in clock.getDelayedCalls() if c.active()]
    assert [c.func for c in calls] == [bridge._attempt], calls
    bridge.stop()


class _FakeLink:
    """A proton link as ``upstream_open`` sets it up (its termini, modes, open)."""

    SND_MIXED = RCV_FIRST = 0

    def __init__(self, name: str) -> None:
        self.name = name
        self.source = SimpleNamespace(address=None)
        self.target = SimpleNamespace(address=None)
        self._impl = object()

    def open(self) -> None:
        pass

    def flow(self, n: int) -> None:
        pass


class _OpenedConn(FakeConn):
    """An ``UpstreamConnection`` whose remote opened: ``begin`` gives a session that
    makes fake links; the remote never answers their attach."""

    def __init__(self) -> None:
        super().__init__()
        self.reason = "connection lost"
        self.aborted = False

    def begin(self, owner: Any) -> Any:
        return SimpleNamespace(sender=_FakeLink, receiver=_FakeLink)

    def register(self, link: Any, owner: Any) -> None:
        pass

    def abortConnection(self) -> None:
        self.aborted = True


def test_the_open_timer_runs_until_the_links_are_attached() -> None:
    """The remote opened (``upstream_open``) but never answered the attach: twice the
    connect-timeout later the open timer drops the connection, saying so."""
    from core_broker import make_broker
    from twisted.internet.defer import Deferred

    from mqttamqp.bridge.amqp import AmqpBridge
    from mqttamqp.bridge.config import BridgeSettings

    broker, clock, _ = make_broker()
    settings = BridgeSettings.from_table({"name": "hq", "address": "amqp://127.0.0.1:1",
                                          "topics": ["out/# out 1", "in/# in 1"],
                                          "connect-timeout": 5.0})
    bridge = AmqpBridge(broker, clock, settings, lambda client: Deferred())
    bridge.start()
    r = bridge.client
    conn = r.conn = _OpenedConn()
    r.upstream_open(conn)
    assert not r.ready and not conn.aborted
    clock.advance(9.9)
    assert not conn.aborted
    clock.advance(0.2)
    assert conn.aborted and "attach" in conn.reason


class _Engines:
    """Our proton client engine and a remote server engine, in memory: a sender to
    the null address on ours, the remote's receiver attached with no credit yet."""

    def __init__(self) -> None:
        from proton import Collector, Connection, Event, Transport

        self.ours, self.theirs = Connection(), Connection()
        self.t, self.st = Transport(), Transport(Transport.SERVER)
        self.t.bind(self.ours)
        self.st.bind(self.theirs)
        self.col, tcol = Collector(), Collector()
        self.ours.collect(self.col)
        self.theirs.collect(tcol)
        self.ours.open()
        self.theirs.open()
        session = self.ours.session()
        session.open()
        self.sender = session.sender("out")
        self.sender.target.address = None
        self.sender.open()
        self.pump()
        self.receiver: Any = None
        for _ in range(100):   # (bounded: the handful of events of one attach)
            e = tcol.peek()
            if e is None:
                break
            if e.type == Event.SESSION_REMOTE_OPEN:
                e.session.open()
            if e.type == Event.LINK_REMOTE_OPEN:
                e.link.target.copy(e.link.remote_target)
                e.link.open()
                self.receiver = e.link
            tcol.pop()
        self.pump()
        while self.col.peek() is not None:
            self.col.pop()

    def pump(self) -> None:
        pump_transports(self.t, self.st)


def test_qos0_backlog_is_out_of_the_count_once_proton_wrote_it() -> None:
    """Three QoS 0 messages sent without credit count as the link's backlog; once the
    remote's flow lets them go and our output is written, the backlog is 0 (it was
    reduced only on the next flow)."""
    from proton import Event

    from mqttamqp.bridge.amqp import AmqpLink

    e = _Engines()
    r = AmqpRemote.__new__(AmqpRemote)
    r.sender_impl = e.sender._impl
    r.unsent = 0
    r._unsent = deque()
    drained: list[object] = []
    r.bridge = SimpleNamespace(client_drained=drained.append)  # type: ignore[assignment]
    link = AmqpLink(SimpleNamespace())
    link.remote = r
    for i in range(3):   # (as ``send`` does without credit)
        d = e.sender.delivery(b"%d" % i)
        e.sender.send(b"x" * 100)
        e.sender.advance()
        d.settle()
        r.unsent += 100
        r._unsent.append(100)
    assert link.backlog_bytes == 300
    e.receiver.flow(10)
    n = e.st.pending()   # (the flow frame in: input only, as dataReceived pushes it)
    e.t.push(e.st.peek(n))
    e.st.pop(n)
    for _ in range(100):
        event = e.col.peek()
        if event is None:
            break
        if event.type == Event.LINK_FLOW:
            r.on_flow(e.sender._impl)
        e.col.pop()
    assert drained == [r]
    e.t.pending()   # (our output written: the three are on the wire)
    assert link.backlog_bytes == 0


def test_qos0_without_credit_is_bounded_by_congested_qos0_bytes() -> None:
    """While the remote grants no credit, the QoS 0 messages ``AmqpRemote.send`` hands
    to proton count (encoded) as the link's backlog: past the congested QoS 0 bound the
    rest are dropped and counted; once the remote's credit lets them go, it is 0."""
    from test_bridge_amqp_settle import _connected

    from mqttamqp.bridge.link import RemoteLimits
    from mqttamqp.core.message import Message

    e = _Engines()
    bridge, _, broker, _ = _connected({"congested_qos0_bytes": 1000},
                                      topics=["out/# out 0"])
    r = AmqpRemote.__new__(AmqpRemote)
    r.conn = FakeConn()  # type: ignore[assignment]
    r.bridge = bridge
    r.sender_impl = e.sender._impl
    r.unsent, r._unsent, r.max_message, r.waiting = 0, deque(), 0, {}
    bridge._client = r
    bridge.link.attach(r, RemoteLimits(None))
    for i in range(100):
        broker.publish(Message(f"out/{i}", b"x" * 100, 0, False, "p", 0.0))
    sent = e.sender.queued   # (handed to proton, waiting for credit)
    assert 0 < sent < 20 and bridge.link.backlog_bytes == r.unsent >= 1000
    assert bridge.session is not None and bridge.session.dropped_congested == 100 - sent
    e.receiver.flow(100)
    e.pump()   # (the flow in, our output out: the queued messages are on the wire)
    assert bridge.link.backlog_bytes == 0


def test_a_sent_message_is_tagged_with_its_packet_id_or_the_settled_tag() -> None:
    """``AmqpRemote.send`` tags an unsettled delivery with its packet id's digits and a
    pre-settled one with "s" (ready tags, ``rawproton``), and the remote reads each."""
    from mqttamqp.core.message import Message

    e = _Engines()
    r = AmqpRemote.__new__(AmqpRemote)
    r.conn = FakeConn()  # type: ignore[assignment]
    r.sender_impl = e.sender._impl
    r.unsent, r._unsent, r.max_message, r.waiting = 0, deque(), 0, {}
    e.receiver.flow(10)
    e.pump()
    for packet_id in (7, None, 65535):
        message = Message("t", b"x", 0 if packet_id is None else 1, False, "p", 0.0)
        assert r.send("t", message, message.qos, False, False, 1, packet_id, 0.0) == 0
    e.pump()
    tags = []
    for _ in range(3):
        dlv = e.receiver.current
        tags.append((dlv.tag, dlv.settled))
        e.receiver.advance()
    assert tags == [("7", False), ("s", True), ("65535", False)]
    assert sorted(r.waiting.values()) == [7, 65535]
