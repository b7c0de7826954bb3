"""One gateway client's timer: the CONNECT deadline, then the keepalive check
(``mqtt.connection.Keepalive``'s rule: silent for 1.5 × keepalive is gone), then,
once the gateway closes the client, the grace it has to read what is left
(``CLOSE_GRACE``).

What it owns: the one delayed call a client has at a time, on the injected clock.
What it must not do: decide what a deadline means (the frontend is called back).
"""

from __future__ import annotations

from collections.abc import Callable

from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.mqtt.connection import Keepalive

__all__ = ["CLOSE_GRACE", "ClientTimer"]

# Seconds a client the gateway closes has to read what was written before it; then
# the socket is cut (a client that stopped reading would hold it, and its place
# under --max-connections, for ever).
CLOSE_GRACE = 5.0


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
