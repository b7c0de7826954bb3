"""One gateway client's timer: the CONNECT deadline, then the keepalive check
(``mqtt.connection.Keepalive``'s rule: silent for 1.5 × keepalive is gone), then,
once the gateway closes the client, the grace it has to read what is left
(``--close-grace``: ``adapter.grace.CloseGrace``).

What it owns: the one delayed call a client has at a time, on the injected clock.
What it must not do: decide what a deadline means (the frontend is called back).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mqttamqp.adapter.grace import CloseGrace
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.mqtt.connection import Keepalive

__all__ = ["ClientTimer"]


class ClientTimer:
    __slots__ = ("_call", "clock")

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._call: DelayedCall | None = None

    def start(self, seconds: float, fire: Callable[[], None]) -> None:
        """Call ``fire`` in ``seconds`` (replacing what was armed)."""
        self.cancel()
        self._call = self.clock.callLater(seconds, self._fired, fire)

    def _fired(self, fire: Callable[[], None]) -> None:
        self._call = None
        fire()

    def lose(self, transport: Any, grace: CloseGrace, who: str,
             at_once: bool = False) -> None:
        """Close a client after what is written.  A registered producer is resumed,
        not closed, once the buffer drains: it is unregistered first, and a client
        that does not read what is left is cut after ``grace`` (``--close-grace``;
        ``at_once``, or 0: now), replacing what was armed."""
        self.cancel()
        transport.unregisterProducer()
        if at_once or grace.seconds <= 0:
            transport.abortConnection()
        else:
            transport.loseConnection()
            self._call = grace.arm(transport, who)

    def keepalive(self, rule: Keepalive, last_activity: Callable[[], float],
                  expired: Callable[[str], None], paused: Callable[[], bool]) -> None:
        """Check now and again at the next point the client may have gone silent;
        ``expired`` with the reason once it has.  While ``paused()`` (the client is not
        read: flow control) its silence is the gateway's: a full period later."""
        self.cancel()
        now = self.clock.seconds()
        wait = rule.next_check(now, last_activity(), paused())
        if wait is None:
            expired(rule.expired_reason(now, last_activity()))
            return
        self._call = self.clock.callLater(wait, self.keepalive, rule, last_activity, expired,
                                          paused)

    def cancel(self) -> None:
        call, self._call = self._call, None
        if call is not None and call.active():
            call.cancel()
