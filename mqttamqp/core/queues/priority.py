"""Priority levels of a queue (issue #30): the order a classic group hands out a
priority queue's messages in.

A queue with ``max-priority`` N (``--queues`` file, the console, AMQP 0.9.1
``x-max-priority``) has levels 0..N: a message's level is its publisher's priority
(AMQP 1.0 header ``priority``, 0.9.1 basic property ``priority``) capped at N, as
RabbitMQ caps it; a message without one takes AMQP 1.0's default 4 (MQTT, AMQP 1.0)
or 0 (AMQP 0.9.1, as RabbitMQ), capped the same way.  A classic group of such a
queue keeps its undelivered offsets here, one heap per level: the highest
non-empty level goes first, lowest offset first within a level (FIFO).  Offsets
that are no longer there to hand out (acknowledged, expired, dropped by retention
or a purge) stay in their heap until they reach its top and are skipped there, as
in the group's ``ready`` heap; but a lower level's top is not looked at while a
higher one holds something, so the heaps count their entries (``count``) and are
rebuilt from what is still there (``bound``, ``compact``) once they hold more
than twice the log (and 64).

Only priority queues have these: a queue without levels hands out by offset
(``ConsumerGroup.next`` and ``ready``) and pays nothing here.  Stream groups read
the log in its order: a priority is ignored there (a stream is a log; RabbitMQ
refuses ``x-max-priority`` on a stream queue, and so does the 0.9.1 declare here).

What this module must not do: decide who gets a message (``Dispatch``) or store
anything: the order is rebuilt from the log, whose records keep each message's
priority, at every restart (nothing of it is stored)."""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator, Mapping

from mqttamqp.core.message import Message

__all__ = ["PriorityLevels", "level_of", "DEFAULT_PRIORITY", "MAX_PRIORITY"]

DEFAULT_PRIORITY = 4     # AMQP 1.0's default header priority
MAX_PRIORITY = 255       # as RabbitMQ's x-max-priority


def level_of(message: Message, top: int) -> int:
    """``message``'s level in a queue whose highest level is ``top``."""
    priority = message.priority
    if priority is None:
        priority = 0 if message.amqp091 is not None else DEFAULT_PRIORITY
    return priority if priority < top else top


class PriorityLevels:
    """A classic group's offsets to hand out, one heap per level."""

    __slots__ = ("compactions", "count", "heaps", "high", "stale", "top")

    def __init__(self, top: int) -> None:
        self.top = top
        self.heaps: list[list[int]] = [[] for _ in range(top + 1)]
        self.high = -1     # no level above this holds anything
        self.count = 0     # entries in all heaps, those no longer there included
        # Set when an offset waiting here left the log (retention, expiry, a purge):
        # ``count`` may hold it until ``compact`` (``ConsumerGroup.lag``).
        self.stale = False
        self.compactions = 0

    def push(self, level: int, offset: int) -> None:
        heapq.heappush(self.heaps[level], offset)
        self.count += 1
        if level > self.high:
            self.high = level

    def bound(self, log: Mapping[int, Message], done: Collection[int]) -> None:
        """Compact when the heaps hold more than twice the log (and 64): offsets
        dropped below a higher level's are never reached by ``peek``."""
        if self.count > 2 * len(log) + 64:
            self.compact(log, done)

    def compact(self, log: Mapping[int, Message], done: Collection[int]) -> None:
        """Rebuild the heaps from the offsets still in ``log`` and not ``done``."""
        live = {o for o in self if o in log and o not in done}
        self.clear()
        top = self.top
        for offset in sorted(live):     # (a sorted list is a heap: appended in order)
            self.heaps[level_of(log[offset], top)].append(offset)
        for level, heap in enumerate(self.heaps):
            if heap:
                self.high = level
        self.count = len(live)
        self.stale = False
        self.compactions += 1

    def add(self, message: Message, offset: int) -> None:
        """``offset`` (holding ``message``) is there to hand out."""
        self.push(level_of(message, self.top), offset)

    def peek(self, log: Mapping[int, Message], done: Collection[int]) -> int | None:
        """The offset to hand out next (not taken: ``pop``), dropping on the way
        those no longer in ``log`` or already ``done``."""
        heaps = self.heaps
        level = self.high
        while level >= 0:
            heap = heaps[level]
            while heap:
                offset = heap[0]
                if offset in log and offset not in done:
                    self.high = level
                    return offset
                heapq.heappop(heap)
                self.count -= 1
            level -= 1
        self.high = -1
        return None

    def pop(self) -> None:
        """Take the offset ``peek`` returned."""
        heapq.heappop(self.heaps[self.high])
        self.count -= 1

    def __len__(self) -> int:
        """Entries held, offsets no longer there included (``compact`` first for
        what waits)."""
        return self.count

    def __iter__(self) -> Iterator[int]:
        for heap in self.heaps:
            yield from heap

    def first(self, count: int) -> list[int]:
        """Up to ``count`` offsets that go out first (what the memory budget keeps)."""
        out: list[int] = []
        for level in range(self.high, -1, -1):
            if len(out) >= count:
                break
            out.extend(heapq.nsmallest(count - len(out), self.heaps[level]))
        return out

    def clear(self) -> None:
        for heap in self.heaps:
            heap.clear()
        self.high = -1
        self.count = 0
        self.stale = False
