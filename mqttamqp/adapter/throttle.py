"""``PublishThrottle``: a publisher over its publish rate is paused until its budget
is back, then resumed; the same rule for an MQTT connection (not read) and an
AMQP sender link (no more credit).

Each routed message is charged to the budget (``Budget``: the core's
``PublishRate``, a token bucket that may go negative).  When it says wait, the
publisher is paused once (``on_pause``, told how long, which also reports it)
and one timer on the injected clock resumes it (``on_resume``); a charge while
paused (what one socket read or the peer's credit still held) makes the pause
longer by resetting that timer, so the average rate holds.

What it must not do: know the protocol (pausing is the adapter's callback), or
exist for a publisher without a budget: adapters make one only when a rate is
limited, so the common case costs a None test per message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from mqttamqp.core.clock import Clock, DelayedCall

__all__ = ["Budget", "PublishThrottle"]


class Budget(Protocol):
    """A publish budget (``PublishRate``): charge a message, learn how long to wait."""

    def take(self, size: int) -> float: ...


class PublishThrottle:
    """One publisher's pause over its publish rate (see the module)."""

    __slots__ = ("_budget", "_clock", "_on_pause", "_on_resume", "_timer")

    def __init__(self, budget: Budget, clock: Clock, on_pause: Callable[[float], None],
                 on_resume: Callable[[], None]) -> None:
        self._budget = budget
        self._clock = clock
        self._on_pause = on_pause
        self._on_resume = on_resume
        self._timer: DelayedCall | None = None

    @property
    def paused(self) -> bool:
        return self._timer is not None

    def charge(self, size: int) -> None:
        """A message of ``size`` payload bytes was routed."""
        wait = self._budget.take(size)
        if wait > 0:
            timer = self._timer
            if timer is None:
                self._on_pause(wait)
                self._timer = self._clock.callLater(wait, self._over)
            else:   # more of the same read (or credit): the pause grows to pay for it
                timer.reset(wait)

    def _over(self) -> None:
        self._timer = None
        self._on_resume()

    def stop(self) -> None:
        """The publisher is gone: no resume will come.  The owner's callbacks are
        dropped too (owner and throttle point at each other: so both are freed by
        reference counting, not left for the cycle collector)."""
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()
        self._on_pause = _paused_after_stop
        self._on_resume = _resumed_after_stop


def _paused_after_stop(wait: float) -> None:
    """(A charge after ``stop``: the publisher is gone, nothing to pause.)"""


def _resumed_after_stop() -> None:
    """(Nothing to resume after ``stop``.)"""
