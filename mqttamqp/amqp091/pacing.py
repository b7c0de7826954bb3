"""The pace of a 0.9.1 connection: heartbeats both ways on one timer, and when its
socket is read (held while the storage alarm lasts, or while subscribers it fed
through ``amq.topic`` are past their high-water mark), with ``connection.blocked``
and ``unblocked`` for clients that understand them.

What it must not do: decide when the alarm is raised or a subscriber is congested
(the core does), or handle frames.
"""

from __future__ import annotations

from typing import Any

from pamqp import commands
from twisted.logger import Logger

from mqttamqp.amqp091.frames import HEARTBEAT
from mqttamqp.amqp091.handshake import State
from mqttamqp.core.broker import Broker
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.recorder import CAUSE_KEEPALIVE

__all__ = ["Pacing", "short", "FLOW_KEY"]

Conn = commands.Connection
FLOW_KEY = 1 << 48   # (flow control keys: apart from the storage alarm's id() keys)


def short(text: str) -> str:
    """``text`` cut to a short string's 255 bytes of UTF-8 (reply texts quote what
    the client sent)."""
    data = text.encode("utf-8", "replace")
    return text if len(data) <= 255 else data[:255].decode("utf-8", "ignore")


class Pacing:
    """Heartbeats and reading pauses of ``connection.AMQP091Connection``."""

    log: Logger
    transport: Any
    broker: Broker
    clock: Clock
    state: State
    peer: str
    serial: int
    heartbeat: int
    last_in: float
    last_out: float
    blocked_notify: bool
    _blocked_sent: bool
    _timer: DelayedCall | None
    _reason: str
    _cause: str
    reading_paused: set[str]
    channels: dict[int, Any]

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    def _write(self, data: bytes) -> None:
        raise NotImplementedError

    def send_method(self, channel: int, method: Any) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        """Drop a peer that went silent (missed heartbeats, no close-ok in time):
        abortConnection, not loseConnection, which waits for the send buffer to
        drain and so never ends for a peer that stopped reading; its channels end
        at once, what they held goes back to their queues."""
        self._timer = None
        self.state = State.CLOSED
        self.transport.abortConnection()
        for channel in list(self.channels.values()):
            channel.end()
        self.channels.clear()

    # -- heartbeats ----------------------------------------------------------------

    def _arm(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()
        if self.heartbeat and self.state is not State.CLOSED:
            self._timer = self.clock.callLater(self.heartbeat / 2, self._tick)

    def _tick(self) -> None:
        self._timer = None
        now = self.clock.seconds()
        if self.reading_paused:
            self.last_in = now     # (not read: its heartbeats wait in the socket)
        elif now - self.last_in > 2 * self.heartbeat:
            self._reason = f"missed heartbeats from the client for {2 * self.heartbeat}s"
            self._cause = CAUSE_KEEPALIVE
            self.log.info("AMQP 0.9.1 connection from {peer}: {r}; closing", peer=self.peer,
                          r=self._reason)
            self.abort()
            return
        if now - self.last_out >= self.heartbeat / 2:
            self._write(HEARTBEAT)
        self._arm()

    # -- blocked -------------------------------------------------------------------

    def set_blocked(self, reason: str | None) -> None:
        """The durable queues' storage alarm was raised (``reason``) or cleared."""
        if not self.blocked_notify or self.state is not State.OPEN:
            return
        if reason is not None and not self._blocked_sent:
            self._blocked_sent = True
            self.send_method(0, Conn.Blocked(short(reason)))
        elif reason is None and self._blocked_sent:
            self._blocked_sent = False
            self.send_method(0, Conn.Unblocked())

    def hold_reading(self, why: str) -> None:
        if not self.reading_paused:
            self.transport.pauseProducing()
        self.reading_paused.add(why)

    def release_reading(self, why: str) -> None:
        if why not in self.reading_paused:
            return
        self.reading_paused.discard(why)
        if not self.reading_paused and not self.closed:
            self.last_in = self.clock.seconds()
            self.transport.resumeProducing()

    def fed_congested(self, sessions: Any) -> None:
        """A publish into the topic space left subscribers past their high-water
        mark: not read until they drain (or the stall time-out), as MQTT publishers."""
        if "flow" in self.reading_paused:
            return
        self.hold_reading("flow")
        self.broker.pause_until_drained(self.serial | FLOW_KEY,
                                        lambda: self.release_reading("flow"), sessions)
