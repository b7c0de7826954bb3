"""The broker's archive: every routed message and connection/session/will event,
written as Parquet by a process of its own, fed by a thread of this one.

Three parts, one object:

- the reactor side (``message``, ``event``, ``stats``) adds a message's payload
  (its first ``payload_bytes``) to the end of one ``bytearray`` and its other
  values to the end of one flat list, the batch being filled, and returns. When
  the batch holds ``_BATCH`` messages (half the buffer if that is less) it queues
  the pair whole and starts a new one (a swap: no value is copied). An event's
  time goes to an ``array('d')`` and its other values to the end of one flat list
  (``eventbuffer``). At the bound (``buffer_limit`` messages, and as many events)
  a record is dropped and counted, and the first drop of a spell logged (a spell
  per dataset, ended by the feeding thread once less than half the bound waits). It never
  blocks, never takes a lock, never touches a file and never waits for the writer;
- the feeding thread turns the queued batches into columns (``columns``: numbers
  as packed bytes, a string every row shares once) and sends them to the writer
  process (``mqttamqp.archive.writer``) in one pickled frame on its stdin, then
  waits for its answer (counters and log lines). When no whole batch waits it
  takes what the batch being filled holds (a copy and a delete of its front), so a
  slow trickle is written too (within a second: a trickle is stepped once a
  second, a stream every tenth, ``_pause``). Packing and pickling are all the GIL time the
  archive costs besides the appends;
- the writer process filters topics (``include``/``exclude``), turns rows into
  Arrow record batches through ``SegmentSet``, rolls segments on time or size and
  deletes partitions older than ``retention_days``. Arrow and Parquet never hold
  this process's GIL.

``list.extend``, ``bytearray`` ``+=``, ``array.append``, slicing and deleting a list's,
an array's or a bytearray's front, ``deque.append`` and ``popleft`` are each atomic
under the GIL, so the reactor and the feeding thread share no lock; the counters
each side increments are its own. Only the reactor side appends and swaps batches
(a message's payload before its values, an event's time before its values, so
whoever sees the values finds the rest); only the feeding thread removes, from the
front of a batch, whether the reactor has queued that batch meanwhile or not: every
record is sent once, in order. The feeding thread reads the clock it was given (a
reactor or ``task.Clock``) and sends that time with every batch, for roll times and
retention only; a record's time is the timestamp its caller passed.

The writer process dies with the broker: it exits when its stdin reaches end of file
(the broker was killed), leaving its open segment under its temporary name, which
the next start removes. It is started and stopped through its own ``Popen`` only
(its PID), never by name. If it dies, its open segments are counted as lost, an
error is counted and logged, and a new one is started a second later.

This module must not be imported by the core: the broker service creates one
``Archive`` and hands the core its two bound methods.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from mqttamqp.archive.columns import pack
from mqttamqp.archive.eventbuffer import EventBatches, take_event_batches
from mqttamqp.archive.files import check_writable, remove_leftovers
from mqttamqp.archive.frames import CLOSE, STEP
from mqttamqp.archive.names import EVENT_FIELD_NAMES, MESSAGE_VALUES, SIZE_VALUE
from mqttamqp.archive.process import EXIT_WAIT, WriterProcess
from mqttamqp.archive.topics import TopicSelector
from mqttamqp.events import EVENT_KINDS

__all__ = ["Archive", "DEFAULT_BUFFER_LIMIT", "DEFAULT_EXCLUDE"]

log = Logger(namespace="mqttamqp.archive")

#: Records waiting for the writer, per dataset. At most ``payload_bytes`` of payload
#: each, so the worst case at the defaults is about 64k x (256 + ~150) bytes.
DEFAULT_BUFFER_LIMIT = 65536
DEFAULT_EXCLUDE = ("$SYS/#",)

# Messages per batch the reactor side queues whole; half the buffer when that is
# less, so that a full batch can always be queued and wake the dozing feeding thread
# (``_rotate``): one the buffer could not queue would wake it only by a dropped
# record.  (``_pause`` dozes on a trickle only if a batch can be queued: not with a
# one-record buffer.)
_BATCH = 4096
_FRAME = 16384            # events per frame at most (messages: every queued batch)
# Longest the feeding thread sleeps while no message waits (nothing, or only events).
# Events come in bursts (a connect storm is two a client): a step every 100 ms took
# the GIL from the reactor four times a third of a second and made 5,000 connects
# ~15 % slower; a second of events is one frame.  A full message batch, or a
# frame's worth of events (``_EVENT_WAKE``), wakes it at once (``_dozing``).  (Each
# buffered event is ~190 bytes: a 5,000-client storm's 10,000 events are ~1.9 MB
# until the next step.)
_IDLE_WAIT = 1.0
_EVENT_WAKE = _FRAME
# While records flow, the feeding thread sends a frame this often (at once again
# when a step took half the buffer or more: it is behind). Every step takes the GIL
# back half a dozen times (after the pipe write, the select, the reads, the sleep),
# and each time the reactor is made to hand it over (on a busy machine it may then
# wait for a CPU as well). One step a batch, about every 20 ms at 200k msg/s, against
# this: broker CPU 5.60 -> 5.53 us a message in bench scenario 1, interleaved.
# A trickle (the last step took less than a batch) is stepped every ``_IDLE_WAIT``
# instead, or at once when a batch fills: at a paced 1,000 msg/s ten steps a second
# each held the GIL ~0.15 ms (~0.15 % of the time; a message arriving then waited
# for it, at the p99.9 of issue 31's latency test), one a second holds it ~0.2 ms.
_STEP_WAIT = 0.1
_EVENT_FIELDS = frozenset(EVENT_FIELD_NAMES)
# Each tuple of field names events came with, itself (checked once; bounded: the
# names come from the broker's code, not from clients).
_KNOWN_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}
_COUNTERS = ("messages", "events", "segments", "bytes", "filtered", "errors", "lost")


def _checked(kind: str, names: tuple[str, ...], count: int) -> tuple[str, ...]:
    """An event's ``names`` (with ``count`` values) and ``kind`` checked, and kept."""
    for name in names:
        if name not in _EVENT_FIELDS:
            raise ValueError(f"archive: event {kind!r} has no column {name!r}")
    if count != len(names):
        raise ValueError(f"archive: event {kind!r}: {count} values for {len(names)} columns")
    if kind not in EVENT_KINDS:
        raise ValueError(f"archive: unknown event kind {kind!r}")
    return _KNOWN_NAMES.setdefault(names, names)


def stored_bytes(cap: int, sizes: list[int]) -> int:
    """Bytes of payload kept for messages of these sizes, each capped at ``cap``."""
    if not cap:
        return 0
    if max(sizes) <= cap:
        return sum(sizes)
    return sum(size if size < cap else cap for size in sizes)


def take_messages(full: deque[tuple[list[Any], bytearray]],
                  filling: tuple[list[Any], bytearray], most: int, payload_bytes: int
                  ) -> list[tuple[list[Any], bytearray]]:
    """The queued batches (all of them up to ``most`` values, bounded by the buffer),
    as they are; when none is queued, what the batch being filled (``filling``)
    holds so far. The reactor side only adds whole records at the end of that pair
    (the payload first) or queues it, so its first ``n`` values and their payloads'
    bytes stay as they are between the copy and the delete. Feeding thread only."""
    taken: list[tuple[list[Any], bytearray]] = []
    values = 0
    while full and values < most:
        batch = full.popleft()   # only this thread removes: never empty here
        if batch[0]:
            taken.append(batch)
            values += len(batch[0])
    if not taken:
        buffer, payloads = filling
        n = len(buffer)
        if n:
            head = buffer[:n]
            del buffer[:n]
            stored = stored_bytes(payload_bytes, head[SIZE_VALUE::MESSAGE_VALUES])
            data = payloads[:stored]
            del payloads[:stored]
            taken.append((head, data))
    return taken


class DropSpells:
    """Spells of records dropped at the buffer's bound, one flag per dataset: the
    first drop of a spell is one log line (reactor side). The feeding thread ends a
    spell before a step's take once less than half the bound waits (``end``), not
    at every step: a writer that cannot keep up makes one line however long it
    lasts. (While the reactor drops, at least half the bound waits until the thread
    takes: a batch is at most half of it.)"""

    __slots__ = ("events", "limit", "messages")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.messages = False
        self.events = False

    def begin(self, what: str, bound: int) -> None:
        """The first ``what`` (messages or events) dropped since the spell ended, at
        a bound of ``bound`` records (0 while closing: no line then)."""
        if not bound:
            return
        if what == "events":
            self.events = True
        else:
            self.messages = True
        log.warn("archive: the buffer is full ({n} {what} waiting, --archive-buffer "
                 "{limit}); {what} are dropped and counted "
                 "($SYS/broker/archive/dropped) until the writer catches up",
                 n=bound, what=what, limit=self.limit)

    def end(self, messages_waiting: Callable[[], int],
            events_waiting: Callable[[], int]) -> None:
        """Feeding thread, before it takes: end each spell whose backlog drained.
        (Not locked: should the reactor fill more than half the buffer and begin a
        new spell between this test and its write, that spell's next drop logs a
        second line; an extra line at most, and only with a small buffer.)"""
        half = self.limit / 2
        if self.messages and messages_waiting() < half:
            self.messages = False
        if self.events and events_waiting() < half:
            self.events = False


class Archive:
    """Parquet archive of messages and events, written off the reactor's process."""

    records_messages = True

    def __init__(self, directory: str, reactor_or_clock: Any, *, payload_bytes: int = 256,
                 roll_seconds: float = 60.0, roll_bytes: int = 64 << 20,
                 buffer_limit: int = DEFAULT_BUFFER_LIMIT, retention_days: int = 30,
                 include: Sequence[str] = ("#",),
                 exclude: Sequence[str] = DEFAULT_EXCLUDE,
                 row_group_rows: int = 8192) -> None:
        if payload_bytes < 0 or buffer_limit < 1 or roll_seconds <= 0 or roll_bytes < 1:
            raise ValueError("archive: payload_bytes >= 0, buffer_limit >= 1, "
                             "roll_seconds > 0 and roll_bytes >= 1 are required")
        self.directory = directory
        self.clock = reactor_or_clock
        self.payload_bytes = payload_bytes
        self.roll_seconds = roll_seconds
        self.retention_days = retention_days
        self.buffer_limit = buffer_limit
        self.selector = TopicSelector(include, exclude)  # checked here, used by the writer
        self._config: dict[str, Any] = {
            "directory": directory, "payload_bytes": payload_bytes,
            "roll_seconds": roll_seconds, "roll_bytes": roll_bytes,
            "retention_days": retention_days, "include": tuple(include),
            "exclude": tuple(exclude), "row_group_rows": row_group_rows}
        # Messages are kept flat, MESSAGE_VALUES values each, in one list: no tuple
        # (a GC-tracked object) per message, hence fewer young collections on the
        # reactor thread, and the writer slices columns out of it directly. Their
        # payloads are copied into one bytearray while the reactor has them in its
        # cache: the feeding thread never touches a payload object, and the
        # reactor frees each one as it would without the archive. Full batches
        # are queued whole: the feeding thread neither copies nor deletes their
        # values (which touched every record's objects once more, on the GIL).
        self._messages: list[Any] = []              # the batch being filled...
        self._payloads = bytearray()                # ...and its payloads
        # The same pair, for the feeding thread (one read, never half of a swap):
        self._filling: tuple[list[Any], bytearray] = (self._messages, self._payloads)
        self._full: deque[tuple[list[Any], bytearray]] = deque()  # oldest first
        # Events: a time each in an array, the other values flat in a list, in
        # batches queued whole as messages' are (``eventbuffer``: no object per
        # event outlives the call).
        self._events = EventBatches(buffer_limit, self._events_queued)
        self._limit = buffer_limit   # 0 once closing: every record is then dropped
        self._batch = max(1, min(_BATCH, buffer_limit // 2))   # messages per batch
        self._rotate_at = self._batch * MESSAGE_VALUES   # values; 0 once closing
        # Counted on the reactor thread:
        self.dropped = 0
        self._spells = DropSpells(buffer_limit)
        # Written by the feeding thread only (each a whole new dict, read as it is):
        self._counts: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self._base = dict(self._counts)  # what writer processes that died had done
        self._open_rows = 0              # rows in the writer's open segments
        self._inflight = 0               # records sent and not yet answered
        self._writer = WriterProcess(self._config)
        self._fault: str | None = None   # tests: the next append of this dataset fails
        self._worker: threading.Thread | None = None
        self._batch_limit = max(_FRAME, buffer_limit)   # messages a step may take
        self._behind = False   # the last step took half the buffer or more
        self._taken = 0        # messages the last step took
        self._dozing = False   # the feeding thread sleeps ``_IDLE_WAIT``: wake it for work
        # (events that wake it: half the buffer when that is smaller than a frame)
        self._event_wake = max(1, min(_EVENT_WAKE, buffer_limit // 2))
        self._stopping = False
        self._wake = threading.Event()
        self._progress = threading.Condition()
        self._steps = 0

    @property
    def filtered(self) -> int:
        return self._counts["filtered"]

    @property
    def errors(self) -> int:
        return self._counts["errors"]

    @property
    def lost(self) -> int:
        """Records lost after they left the buffer: in segments abandoned after a
        write error, or held by a writer process that died."""
        return self._counts["lost"]

    @property
    def writer_pid(self) -> int | None:
        """The writer process's PID while it runs (for tests and tools)."""
        return self._writer.pid

    # -- reactor side -------------------------------------------------------------------

    def message(self, timestamp: float, topic: str, qos: int, retain: bool, payload: bytes,
                publisher: str | None, user: str | None, protocol: str | None,
                deliveries: int, dropped: int) -> None:
        """Record one routed message. Cheap: a length check, a copy of the payload
        and one ``extend`` (single calls under the GIL: the feeding thread never sees
        half a record, and the payload comes first)."""
        buffer = self._messages
        if len(buffer) >= self._rotate_at:
            batch = self._rotate()
            if batch is None:
                self.dropped += 1
                if not self._spells.messages:
                    self._spells.begin("messages", self._limit)
                return
            buffer = batch
        size = len(payload)
        if size > self.payload_bytes:
            payload = payload[:self.payload_bytes]
        payloads = self._payloads
        payloads += payload
        buffer += (timestamp, topic, qos, retain, size, publisher, user, protocol,
                   deliveries, dropped)

    def _rotate(self) -> list[Any] | None:
        """The batch being filled is full: queue it and return a new, empty one; or
        None (the record is dropped) while closing or when the queued batches and a
        new one would hold more than ``buffer_limit`` messages. O(1), no lock."""
        full = self._full
        if not self._rotate_at or (len(full) + 2) * self._batch > self._limit:
            self._rouse()         # (full: the thread must take what is queued)
            return None
        # Queued, then replaced (as ``EventBatches._rotate``): ``_messages_waiting``
        # (the batch being filled read first) never misses it; the thread takes
        # from ``_filling`` only when it found no queued batch.
        full.append(self._filling)
        batch: list[Any] = []
        self._messages, self._payloads = self._filling = (batch, bytearray())
        self._rouse()         # (messages after a quiet spell: at once, not within 1 s)
        return batch

    def _rouse(self) -> None:
        """Wake the feeding thread if it sleeps ``_IDLE_WAIT`` (reactor side)."""
        if self._dozing:
            self._dozing = False
            self._wake.set()

    def event(self, timestamp: float, kind: str, client_id: str | None,
              **fields: object) -> None:
        """Record one event. ``kind`` is one of ``EVENT_KINDS``; ``fields`` are
        columns of ``EVENT_FIELDS``. A wrong name is a programming error: raises
        ``ValueError`` at once rather than losing the record later."""
        self.fields_event(timestamp, kind, client_id, tuple(fields), tuple(fields.values()))

    def fields_event(self, timestamp: float, kind: str, client_id: str | None,
                     names: tuple[str, ...], values: tuple[object, ...]) -> None:
        """``event``, its fields as ``names`` and ``values`` (no keywords to parse: ~2,000 less)."""
        known = _KNOWN_NAMES.get(names)
        if known is None or len(values) != len(known) or kind not in EVENT_KINDS:
            known = _checked(kind, names, len(values))   # (or raises what is wrong)
        # Flat, the names shared (a CONNECT is 8 references and 8 bytes of time
        # while it waits, where its tuple and float were 160 bytes of pymalloc's
        # small blocks; a connect storm buffers two events a client, issue 31 §2).
        # (compiled, a starred display went through ``PySequence_Fast``: ~2,000 more)
        head: tuple[object, ...] = (kind, client_id, known)
        if not self._events.add(timestamp, head + values):
            self.dropped += 1    # (full: ``add`` refuses in two comparisons)
            if not self._spells.events:
                self._spells.begin("events", self._limit)

    def _events_queued(self, queued: int) -> None:
        """Events were queued (a frame's worth, or no room left): wake the thread."""
        if queued >= self._event_wake:
            self._rouse()

    def stats(self) -> dict[str, int]:
        """Counters for $SYS and the console (plain reads; no lock needed)."""
        c = self._counts
        return {
            "records": c["messages"] + c["events"],
            "messages": c["messages"],
            "events": c["events"],
            "dropped": self.dropped,
            "segments": c["segments"],
            "bytes": c["bytes"],
            "buffered": self._waiting() + self._inflight,
            "filtered": c["filtered"],
            "errors": c["errors"],
            "lost": c["lost"],
        }

    def start(self) -> None:
        """Remove what a crash left, then start the writer process and the thread
        that feeds it."""
        if self._worker is not None:
            raise RuntimeError("archive: already started")
        check_writable(self.directory)
        for path in remove_leftovers(self.directory):
            log.info("archive: removed unfinished segment {path}", path=path)
        try:
            self._writer.spawn()
        except OSError as e:
            raise RuntimeError(f"archive: cannot start its writer process ({e}); "
                               "run with --no-archive") from None
        self._worker = threading.Thread(target=self._run, name="mqttamqp-archive",
                                        daemon=True)
        self._worker.start()

    def close(self) -> Deferred[None]:
        """Stop taking records, write what is buffered, close the open segments, let
        the writer process exit and end the thread. Fires once the thread is gone;
        with a real reactor the join happens on the thread's way out, never on the
        reactor thread."""
        self._limit = self._rotate_at = 0
        self._events.close()
        thread = self._worker
        if thread is None or not thread.is_alive():
            self._stopping = True
            return succeed(None)
        call_from_thread: Callable[..., Any] | None = getattr(
            self.clock, "callFromThread", None)
        if call_from_thread is None:
            # A task.Clock in tests: no reactor to call back into; wait here.
            self._stopping = True
            self._wake.set()
            thread.join(2 * EXIT_WAIT)
            return succeed(None)
        done: Deferred[None] = Deferred()
        # Set before _stopping: the thread leaves only once it sees _stopping, and
        # then it must find who to tell.
        self._on_exit = lambda: call_from_thread(done.callback, None)
        self._stopping = True
        self._wake.set()
        return done

    # -- for tests and tools (blocking: never call on the reactor thread) --------------

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Wake the feeding thread and wait until ``predicate()`` holds after one of
        its steps, or ``timeout`` passes. For tests and command-line tools."""
        deadline = time.monotonic() + timeout
        with self._progress:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.set()
                self._progress.wait(min(left, 0.5))
        return True

    def wait_step(self, timeout: float = 10.0) -> bool:
        """Wait until the writer has finished one whole step begun after this call."""
        with self._progress:
            target = self._steps + 2
        return self.wait_until(lambda: self._steps >= target, timeout)

    # -- feeding thread -----------------------------------------------------------------

    _on_exit: Callable[[], Any] | None = None

    def _run(self) -> None:
        try:
            while True:
                stopping = self._stopping
                began = time.monotonic()
                progressed = self._step()
                waiting = self._waiting()
                if stopping and (not waiting or not progressed):
                    break
                if not stopping and (not progressed or not self._behind):
                    # Let batches build up: one frame (one pickle, a write and a
                    # few GIL hand-overs) per many records. The period counts from
                    # the step's start: the writer's time is not added to it.
                    pause = self._pause(progressed, time.monotonic() - began)
                    if pause > 0:
                        self._wake.wait(pause)
                    self._dozing = False
                    self._wake.clear()
        finally:
            self._finish()
            with self._progress:
                self._steps += 1
                self._progress.notify_all()
            if self._on_exit is not None:
                self._on_exit()

    def _pause(self, progressed: bool, elapsed: float) -> float:
        """How long to sleep after a step begun ``elapsed`` seconds ago; ``_dozing``
        is left set when a full batch (or a frame of events) should cut it short."""
        self._dozing = True   # (before the count: a batch queued after it wakes us)
        events = self._events
        if (progressed and not events.room and events.limit and events.refused
                and len(events.full) >= events.refused):
            # Events fill the buffer and it has refused some since the take: behind.
            # (Refused events do not wake the thread: the refusal that began it did,
            # or it finds it here.)
            self._dozing = False
            return 0.0
        if progressed and self._messages_waiting():
            if self._taken < self._batch and not self._full and 2 * self._batch <= self._limit:
                return _IDLE_WAIT - elapsed   # a trickle: a step a second at most
            self._dozing = False              # a stream: a frame every _STEP_WAIT
            return _STEP_WAIT - elapsed
        if progressed:
            return _IDLE_WAIT
        # no writer process: until one may be started again
        return min(_IDLE_WAIT, max(_STEP_WAIT, self._writer.respawn_at - time.monotonic()))

    def _step(self) -> bool:
        """Send one batch (perhaps empty: the writer rolls on time) and take the
        answer; false if there is no writer process to send it to."""
        if not self._writer.running and not self._writer.respawn(self._stopping):
            return False
        now = self.clock.seconds()
        messages = self._pack_all(take_messages(
            self._full, self._filling, self._batch_limit * MESSAGE_VALUES, self.payload_bytes))
        self._spells.end(self._messages_waiting, self._events.waiting)
        events = take_event_batches(self._events.full, self._events.filling, _FRAME)
        taken = sum(packed[0] for packed in messages)
        self._taken = taken
        n_events = sum(len(stamps) for stamps, _ in events) // 8
        self._inflight = taken + n_events
        self._behind = 2 * taken >= self.buffer_limit or n_events >= _FRAME
        fault, self._fault = self._fault, None
        try:
            report = self._writer.exchange((STEP, now, messages, events, fault))
        except Exception:
            self._writer_failed()
            return False
        self._apply(report)
        self._writer.recovered()
        with self._progress:
            self._steps += 1
            self._progress.notify_all()
        return True

    def _pack_all(self, batches: list[tuple[list[Any], bytearray]]) -> list[Any]:
        """``pack`` each batch; one that cannot be packed (a value of the wrong type:
        a bug upstream) is lost and counted, with one log line, instead of ending
        the feeding thread, which would drop every record after it."""
        packed = []
        for values, payloads in batches:
            try:
                packed.append(pack(values, payloads))
            except Exception:
                lost = len(values) // MESSAGE_VALUES
                log.failure("archive: a batch of {n} messages could not be packed; "
                            "it is lost", n=lost)
                self._count_lost(lost)
        return packed

    def _count_lost(self, records: int) -> None:
        """``records`` lost and one error, on top of what the writer process reports
        (``_base``: ``_apply`` adds its figures to it)."""
        base, counts = dict(self._base), dict(self._counts)
        for totals in (base, counts):
            totals["lost"] += records
            totals["errors"] += 1
        self._base, self._counts = base, counts

    def _waiting(self) -> int:
        """Records in the buffers. (From the feeding thread while the reactor adds
        it may count a batch queued meanwhile twice, never fewer records than were
        buffered when the count began.)"""
        return self._messages_waiting() + self._events.waiting()

    def _messages_waiting(self) -> int:
        filling = len(self._messages)
        queued = sum(len(v) for v, _ in list(self._full))  # list(): one call, atomic
        return (filling + queued) // MESSAGE_VALUES

    def _apply(self, report: dict[str, Any]) -> None:
        for level, text in report["logs"]:
            if level == "error":
                log.error("{text}", text=text)
            else:
                log.info("{text}", text=text)
        base = self._base
        self._open_rows = report["open_rows"]
        self._counts = {name: base[name] + report[name] for name in _COUNTERS}
        self._inflight = 0   # after the counts: "buffered" never hides a record

    def _writer_failed(self) -> None:
        """The writer process died or answered nonsense: what it held is lost."""
        self._writer.failed()
        self._count_lost(self._open_rows + self._inflight)
        self._base = dict(self._counts)   # (the next writer process counts from 0)
        self._open_rows = 0
        self._inflight = 0

    def _finish(self) -> None:
        """The clean stop: the writer closes its segments and exits."""
        if self._writer.running:
            try:
                report = self._writer.exchange((CLOSE, self.clock.seconds()), EXIT_WAIT)
            except Exception:
                self._writer_failed()
            else:
                self._apply(report)
                self._writer.stop()
        left = self._waiting()
        if left:  # no writer would take them
            self._messages.clear()
            self._payloads.clear()
            self._full.clear()
            self._events.clear()
            counts = dict(self._counts)
            counts["lost"] += left
            self._counts = counts
