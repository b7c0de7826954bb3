"""The process's descriptor table, grown once at start-up to what ``--max-connections``
will need: ``grow_descriptor_table``.

Linux keeps a process's open files in one table that starts with 64 slots (on a
64-bit machine) and grows, when a new descriptor does not fit, to the next power of
two that holds it (``expand_files`` in ``fs/file.c``): opened one at a time,
descriptors double it again and again.  In a process with more than one thread
sharing the table (the broker has its ZODB writer and the reactor's pool) each
doubling waits for an RCU grace period (``expand_fdtable``'s ``synchronize_rcu``)
inside the system call that needed the slot: for a broker, the ``accept`` of a new
client, with the reactor stopped.
Measured here (``perf sched``, 2026-12-01, kernel 6.18): 7 to 13 ms each time, six
times between the 256 slots a started broker has and 16,384 (9,000 clients
connecting: 65 ms of a 330 ms connect storm), while the clients waited for their
CONNACKs; a single-threaded broker (Mosquitto) never waits.  A table that holds
the descriptors wanted from the start never grows again (the kernel never shrinks
it), so the waits are gone; growing it costs one grace period at start-up at most
and 8 bytes of kernel memory a slot and a little for its bitmaps, the slots rounded
up to a power of two (the default 10,000 connections and 256: 16,384 slots, about
136 KB; not in the process's RSS).

What it must not do: know any protocol, or import the broker's core.
"""

from __future__ import annotations

import fcntl
import os
import resource

__all__ = ["HEADROOM", "grow_descriptor_table"]

#: Descriptors beyond the connections: listeners, the store's and the archive's
#: files, the log, pipes to helper processes.
HEADROOM = 256

#: The table's slots the kernel starts a process with (``NR_OPEN_DEFAULT``, 64-bit)
_INITIAL = 64


def grow_descriptor_table(connections: int) -> int:
    """Make room in the descriptor table for ``connections`` plus ``HEADROOM``
    descriptors, at most the soft ``RLIMIT_NOFILE`` (a descriptor beyond it could not
    be opened anyway).  Returns the descriptors the table was asked to hold, or 0
    when nothing was done (too few to matter, or the system refused: the table then
    grows on demand, as before).

    A descriptor is opened at the highest number wanted (``F_DUPFD``: the lowest free
    number at or above it, so no open descriptor is touched) and closed again."""
    want = connections + HEADROOM
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        return 0
    if soft != resource.RLIM_INFINITY:
        want = min(want, soft)
    if want <= _INITIAL:
        return 0
    try:
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        os.close(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, want - 1))
    except (OSError, OverflowError):   # (OverflowError: no C int holds it)
        return 0
    finally:
        os.close(fd)
    return want
