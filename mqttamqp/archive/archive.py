"""The broker's archive: every routed message and connection/session/will event,
written as Parquet by a thread of its own.

Two halves, one object:

- the reactor side (``message``, ``event``, ``stats``) appends a tuple to a bounded
  ``deque`` and returns; when the deque is full the record is dropped and counted.
  It never blocks, never touches a file and never waits for the writer;
- the writer thread drains the deques in batches, truncates nothing that the
  reactor did not already cut, filters topics (``include``/``exclude``), turns rows
  into Arrow record batches through ``SegmentSet`` and rolls segments on time or
  size. It also deletes partitions older than ``retention_days``.

``deque.append``/``popleft`` are atomic under the GIL, so the two sides share no
lock; the counters each side increments are its own. The writer reads the clock
it was given (a reactor or ``task.Clock``) for roll times only; a record's time is
the timestamp its caller passed.

This module must not be imported by the core: the broker service creates one
``Archive`` and hands the core its two bound methods.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from mqttamqp.archive.schema import (
    EVENT_COLUMNS,
    EVENT_FIELDS,
    EVENT_KINDS,
    EVENT_SCHEMA,
    EVENTS,
    MESSAGE_SCHEMA,
    MESSAGES,
)
from mqttamqp.archive.segments import (
    SegmentSet,
    remove_leftovers,
    remove_partitions_before,
)
from mqttamqp.archive.topics import TopicSelector

__all__ = ["Archive", "DEFAULT_BUFFER_LIMIT", "DEFAULT_EXCLUDE"]

log = Logger(namespace="mqttamqp.archive")

#: Records waiting for the writer, per dataset. At most ``payload_bytes`` of payload
#: each, so the worst case at the defaults is about 64k x (256 + ~150) bytes.
DEFAULT_BUFFER_LIMIT = 65536
DEFAULT_EXCLUDE = ("$SYS/#",)

_EVENT_OPTIONAL = tuple(EVENT_COLUMNS[3:])
_BATCH = 4096             # records taken from a deque per writer step
_IDLE_WAIT = 0.25         # longest the writer sleeps between looks at the deques
_RETENTION_EVERY = 3600.0  # seconds between retention sweeps


class Archive:
    """Parquet archive of messages and events, written off the reactor thread."""

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
        self.selector = TopicSelector(include, exclude)
        self._messages: deque[tuple[Any, ...]] = deque()
        self._events: deque[tuple[Any, ...]] = deque()
        self._sets = {
            MESSAGES: SegmentSet(os.path.join(directory, MESSAGES), MESSAGE_SCHEMA,
                                 roll_seconds=roll_seconds, roll_bytes=roll_bytes,
                                 row_group_rows=row_group_rows),
            EVENTS: SegmentSet(os.path.join(directory, EVENTS), EVENT_SCHEMA,
                               roll_seconds=roll_seconds, roll_bytes=roll_bytes,
                               row_group_rows=row_group_rows),
        }
        # Counted on the reactor thread:
        self.dropped = 0
        # Counted on the writer thread:
        self.filtered = 0
        self.errors = 0
        self.lost = 0          # records in segments abandoned after a write error
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._wake = threading.Event()
        self._progress = threading.Condition()
        self._steps = 0
        self._last_retention = float("-inf")

    # -- reactor side -------------------------------------------------------------------

    def message(self, timestamp: float, topic: str, qos: int, retain: bool, payload: bytes,
                publisher: str | None, user: str | None, protocol: str | None,
                deliveries: int, dropped: int) -> None:
        """Record one routed message. Cheap: a length check and an append."""
        buffer = self._messages
        if len(buffer) >= self.buffer_limit or self._stopping:
            self.dropped += 1
            return
        size = len(payload)
        if size > self.payload_bytes:
            payload = payload[:self.payload_bytes]
        buffer.append((timestamp, topic, qos, retain, size, payload, publisher, user,
                       protocol, deliveries, dropped))

    def event(self, timestamp: float, kind: str, client_id: str | None,
              **fields: object) -> None:
        """Record one event. ``kind`` is one of ``EVENT_KINDS``; ``fields`` are
        columns of ``EVENT_FIELDS``. A wrong name is a programming error: raises
        ``ValueError`` at once rather than losing the record later."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"archive: unknown event kind {kind!r}")
        for name in fields:
            if name not in EVENT_FIELDS:
                raise ValueError(f"archive: event {kind!r} has no column {name!r}")
        buffer = self._events
        if len(buffer) >= self.buffer_limit or self._stopping:
            self.dropped += 1
            return
        buffer.append((timestamp, kind, client_id, fields))

    def stats(self) -> dict[str, int]:
        """Counters for $SYS and the console (plain reads; no lock needed)."""
        m, e = self._sets[MESSAGES], self._sets[EVENTS]
        return {
            "records": m.rows_written + e.rows_written,
            "messages": m.rows_written,
            "events": e.rows_written,
            "dropped": self.dropped,
            "segments": m.segments_closed + e.segments_closed,
            "bytes": m.bytes_closed + e.bytes_closed,
            "buffered": len(self._messages) + len(self._events),
            "filtered": self.filtered,
            "errors": self.errors,
            "lost": self.lost,
        }

    def start(self) -> None:
        """Remove what a crash left, then start the writer thread."""
        if self._thread is not None:
            raise RuntimeError("archive: already started")
        probe = os.path.join(self.directory, f".probe-{os.getpid()}")
        try:  # an existing directory may still be read-only: say so now, once
            os.makedirs(self.directory, exist_ok=True)
            with open(probe, "wb"):
                pass
            os.unlink(probe)
        except OSError as e:
            raise RuntimeError(f"archive: cannot write to {self.directory}: {e.strerror}; "
                               "fix its permissions, choose --archive-dir, or run with "
                               "--no-archive") from None
        for path in remove_leftovers(self.directory):
            log.info("archive: removed unfinished segment {path}", path=path)
        self._thread = threading.Thread(target=self._run, name="mqttamqp-archive",
                                        daemon=True)
        self._thread.start()

    def close(self) -> Deferred[None]:
        """Stop taking records, write what is buffered, close the open segments
        and end the thread. Fires once the thread is gone; with a real reactor the
        join happens on the writer thread's way out, never on the reactor thread."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            self._stopping = True
            return succeed(None)
        call_from_thread: Callable[..., Any] | None = getattr(
            self.clock, "callFromThread", None)
        if call_from_thread is None:
            # A task.Clock in tests: no reactor to call back into; wait here.
            self._stopping = True
            self._wake.set()
            thread.join(30)
            return succeed(None)
        done: Deferred[None] = Deferred()
        # Set before _stopping: the writer leaves only once it sees _stopping, and
        # then it must find who to tell.
        self._on_exit = lambda: call_from_thread(done.callback, None)
        self._stopping = True
        self._wake.set()
        return done

    # -- for tests and tools (blocking: never call on the reactor thread) --------------

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Wake the writer and wait until ``predicate()`` holds after one of its
        steps, or ``timeout`` passes. For tests and command-line tools."""
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

    # -- writer thread ------------------------------------------------------------------

    _on_exit: Callable[[], Any] | None = None

    def _run(self) -> None:
        try:
            while True:
                stopping = self._stopping
                self._step()
                if stopping and not self._messages and not self._events:
                    break
                if not self._messages and not self._events:
                    self._wake.wait(_IDLE_WAIT)
                    self._wake.clear()
        finally:
            for name, segments in self._sets.items():
                try:
                    segments.close()
                except Exception:
                    self._failed(name, segments)
            with self._progress:
                self._steps += 1
                self._progress.notify_all()
            if self._on_exit is not None:
                self._on_exit()

    def _step(self) -> None:
        now = self.clock.seconds()
        self._write(MESSAGES, self._message_rows(self._take(self._messages)), now)
        self._write(EVENTS, self._event_rows(self._take(self._events)), now)
        for name, segments in self._sets.items():
            try:
                segments.roll(now)
            except Exception:
                self._failed(name, segments)
        if self.retention_days > 0 and now - self._last_retention >= _RETENTION_EVERY:
            self._last_retention = now
            self._expire(now)
        with self._progress:
            self._steps += 1
            self._progress.notify_all()

    @staticmethod
    def _take(buffer: deque[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        pop = buffer.popleft
        return [pop() for _ in range(min(len(buffer), _BATCH))]

    def _write(self, name: str, rows: list[tuple[float, tuple[Any, ...]]],
               now: float) -> None:
        if not rows:
            return
        segments = self._sets[name]
        try:
            segments.append(rows, now)
        except Exception:
            self._failed(name, segments)

    def _failed(self, name: str, segments: SegmentSet) -> None:
        log.failure("archive: writing {name} failed; the open segments are dropped",
                    name=name)
        self.lost += segments.abandon()
        self.errors += 1  # last: a reader that sees it also sees the clean-up

    def _message_rows(self, records: Iterable[tuple[Any, ...]]
                      ) -> list[tuple[float, tuple[Any, ...]]]:
        rows: list[tuple[float, tuple[Any, ...]]] = []
        append = rows.append
        wanted = self.selector.wanted
        keep_payload = self.payload_bytes > 0
        last_topic: str | None = None
        keep = False
        filtered = 0
        for (ts, topic, qos, retain, size, payload, publisher, user, protocol,
             deliveries, dropped) in records:
            if topic != last_topic:   # a stream on one topic asks once
                last_topic = topic
                keep = wanted(topic)
            if not keep:
                filtered += 1
                continue
            append((ts, (round(ts * 1_000_000), topic, qos, retain, size,
                         payload if keep_payload else None, publisher, user,
                         protocol, deliveries, dropped)))
        self.filtered += filtered
        return rows

    @staticmethod
    def _event_rows(records: Iterable[tuple[Any, ...]]
                    ) -> list[tuple[float, tuple[Any, ...]]]:
        rows: list[tuple[float, tuple[Any, ...]]] = []
        for ts, kind, client_id, fields in records:
            get = fields.get
            rows.append((ts, (round(ts * 1_000_000), kind, client_id,
                              *(get(c) for c in _EVENT_OPTIONAL))))
        return rows

    def _expire(self, now: float) -> None:
        cutoff = time.strftime("%Y-%m-%d", time.gmtime(now - self.retention_days * 86400))
        for name, segments in self._sets.items():
            removed = remove_partitions_before(os.path.join(self.directory, name), cutoff,
                                               keep=segments.open_partitions)
            for partition in removed:
                log.info("archive: removed {name}/{partition} (older than {days} days)",
                         name=name, partition=partition, days=self.retention_days)
