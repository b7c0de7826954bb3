"""The gateway's few AMQP connections to its core, shared by all its MQTT clients.

What it owns: ``--upstream-connections`` slots, each an ``UpstreamConnection`` kept
open (one attempt at a time per slot, a bounded exponential back-off between
attempts: ``adapter.backoff.Backoff``), the pick of a connection for a new client (the
one it had, on a takeover, else the least loaded with a session to spare), and one
log line per state change of a slot (up; down with the reason; the first failed
attempt of a spell).  ``up``: whether any connection is open (CONNECTs are refused
with "server unavailable" otherwise).

What it must not do: know MQTT or the contract (``frontend``, ``channel``), or close
clients itself: a connection that ends tells its channels, and they their clients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.adapter.backoff import Backoff
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.gateway.engine import UpstreamConnection
from mqttamqp.gateway.target import Upstream

__all__ = ["UpstreamPool", "Connector", "RETRY_MIN", "RETRY_MAX"]

# Connect one ``UpstreamConnection``: fires once the socket is connected (or fails).
Connector = Callable[[UpstreamConnection], "Deferred[Any]"]

RETRY_MIN = 0.5    # seconds before the first retry; doubled up to RETRY_MAX
RETRY_MAX = 15.0


class _Slot:
    __slots__ = ("attempts", "backoff", "conn", "down_logged", "index", "last_error", "opens",
                 "retry", "since", "state")

    def __init__(self, index: int) -> None:
        self.index = index
        self.conn: UpstreamConnection | None = None
        self.backoff = Backoff(RETRY_MIN, RETRY_MAX)
        self.retry: DelayedCall | None = None
        self.state = "idle"      # idle, connecting, open, waiting
        self.attempts = 0        # failed attempts since the slot was last open
        self.down_logged = False
        self.last_error = ""     # why it last went down, or could not connect
        self.opens = 0           # times it was open (reconnects: opens - 1)
        self.since = 0.0         # when it was last open


class UpstreamPool:
    """``size`` connections to ``upstream``, each reconnected when it ends."""

    log: ClassVar[Logger] = Logger()

    def __init__(self, clock: Clock, upstream: Upstream, connector: Connector, size: int,
                 container_id: str, idle_timeout: float, max_frame_size: int,
                 max_clients: int = 150) -> None:
        self.clock = clock
        self.max_clients = max_clients   # per connection (--upstream-max-clients)
        self.full = 0                    # clients refused: every open connection full
        self.upstream = upstream
        self.connector = connector
        self.container_id = container_id
        self.idle_timeout = idle_timeout
        self.max_frame_size = max_frame_size
        self.slots = [_Slot(i) for i in range(max(1, size))]
        self.stopping = False
        self.connects = 0          # connections opened, over the run
        self.losses = 0            # connections that ended, over the run

    @property
    def up(self) -> bool:
        return any(s.state == "open" for s in self.slots)

    def start(self) -> None:
        self.stopping = False
        for slot in self.slots:
            self._attempt(slot)

    def stop(self) -> None:
        self.stopping = True
        for slot in self.slots:
            if slot.retry is not None and slot.retry.active():
                slot.retry.cancel()
            slot.retry = None
            if slot.conn is not None:
                slot.conn.close("the gateway stops")

    def pick(self, prefer: UpstreamConnection | None = None) -> UpstreamConnection | None:
        """The connection a new client's session goes on, or None: none is open (or
        every one is at the core's channel-max)."""
        if prefer is not None and prefer.has_room:
            return prefer
        best: UpstreamConnection | None = None
        for slot in self.slots:
            conn = slot.conn
            if conn is not None and slot.state == "open" and conn.has_room and (
                    best is None or conn.load < best.load):
                best = conn
        if best is None and self.up:
            self.full += 1
            if self.full == 1 or self.full % 1000 == 0:
                self.log.warn("every upstream connection holds its most clients "
                              "(--upstream-max-clients {m}, or the core's channel-max): "
                              "CONNECT refused with server unavailable ({n} so far)",
                              m=self.max_clients, n=self.full)
        return best

    # -- the connect loop ---------------------------------------------------------------

    def _attempt(self, slot: _Slot) -> None:
        slot.retry = None
        if self.stopping:
            return
        slot.state = "connecting"
        conn = UpstreamConnection(self, self.clock, self.upstream,
                                  f"{self.container_id}/{slot.index}", self.idle_timeout,
                                  self.max_frame_size, self.max_clients)
        slot.conn = conn
        d = self.connector(conn)
        d.addErrback(self._not_connected, slot, conn)

    def _not_connected(self, failure: Failure, slot: _Slot, conn: UpstreamConnection) -> None:
        if slot.conn is conn:
            self._down(slot, f"cannot connect: {failure.getErrorMessage()}")

    def _slot_of(self, conn: UpstreamConnection) -> _Slot | None:
        for slot in self.slots:
            if slot.conn is conn:
                return slot
        return None

    def upstream_open(self, conn: UpstreamConnection) -> None:
        slot = self._slot_of(conn)
        if slot is None:
            return
        slot.state = "open"
        self.connects += 1
        slot.opens += 1
        slot.since = self.clock.seconds()
        after = f" after {slot.attempts} failed attempts" if slot.attempts else ""
        slot.attempts = 0
        slot.down_logged = False
        slot.backoff.reset()
        self.log.info("upstream connection {i} to {u} is open{after} (the core allows "
                      "{n} sessions on it)", i=slot.index, u=self.upstream.display,
                      after=after, n=conn.channel_max)

    def upstream_lost(self, conn: UpstreamConnection, reason: str) -> None:
        slot = self._slot_of(conn)
        if slot is not None:
            self._down(slot, reason)

    def _down(self, slot: _Slot, reason: str) -> None:
        was_open = slot.state == "open"
        slot.conn = None
        slot.last_error = reason
        if was_open:
            self.losses += 1
        slot.attempts += 0 if was_open else 1
        if self.stopping:
            slot.state = "idle"
            return
        slot.state = "waiting"
        delay = slot.backoff.next()
        if was_open or not slot.down_logged:
            self.log.warn("upstream connection {i} to {u} is down: {r}; retrying in {d:g} s "
                          "(and with back-off up to {m:g} s)", i=slot.index,
                          u=self.upstream.display, r=reason, d=delay, m=RETRY_MAX)
            slot.down_logged = True
        slot.retry = self.clock.callLater(delay, self._attempt, slot)
