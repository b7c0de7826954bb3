"""The close grace (``--close-grace``, ``Limits.close_grace``): a connection the
broker, a gateway or a bridge closes after writing what is left has that many
seconds for its peer to read it and close; then the socket is cut (a peer that
stopped reading would hold it, and its place under ``--max-connections``, for ever).

What it owns: ``CloseGrace``, one per listener factory (the MQTT front end, AMQP
0.9.1's, the gateway's) and per bridge service: the cut armed on the injected clock
(``arm``: the caller cancels it when the connection is lost; a connection already
gone when it fires is not cut), and when it fires, the count of
connections cut so (``cut``; also handed to ``counted``, e.g. the core's
``limit_hit("close_grace")`` for ``$SYS/broker/limits/close_grace`` and the
metrics) and one log line per minute at most.

What it must not do: close a connection itself (the caller's ``loseConnection``
comes first), or import Twisted (the ``log`` it is given is a Twisted ``Logger``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.ratelog import LogLimiter

__all__ = ["CloseGrace"]


class CloseGrace:
    """The cut after ``seconds`` of a connection being closed (see the module)."""

    __slots__ = ("_limit", "clock", "counted", "cut", "log", "seconds", "what")

    def __init__(self, clock: Clock, seconds: float, log: Any, what: str,
                 counted: Callable[[], None] | None = None) -> None:
        self.clock = clock
        self.seconds = seconds
        self.log = log            # a Twisted Logger (``warn``)
        self.what = what          # whose connections, for the line ("MQTT", ...)
        self.counted = counted
        self.cut = 0              # connections cut after the grace
        self._limit = LogLimiter(clock.seconds)

    def arm(self, transport: Any, who: str | None = None,
            cut: Callable[[], None] | None = None) -> DelayedCall:
        """Cut ``transport`` (being closed) ``seconds`` from now, with ``cut`` if
        given (an adapter's abort that ends more than the socket), else its
        ``abortConnection``: the caller cancels the call once the connection is
        lost."""
        return self.clock.callLater(self.seconds, self._cut, transport, who, cut)

    def _cut(self, transport: Any, who: str | None,
             cut: Callable[[], None] | None = None) -> None:
        if _gone(transport):   # (closed in time, its call not cancelled: nothing to cut)
            return
        self.cut += 1
        if self.counted is not None:
            self.counted()
        held = self._limit.allow("close-grace")
        if held is not None:
            self.log.warn("{w} connection of {c} did not close within --close-grace "
                          "{g:g} s of being closed (its peer reads nothing); cut, {n} so "
                          "far{h}", w=self.what, c=who or "?", g=self.seconds, n=self.cut,
                          h=f" ({held} not logged)" if held else "")
        if cut is not None:
            cut()
        else:
            transport.abortConnection()


def _gone(transport: Any) -> bool:
    """Whether ``transport`` is disconnected already: its own flag (TCP's, a
    WebSocket stream's) or, for a wrapper without one (TLS), the one below it."""
    for _ in range(3):   # (TLS over TCP: two levels)
        gone = getattr(transport, "disconnected", None)
        if gone is not None:
            return bool(gone)
        transport = getattr(transport, "transport", None)
        if transport is None:
            return False
    return False
