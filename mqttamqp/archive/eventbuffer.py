"""The archive's buffered events in their flat form: how the feeding thread takes
them off the buffer and how the writer process reads them back into rows.

``Archive.event`` keeps an event as a float in an ``array('d')`` of times and its
other values at the end of a flat list: the kind, the client id, the tuple of its
field names (one per set of names, shared) and the fields' values. No object is
made per event that outlives the call (a tuple a record, and the float of its time,
were blocks of pymalloc's small size classes: a connect storm buffers two events a
client, and the pools they filled stayed pinned among the connections' own blocks
after the thread had written them; issue 31 §2).

The pair (times, values) is a batch of at most ``EVENT_BATCH`` records; a full one
is queued whole and a new one started, as the messages' batches are: the feeding
thread takes queued batches without copying them, and a batch's list and array
(tens of kilobytes) are freed whole once written, where one list of a whole storm's
events grew by copies and left its old copies as free holes in the C heap.

The reactor appends a record's time first and then its values in one ``+=`` (a
single call under the GIL); only the feeding thread removes, from the front. So the
values the thread sees are whole records, and the times array holds at least as many
times as the values hold records.

This module must not import Twisted, the broker or pyarrow: the broker's process and
the writer process both use it.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["EVENT_BATCH", "HEAD", "EventBatches", "event_records", "take_event_batches",
           "take_events"]

#: Values a record has before its fields: the kind, the client id, the field names.
HEAD = 3
#: Events per batch (half the buffer when that is less).
EVENT_BATCH = 1024

Batch = tuple["array[float]", list[Any]]


class EventBatches:
    """The reactor side of the buffer: the batch being filled and the queued ones,
    at most ``limit`` events in all. ``on_queued(n)`` is told the events queued after
    each rotation (``limit`` when the buffer is full): the archive wakes its feeding
    thread on it.

    The bound holds exactly: a new batch takes ``min(batch, limit - queued)`` events
    (``room``), ``queued`` counted when it starts; the feeding thread only takes
    events away meanwhile. When that room is none the buffer is full: ``room`` is 0
    and ``refused`` the number of queued batches then, and every event is refused
    by two comparisons until the thread has taken a batch (the queue is shorter)."""

    __slots__ = ("batch", "filling", "full", "limit", "on_queued", "refused", "room",
                 "times", "values")

    def __init__(self, limit: int, on_queued: Callable[[int], object]) -> None:
        self.limit = limit                # 0 once closing
        self.on_queued = on_queued
        self.batch = max(1, min(EVENT_BATCH, limit // 2))   # events per batch at most
        self.room = min(self.batch, limit)   # events the batch being filled takes
        self.refused = 0                  # queued batches when the buffer was found full
        self.times: array[float] = array("d")
        self.values: list[Any] = []
        self.filling: Batch = (self.times, self.values)   # (one read, never half a swap)
        self.full: deque[Batch] = deque()                 # oldest first

    def add(self, timestamp: float, record: tuple[Any, ...]) -> bool:
        """Buffer one event (``record``: kind, client id, field names, values); False
        if it is dropped (the buffer is full, or closing). Reactor thread only."""
        times = self.times
        if len(times) >= self.room:
            if not self.room and len(self.full) >= self.refused:
                return False          # still full (nothing taken since): the short way
            rotated = self._rotate()
            if rotated is None:
                return False
            times = rotated
        times.append(timestamp)       # the time first, then the values in one call
        self.values += record
        if len(times) >= self.room:
            self._rotate()
        return True

    def _rotate(self) -> array[float] | None:
        """Queue the batch being filled (if it holds any event) and give the new one
        the room the bound leaves; return its times, or None if it has none (the
        buffer is full) or while closing."""
        full = self.full
        if not self.limit:
            self.room = self.refused = 0
            return None
        times = self.times
        if times:
            # Queued, then replaced: ``waiting`` (the batch being filled read first)
            # counts it once or twice, never not at all. The thread may find it both
            # queued and still as ``filling`` meanwhile: it takes from ``filling``
            # only when it found no queued batch, and this side adds nothing more
            # to a batch it queues.
            full.append(self.filling)
            times = array("d")
            values: list[Any] = []
            self.times, self.values = self.filling = (times, values)
        # (list(): one call; the thread may take batches meanwhile: never too few)
        queued = sum(len(stamps) for stamps, _ in list(full))
        room = min(self.batch, self.limit - queued)
        if room <= 0:
            self.room = 0
            self.refused = len(full)
            self.on_queued(self.limit)
            return None
        self.room = room
        self.on_queued(queued)
        return times

    def close(self) -> None:
        """Refuse every event from now on (reactor thread)."""
        self.limit = self.room = self.refused = 0

    def waiting(self) -> int:
        """Events buffered. From the feeding thread while the reactor adds: perhaps
        a batch twice, never fewer than were buffered when the count began (the
        batch being filled is read first, and ``_rotate`` queues a batch before it
        starts the next)."""
        filling = len(self.times)
        return filling + sum(len(times) for times, _ in list(self.full))

    def clear(self) -> None:
        del self.times[:]
        self.values.clear()
        self.full.clear()


def take_events(times: array[float], values: list[Any], most: int
                ) -> tuple[bytes, list[Any]]:
    """Up to ``most`` whole records off the front of the buffer, oldest first: their
    times (packed doubles) and their values. Feeding thread only."""
    end = count = 0
    available = len(values)    # (the reactor may append meanwhile: whole records)
    while end < available and count < most:
        end += HEAD + len(values[end + 2])
        count += 1
    if not count:
        return b"", []
    head = values[:end]
    del values[:end]
    stamps = times[:count].tobytes()
    del times[:count]
    return stamps, head


def take_event_batches(full: deque[Batch], filling: Batch, most: int
                       ) -> list[tuple[bytes, list[Any]]]:
    """The queued batches, oldest first, until ``most`` records are taken (at least
    one batch), as they are; when none is queued, up to ``most`` records of the
    batch being filled (``filling``, read once by the caller). Feeding thread only."""
    taken: list[tuple[bytes, list[Any]]] = []
    count = 0
    while full and count < most:
        times, values = full.popleft()   # (only this thread removes)
        if times:
            taken.append((times.tobytes(), values))
            count += len(times)
    if not taken:
        stamps, values = take_events(*filling, most)
        if stamps:
            taken.append((stamps, values))
    return taken


def event_records(stamps: bytes, values: list[Any]
                  ) -> Iterator[tuple[float, str, str | None, tuple[str, ...], list[Any]]]:
    """The records ``take_events`` took: (time, kind, client id, field names, values)."""
    times = array("d")
    times.frombytes(stamps)
    at = 0
    for ts in times:
        names = values[at + 2]
        start = at + HEAD
        at = start + len(names)
        yield ts, values[start - 3], values[start - 2], names, values[start:at]
    if at != len(values):
        raise ValueError(f"archive: {len(times)} event times for {len(values)} values "
                         f"that hold records up to {at}")
