"""The archive's buffered events in their flat form: how the feeding thread takes
them off the buffer and how the writer process reads them back into rows.

``Archive.event`` keeps an event as a float in one ``array('d')`` of times and its
other values at the end of one flat list: the kind, the client id, the tuple of its
field names (one per set of names, shared) and the fields' values. No object is
made per event that outlives the call (a tuple a record, and the float of its time,
were blocks of pymalloc's small size classes: a connect storm buffers two events a
client, and the pools they filled stayed pinned among the connections' own blocks
after the thread had written them; issue 31 §2). The array and the list are each
one large allocation, of the C heap, that grows and shrinks as a whole.

The reactor appends a record's time first and then its values in one ``+=`` (a
single call under the GIL); only the feeding thread removes, from the front. So the
values the thread sees are whole records, and the times array holds at least as many
times as the values hold records.

This module must not import Twisted, the broker or pyarrow: the broker's process and
the writer process both use it.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any

__all__ = ["HEAD", "event_records", "take_events"]

#: Values a record has before its fields: the kind, the client id, the field names.
HEAD = 3


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
