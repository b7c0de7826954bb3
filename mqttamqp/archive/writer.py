"""The archive's writer process: filters records, turns them into Arrow record batches
and writes Parquet segments, in a process of its own so that none of that work holds
the broker's GIL.

The broker (``Archive``) starts it as ``python -c "... from mqttamqp.archive.writer
import main; main()"`` and, from its feeding thread, talks to it
through its stdin and stdout, one frame at a time, each answered before the next is
sent: a frame is a 4-byte big-endian length and a pickle (protocol 5) of plain values
(``frames``).

- the first frame is the configuration (``Writer`` keyword arguments) and the
  frames' ``format`` (``frames.FORMAT``): a broker that sends another (one started
  before its code on disk changed) is refused with one line on stderr and the exit
  status ``REFUSED``, which the broker logs once and does not start it again for;
- ``(STEP, now, messages, events, fault)``: the messages as batches of columns
  (``columns.pack``: numbers as packed bytes, a string every row shares once, the
  capped payloads joined), oldest first, the events as the reactor buffered them
  (``eventbuffer.take_event_batches``: batches, each its times packed and its
  values flat: kind, client id, field names, the fields' values),
  the broker's clock for roll times and retention; ``fault`` is ``None`` except in
  tests (the next append of that dataset raises ``OSError``);
- ``(CLOSE, now)``: write what is buffered, close and rename every open segment, answer
  and exit;
- the answer to each is ``Writer.report()``: cumulative counters and the lines to log.

It dies with the broker: end of file on stdin without ``CLOSE`` (the broker was killed
or crashed) makes it exit at once, leaving its open segments as they are (temporary
names that readers skip, removed by the next start). A broken stdout does the same. It
ignores SIGINT and SIGTERM, which a terminal or a service manager may send to the whole
group: the broker's clean stop sends ``CLOSE`` and waits for it.

This module must not import Twisted or the broker: it owns the files only.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from mqttamqp.archive.columns import Packed, Strings
from mqttamqp.archive.eventbuffer import event_records
from mqttamqp.archive.frames import CLOSE, FORMAT, REFUSED, STEP, read_frame, write_frame
from mqttamqp.archive.schema import (
    EVENT_COLUMNS,
    EVENT_SCHEMA,
    EVENTS,
    MESSAGE_SCHEMA,
    MESSAGES,
)
from mqttamqp.archive.segments import SegmentSet, remove_partitions_before
from mqttamqp.archive.topics import TopicSelector

__all__ = ["Writer", "STEP", "CLOSE", "WRITER_NICE", "read_frame", "write_frame", "main"]

_EVENT_OPTIONAL = tuple(EVENT_COLUMNS[3:])
_RETENTION_EVERY = 3600.0  # seconds between retention sweeps
_COLLECT_EVERY = 100       # frames between garbage collections in the writer process
WRITER_NICE = 19           # the writer process's niceness: the broker comes first


class Writer:
    """Filters, rows, segments, rolls and retention: one step per frame."""

    def __init__(self, directory: str, *, payload_bytes: int, roll_seconds: float,
                 roll_bytes: int, retention_days: int, include: Iterable[str],
                 exclude: Iterable[str], row_group_rows: int) -> None:
        self.directory = directory
        self.payload_bytes = payload_bytes
        self.retention_days = retention_days
        self.selector = TopicSelector(tuple(include), tuple(exclude))
        self.sets = {
            MESSAGES: SegmentSet(os.path.join(directory, MESSAGES), MESSAGE_SCHEMA,
                                 roll_seconds=roll_seconds, roll_bytes=roll_bytes,
                                 row_group_rows=row_group_rows,
                                 plain=("timestamp", "payload")),
            EVENTS: SegmentSet(os.path.join(directory, EVENTS), EVENT_SCHEMA,
                               roll_seconds=roll_seconds, roll_bytes=roll_bytes,
                               row_group_rows=row_group_rows),
        }
        self.filtered = 0
        self.errors = 0
        self.lost = 0          # rows in segments abandoned after a write error
        self.bad_events = 0    # batches of events that could not be read (a bug)
        self.logs: list[tuple[str, str]] = []   # (level, text), sent with the next report
        self._last_retention = float("-inf")
        self._fault: str | None = None
        # A spell of failed writes (a read-only or full file system, say) is one log
        # line when it begins and one when a segment is published again, like
        # storage's: never a traceback per step.
        self._failing_since: float | None = None
        self._failed_writes = 0      # in the current spell
        self._lost_at_start = 0      # ``lost`` when the spell began
        self._closed_mark = 0        # segments published before the last failure
        self._now = 0.0
        self._message_types = [f.type for f in MESSAGE_SCHEMA]

    def step(self, now: float, messages: list[Packed],
             events: Sequence[tuple[bytes, list[Any]]] = (),
             fault: str | None = None) -> None:
        if fault is not None:
            self._fault = fault
        self._now = now
        for packed in messages:
            self._write(MESSAGES, partial(self._append, packed=packed, now=now))
        rows = self._decode_events(events)
        if rows:
            self._write(EVENTS, lambda segments: segments.append(rows, now))
        for name, segments in self.sets.items():
            try:
                segments.roll(now)
            except Exception:
                self._failed(name, segments)
        if self.retention_days > 0 and now - self._last_retention >= _RETENTION_EVERY:
            self._last_retention = now
            self._expire(now)
        self._end_of_spell()

    def close(self) -> None:
        for name, segments in self.sets.items():
            try:
                segments.close()
            except Exception:
                self._failed(name, segments)
        self._end_of_spell()

    def report(self) -> dict[str, Any]:
        """Cumulative counters (and the log lines since the last report)."""
        m, e = self.sets[MESSAGES], self.sets[EVENTS]
        logs, self.logs = self.logs, []
        return {"messages": m.rows_written, "events": e.rows_written,
                "segments": m.segments_closed + e.segments_closed,
                "bytes": m.bytes_closed + e.bytes_closed,
                "filtered": self.filtered, "errors": self.errors, "lost": self.lost,
                "open_rows": m.open_rows + e.open_rows, "logs": logs}

    # -- internals ----------------------------------------------------------------------

    def _write(self, name: str, append: Callable[[SegmentSet], None]) -> None:
        segments = self.sets[name]
        try:
            if self._fault == name:
                self._fault = None
                raise OSError(f"archive: fault injected into {name} (tests)")
            append(segments)
        except Exception:
            self._failed(name, segments)

    def _failed(self, name: str, segments: SegmentSet) -> None:
        """A write of ``name`` failed (called from an ``except`` block): its open
        segments are dropped and counted. Logged once per spell of failures."""
        if self._failing_since is None:
            self._failing_since = self._now
            self._failed_writes = 0
            self._lost_at_start = self.lost
            error = sys.exc_info()[1]
            summary = f"{type(error).__name__}: {error}"[:300]
            # (an I/O error is the file system's; anything else is a bug of ours,
            # whose traceback is worth its lines once)
            detail = "" if isinstance(error, OSError) else f"\n{traceback.format_exc()}"
            self.logs.append(("error", f"archive: writing {name} failed ({summary}); "
                                       "records are dropped and counted as lost until "
                                       f"a segment is written again{detail}"))
        self._failed_writes += 1
        self.lost += segments.abandon()
        self.errors += 1
        self._closed_mark = self._closed()

    def _closed(self) -> int:
        return sum(s.segments_closed for s in self.sets.values())

    def _end_of_spell(self) -> None:
        """After a step: a spell of failures ends once a segment was published
        with no failure since."""
        if self._failing_since is None or self._closed() <= self._closed_mark:
            return
        self.logs.append(("info", f"archive: writing works again after "
                                  f"{self._failed_writes} failed write(s) in "
                                  f"{max(0.0, self._now - self._failing_since):.1f}s; "
                                  f"{self.lost - self._lost_at_start} record(s) lost"))
        self._failing_since = None

    def _append(self, segments: SegmentSet, packed: Packed, now: float) -> None:
        batch = self._message_batch(packed)
        if batch is not None and batch.num_rows:
            segments.append_batch(batch, now)

    def _message_batch(self, packed: Packed) -> pa.RecordBatch | None:
        """One batch of messages as the feeding thread packed it (``columns.pack``)
        as a record batch of ``MESSAGE_SCHEMA``: each number column is the buffer
        as it came, a string every row shares repeated by Arrow, the payloads one
        buffer cut at offsets computed by Arrow, and the topic filter decided once
        per distinct topic."""
        (count, seconds, topics, qos, retain, size, publisher, user, protocol,
         deliveries, dropped, payloads) = packed
        wanted = self.selector.wanted
        if not count:
            return None
        if isinstance(topics, tuple) and not wanted(topics[0]):   # one topic, unwanted
            self.filtered += count
            return None
        types = self._message_types
        micros = pc.round(pc.multiply(_numbers(pa.float64(), count, seconds), 1_000_000.0))
        sizes = _numbers(pa.int64(), count, size)
        columns = [
            micros.cast(pa.int64()).cast(types[0]),
            _strings(types[1], count, topics),
            _numbers(pa.int8(), count, qos),
            _numbers(pa.uint8(), count, retain).cast(types[3]),
            sizes,
            self._payload_column(sizes, payloads),
            _strings(types[6], count, publisher), _strings(types[7], count, user),
            _strings(types[8], count, protocol),
            _numbers(pa.int64(), count, deliveries).cast(types[9]),
            _numbers(pa.int64(), count, dropped).cast(types[10])]
        batch = pa.RecordBatch.from_arrays(columns, schema=MESSAGE_SCHEMA)
        if isinstance(topics, tuple):   # one topic, wanted
            return batch
        unwanted = {topic for topic in set(topics) if not wanted(topic)}
        if unwanted:
            batch = batch.filter(pa.array([t not in unwanted for t in topics], pa.bool_()))
            self.filtered += count - batch.num_rows
        return batch

    def _payload_column(self, sizes: pa.Array, payloads: bytes) -> pa.Array:
        """The payload column: ``payloads`` cut after each message's
        ``min(payload_size, payload_bytes)`` bytes (all null when payloads are off)."""
        kind = MESSAGE_SCHEMA.field("payload").type
        if self.payload_bytes <= 0:
            return pa.nulls(len(sizes), kind)
        kept = pc.min_element_wise(sizes, pa.scalar(self.payload_bytes, sizes.type))
        ends = pc.cumulative_sum(kept)
        total = ends[-1].as_py() if len(ends) else 0
        if total != len(payloads):
            raise ValueError(f"archive writer: {len(payloads)} bytes of payload for "
                             f"messages that kept {total}")
        offsets = pa.concat_arrays([pa.array([0], pa.int64()), ends]).cast(pa.int32())
        return pa.Array.from_buffers(kind, len(sizes),
                                     [None, offsets.buffers()[1], pa.py_buffer(payloads)])

    def _decode_events(self, events: Sequence[Any]
                       ) -> list[tuple[float, tuple[Any, ...]]]:
        """The rows of the batches of events; a batch that cannot be read (a bug
        upstream) is counted as lost and an error, the first one logged with its
        traceback; the rest of the frame, and the open segments, are kept."""
        rows: list[tuple[float, tuple[Any, ...]]] = []
        for batch in events:
            try:
                rows += self._event_rows(*batch)
            except Exception:
                lost = _records(batch)
                self.lost += lost
                self.errors += 1
                self.bad_events += 1
                if self.bad_events == 1:
                    self.logs.append(("error", f"archive: a batch of {lost} event(s) "
                                               "could not be read; it is lost (further "
                                               "ones are counted only: errors, lost)\n"
                                               f"{traceback.format_exc()}"))
        return rows

    @staticmethod
    def _event_rows(stamps: bytes, values: list[Any]
                    ) -> list[tuple[float, tuple[Any, ...]]]:
        rows: list[tuple[float, tuple[Any, ...]]] = []
        for ts, kind, client_id, names, fields in event_records(stamps, values):
            get = dict(zip(names, fields, strict=True)).get
            rows.append((ts, (round(ts * 1_000_000), kind, client_id,
                              *(get(c) for c in _EVENT_OPTIONAL))))
        return rows

    def _expire(self, now: float) -> None:
        cutoff = time.strftime("%Y-%m-%d", time.gmtime(now - self.retention_days * 86400))
        for name, segments in self.sets.items():
            removed = remove_partitions_before(os.path.join(self.directory, name), cutoff,
                                               keep=segments.open_partitions)
            for partition in removed:
                self.logs.append(("info", f"archive: removed {name}/{partition} "
                                          f"(older than {self.retention_days} days)"))


def _records(batch: Any) -> int:
    """Events in a batch that could not be read: one per time if its times are
    bytes, else one."""
    stamps = batch[0] if isinstance(batch, tuple) and batch else None
    return max(1, len(stamps) // 8) if isinstance(stamps, bytes) else 1


def _numbers(kind: pa.DataType, count: int, data: Any) -> pa.Array:
    """``count`` fixed-width values of ``kind`` in ``data`` (``bytes`` in native
    byte order) as an Arrow array over the same memory."""
    if memoryview(data).nbytes != count * kind.bit_width // 8:
        raise ValueError(f"archive writer: {memoryview(data).nbytes} bytes are not "
                         f"{count} values of {kind}")
    return pa.Array.from_buffers(kind, count, [None, pa.py_buffer(data)])


def _strings(kind: pa.DataType, count: int, column: Strings) -> pa.Array:
    """A packed string column (``(value,)`` for every row, or the values) as a
    plain ``kind`` array of ``count`` rows (the schema's type: the files keep their
    columns; Parquet dictionary-encodes them itself)."""
    if isinstance(column, tuple):
        return pa.repeat(pa.scalar(column[0], kind), count)
    if len(column) != count:
        raise ValueError(f"archive writer: {len(column)} strings for {count} rows")
    return pa.array(column, kind)


def main() -> None:
    """The writer process: frames in on stdin, reports out on stdout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inp, out = sys.stdin.fileno(), sys.stdout.fileno()
    sys.stdout = sys.stderr  # a stray print must not corrupt the frames
    # Each frame loads thousands of tuples at once; the cyclic collector would
    # walk them again and again (it more than doubled the cost of a record). Nothing
    # here makes cycles worth chasing often: collect now and then instead.
    gc.disable()
    # The broker comes first: on a busy machine this process gets the CPU the broker
    # leaves, and when that is not enough the broker's buffer fills and records are
    # dropped and counted ($SYS/broker/archive/dropped), as for any slow writer.
    # Measured on two busy cores: archive-on throughput 0.77 of off at nice 0, 0.95
    # at nice 19 (every message still archived; session 25, with SCHED_IDLE too: 2 of
    # 3 runs archived every message, as at nice 19 alone in the same run).
    try:
        os.nice(WRITER_NICE)
    except OSError:
        pass
    # And, on Linux, SCHED_IDLE: a nice-19 task that is running when a broker or
    # client thread wakes on its CPU is not preempted at once (traced here: a woken
    # subscriber waited ~2 ms behind it, bench/README "Tail latency, session 24");
    # an idle-policy task always is (its weight is a fifth of nice 19's).
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass
    steps = 0
    try:
        config = read_frame(inp)
        sent = config.pop("format", None) if isinstance(config, dict) else None
        if sent != FORMAT:
            print(f"archive: the archive writer is format {FORMAT}, the broker sent "
                  f"{sent}: restart the broker after an upgrade", file=sys.stderr,
                  flush=True)
            os._exit(REFUSED)
        writer = Writer(**config)
        while True:
            frame = read_frame(inp)
            if frame[0] == STEP:
                writer.step(*frame[1:])
                write_frame(out, writer.report())
                steps += 1
                if steps % _COLLECT_EVERY == 0:
                    gc.collect()
            elif frame[0] == CLOSE:
                writer.close()
                write_frame(out, writer.report())
                return
            else:
                raise ValueError(f"archive writer: unknown frame {frame[0]!r}")
    except (EOFError, BrokenPipeError):
        # The broker is gone without a clean stop: leave the files exactly as a
        # kill -9 would (temporary names; the next start removes them).
        os._exit(0)


if __name__ == "__main__":
    main()
