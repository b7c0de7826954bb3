"""Many connections' deadlines (CONNECT time-outs, keepalive checks) on one
reactor timer.

This is the I/O side of the rules in ``connection``: they say when a connection
must be looked at again (``Keepalive.next_check``), and ``Deadlines`` calls the
clock to look then.  It owns the heap of deadlines and the one ``callLater``
behind them; it must not decide anything about a connection (the callback it is
given does).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

from mqttamqp.core.clock import Clock, DelayedCall

__all__ = ["Deadlines"]

_log = Logger(namespace="mqttamqp.mqtt")


class Deadlines:
    """Many connections' deadlines (keepalive checks) on one reactor timer.

    A ``DelayedCall`` per connection was about 450 bytes of the broker's memory per
    idle client; an entry here is a small list in one heap.  Deadlines are kept
    exactly: the timer is never later than the earliest live deadline.  A
    cancelled entry stays in the heap, inert, until its time (or until none is
    left), and the timer stays set when its deadline is cancelled: it runs then,
    finds what is due (perhaps nothing) and sets itself for the next.  A connect
    storm adds and cancels a CONNECT deadline per connection; moving the timer each
    time was a ``callLater`` and a ``cancel`` per connection.
    """

    __slots__ = ("_clock", "_due", "_fire", "_heap", "_live", "_seq", "_timer")

    def __init__(self, clock: Clock, fire: Callable[[Any], None]) -> None:
        self._clock = clock
        self._fire = fire            # called with the item whose deadline came
        self._heap: list[list[Any]] = []
        self._live = 0
        self._seq = 0
        self._timer: DelayedCall | None = None
        self._due = 0.0               # when ``_timer`` runs

    def add(self, item: Any, delay: float) -> list[Any]:
        """``item`` is due in ``delay`` seconds; returns the handle ``cancel`` takes."""
        self._seq += 1
        entry = [self._clock.seconds() + delay, self._seq, item]
        heapq.heappush(self._heap, entry)
        self._live += 1
        if self._heap[0] is entry:
            self._arm()
        return entry

    def cancel(self, entry: list[Any]) -> None:
        if entry[2] is None:
            return
        entry[2] = None
        self._live -= 1
        if not self._live:
            self._heap.clear()   # (the timer, if set, runs once and finds nothing)
        elif len(self._heap) > 2 * self._live + 64:
            # (cancelled entries would stay until their time: connection churn with
            # long keepalives grew the heap without bound)
            self._heap = [e for e in self._heap if e[2] is not None]
            heapq.heapify(self._heap)

    def __len__(self) -> int:
        return self._live

    def _arm(self) -> None:
        due = self._heap[0][0]
        timer = self._timer
        if timer is not None and timer.active():
            if self._due <= due:
                return    # it runs first, and then sets itself for this one
            timer.cancel()
        self._due = due
        self._timer = self._clock.callLater(max(0.0, due - self._clock.seconds()), self._run)

    def _run(self) -> None:
        self._timer = None
        now = self._clock.seconds()
        try:
            while self._heap and self._heap[0][0] <= now:
                entry = heapq.heappop(self._heap)
                item = entry[2]
                if item is None:
                    continue
                entry[2] = None
                self._live -= 1
                try:
                    self._fire(item)
                except Exception:   # one connection's failure must not stop the others
                    _log.failure("keepalive check of {item!r} failed", item=item)
        finally:
            heap = self._heap
            while heap and heap[0][2] is None:   # (cancelled ones at the head)
                heapq.heappop(heap)
            if heap and self._timer is None:
                self._arm()
