"""The archive writer: segments, partitions, schema, filters, drops and crashes.

No Spark here: files are read back with pyarrow. Time is a ``task.Clock``; the
writer thread is real and tests wait on its progress, never sleep.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from archive_files import T0, alive, hidden, read
from twisted.internet.task import Clock

import mqttamqp.archive.archive as archive_module
from mqttamqp.archive import (
    CAUSE_LOST,
    CONNECT,
    DISCONNECT,
    EVENT_SCHEMA,
    MESSAGE_SCHEMA,
    Archive,
    TopicSelector,
    filter_matches,
)
from mqttamqp.archive.columns import pack, strings
from mqttamqp.archive.segments import SegmentSet, partition_of
from mqttamqp.archive.writer import WRITER_NICE, Writer


def visible(root: Path, dataset: str = "messages") -> list[str]:
    base = root / dataset
    if not base.exists():
        return []
    return sorted(str(p.relative_to(base)) for p in base.rglob("*")
                  if p.is_file() and not p.name.startswith("."))


def publish(archive: Archive, ts: float, topic: str = "a/b", payload: bytes = b"x",
            **kw: Any) -> None:
    args: dict[str, Any] = dict(qos=1, retain=False, publisher="dev1", user="u",
                                protocol="mqtt3.1.1", deliveries=2, dropped=0)
    args.update(kw)
    archive.message(ts, topic, args["qos"], args["retain"], payload, args["publisher"],
                    args["user"], args["protocol"], args["deliveries"], args["dropped"])


@pytest.fixture
def clock() -> Clock:
    c = Clock()
    c.advance(T0)
    return c


@pytest.fixture
def archive(tmp_path: Path, clock: Clock) -> Any:
    a = Archive(str(tmp_path), clock, roll_seconds=60, row_group_rows=4)
    a.start()
    yield a
    a.close()


def test_filter_matching_follows_mqtt_rules() -> None:
    """The archive's include/exclude filters match topics by MQTT's rules ($SYS only by its
    own filters)."""
    assert filter_matches("a/+/c", "a/b/c") and not filter_matches("a/+/c", "a/b/d")
    assert filter_matches("a/#", "a") and filter_matches("a/#", "a/b/c")
    assert not filter_matches("#", "$SYS/broker") and filter_matches("$SYS/#", "$SYS/x")
    assert not filter_matches("a/b", "a/b/c") and not filter_matches("a/b/c", "a/b")
    sel = TopicSelector(["sensors/#", "$SYS/broker/load"], ["sensors/secret/#"])
    assert sel.wanted("sensors/1") and not sel.wanted("sensors/secret/k")
    assert sel.wanted("$SYS/broker/load") and not sel.wanted("other")


def test_partition_is_utc_date_and_hour() -> None:
    """A record's partition is its UTC date and hour."""
    assert partition_of(T0) == ("2026-11-24", "07")
    assert partition_of(T0 + 30) == ("2026-11-24", "08")


def test_segment_visible_only_after_close(tmp_path: Path) -> None:
    """A segment is a hidden file until it rolls at its age, then one visible Parquet file
    in its partition."""
    seg = SegmentSet(str(tmp_path / "messages"), MESSAGE_SCHEMA, roll_seconds=60,
                     roll_bytes=1 << 20, row_group_rows=2)
    row = (int(T0 * 1e6), "t", 0, False, 1, b"x", "c", None, "amqp", 1, 0)
    seg.append([(T0, row)] * 3, now=T0)
    assert visible(tmp_path) == [] and len(hidden(tmp_path)) == 1
    assert not seg.roll(T0 + 59.9)
    assert seg.roll(T0 + 60)
    files = visible(tmp_path)
    assert len(files) == 1 and files[0].startswith("date=2026-11-24/hour=07/part-")
    assert files[0].endswith(".parquet") and hidden(tmp_path) == []
    assert (seg.rows_written, seg.segments_closed) == (3, 1)
    assert seg.bytes_closed == os.path.getsize(tmp_path / "messages" / files[0])


def test_segment_rolls_at_size(tmp_path: Path) -> None:
    """A segment rolls once it reaches its size bound."""
    seg = SegmentSet(str(tmp_path / "messages"), MESSAGE_SCHEMA, roll_seconds=3600,
                     roll_bytes=1, row_group_rows=1)
    row = (int(T0 * 1e6), "t", 0, False, 1, b"x", None, None, "amqp", 0, 0)
    seg.append([(T0, row)], now=T0)
    assert seg.roll(T0 + 1) and len(visible(tmp_path)) == 1


def test_new_hour_closes_the_previous_hours_segment(tmp_path: Path) -> None:
    """A record of a new hour closes the previous hour's segment; close closes the rest."""
    seg = SegmentSet(str(tmp_path / "messages"), MESSAGE_SCHEMA, roll_seconds=3600,
                     roll_bytes=1 << 30)
    row = (int(T0 * 1e6), "t", 0, False, 1, b"x", None, None, "amqp", 0, 0)
    seg.append([(T0, row)], now=T0)
    seg.append([(T0 + 31, row)], now=T0 + 31)
    assert [f.split("/part-")[0] for f in visible(tmp_path)] == ["date=2026-11-24/hour=07"]
    seg.close()
    assert len(visible(tmp_path)) == 2 and hidden(tmp_path) == []


def test_messages_schema_partitions_and_payload_cap(tmp_path: Path, clock: Clock) -> None:
    """Messages are written with the schema's types, partitioned by hour, payloads capped,
    $SYS excluded by default."""
    a = Archive(str(tmp_path), clock, payload_bytes=4)
    a.start()
    publish(a, T0 + 0.000001, payload=b"0123456789", qos=2, retain=True)
    publish(a, T0 + 31.5, topic="b", payload=b"ab", publisher=None, user=None,
            protocol="amqp", deliveries=0, dropped=3)
    publish(a, T0 + 32, topic="$SYS/broker/uptime")  # excluded by default
    assert a.wait_until(lambda: a.stats()["filtered"] == 1) and a.wait_step()
    assert visible(tmp_path) != []  # the 07:00 hour closed when 08:00 began
    a.close()
    assert hidden(tmp_path) == []
    table = read(tmp_path).sort_by("timestamp")
    assert table.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    rows = table.to_pylist()
    assert [(r["date"], r["hour"]) for r in rows] == [("2026-11-24", 7), ("2026-11-24", 8)]
    first, second = rows
    assert first["timestamp"].timestamp() == pytest.approx(T0 + 0.000001, abs=1e-6)
    assert (first["topic"], first["qos"], first["retain"], first["payload_size"],
            first["payload"], first["publisher"], first["user"], first["protocol"],
            first["deliveries"], first["dropped"]) == (
        "a/b", 2, True, 10, b"0123", "dev1", "u", "mqtt3.1.1", 2, 0)
    assert (second["payload"], second["publisher"], second["protocol"],
            second["dropped"]) == (b"ab", None, "amqp", 3)
    for f in visible(tmp_path):
        assert pq.read_schema(tmp_path / "messages" / f).equals(MESSAGE_SCHEMA)
    assert a.stats() | {"bytes": 0} == {
        "records": 2, "messages": 2, "events": 0, "dropped": 0, "segments": 2, "bytes": 0,
        "buffered": 0, "filtered": 1, "errors": 0, "lost": 0}


def test_payload_bytes_zero_stores_no_payload(tmp_path: Path, clock: Clock) -> None:
    """With payload bytes 0 no payload is stored, only its size."""
    a = Archive(str(tmp_path), clock, payload_bytes=0)
    a.start()
    publish(a, T0, payload=b"secret")
    a.close()
    (row,) = read(tmp_path).to_pylist()
    assert row["payload"] is None and row["payload_size"] == 6


def test_include_and_exclude(tmp_path: Path, clock: Clock) -> None:
    """Only topics the include filters match and the exclude filters do not are archived;
    the others are counted as filtered."""
    a = Archive(str(tmp_path), clock, include=["plant/#", "$SYS/broker/load"],
                exclude=["plant/debug/#"])
    a.start()
    for topic in ["plant/1/t", "plant/debug/x", "office/1", "$SYS/broker/load"]:
        publish(a, T0, topic=topic)
    a.close()
    assert sorted(read(tmp_path).column("topic").to_pylist()) == [
        "$SYS/broker/load", "plant/1/t"]
    assert a.stats()["filtered"] == 2


def test_packed_columns_come_back_as_the_rows_recorded(tmp_path: Path) -> None:
    """The feeding thread's columns (``columns.pack``) through the writer's Arrow
    conversion: every value of every row as recorded, strings that vary per row
    and ones that do not, nulls among them, the payload cap, and topics filtered
    once per distinct topic."""
    rows = [(T0 + i / 1000, f"plant/{i % 7}" if i % 5 else "office/x", i % 3, i % 2 == 0,
             i, f"dev{i % 4}" if i % 3 else None, None if i % 2 else "u", "mqtt3.1.1",
             i % 9, i % 4) for i in range(300)]
    values: list[Any] = []
    payloads = bytearray()
    for (ts, topic, qos, retain, size, publisher, user, protocol, deliveries,
         dropped) in rows:
        payloads += bytes(range(256))[:min(size, 16)]
        values += (ts, topic, qos, retain, size, publisher, user, protocol, deliveries,
                   dropped)
    packed = pickle.loads(pickle.dumps(pack(values, payloads), protocol=5))
    w = Writer(str(tmp_path), payload_bytes=16, roll_seconds=60, roll_bytes=1 << 30,
               retention_days=0, include=["#"], exclude=["office/#"], row_group_rows=64)
    batch = w._message_batch(packed)
    assert batch is not None and batch.schema.equals(MESSAGE_SCHEMA)
    kept = [r for r in rows if not r[1].startswith("office/")]
    assert w.filtered == len(rows) - len(kept)
    got = batch.to_pylist()
    assert [(r["timestamp"].timestamp(), r["topic"], r["qos"], r["retain"],
             r["payload_size"], r["publisher"], r["user"], r["protocol"], r["deliveries"],
             r["dropped"]) for r in got] == [
        (pytest.approx(r[0], abs=1e-6), *r[1:]) for r in kept]
    assert [r["payload"] for r in got] == [bytes(range(256))[:min(r[4], 16)] for r in kept]
    # A batch of one topic: all of it kept, or all of it filtered.
    one = [T0, "office/x", 0, False, 1, "dev", "u", "amqp", 1, 0]
    assert w._message_batch(pack(one * 3, b"xxx")) is None
    assert w.filtered == len(rows) - len(kept) + 3
    one[1] = "plant/1"
    kept_batch = w._message_batch(pack(one * 3, b"xxx"))
    assert kept_batch is not None and kept_batch.column("topic").to_pylist() == ["plant/1"] * 3


def test_a_string_column_that_every_row_shares_travels_once() -> None:
    """A string column whose rows all share one value is sent as that one value."""
    assert strings(["a", "a", "a"]) == ("a",)
    assert strings([None, None]) == (None,)
    assert strings(["a", None, "a"]) == ["a", None, "a"]


def test_events_one_schema_with_nullable_columns(tmp_path: Path, clock: Clock) -> None:
    """Events of every kind share one schema with nullable columns; unknown kinds and
    fields are refused."""
    a = Archive(str(tmp_path), clock)
    a.start()
    a.event(T0, CONNECT, "dev1", protocol="mqtt3.1.1", address="127.0.0.1:5000",
            user="u", clean_session=False, keepalive=30)
    a.event(T0 + 1, DISCONNECT, "dev1", reason=CAUSE_LOST)
    with pytest.raises(ValueError):
        a.event(T0, "connected", "dev1")
    with pytest.raises(ValueError):
        a.event(T0, CONNECT, "dev1", colour="red")
    a.close()
    rows = read(tmp_path, "events").sort_by("timestamp").to_pylist()
    assert [(r["kind"], r["client_id"], r["reason"], r["keepalive"]) for r in rows] == [
        ("connect", "dev1", None, 30), ("disconnect", "dev1", "lost", None)]
    assert rows[0]["clean_session"] is False and rows[0]["address"] == "127.0.0.1:5000"
    (name,) = visible(tmp_path, "events")
    assert pq.read_schema(tmp_path / "events" / name).equals(EVENT_SCHEMA)


def test_roll_on_time_with_the_injected_clock(archive: Archive, clock: Clock,
                                              tmp_path: Path) -> None:
    """Segments roll when the injected clock passes their age, not by wall time."""
    publish(archive, T0)
    assert archive.wait_until(lambda: archive.stats()["buffered"] == 0)
    assert archive.wait_step()
    assert visible(tmp_path) == [] and len(hidden(tmp_path)) == 1
    clock.advance(60)
    assert archive.wait_until(lambda: archive.stats()["segments"] == 1)
    assert len(visible(tmp_path)) == 1 and hidden(tmp_path) == []


def stall_first_message_step(a: Archive) -> tuple[threading.Event, threading.Event]:
    """Make the feeding thread's first frame with a message wait, inside the
    exchange with the writer process, until the test sets ``release``; ``entered``
    is set once it waits."""
    entered, release = threading.Event(), threading.Event()
    real_exchange = a._writer.exchange

    def stalled_exchange(frame: Any, *args: Any) -> Any:
        if frame[0] == "step" and frame[2]:
            entered.set()
            assert release.wait(30)
        return real_exchange(frame, *args)

    a._writer.exchange = stalled_exchange  # type: ignore[method-assign]
    return entered, release


def test_stalled_writer_drops_and_counts_without_blocking(tmp_path: Path,
                                                         clock: Clock) -> None:
    """A stalled writer makes the bounded buffer drop and count, and the caller never
    blocks."""
    a = Archive(str(tmp_path), clock, buffer_limit=10)
    entered, release = stall_first_message_step(a)
    a.start()
    publish(a, T0)
    assert a.wait_until(entered.is_set)
    assert a.stats()["buffered"] == 1  # taken, not yet written: still counted
    for i in range(25):  # the feeding thread is stuck: nothing drains
        publish(a, T0 + i / 100)
    assert a.stats()["dropped"] == 15 and a.stats()["buffered"] == 11
    a.event(T0, CONNECT, "x")  # events have their own bound
    release.set()
    a.close()
    assert a.stats() | {"bytes": 0} == {
        "records": 12, "messages": 11, "events": 1, "dropped": 15, "segments": 2,
        "bytes": 0, "buffered": 0, "filtered": 0, "errors": 0, "lost": 0}
    assert len(read(tmp_path)) == 11


def test_whole_batches_are_queued_within_the_bound_and_written_in_order(
        tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Full batches are queued whole (no copy); the queue and the batch being filled
    together hold at most ``buffer_limit`` messages, the rest is dropped and counted,
    and what was kept is written once each, in order."""
    monkeypatch.setattr(archive_module, "_BATCH", 4)
    a = Archive(str(tmp_path), clock, buffer_limit=20)
    entered, release = stall_first_message_step(a)
    a.start()
    publish(a, T0, topic="t/0")
    assert a.wait_until(entered.is_set)
    for i in range(1, 31):
        publish(a, T0, topic=f"t/{i}")
    # 1 in flight, 4 queued batches of 4 and 4 in the batch being filled; 10 dropped
    assert a.stats()["dropped"] == 10 and a.stats()["buffered"] == 21
    release.set()
    a.close()
    assert read(tmp_path).column("topic").to_pylist() == [f"t/{i}" for i in range(21)]
    assert a.stats()["messages"] == 21 and a.stats()["lost"] == 0


def test_records_added_while_the_thread_feeds_are_each_written_once_in_order(
        tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reactor side queues batches while the feeding thread takes from the batch
    being filled (and from batches it queued meanwhile): every record arrives once,
    in order, with its own payload (some cut at the cap, some empty). Small batches
    make the two meet often."""
    monkeypatch.setattr(archive_module, "_BATCH", 7)
    a = Archive(str(tmp_path), clock, buffer_limit=1_000_000, payload_bytes=8)
    a.start()
    count = 20_000

    def payload(i: int) -> bytes:
        return str(i).encode() * (i % 4)

    for i in range(count):
        publish(a, T0, topic=str(i), payload=payload(i))
        if i % 1000 == 0:
            a._wake.set()  # meet the feeding thread in the middle of a batch
    a.close()
    assert a.stats()["dropped"] == 0 and a.stats()["lost"] == 0
    table = read(tmp_path)
    assert table.column("topic").to_pylist() == [str(i) for i in range(count)]
    assert table.column("payload").to_pylist() == [payload(i)[:8] for i in range(count)]
    assert table.column("payload_size").to_pylist() == [len(payload(i)) for i in range(count)]


def test_a_slow_writer_process_never_blocks_the_reactor_side(tmp_path: Path,
                                                            clock: Clock) -> None:
    """The writer process itself stopped (SIGSTOP): the feeding thread waits for its
    answer, the buffer fills, records are dropped and counted; once it runs again
    everything buffered is written."""
    a = Archive(str(tmp_path), clock, buffer_limit=100)
    a.start()
    assert a.wait_step(30)
    pid = a.writer_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        for i in range(1000):    # returns while the writer is stopped: nothing waits
            publish(a, T0 + i / 1000)
        # What is held stays within the bound (in flight to the writer included); the
        # rest is dropped and counted.  (Speed is the benchmark's business, not a test's.)
        assert a.stats()["buffered"] <= 100
        assert a.stats()["dropped"] >= 800
    finally:
        os.kill(pid, signal.SIGCONT)
    a.close()
    stats = a.stats()
    assert stats["messages"] + stats["dropped"] == 1000 and stats["lost"] == 0
    assert len(read(tmp_path)) == stats["messages"]


def test_records_after_close_are_counted_as_dropped(tmp_path: Path, clock: Clock) -> None:
    """A record given after close is counted as dropped."""
    a = Archive(str(tmp_path), clock)
    a.start()
    a.close()
    publish(a, T0)
    assert a.stats()["dropped"] == 1


def test_close_fires_through_the_reactor_when_there_is_one(tmp_path: Path,
                                                          clock: Clock) -> None:
    """With a reactor, close's Deferred fires through callFromThread."""
    fired = threading.Event()
    threads: list[str] = []

    class Reactor:
        def seconds(self) -> float:
            return clock.seconds()

        def callFromThread(self, f: Any, *args: Any) -> None:
            threads.append(threading.current_thread().name)
            f(*args)

    a = Archive(str(tmp_path), Reactor())
    a.start()
    publish(a, T0)
    d = a.close()
    d.addCallback(lambda _: fired.set())
    assert fired.wait(10)
    assert threads == ["mqttamqp-archive"] and len(visible(tmp_path)) == 1


def test_write_error_is_counted_and_the_writer_goes_on(tmp_path: Path, clock: Clock) -> None:
    """A failed write is counted (its segment lost, its temp file removed) and later
    records are written."""
    a = Archive(str(tmp_path), clock, row_group_rows=1)
    a.start()
    publish(a, T0, topic="a")
    assert a.wait_until(lambda: a.stats()["buffered"] == 0) and a.wait_step()
    (temp,) = hidden(tmp_path)
    a._fault = "messages"   # the writer process's next append raises OSError
    publish(a, T0, topic="b")
    assert a.wait_until(lambda: a.stats()["errors"] == 1)
    assert not temp.exists()
    publish(a, T0, topic="c")
    a.close()
    assert read(tmp_path).column("topic").to_pylist() == ["c"]
    assert a.stats()["lost"] == 1 and a.stats()["errors"] == 1


def test_a_batch_that_cannot_be_packed_is_counted_and_the_archive_goes_on(
        tmp_path: Path, clock: Clock) -> None:
    """A value the columns cannot hold (a bug upstream: a count past the ``int64``
    column) costs its batch, counted, not the feeding thread: before, the thread
    died and every later record was dropped."""
    a = Archive(str(tmp_path), clock)
    a.start()
    publish(a, T0, topic="a")
    assert a.wait_until(lambda: a.stats()["buffered"] == 0) and a.wait_step()
    publish(a, T0, topic="bad", deliveries=1 << 64)
    assert a.wait_until(lambda: a.stats()["errors"] == 1)
    publish(a, T0, topic="c")
    assert a.wait_until(lambda: a.stats()["buffered"] == 0) and a.wait_step()
    a.close()
    assert read(tmp_path).column("topic").to_pylist() == ["a", "c"]
    assert a.stats()["lost"] == 1 and a.stats()["errors"] == 1


def test_a_writer_process_that_dies_is_counted_and_replaced(tmp_path: Path,
                                                            clock: Clock) -> None:
    """kill -9 of the writer process alone: its open segment is lost (counted, left
    under its temporary name), an error is counted, and a new process carries on."""
    a = Archive(str(tmp_path), clock, row_group_rows=1)
    a.start()
    publish(a, T0, topic="a")
    assert a.wait_until(lambda: a.stats()["buffered"] == 0) and a.wait_step()
    first = a.writer_pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    publish(a, T0, topic="b")
    assert a.wait_until(lambda: a.stats()["errors"] == 1)
    assert a.wait_until(lambda: a.stats()["buffered"] == 0 and a.writer_pid not in (None, first))
    publish(a, T0, topic="c")
    a.close()
    topics = read(tmp_path).column("topic").to_pylist()
    # "b" went to the dead process or, if the death was noticed first, to the new one
    assert topics in (["c"], ["b", "c"])
    assert a.stats()["lost"] == 3 - len(topics) and a.stats()["errors"] == 1
    assert len(hidden(tmp_path)) == 1   # the dead one's segment: removed at the next start
    assert not alive(first)


def test_the_writer_process_is_a_child_that_a_clean_close_ends(tmp_path: Path,
                                                               clock: Clock) -> None:
    """The writer is a child process at a lower priority than the broker (nice 19 and the
    idle scheduling policy), and a clean close ends it."""
    a = Archive(str(tmp_path), clock)
    a.start()
    assert a.wait_step(30)
    pid = a.writer_pid
    assert pid is not None and pid != os.getpid()
    with open(f"/proc/{pid}/stat") as f:
        assert int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()  # its parent
    # it runs at a lower priority than the broker: the broker comes first
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(
        19, os.getpriority(os.PRIO_PROCESS, 0) + WRITER_NICE)
    # and, where the system has it, the idle policy (preempted at once on a wake-up)
    if hasattr(os, "SCHED_IDLE"):
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
    a.close()
    assert a.writer_pid is None and not alive(pid)


def test_retention_removes_old_partitions(tmp_path: Path, clock: Clock) -> None:
    """Partitions older than the retention days are removed at start, in both datasets."""
    for day in ("2026-10-24", "2026-10-25", "2026-11-23"):
        (tmp_path / "messages" / f"date={day}" / "hour=00").mkdir(parents=True)
        (tmp_path / "events" / f"date={day}" / "hour=00").mkdir(parents=True)
    a = Archive(str(tmp_path), clock, retention_days=30)  # cut-off: 2026-10-25
    a.start()
    assert a.wait_step()
    a.close()
    for dataset in ("messages", "events"):
        assert sorted(os.listdir(tmp_path / dataset)) == ["date=2026-10-25",
                                                          "date=2026-11-23"]


def test_a_broker_that_cannot_open_its_store_leaves_the_archive_alone(tmp_path: Path) -> None:
    """The archive starts (and removes unfinished segments) only once the store is open:
    a second broker on the same data directory, refused its lock, deletes nothing of the
    running broker's open segments."""
    from mqttamqp.core.limits import Limits
    from mqttamqp.service import BrokerService

    archive_dir = tmp_path / "archive"
    svc = BrokerService(str(tmp_path / "data"), Limits(sys_interval=0),
                        archive={"directory": str(archive_dir)})
    hour = archive_dir / "messages" / "date=2026-11-24" / "hour=01"
    hour.mkdir(parents=True)
    open_segment = hour / ".part-1-2-000001.parquet.tmp"
    open_segment.write_bytes(b"being written by the running broker")

    def locked() -> None:
        raise RuntimeError("Couldn't lock mqttamqp.fs.lock")

    svc.broker.start = locked  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="lock"):
        svc.startService()
    assert open_segment.exists()


def test_an_unusable_archive_directory_fails_at_start_with_one_clear_reason(
        tmp_path: Path) -> None:
    """An archive directory the broker cannot create or write is refused at start, with
    the reason and what to do, before any thread starts."""
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    archive = Archive(str(blocker / "archive"), Clock())
    with pytest.raises(RuntimeError, match=r"cannot write to .*--no-archive"):
        archive.start()
    assert archive._worker is None


def test_the_packages_lazy_names_are_the_schemas() -> None:
    """mqttamqp.archive's lazily loaded names are the schema module's objects."""
    import mqttamqp.archive as package
    from mqttamqp.archive import schema
    assert set(schema.__all__) <= set(package.__all__)
    assert package.MESSAGE_SCHEMA is schema.MESSAGE_SCHEMA


def test_a_dozing_feeding_thread_is_woken_by_a_full_batch_or_a_frame_of_events(
        tmp_path: Path, clock: Clock) -> None:
    """While no message waits the feeding thread sleeps up to a second (events come
    in bursts: one frame a second, not ten); a full message batch, or
    ``_EVENT_WAKE`` events, wakes it at once, and nothing less does."""
    from mqttamqp.archive import archive as module
    from mqttamqp.events import CONNECT

    a = Archive(str(tmp_path), clock, buffer_limit=1_000_000)   # (no thread started)
    assert module._IDLE_WAIT >= 10 * module._STEP_WAIT
    a._dozing = True
    for _ in range(module._BATCH):              # fills the first batch exactly
        a.message(1.0, "t", 0, False, b"", None, None, None, 1, 0)
    for i in range(module._EVENT_WAKE - 1):
        a.event(1.0, CONNECT, f"c{i}")
    assert not a._wake.is_set() and a._dozing
    a.message(1.0, "t", 0, False, b"", None, None, None, 1, 0)    # the batch rotates
    assert a._wake.is_set() and not a._dozing
    a._wake.clear()
    a._dozing = True
    a.event(1.0, CONNECT, "last")               # _EVENT_WAKE events
    assert a._wake.is_set() and not a._dozing


def test_buffered_events_share_their_field_names(tmp_path: Path, clock: Clock) -> None:
    """A buffered event keeps its values flat, with one tuple of field names shared by
    every event with the same names, and its time packed in the times array (no
    tuple nor float per event waits in the buffer); a wrong name still raises at once."""
    from mqttamqp.events import CONNECT

    a = Archive(str(tmp_path), clock)          # (no thread started)
    a.event(1.0, CONNECT, "a", protocol="mqtt3.1.1", address="127.0.0.1:1")
    a.event(2.0, CONNECT, "b", protocol="mqtt5", address="127.0.0.1:2")
    values = a._events.values
    assert values[2] is values[7] == ("protocol", "address")
    assert values == [CONNECT, "a", values[2], "mqtt3.1.1", "127.0.0.1:1",
                      CONNECT, "b", values[2], "mqtt5", "127.0.0.1:2"]
    assert list(a._events.times) == [1.0, 2.0]
    assert not any(type(v) in (tuple, float) for v in values if v is not values[2])
    with pytest.raises(ValueError, match="no column 'adress'"):
        a.event(3.0, CONNECT, "c", adress="x")
    assert len(a._events.times) == 2 and len(values) == 10


def test_an_event_given_as_names_and_values_is_the_same_record(tmp_path: Path,
                                                               clock: Clock) -> None:
    """``fields_event`` (the connect path's, positional) buffers exactly what ``event``
    with the same fields as keywords does, the names shared with it; a wrong name, a
    count of values unlike the names' or an unknown kind still raises at once."""
    from mqttamqp.events import CONNECT

    a = Archive(str(tmp_path), clock)          # (no thread started)
    a.event(1.0, CONNECT, "a", protocol="mqtt3.1.1", address="127.0.0.1:1", user=None,
            clean_session=True, keepalive=60)
    a.fields_event(1.0, CONNECT, "a",
                   ("protocol", "address", "user", "clean_session", "keepalive"),
                   ("mqtt3.1.1", "127.0.0.1:1", None, True, 60))
    values = a._events.values
    assert values[:8] == values[8:] and values[2] is values[10]
    assert list(a._events.times) == [1.0, 1.0]
    with pytest.raises(ValueError, match="no column 'adress'"):
        a.fields_event(3.0, CONNECT, "c", ("adress",), ("x",))
    with pytest.raises(ValueError, match="1 values for 2 columns"):
        a.fields_event(3.0, CONNECT, "c", ("protocol", "address"), ("mqtt5",))
    with pytest.raises(ValueError, match="unknown event kind"):
        a.fields_event(3.0, "connected", "c", ("protocol",), ("mqtt5",))
    assert len(a._events.times) == 2 and len(values) == 16


def test_events_taken_in_frames_come_back_whole_and_in_order(tmp_path: Path,
                                                             clock: Clock) -> None:
    """The feeding thread takes at most a frame of whole records off the front (times
    and values together), and the writer reads them back as they were recorded."""
    from mqttamqp.archive.eventbuffer import event_records, take_events
    from mqttamqp.events import CONNECT, DISCONNECT, SESSION_CREATED

    a = Archive(str(tmp_path), clock)          # (no thread started)
    a.event(1.0, SESSION_CREATED, "a", clean_session=True)
    a.event(1.5, CONNECT, "a", protocol="mqtt5", address="h:1", user=None,
            clean_session=True, keepalive=60)
    a.event(2.0, DISCONNECT, None)
    stamps, values = take_events(a._events.times, a._events.values, 2)
    assert list(event_records(stamps, values)) == [
        (1.0, SESSION_CREATED, "a", ("clean_session",), [True]),
        (1.5, CONNECT, "a", ("protocol", "address", "user", "clean_session", "keepalive"),
         ["mqtt5", "h:1", None, True, 60])]
    assert list(a._events.times) == [2.0] and a._events.values == [DISCONNECT, None, ()]
    stamps, values = take_events(a._events.times, a._events.values, 2)
    assert list(event_records(stamps, values)) == [(2.0, DISCONNECT, None, (), [])]
    assert take_events(a._events.times, a._events.values, 2) == (b"", [])
    with pytest.raises(ValueError, match="event times"):
        list(event_records(stamps, [*values, "stray"]))


def test_a_full_event_buffer_drops_counts_and_logs_once_a_spell(
        tmp_path: Path, clock: Clock, log_lines: list[str]) -> None:
    """At the bound an event is dropped and counted; the first drop of a spell is one
    log line naming the option and the dataset. Review finding: every step of the
    feeding thread ended the spell (a line a step under sustained overload); real
    steps (``_step``, its writer process real) now end it only once the backlog has
    drained, and messages have their own spell."""
    from mqttamqp.events import CONNECT

    def spells(what: str) -> list[str]:
        return [line for line in log_lines if "buffer is full" in line and what in line]

    a = Archive(str(tmp_path), clock, buffer_limit=3)   # (steps driven here: no thread)
    try:
        for i in range(6):
            a.event(1.0, CONNECT, f"c{i}")
        assert a.stats()["dropped"] == 3 and a.stats()["buffered"] == 3
        assert len(spells("events")) == 1 and "--archive-buffer 3" in spells("events")[0]
        assert a._step() and a.stats()["buffered"] == 0
        for i in range(6):          # overloaded again, the step found the buffer full:
            a.event(1.0, CONNECT, f"d{i}")          # the same spell
        assert a.stats()["dropped"] == 6 and len(spells("events")) == 1
        for _ in range(4):          # a message spell of its own (a batch of 1)
            publish(a, 1.0)
        assert a.stats()["dropped"] == 7 and len(spells("messages")) == 1
        assert a._step()            # (found full: still one spell each)
        assert a._step() and a.stats()["buffered"] == 0   # found drained: both end
        for i in range(6):
            a.event(1.0, CONNECT, f"e{i}")
        assert a.stats()["dropped"] == 10 and len(spells("events")) == 2
        assert len(spells("messages")) == 1
    finally:
        a._finish()


def test_a_buffer_full_of_events_keeps_the_thread_stepping(
        tmp_path: Path, clock: Clock) -> None:
    """Refused events no longer wake the thread one by one: a step's pause finds the
    event buffer full (refused since the take) and steps again at once; after a take
    it dozes as usual."""
    from mqttamqp.archive.eventbuffer import take_event_batches
    from mqttamqp.events import CONNECT

    a = Archive(str(tmp_path), clock, buffer_limit=4)   # (no thread started)
    assert a._pause(True, 0.0) == archive_module._IDLE_WAIT and a._dozing
    for i in range(6):
        a.event(1.0, CONNECT, f"c{i}")
    assert a.stats()["dropped"] == 2
    assert a._pause(True, 0.0) == 0.0 and not a._dozing
    take_event_batches(a._events.full, a._events.filling, 100)
    assert a._pause(True, 0.0) == archive_module._IDLE_WAIT and a._dozing


def test_the_event_count_never_misses_a_batch_being_queued() -> None:
    """Review finding: ``waiting`` could miss a whole batch read while ``_rotate``
    had started the next batch but not yet queued the full one; a rotation now
    queues first, so a count taken at any point of it finds every event."""
    from collections import deque

    from mqttamqp.archive.eventbuffer import EventBatches

    seen: list[tuple[int, int]] = []

    class Watched(deque):   # type: ignore[type-arg]
        def append(self, batch: object) -> None:
            seen.append((buffer.waiting(), added))   # (the feeding thread's view here)
            super().append(batch)
            seen.append((buffer.waiting(), added))

    buffer = EventBatches(64, lambda n: None)
    buffer.full = Watched()
    added = 0
    for i in range(40):
        added += 1
        assert buffer.add(float(i), (CONNECT, f"c{i}", ()))
    assert len(seen) == 2 * 40 // buffer.batch
    assert all(counted >= held for counted, held in seen), seen
    assert buffer.waiting() == 40


def test_a_take_during_a_rotation_does_not_leave_the_event_buffer_refusing() -> None:
    """Review finding: ``_rotate`` counted the queued batches from one read of the
    queue and set ``refused`` from a second; the feeding thread taking every batch
    between the two left ``refused`` 0 with no room, and ``add``'s short way then
    refused every event for good. One snapshot now: after such a take, the next
    event rotates again and is taken."""
    from collections import deque

    from mqttamqp.archive.eventbuffer import EventBatches

    class TakenAfterTheSnapshot(deque):   # type: ignore[type-arg]
        take = False

        def __iter__(self) -> Any:
            items = list(super().__iter__())
            if self.take:                 # the thread's take, right after the read
                self.take = False
                self.clear()
            return iter(items)

    buffer = EventBatches(4, lambda n: None)   # batches of 2, 4 events at most
    queue = buffer.full = TakenAfterTheSnapshot()
    for i in range(3):
        assert buffer.add(float(i), (CONNECT, f"c{i}", ()))
    queue.take = True
    assert buffer.add(3.0, (CONNECT, "c3", ()))   # fills the bound: the last rotation
    assert buffer.room == 0 and len(queue) == 0   # ... during which all was taken
    assert buffer.add(4.0, (CONNECT, "c4", ()))   # room again: taken, not refused
    assert buffer.waiting() == 1


def test_the_message_count_never_misses_a_batch_being_queued(
        tmp_path: Path, clock: Clock) -> None:
    """Found with the events' finding: ``_messages_waiting`` could miss a whole batch
    read while ``_rotate`` had started the next but not yet queued the full one; a
    count taken at any point of a rotation now finds every message."""
    from collections import deque

    a = Archive(str(tmp_path), clock, buffer_limit=64)   # (no thread started)
    seen: list[tuple[int, int]] = []

    class Watched(deque):   # type: ignore[type-arg]
        def append(self, batch: object) -> None:
            seen.append((a._messages_waiting(), added))   # (the thread's view here)
            super().append(batch)
            seen.append((a._messages_waiting(), added))

    a._full = Watched()
    added = 0
    for i in range(40):
        publish(a, T0 + i)
        added += 1
    assert len(seen) == 2 and all(counted >= held for counted, held in seen), seen
    assert a._messages_waiting() == 40

@pytest.mark.parametrize("limit", [3, 2047, 65537])
def test_the_event_buffer_holds_exactly_its_bound(
        tmp_path: Path, clock: Clock, limit: int) -> None:
    """Review finding: ``--archive-buffer`` let up to a batch less one event over the
    bound (2047 -> 3069 held); the events held fill the bound exactly, never more,
    and room taken by the feeding thread is filled again up to it."""
    from mqttamqp.archive.eventbuffer import take_event_batches
    from mqttamqp.events import CONNECT

    a = Archive(str(tmp_path), clock, buffer_limit=limit)   # (no thread started)
    for i in range(limit + 50):
        a.event(1.0, CONNECT, f"c{i}")
    assert a.stats()["buffered"] == limit and a.stats()["dropped"] == 50
    taken = take_event_batches(a._events.full, a._events.filling, 1)   # one batch
    freed = sum(len(stamps) for stamps, _ in taken) // 8
    assert 0 < freed and a.stats()["buffered"] == limit - freed
    for i in range(freed + 10):
        a.event(2.0, CONNECT, f"d{i}")
    assert a.stats()["buffered"] == limit and a.stats()["dropped"] == 60


def test_full_event_batches_are_queued_whole_and_taken_without_a_copy(
        tmp_path: Path, clock: Clock) -> None:
    """Events fill batches of ``EVENT_BATCH``; a full one is queued whole and the
    feeding thread takes it as it is (its list, not a copy), then the rest of the
    batch being filled; every event once, in order."""
    from mqttamqp.archive.eventbuffer import EVENT_BATCH, event_records, take_event_batches
    from mqttamqp.events import CONNECT

    a = Archive(str(tmp_path), clock)          # (no thread started)
    for i in range(EVENT_BATCH + 5):
        a.event(float(i), CONNECT, f"c{i}")
    assert len(a._events.full) == 1 and len(a._events.times) == 5
    first_list = a._events.full[0][1]
    taken = take_event_batches(a._events.full, a._events.filling, 16384)
    assert len(taken) == 1 and taken[0][1] is first_list
    taken += take_event_batches(a._events.full, a._events.filling, 16384)
    records = [r for stamps, values in taken for r in event_records(stamps, values)]
    assert [(ts, cid) for ts, _, cid, _, _ in records] == [
        (float(i), f"c{i}") for i in range(EVENT_BATCH + 5)]
    assert a.stats()["buffered"] == 0


def test_a_small_buffer_wakes_the_dozing_thread_before_it_drops(
        tmp_path: Path, clock: Clock) -> None:
    """Review finding: with a buffer smaller than a batch pair or a frame of events,
    records were dropped for a whole second while the thread slept: half the buffer
    of events, or a refused batch, wakes it."""
    from mqttamqp.events import CONNECT

    a = Archive(str(tmp_path), clock, buffer_limit=10)   # (no thread started)
    a._dozing = True
    for i in range(4):
        a.event(1.0, CONNECT, f"c{i}")
    assert not a._wake.is_set()
    a.event(1.0, CONNECT, "c4")                 # half of the buffer
    assert a._wake.is_set() and not a._dozing
    a._wake.clear()
    a._dozing = True
    for _ in range(11):                         # a batch of 10, refused
        a.message(1.0, "t", 0, False, b"", None, None, None, 1, 0)
    assert a._wake.is_set() and not a._dozing


def _block_dataset(root: Path, dataset: str = "messages") -> Path:
    """Make ``root/dataset`` unwritable even for root: the directory moves aside and
    a regular file takes its name (so opening or renaming below it fails)."""
    aside = root / f"{dataset}.aside"
    (root / dataset).rename(aside)
    (root / dataset).write_bytes(b"")
    return aside


def _unblock_dataset(root: Path, aside: Path, dataset: str = "messages") -> None:
    (root / dataset).unlink()
    aside.rename(root / dataset)


def test_a_spell_of_failed_writes_is_one_line_then_one_when_writes_work_again(
        tmp_path: Path) -> None:
    """A file system that refuses every write (read-only, full) costs one log line
    when the failures begin and one when a segment is written again, never a
    traceback per step; every failure is still counted."""
    w = Writer(str(tmp_path), payload_bytes=16, roll_seconds=1, roll_bytes=1 << 30,
               retention_days=0, include=["#"], exclude=[], row_group_rows=1)
    one = [T0, "plant/1", 1, False, 1, "dev", "u", "mqtt3.1.1", 1, 0]
    w.step(T0, [pack(one, b"x")])
    assert w.report()["logs"] == [] and w.errors == 0
    aside = _block_dataset(tmp_path)
    logs: list[tuple[str, str]] = []
    steps = 50   # ten seconds of a step every 200 ms
    for i in range(1, steps + 1):
        now = T0 + i * 0.2
        w.step(now, [pack([now, *one[1:]], b"x")])
        logs += w.report()["logs"]
    failures = w.errors   # (the segment open before could take a few rows first)
    assert failures > steps - 10
    assert len(logs) == 1, logs
    level, text = logs[0]
    assert level == "error" and "\n" not in text
    assert "archive: writing messages failed (" in text and "until a segment" in text
    _unblock_dataset(tmp_path, aside)
    now = T0 + steps * 0.2 + 2
    w.step(now, [pack([now, *one[1:]], b"x")])
    w.step(now + 2, [])   # rolls: the segment is published
    logs = w.report()["logs"]
    assert [level for level, _ in logs] == ["info"], logs
    assert f"after {failures} failed write(s)" in logs[0][1]
    assert w.report()["logs"] == [] and w.errors == failures
    w.close()
    assert read(tmp_path).num_rows == 1   # the last (the first was in the lost segment)


def test_a_bug_in_the_writer_still_logs_its_traceback_once(tmp_path: Path) -> None:
    """An error that is not the file system's (a bug) keeps its traceback, once per
    spell."""
    w = Writer(str(tmp_path), payload_bytes=16, roll_seconds=60, roll_bytes=1 << 30,
               retention_days=0, include=["#"], exclude=[], row_group_rows=1)
    bad = (2, ("a",))   # not a packed batch
    for _ in range(3):
        w.step(T0, [bad])  # type: ignore[list-item]
    logs = w.report()["logs"]
    assert len(logs) == 1 and "Traceback" in logs[0][1] and w.errors == 3


def test_the_broker_logs_a_read_only_archive_once(tmp_path: Path, clock: Clock,
                                                   log_lines: list[str]) -> None:
    """Through the writer process and the feeding thread: a dataset that cannot be
    written is one error line in the broker's log for many failed steps."""
    a = Archive(str(tmp_path), clock, row_group_rows=1)
    a.start()
    publish(a, T0, topic="a")
    assert a.wait_until(lambda: a.stats()["buffered"] == 0) and a.wait_step()
    aside = _block_dataset(tmp_path)
    for i in range(1, 11):
        clock.advance(61)   # every step rolls, and fails to publish or to open
        publish(a, T0 + i, topic="b")
        assert a.wait_until(lambda i=i: a.stats()["buffered"] == 0 and a.errors >= i)
    failed = [line for line in log_lines if "archive: writing" in line]
    assert len(failed) == 1 and "failed" in failed[0] and "\n" not in failed[0]
    _unblock_dataset(tmp_path, aside)
    a.close()


def test_the_core_records_with_the_archives_names() -> None:
    """Every event kind and cause the core records is one the archive's schema knows."""
    import mqttamqp.archive as archive
    from mqttamqp.core import recorder

    assert recorder.EVENT_KINDS == archive.EVENT_KINDS
    causes = {v for k, v in vars(recorder).items() if k.startswith("CAUSE_")}
    assert causes == set(archive.DISCONNECT_CAUSES) | set(archive.WILL_CAUSES)


def test_a_trickle_of_messages_is_stepped_once_a_second_a_stream_every_tenth(
        tmp_path: Path, clock: Clock) -> None:
    """After a step that took less than a batch, waiting messages are sent within
    ``_IDLE_WAIT`` (and a full batch still wakes the thread); after a step of a batch
    or more, or with a batch already queued, within ``_STEP_WAIT``; nothing waiting:
    ``_IDLE_WAIT``."""
    from mqttamqp.archive import archive as module

    a = Archive(str(tmp_path), clock, buffer_limit=1_000_000)   # (no thread started)
    assert a._pause(True, 0.25) == module._IDLE_WAIT and a._dozing   # nothing waits
    a.message(1.0, "t", 1, False, b"x", None, None, None, 1, 0)
    a._taken = 100                                   # the last step: a trickle
    assert a._pause(True, 0.25) == module._IDLE_WAIT - 0.25 and a._dozing
    for _ in range(module._BATCH):                   # a batch fills: queued, wakes it
        a.message(1.0, "t", 1, False, b"x", None, None, None, 1, 0)
    assert a._wake.is_set() and not a._dozing
    assert a._pause(True, 0.25) == module._STEP_WAIT - 0.25 and not a._dozing
    a._full.clear()
    a._taken = module._BATCH                          # the last step: a stream
    assert a._pause(True, 0.0) == module._STEP_WAIT and not a._dozing


def test_a_buffer_below_two_batches_queues_half_of_it_as_a_batch_and_wakes_the_thread(
        tmp_path: Path, clock: Clock) -> None:
    """Review finding: with ``buffer_limit < 2 x _BATCH`` no full batch could be
    queued, so a dozing thread was woken only by a dropped record; a batch is now half
    the buffer, and a one-record buffer (no batch can be queued) is never dozed on."""
    from mqttamqp.archive import archive as module

    a = Archive(str(tmp_path), clock, buffer_limit=400)   # (no thread started)
    a._dozing = True
    for _ in range(200):                        # half the buffer: one batch, exactly
        a.message(1.0, "t", 1, False, b"x", None, None, None, 1, 0)
    assert not a._wake.is_set() and a._dozing
    a.message(1.0, "t", 1, False, b"x", None, None, None, 1, 0)   # the batch is queued
    assert a._wake.is_set() and not a._dozing
    assert len(a._full) == 1 and a.stats()["dropped"] == 0
    one = Archive(str(tmp_path), clock, buffer_limit=1)
    one.message(1.0, "t", 1, False, b"x", None, None, None, 1, 0)
    one._taken = 0                              # the last step: less than a batch
    assert one._pause(True, 0.0) == module._STEP_WAIT and not one._dozing

