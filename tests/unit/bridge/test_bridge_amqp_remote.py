"""An AMQP 1.0 bridge's connection to the remote (``AmqpRemote``) holding the remote
by its credit, on a fake engine (proton's delivery and link calls recorded): paused,
an answered delivery gives no credit back and the socket is not paused (heartbeats
go on); resumed, the withheld credit goes at once; once dropped, nothing is answered."""

from __future__ import annotations

from typing import Any

import pytest

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


def test_the_open_timer_runs_until_the_links_are_attached(
        remote: tuple[AmqpRemote, list[tuple[str, Any]]]) -> None:
    """The remote opened but never answered the attach: the open timer still drops the
    connection, saying so."""
    r, _ = remote
    r.ready = False
    r._timer = None
    r.conn.reason = "connection lost"  # type: ignore[attr-defined]
    aborted: list[bool] = []
    r.conn.abortConnection = lambda: aborted.append(True)  # type: ignore[attr-defined]
    r.conn.open = True  # type: ignore[misc]
    r._no_open()
    assert aborted and "attach" in r.conn.reason
