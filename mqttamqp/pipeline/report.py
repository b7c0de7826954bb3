"""The traffic report as Spark transformations: archive in, tables and a summary out.

The job works in two stages so that full and ``--incremental`` runs, mixed in any
order over a growing archive, give the same report as one full run:

1. *state*: archive files not read before are reduced to additive partial
   aggregates and appended under ``OUT/_state`` — messages per (minute, topic,
   publisher, user) with counts, bytes, QoS mix and retained count, and the few event
   columns the report needs. Which files were read is known to one place only, the
   Structured Streaming file source (``Trigger.AvailableNow``, checkpoint in
   ``OUT/_checkpoint``), and both kinds of run go through it: a full run deletes the
   state and the checkpoint and then reads every file as the first batch of a fresh
   stream, so a later incremental run reads only what came after. ``_state/state.json``
   names the archive the state was built from and is written when both streams have
   finished; an incremental run without it (a run that was stopped half-way, a report
   folder from an older version, another archive) starts over like a full run.
2. *report*: every table is derived from the state (re-summing partial rows), then
   written as Parquet under ``OUT/tables/<name>`` and summarised in
   ``OUT/summary.json``.

This module owns the Spark logic. It must not parse command lines, print, or start
a session (``cli`` does), and it must not import the broker: the archive's column
names come from ``mqttamqp.archive.schema``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from pyspark.sql import DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mqttamqp.archive.schema import (
    AUTH_FAILURE,
    CONNECT,
    DISCONNECT,
    EVENTS,
    MESSAGES,
    WILL_PUBLISHED,
)

__all__ = ["ReportOptions", "ReportResult", "EmptyArchive", "build_report",
           "MESSAGES_READ_SCHEMA", "EVENTS_READ_SCHEMA", "SUMMARY_VERSION", "TABLES"]

#: 2: ``input`` says ``files_read``/``rows_read`` in both modes (1 had ``new_files``
#: for a full run and ``new_rows`` for an incremental one).
SUMMARY_VERSION = 2
#: Bumped when the state's layout or meaning changes: an older state is rebuilt.
STATE_VERSION = 2
_STATE_INFO = "state.json"
# The file source skips a file whose modification time is older than this before the
# newest file it has seen (after its first batch), and the default is 7 days: an old
# file copied into the archive late would be missed by incremental runs only.
_MAX_FILE_AGE = "36500d"
_FILE = "_report_input_file"   # the column naming each row's archive file
TABLES = ("topic_minute", "top_topics", "top_publishers", "topic_tree", "sessions",
          "clients", "disconnect_causes", "wills", "auth_failures")

# The archive's columns as Spark types (timestamps are microseconds in the files).
MESSAGES_READ_SCHEMA = T.StructType([
    T.StructField("timestamp", T.TimestampType()),
    T.StructField("topic", T.StringType()),
    T.StructField("qos", T.ByteType()),
    T.StructField("retain", T.BooleanType()),
    T.StructField("payload_size", T.LongType()),
    T.StructField("payload", T.BinaryType()),
    T.StructField("publisher", T.StringType()),
    T.StructField("user", T.StringType()),
    T.StructField("protocol", T.StringType()),
    T.StructField("deliveries", T.IntegerType()),
    T.StructField("dropped", T.IntegerType()),
])
EVENTS_READ_SCHEMA = T.StructType([
    T.StructField("timestamp", T.TimestampType()),
    T.StructField("kind", T.StringType()),
    T.StructField("client_id", T.StringType()),
    T.StructField("protocol", T.StringType()),
    T.StructField("address", T.StringType()),
    T.StructField("user", T.StringType()),
    T.StructField("reason", T.StringType()),
    T.StructField("topic", T.StringType()),
])
_EVENT_KINDS_USED = [CONNECT, DISCONNECT, WILL_PUBLISHED, AUTH_FAILURE]
# Session-duration histogram bucket upper bounds, seconds (last: open-ended).
_DURATION_BUCKETS = (10, 60, 600, 3600, 6 * 3600, 86400)


class EmptyArchive(Exception):
    """The archive holds no messages and no events (in the window)."""


@dataclass(frozen=True)
class ReportOptions:
    archive: str                     # directory holding messages/ and events/
    out: str                         # report directory
    since: datetime | None = None    # UTC, inclusive
    until: datetime | None = None    # UTC, exclusive
    incremental: bool = False
    top: int = 20                    # rows in top tables and stacked series
    flap_threshold: int = 10         # more reconnects than this in an hour: flapping
    now: Callable[[], float] = time.time


@dataclass
class ReportResult:
    summary: dict[str, Any]
    incremental: bool = False        # added to an earlier state (False: built anew)
    files_read: int = 0              # archive files read by this run
    rows_read: int = 0               # rows in them (messages and events)
    stages: list[str] = field(default_factory=list)


def _path(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


# -- stage 1: state ---------------------------------------------------------------------

def _message_parts(messages: DataFrame) -> DataFrame:
    """Additive partial aggregates of message rows."""
    return (messages
            .withColumn("minute", F.date_trunc("minute", "timestamp"))
            .groupBy("minute", "topic", "publisher", "user")
            .agg(F.count(F.lit(1)).alias("messages"),
                 F.sum("payload_size").alias("bytes"),
                 F.sum((F.col("qos") == 0).cast("long")).alias("qos0"),
                 F.sum((F.col("qos") == 1).cast("long")).alias("qos1"),
                 F.sum((F.col("qos") == 2).cast("long")).alias("qos2"),
                 F.sum(F.col("retain").cast("long")).alias("retained"),
                 F.sum("deliveries").cast("long").alias("deliveries"),
                 F.sum("dropped").cast("long").alias("dropped")))


def _event_rows(events: DataFrame) -> DataFrame:
    return (events.where(F.col("kind").isin(_EVENT_KINDS_USED))
            .select("timestamp", "kind", "client_id", "protocol", "address", "user",
                    "reason", "topic"))


_SOURCES = ((MESSAGES, MESSAGES_READ_SCHEMA, _message_parts),
            (EVENTS, EVENTS_READ_SCHEMA, _event_rows))


def _local_archive(archive: str) -> str:
    """A local archive path made absolute and free of symbolic links: the file
    source remembers files by full path, so ``data/archive`` and the same directory
    by another name must not look like new files."""
    if urlsplit(archive).scheme:
        return archive
    return os.path.realpath(archive)


def _state_identity(archive: str) -> dict[str, Any]:
    return {"version": STATE_VERSION, "archive": archive}


def _can_add_to_state(spark: SparkSession, opts: ReportOptions, archive: str) -> bool:
    """Whether the state under ``OUT`` is a complete one of this archive."""
    text = _read_text(spark, _path(opts.out, "_state", _STATE_INFO))
    try:
        return text is not None and json.loads(text) == _state_identity(archive)
    except ValueError:
        return False


def _read_new_files(spark: SparkSession, opts: ReportOptions, archive: str,
                    result: ReportResult) -> None:
    """Reduce the archive files the checkpoint has not seen into new state batches."""
    for name, schema, reduce in _SOURCES:
        source = _path(archive, name)
        if not _exists(spark, source):   # nothing archived there yet; read nothing
            continue
        stream = (spark.readStream.schema(schema)
                  .option("recursiveFileLookup", "true")
                  .option("pathGlobFilter", "part-*.parquet")
                  .option("maxFileAge", _MAX_FILE_AGE)
                  .parquet(source)
                  .withColumn(_FILE, F.col("_metadata.file_path")))
        target = _path(opts.out, "_state", name)
        counted: dict[int, tuple[int, int]] = {}

        def write_batch(batch: DataFrame, batch_id: int, target: str = target,
                        reduce: Callable[[DataFrame], DataFrame] = reduce,
                        counted: dict[int, tuple[int, int]] = counted) -> None:
            # The batch is an RDD already planned: a second action would read every
            # column of every file again, so the counts are observed in the one
            # pass that writes (the set holds one path per file of the batch).
            seen = Observation(f"read-{batch_id}")
            observed = batch.observe(seen, F.count(F.lit(1)).alias("rows"),
                                     F.size(F.collect_set(_FILE)).alias("files"))
            # Overwriting the batch's own directory makes a replayed batch idempotent.
            reduce(observed).write.mode("overwrite").parquet(
                _path(target, f"batch={batch_id:012d}"))
            counts = seen.get
            counted[batch_id] = (int(counts["files"]), int(counts["rows"]))

        query = (stream.writeStream.foreachBatch(write_batch)
                 .option("checkpointLocation", _path(opts.out, "_checkpoint", name))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        result.files_read += sum(files for files, _ in counted.values())
        result.rows_read += sum(rows for _, rows in counted.values())
        result.stages.append(f"state {name}")


def _update_state(spark: SparkSession, opts: ReportOptions, result: ReportResult) -> None:
    archive = _local_archive(opts.archive)
    result.incremental = opts.incremental and _can_add_to_state(spark, opts, archive)
    if not result.incremental:
        _delete(spark, _path(opts.out, "_checkpoint"))
        _delete(spark, _path(opts.out, "_state"))
    _read_new_files(spark, opts, archive, result)
    if not result.incremental:
        _write_text(spark, _path(opts.out, "_state", _STATE_INFO),
                    json.dumps(_state_identity(archive), sort_keys=True) + "\n")


def _read_state(spark: SparkSession, opts: ReportOptions) -> tuple[DataFrame, DataFrame]:
    """The state's message parts and event rows (empty ones where nothing was read)."""
    found = []
    for name, schema, reduce in _SOURCES:
        path = _path(opts.out, "_state", name)
        if _exists(spark, path):
            found.append(spark.read.parquet(path).drop("batch"))
        else:
            found.append(reduce(spark.createDataFrame([], schema)))
    return found[0], found[1]


def _delete(spark: SparkSession, path: str) -> None:
    jvm: Any = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if fs.exists(hadoop_path):
        fs.delete(hadoop_path, True)


def _exists(spark: SparkSession, path: str) -> bool:
    jvm: Any = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return bool(fs.exists(hadoop_path))


# -- stage 2: report --------------------------------------------------------------------

def _window(df: DataFrame, column: str, opts: ReportOptions) -> DataFrame:
    if opts.since is not None:
        df = df.where(F.col(column) >= F.lit(opts.since))
    if opts.until is not None:
        df = df.where(F.col(column) < F.lit(opts.until))
    return df


def _tables(parts: DataFrame, events: DataFrame, opts: ReportOptions
            ) -> dict[str, DataFrame]:
    sums = [F.sum(c).alias(c) for c in ("messages", "bytes", "qos0", "qos1", "qos2",
                                       "retained", "deliveries", "dropped")]
    # One row per (minute, topic, publisher, user) whatever the number of runs.
    parts = parts.groupBy("minute", "topic", "publisher", "user").agg(*sums)
    topic_minute = (parts.groupBy("minute", "topic")
                    .agg(*sums[:6], F.count(F.col("publisher")).alias("publishers")))
    top_topics = (parts.groupBy("topic")
                  .agg(*sums, F.countDistinct("publisher").alias("publishers"))
                  .orderBy(F.desc("messages"), "topic").limit(opts.top))
    top_publishers = (parts.groupBy("publisher", "user")
                      .agg(*sums[:2], F.countDistinct("topic").alias("topics"))
                      .orderBy(F.desc("messages"), F.asc_nulls_last("publisher"))
                      .limit(opts.top))
    levels = F.split("topic", "/")
    topic_tree = (parts
                  .select(F.explode(F.array(
                      F.struct(F.lit(1).alias("level"), levels[0].alias("prefix")),
                      F.struct(F.lit(2).alias("level"),
                               F.when(F.size(levels) >= 2,
                                      F.concat_ws("/", levels[0], levels[1]))
                               .alias("prefix")))).alias("node"), "messages", "bytes")
                  .select("node.level", "node.prefix", "messages", "bytes")
                  .where(F.col("prefix").isNotNull())
                  .groupBy("level", "prefix")
                  .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes")))

    conn = events.where(F.col("kind").isin(CONNECT, DISCONNECT))
    # At one time a DISCONNECT goes first: the broker records a holder's end before its
    # successor's start, at times that may be equal (one clock reading for both:
    # ``SessionRegistry.register_connection``; or two within a microsecond).
    by_client = Window.partitionBy("client_id").orderBy("timestamp",
                                                        F.col("kind") == CONNECT)
    seq = conn.withColumn("next_kind", F.lead("kind").over(by_client)) \
              .withColumn("next_ts", F.lead("timestamp").over(by_client)) \
              .withColumn("next_reason", F.lead("reason").over(by_client))
    sessions = (seq.where(F.col("kind") == CONNECT)
                .select("client_id", "protocol", "address", "user",
                        F.col("timestamp").alias("connected_at"),
                        F.when(F.col("next_kind") == DISCONNECT, F.col("next_ts"))
                        .alias("disconnected_at"),
                        F.when(F.col("next_kind") == DISCONNECT,
                               F.coalesce(F.col("next_reason"), F.lit("unknown")))
                        .when(F.col("next_kind") == CONNECT, F.lit("no_disconnect"))
                        .alias("cause"))
                .withColumn("duration_seconds",
                            (F.unix_micros("disconnected_at")
                             - F.unix_micros("connected_at")) / 1e6))
    connects = events.where(F.col("kind") == CONNECT)
    ranked = connects.withColumn("n", F.row_number().over(by_client))
    per_hour = (ranked.where(F.col("n") > 1)
                .groupBy("client_id", F.date_trunc("hour", "timestamp").alias("hour"))
                .agg(F.count(F.lit(1)).alias("reconnects")))
    clients = (connects.groupBy("client_id")
               .agg(F.count(F.lit(1)).alias("connects"),
                    F.min("timestamp").alias("first_connect"),
                    F.max("timestamp").alias("last_connect"))
               .join(per_hour.groupBy("client_id")
                     .agg(F.max("reconnects").alias("max_reconnects_per_hour")),
                     "client_id", "left")
               .withColumn("reconnects", F.col("connects") - 1)
               .withColumn("max_reconnects_per_hour",
                           F.coalesce("max_reconnects_per_hour", F.lit(0)).cast("long"))
               .withColumn("flapping",
                           F.col("max_reconnects_per_hour") > opts.flap_threshold))
    disconnect_causes = (events.where(F.col("kind") == DISCONNECT)
                         .groupBy(F.coalesce("reason", F.lit("unknown")).alias("cause"))
                         .agg(F.count(F.lit(1)).alias("count")))
    wills = (events.where(F.col("kind") == WILL_PUBLISHED)
             .groupBy(F.date_trunc("hour", "timestamp").alias("hour"), "client_id",
                      "topic", F.coalesce("reason", F.lit("unknown")).alias("cause"))
             .agg(F.count(F.lit(1)).alias("count")))
    host = F.regexp_extract("address", r"^\[?([^\]]*?)\]?(:\d+)?$", 1)
    auth_failures = (events.where(F.col("kind") == AUTH_FAILURE)
                     .groupBy(F.when(host == "", None).otherwise(host).alias("address"),
                              "user")
                     .agg(F.count(F.lit(1)).alias("count"),
                          F.min("timestamp").alias("first"),
                          F.max("timestamp").alias("last")))
    return {"topic_minute": topic_minute, "top_topics": top_topics,
            "top_publishers": top_publishers, "topic_tree": topic_tree,
            "sessions": sessions, "clients": clients,
            "disconnect_causes": disconnect_causes, "wills": wills,
            "auth_failures": auth_failures}


def _order(name: str) -> list[Any]:
    """How a table is sorted: inside its one file when written (no global sort, so
    no sampling job), and in the summary's lists. Built on call: column functions
    need a running Spark context."""
    return _orders()[name]


def _orders() -> dict[str, list[Any]]:
    return {
        "topic_minute": ["minute", "topic"],
        "top_topics": [F.desc("messages"), "topic"],
        "top_publishers": [F.desc("messages"), F.asc_nulls_last("publisher")],
        "topic_tree": ["level", F.desc("messages"), "prefix"],
        "sessions": ["connected_at", "client_id"],
        "clients": [F.desc("reconnects"), "client_id"],
        "disconnect_causes": [F.desc("count"), "cause"],
        "wills": ["hour", "client_id", "topic"],
        "auth_failures": [F.desc("count"), F.asc_nulls_last("address"),
                          F.asc_nulls_last("user")],
    }


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:  # Spark hands back session-local naive times
            value = value.astimezone(UTC)
        text: str = value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return text.replace(".000000Z", "Z")
    return str(value)


def _plain(row: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.asDict().items():
        if isinstance(value, datetime):
            out[key] = _iso(value)
        elif isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            out[key] = None
        else:
            out[key] = value
    return out


def _summary(tables: dict[str, DataFrame], opts: ReportOptions, result: ReportResult
             ) -> dict[str, Any]:
    top_topics = [_plain(r) for r in tables["top_topics"].collect()]
    stacked_topics = [t["topic"] for t in top_topics[:min(opts.top, 8)]]
    tm = tables["topic_minute"]
    series_rows = (tm.withColumn("series", F.when(F.col("topic").isin(stacked_topics),
                                                  F.col("topic")).otherwise("(other)"))
                   .groupBy("minute", "series").agg(F.sum("messages").alias("messages"))
                   .orderBy("minute", "series").collect())
    minutes = sorted({r["minute"] for r in series_rows})
    index = {m: i for i, m in enumerate(minutes)}
    names = stacked_topics + (["(other)"] if any(r["series"] == "(other)"
                                                  for r in series_rows) else [])
    series = {n: [0] * len(minutes) for n in names}
    for r in series_rows:
        series[r["series"]][index[r["minute"]]] = int(r["messages"])
    totals_row = tm.agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"),
                        F.sum("qos0").alias("qos0"), F.sum("qos1").alias("qos1"),
                        F.sum("qos2").alias("qos2"), F.sum("retained").alias("retained"),
                        F.min("minute").alias("first"), F.max("minute").alias("last"),
                        F.countDistinct("topic").alias("topics")).collect()[0]
    totals = {k: int(totals_row[k] or 0) for k in ("messages", "bytes", "retained",
                                                    "topics")}
    sessions = tables["sessions"]
    bounds = list(_DURATION_BUCKETS)
    duration = F.col("duration_seconds")
    slots = [F.sum((duration <= b).cast("long")) for b in bounds]
    hist_row = sessions.agg(
        F.count(F.lit(1)).alias("sessions"), F.count(duration).alias("closed"),
        *[s.alias(f"le{i}") for i, s in enumerate(slots)]).collect()[0]
    cumulative = [int(hist_row[f"le{i}"] or 0) for i in range(len(bounds))]
    cumulative.append(int(hist_row["closed"]))
    counts = [c - (cumulative[i - 1] if i else 0) for i, c in enumerate(cumulative)]
    histogram = [{"le": b, "count": n}
                 for b, n in zip([*bounds, None], counts, strict=True)]
    clients = tables["clients"]
    client_counts = clients.agg(F.count(F.lit(1)).alias("clients"),
                                F.sum("reconnects").alias("reconnects")).collect()[0]
    wills_by_hour = sorted(tables["wills"].groupBy("hour")
                           .agg(F.sum("count").alias("count")).collect(),
                           key=lambda r: r["hour"])
    return {
        "version": SUMMARY_VERSION,
        "generated_at": _iso(datetime.fromtimestamp(opts.now(), UTC)),
        "window": {"since": _iso(opts.since), "until": _iso(opts.until),
                   "first_minute": _iso(totals_row["first"]),
                   "last_minute": _iso(totals_row["last"])},
        "input": {"incremental": result.incremental, "files_read": result.files_read,
                  "rows_read": result.rows_read},
        "totals": totals,
        "qos": {str(q): int(totals_row[f"qos{q}"] or 0) for q in (0, 1, 2)},
        # A list, busiest topic first and "(other)" last: the order of the stack.
        "per_minute": {"minutes": [_iso(m) for m in minutes],
                       "series": [{"name": n, "values": series[n]} for n in names]},
        "top_topics": top_topics,
        "top_publishers": [_plain(r) for r in tables["top_publishers"].collect()],
        "topic_tree": [_plain(r) for r in tables["topic_tree"]
                       .orderBy(*_order("topic_tree")).limit(4 * opts.top).collect()],
        "sessions": {
            "count": int(hist_row["sessions"]),
            "clients": int(client_counts["clients"] or 0),
            "reconnects": int(client_counts["reconnects"] or 0),
            "duration_histogram": histogram,
            "disconnect_causes": [_plain(r) for r in tables["disconnect_causes"]
                                  .orderBy(*_order("disconnect_causes")).limit(100)
                                  .collect()],
            "flap_threshold": opts.flap_threshold,
            "flapping": [_plain(r) for r in clients.where("flapping")
                         .select("client_id", "connects", "reconnects",
                                 "max_reconnects_per_hour")
                         .orderBy(*_order("clients")).limit(opts.top).collect()],
        },
        "wills": {"per_hour": [{"hour": _iso(r["hour"]), "count": int(r["count"])}
                               for r in wills_by_hour],
                  "top": [_plain(r) for r in
                          tables["wills"].groupBy("client_id", "topic")
                          .agg(F.sum("count").alias("count"))
                          .orderBy(F.desc("count"), "client_id", "topic")
                          .limit(opts.top).collect()]},
        "auth_failures": [_plain(r) for r in tables["auth_failures"]
                          .orderBy(*_order("auth_failures")).limit(opts.top).collect()],
    }


def build_report(spark: SparkSession, opts: ReportOptions,
                 on_stage: Callable[[str], None] = lambda _: None) -> ReportResult:
    """Update the state from the archive, then write tables and ``summary.json``."""
    result = ReportResult(summary={})
    # Minutes and hours are UTC ones, like the archive's partitions.
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    _update_state(spark, opts, result)
    on_stage(f"archive read ({'incremental' if result.incremental else 'full'}: "
             f"{result.files_read} files, {result.rows_read} rows)")
    parts, events = _read_state(spark, opts)
    parts = _window(parts, "minute", opts).cache()
    events = _window(events, "timestamp", opts).cache()
    if parts.isEmpty() and events.isEmpty():
        raise EmptyArchive(f"no messages or events in {opts.archive}"
                           + (" in the chosen window" if opts.since or opts.until else ""))
    tables = {name: df.cache() for name, df in _tables(parts, events, opts).items()}
    for name, df in tables.items():
        (df.coalesce(1).sortWithinPartitions(*_order(name)).write.mode("overwrite")
         .parquet(_path(opts.out, "tables", name)))
        result.stages.append(f"table {name}")
        on_stage(f"table {name}")
    result.summary = _summary(tables, opts, result)
    _write_text(spark, _path(opts.out, "summary.json"),
                json.dumps(result.summary, indent=1, sort_keys=True) + "\n")
    on_stage("summary")
    for df in (parts, events, *tables.values()):
        df.unpersist()
    return result


def _read_text(spark: SparkSession, path: str) -> str | None:
    """A small file's text on any filesystem Spark can read; ``None`` if missing."""
    jvm: Any = spark.sparkContext._jvm
    target = jvm.org.apache.hadoop.fs.Path(path)
    fs = target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(target):
        return None
    stream = fs.open(target)
    try:
        data = jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
    finally:
        stream.close()
    return bytes(data).decode("utf-8", "replace")


def _write_text(spark: SparkSession, path: str, text: str) -> None:
    """Write a small file on any filesystem Spark can write (temp name + rename)."""
    jvm: Any = spark.sparkContext._jvm
    target = jvm.org.apache.hadoop.fs.Path(path)
    temp = jvm.org.apache.hadoop.fs.Path(path + ".tmp")
    fs = target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    stream = fs.create(temp, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()
    if fs.exists(target):
        fs.delete(target, False)
    fs.rename(temp, target)
