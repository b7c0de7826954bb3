"""A bridge stopped (SIGHUP removed or changed it, or the broker stops) lets its
connection go: the producer is unregistered before the close (a TLS transport waits
for it), the keepalive stops, the connection is aborted if it lingers, and nothing
the old connection still reads is taken or acknowledged."""

from __future__ import annotations

from typing import Any

from bridge_remote import TABLE, Remote, accept
from core_broker import connect, make_broker, subscribe
from loglines import LogLines
from twisted.internet.testing import StringTransport

from mqttamqp.bridge.bridge import Bridge
from mqttamqp.bridge.config import BridgeSettings
from mqttamqp.core.limits import Limits
from mqttamqp.mqtt.packets import Disconnect, Pingreq, Publish


class _Transport(StringTransport):
    """Records the order of unregisterProducer / loseConnection / abortConnection."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def unregisterProducer(self) -> None:
        self.calls.append("unregister")
        super().unregisterProducer()

    def loseConnection(self) -> None:
        self.calls.append("lose")
        super().loseConnection()

    def abortConnection(self) -> None:
        self.calls.append("abort")
        super().abortConnection()


class _Remote(Remote):
    def __call__(self, client: Any) -> Any:
        self.attempts += 1
        self.client, self.transport = client, _Transport()
        client.makeConnection(self.transport)
        from twisted.internet.defer import succeed
        return succeed(client)


CLOSE_GRACE = Limits().close_grace


def _connected(**limits: Any) -> tuple[Bridge, _Remote, Any, Any]:
    broker, clock, _ = make_broker(**limits)
    remote = _Remote()
    bridge = Bridge(broker, clock, BridgeSettings.from_table(dict(TABLE)), remote)
    bridge.start()
    accept(remote)
    remote.packets()
    return bridge, remote, broker, clock


def test_stop_unregisters_the_producer_before_closing() -> None:
    """DISCONNECT is sent, then unregisterProducer, then loseConnection."""
    bridge, remote, _, _ = _connected()
    transport = remote.transport
    assert isinstance(transport, _Transport)
    bridge.stop()
    assert transport.calls == ["unregister", "lose"]
    assert transport.producer is None
    assert [type(p) for p in remote.packets()] == [Disconnect]


def test_stop_ends_the_keepalive_and_aborts_a_lingering_connection() -> None:
    """No PINGREQ after the stop; the connection is aborted CLOSE_GRACE s later."""
    bridge, remote, _, clock = _connected()
    transport = remote.transport
    assert isinstance(transport, _Transport)
    bridge.stop()
    remote.packets()
    clock.advance(CLOSE_GRACE)
    assert transport.calls[:3] == ["unregister", "lose", "abort"]
    clock.advance(60.0)
    assert not any(isinstance(p, Pingreq) for p in remote.packets())
    assert not clock.getDelayedCalls()


def test_the_close_grace_is_the_option_counted_and_logged_once() -> None:
    """--close-grace (here 2 s) is the time a stopped bridge's connection has to
    close: still open just before, cut then; counted with the broker's limits
    ($SYS/broker/limits/close_grace) and said in one line."""
    bridge, remote, broker, clock = _connected(close_grace=2.0)
    transport = remote.transport
    assert isinstance(transport, _Transport)
    with LogLines("--close-grace") as lines:
        bridge.stop()
        clock.advance(2.0 - 1e-6)
        assert "abort" not in transport.calls
        clock.advance(2e-6)
    assert transport.calls[:3] == ["unregister", "lose", "abort"]
    assert broker.stats.limits.get("close_grace") == 1 and bridge.close_grace.cut == 1
    assert len(lines) == 1 and "bridge hq" in lines[0] and "2 s" in lines[0], lines


def test_a_connection_that_closes_in_time_is_not_aborted() -> None:
    """A close completed within the grace leaves no timer and no abort."""
    bridge, remote, _, clock = _connected()
    transport = remote.transport
    assert isinstance(transport, _Transport)
    bridge.stop()
    remote.lose()
    clock.advance(CLOSE_GRACE * 2)
    assert "abort" not in transport.calls


def test_a_stopped_connection_brings_nothing_in() -> None:
    """A PUBLISH read after the stop is neither published here nor acknowledged."""
    bridge, remote, broker, _ = _connected()
    local, link, _ = connect(broker, "near")
    subscribe(broker, local, ("commands/#", 1))
    bridge.stop()
    remote.packets()
    remote.send(Publish("commands/late", b"x", 1, False, False, 3))
    assert link.sent == [] and bridge.received == 0
    assert remote.packets() == []


def test_calls_from_a_replaced_client_are_ignored() -> None:
    """PUBLISH, PUBREL and PUBACK handed on by an old client do nothing."""
    bridge, remote, broker, _ = _connected()
    old = remote.client
    assert old is not None
    local, link, _ = connect(broker, "near")
    subscribe(broker, local, ("commands/#", 1))
    bridge.stop()
    remote.packets()
    bridge.remote_publish(old, Publish("commands/late", b"x", 1, False, False, 3))
    bridge.remote_pubrel(old, 4)
    bridge.remote_puback(old, 5)
    assert link.sent == [] and bridge.received == 0
    assert remote.packets() == []
