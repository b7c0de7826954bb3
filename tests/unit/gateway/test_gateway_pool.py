"""The upstream pool on ``task.Clock`` with a fake connector: every slot connects,
the least loaded open connection is picked, a lost or refused connection is retried
with a doubling, bounded back-off, and nothing is picked while none is open."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from mqttamqp.gateway.engine import UpstreamConnection
from mqttamqp.gateway.pool import RETRY_MAX, RETRY_MIN, UpstreamPool
from mqttamqp.gateway.target import Upstream


class Connector:
    """Refuses while ``up`` is False; else connects to a ``StringTransport``."""

    def __init__(self) -> None:
        self.up = True
        self.attempts = 0
        self.conns: list[UpstreamConnection] = []

    def __call__(self, conn: UpstreamConnection) -> Deferred[Any]:
        self.attempts += 1
        if not self.up:
            return fail(ConnectionRefusedError("refused"))
        conn.makeConnection(StringTransport())
        self.conns.append(conn)
        return succeed(conn)


def make(size: int = 2) -> tuple[UpstreamPool, Connector, Clock]:
    clock = Clock()
    connector = Connector()
    pool = UpstreamPool(clock, Upstream("core", 5672, False), connector, size, "gw", 60.0,
                        65536)
    return pool, connector, clock


def test_every_slot_connects_and_sends_the_protocol_header() -> None:
    """start() makes one attempt per slot; each writes AMQP's SASL header first."""
    pool, connector, _ = make(3)
    pool.start()
    assert connector.attempts == 3
    for conn in connector.conns:
        assert conn.transport.value().startswith(b"AMQP\x03\x01\x00\x00")
    assert not pool.up          # (no core answered: not open yet)
    assert pool.pick() is None


def test_pick_prefers_the_given_then_the_least_loaded() -> None:
    """An open connection with the fewest sessions is picked; a takeover's own first."""
    pool, connector, _ = make(2)
    pool.start()
    a, b = connector.conns
    for conn in (a, b):
        conn.open = True
        pool.upstream_open(conn)
    a.sessions[object()] = object()   # type: ignore[assignment]
    assert pool.up
    assert pool.pick() is b
    assert pool.pick(prefer=a) is a


def test_full_connection_is_not_picked() -> None:
    """A connection at the core's channel-max takes no new session."""
    pool, connector, _ = make(1)
    pool.start()
    (a,) = connector.conns
    a.open = True
    a.channel_max = 1
    pool.upstream_open(a)
    a.sessions[object()] = object()   # type: ignore[assignment]
    assert pool.pick() is None


def test_lost_connection_is_retried_with_back_off() -> None:
    """A refused attempt waits RETRY_MIN, then twice that, up to RETRY_MAX; an open
    connection resets the delay."""
    pool, connector, clock = make(1)
    connector.up = False
    pool.start()
    delays = []
    for _ in range(8):
        before = connector.attempts
        call = clock.getDelayedCalls()[0]
        delays.append(call.getTime() - clock.seconds())
        clock.advance(call.getTime() - clock.seconds())
        assert connector.attempts == before + 1
    assert delays[:3] == [RETRY_MIN, RETRY_MIN * 2, RETRY_MIN * 4]
    assert max(delays) == RETRY_MAX
    connector.up = True
    clock.advance(RETRY_MAX)
    conn = connector.conns[-1]
    conn.open = True
    pool.upstream_open(conn)
    conn.connectionLost(Failure(ConnectionDone()))
    assert not pool.up
    (call,) = clock.getDelayedCalls()
    assert call.getTime() - clock.seconds() == RETRY_MIN


def test_stop_cancels_retries() -> None:
    """After stop() no retry is pending and none is made."""
    pool, connector, clock = make(2)
    connector.up = False
    pool.start()
    pool.stop()
    assert clock.getDelayedCalls() == []


def test_a_connection_holds_at_most_max_clients() -> None:
    """--upstream-max-clients: a connection with that many sessions takes no more; with
    every connection full, pick() finds none and counts it."""
    clock = Clock()
    connector = Connector()
    pool = UpstreamPool(clock, Upstream("core", 5672, False), connector, 1, "gw", 60.0,
                        65536, max_clients=2)
    pool.start()
    (a,) = connector.conns
    a.open = True
    pool.upstream_open(a)
    a.sessions[object()] = object()   # type: ignore[assignment]
    assert pool.pick() is a
    a.sessions[object()] = object()   # type: ignore[assignment]
    assert pool.pick() is None
    assert pool.full == 1
