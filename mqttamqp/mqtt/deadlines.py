"""Many connections' deadlines (CONNECT time-outs, keepalive checks) on one
reactor timer.

This is the I/O side of the rules in ``connection``: they say when a connection
must be looked at again (``Keepalive.next_check``), and ``Deadlines`` calls the
clock to look then.  It owns the wheel of deadlines and the one ``callLater``
behind them; it must not decide anything about a connection (the callback it is
given does).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

from mqttamqp.core.clock import Clock, DelayedCall

__all__ = ["Deadlines", "SoonDeadlines"]

_log = Logger(namespace="mqttamqp.mqtt")
# A cancelled item leaves a bucket of at most this many at once (scanned).
_SCAN = 64


class Deadlines:
    """Many connections' deadlines (keepalive checks) on one reactor timer.

    A ``DelayedCall`` per connection was about 450 bytes of the broker's memory per
    idle client, and a heap entry (a list of the due time, a sequence number and
    the item) 134.  Here an item waits in a wheel of one-second buckets (a pointer in
    the bucket's list), and its exact due time is its own: the float in the
    attribute named ``slot`` (None: no deadline).  An entry whose due time is not
    the item's any more was replaced (the bucket keeps those, inert, until its
    second comes or there are too many of them; a cancelled one leaves its bucket at
    once).  The due times are compared by value, not identity: an item given the
    same time again has two entries, and the first to come fires it once (it then
    has none), and a build compiled with mypyc keeps no float's identity.  The
    saving assumes busy seconds: a deadline alone in its second pays for a bucket
    (~157 bytes, more than the heap entry).  When a bucket's second comes
    its live items move to a small exact heap, which runs each at its due time:
    the timer is never later than the earliest live deadline.  The timer stays set
    when its deadline is cancelled: it runs then, finds what is due (perhaps
    nothing) and sets itself for the next.  A connect storm adds and cancels a
    CONNECT deadline per connection; moving the timer each time was a
    ``callLater`` and a ``cancel`` per connection.

    An item has at most one deadline here: ``add`` replaces the one it had.
    """

    __slots__ = ("_buckets", "_clock", "_due", "_entries", "_fire", "_keys", "_live", "_near",
                 "_opened", "_seq", "_slot", "_timer")

    def __init__(self, clock: Clock, fire: Callable[[Any], None], slot: str) -> None:
        self._clock = clock
        self._fire = fire            # called with the item whose deadline came
        self._slot = slot            # the item's attribute holding its due time
        self._buckets: dict[int, list[Any]] = {}   # second -> items due in it
        self._keys: list[int] = []   # a heap of the buckets' seconds
        self._opened = -1            # the last second whose bucket moved to ``_near``
        self._near: list[list[Any]] = []   # a heap of [due, seq, item] (opened seconds)
        self._seq = 0
        self._live = 0
        self._entries = 0            # items held (live, cancelled or replaced)
        self._timer: DelayedCall | None = None
        self._due = 0.0               # when ``_timer`` runs

    def add(self, item: Any, delay: float) -> None:
        """``item`` is due in ``delay`` seconds (its earlier deadline here, if any,
        is replaced)."""
        slot = self._slot
        if getattr(item, slot) is None:
            self._live += 1
        elif self._entries > 2 * self._live + 64:
            self._compact()
        due = self._clock.seconds() + delay
        setattr(item, slot, due)
        second = int(due)
        bucket = self._buckets.get(second) if second > self._opened else None
        if bucket is not None:   # (``_place``'s common case inlined: a second's bucket)
            bucket.append(item)
        else:
            self._place(item, due)
        self._entries += 1
        # (``_timer`` is None or pending: ``_run`` clears it first thing, and ``_arm``
        # replaces one it cancels; no ``active()`` asked, a Python call a connect)
        if self._timer is None or self._due > due:
            self._arm()

    def cancel(self, item: Any) -> None:
        """``item`` has no deadline here any more (none is fine)."""
        slot = self._slot
        due = getattr(item, slot)
        if due is None:
            return
        setattr(item, slot, None)
        self._live -= 1
        second = int(due)
        if second > self._opened:
            # out of a small bucket now: a closed connection must not stay reachable
            # until its second comes; a large bucket is not scanned (cancels in any
            # order would be quadratic) and keeps it inert until a compaction
            bucket = self._buckets.get(second)
            if bucket is not None and len(bucket) <= _SCAN and item in bucket:
                bucket.remove(item)
                self._entries -= 1
        if not self._live:
            self._clear()    # (the timer, if set, runs once and finds nothing)
        elif self._entries > self._live + (self._live >> 2) + 64:
            # (cancelled entries would stay until their time: connection churn with
            # long keepalives grew the wheel without bound, and kept closed
            # connections reachable; a compaction every live/4 cancels or so)
            self._compact()

    def __len__(self) -> int:
        return self._live

    def _place(self, item: Any, due: float) -> None:
        second = int(due)
        if second <= self._opened:
            self._seq += 1
            heapq.heappush(self._near, [due, self._seq, item])
            return
        bucket = self._buckets.get(second)
        if bucket is None:
            self._buckets[second] = [item]
            heapq.heappush(self._keys, second)
        else:
            bucket.append(item)

    def _clear(self) -> None:
        self._buckets.clear()
        self._keys.clear()
        self._near.clear()
        self._entries = 0

    def _compact(self) -> None:
        slot = self._slot
        held = [entry[2] for entry in self._near]
        for bucket in self._buckets.values():
            held.extend(bucket)
        self._clear()
        seen: set[int] = set()
        for item in held:
            due = getattr(item, slot)
            if due is not None and id(item) not in seen:
                seen.add(id(item))
                self._place(item, due)
                self._entries += 1

    def _next(self) -> float | None:
        """When the timer must run next: the earliest exact deadline opened, or
        the earliest bucket's second."""
        near = self._near
        slot = self._slot
        while near and getattr(near[0][2], slot) != near[0][0]:
            heapq.heappop(near)   # (cancelled or replaced ones at the head)
            self._entries -= 1
        due: float | None = near[0][0] if near else None
        keys = self._keys
        if keys and (due is None or keys[0] < due):
            return float(keys[0])
        return due

    def _arm(self) -> None:
        due = self._next()
        if due is None:
            return
        timer = self._timer
        if timer is not None and timer.active():
            if self._due <= due:
                return    # it runs first, and then sets itself for this one
            timer.cancel()
        now = self._clock.seconds()
        self._due = max(due, now)   # when it really runs (a bucket's second may be past)
        self._timer = self._clock.callLater(max(0.0, due - now), self._run)

    def _open(self, now: float) -> None:
        """Move the buckets whose second has come to the exact heap."""
        keys, buckets, near, slot = self._keys, self._buckets, self._near, self._slot
        while keys and keys[0] <= now:
            second = heapq.heappop(keys)
            self._opened = second
            bucket = buckets.pop(second)
            for item in bucket:
                due = getattr(item, slot)
                if due is not None and int(due) == second:
                    self._seq += 1
                    heapq.heappush(near, [due, self._seq, item])
                else:
                    self._entries -= 1   # (cancelled, or due in another second)

    def _run(self) -> None:
        self._timer = None
        try:
            self._fire_due()
        finally:
            self._rearm()

    def _rearm(self) -> None:
        """After a run: set the timer for the next deadline, unless what a run fired
        set it.  (A method of its own: in ``_run`` mypy narrows ``_timer`` to None
        from its assignment there, across the calls that set it, and a build
        compiled with mypyc trusts that.)"""
        if not self._live:
            self._clear()
        elif self._timer is None:
            self._arm()

    def _fire_due(self) -> None:
        """Fire every item whose deadline has come."""
        now = self._clock.seconds()
        slot = self._slot
        self._open(now)
        near = self._near
        while near and near[0][0] <= now:
            due, _, item = heapq.heappop(near)
            self._entries -= 1
            if getattr(item, slot) != due:
                continue     # (cancelled, or replaced by another deadline)
            setattr(item, slot, None)
            self._live -= 1
            try:
                self._fire(item)
            except Exception:   # one connection's failure must not stop the others
                _log.failure("keepalive check of {item!r} failed", item=item)


class SoonDeadlines:
    """Deadlines of ``delay`` seconds armed in ``deadlines`` at the start of the next
    reactor turn, for items that seldom still need one then: a connection's CONNECT
    time-out, where a client sends CONNECT at once and the listener reads it in the
    turn that accepts it (``net.tcp.LeanPort``).  Adding a deadline to the wheel and
    cancelling it in the same turn cost every connect; here an item is appended to a
    list, and the one ``callLater(0)`` per turn calls ``arm`` (with the item and the
    delay left) only for the items ``needed`` still says need one.

    The delay counts from the turn's first ``add`` (one clock reading per turn): a
    deadline is never later than ``delay`` after its ``add``, and earlier by at most
    the rest of that turn.  The list holds what one turn added, no more.
    """

    __slots__ = ("_arm", "_call", "_clock", "_delay", "_items", "_needed", "_since")

    def __init__(self, clock: Clock, delay: float, needed: Callable[[Any], bool],
                 arm: Callable[[Any, float], None]) -> None:
        self._clock = clock
        self._arm = arm
        self._delay = delay
        self._needed = needed
        self._items: list[Any] = []
        self._call: DelayedCall | None = None
        self._since = 0.0

    def add(self, item: Any) -> None:
        """``item`` is due in ``delay`` seconds, unless ``needed`` says otherwise at
        the start of the next turn."""
        if self._call is None:
            self._since = self._clock.seconds()
            self._call = self._clock.callLater(0, self._run)
        self._items.append(item)

    def __len__(self) -> int:
        """The items waiting that still need their deadline."""
        needed = self._needed
        return sum(1 for item in self._items if needed(item))

    def _run(self) -> None:
        self._call = None
        items, self._items = self._items, []
        needed = self._needed
        delay = max(0.0, self._delay - (self._clock.seconds() - self._since))
        arm = self._arm
        for item in items:
            if needed(item):
                arm(item, delay)
