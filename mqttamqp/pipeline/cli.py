"""``mqttamqp-report`` / ``python -m mqttamqp.pipeline``: the command line of the
report job.

This module owns argument parsing, the checks that turn common set-up mistakes
into one clear sentence (no PySpark, no Java, master unreachable, empty archive),
the Spark session, and progress output (a bar on a terminal, plain lines
otherwise). The Spark logic itself is in ``report``; this module must not build
DataFrames, and it must never run inside the broker's process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import urlsplit

__all__ = ["main", "parse_args", "make_session", "SetupError", "JAVA_PACKAGE"]

#: What to install when ``java`` is missing (Debian's headless JRE).
JAVA_PACKAGE = "default-jre-headless"
EXIT_SETUP = 2
EXIT_EMPTY = 3


class SetupError(Exception):
    """Something outside the job is missing; the message says what to do."""


def _time(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO 8601 time (e.g. 2026-11-24 or 2026-11-24T07:00Z)"
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="mqttamqp-report",
        description="Traffic report from the broker's Parquet archive, on Spark.")
    p.add_argument("--archive", default=os.path.join("mqttamqp-data", "archive"),
                   help="archive directory or URL (holds messages/ and events/); "
                        "default: %(default)s")
    p.add_argument("--out", default=os.path.join("mqttamqp-data", "report"),
                   help="report directory or URL; default: %(default)s")
    p.add_argument("--master", default="local[*]",
                   help="Spark master: local[*] (default), local[N], spark://HOST:7077")
    p.add_argument("--since", type=_time, help="first time included (UTC unless given)")
    p.add_argument("--until", type=_time, help="first time excluded (UTC unless given)")
    p.add_argument("--incremental", action="store_true",
                   help="read only archive files not seen by the last incremental run "
                        "and merge them into the report")
    p.add_argument("--top", type=int, default=20, help="rows in top-N tables (20)")
    p.add_argument("--flap-threshold", type=int, default=10,
                   help="a client reconnecting more often than this in an hour flaps")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting (repeatable), e.g. for s3a credentials")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    args = p.parse_args(argv)
    if args.since and args.until and args.since >= args.until:
        p.error("--since must be before --until")
    return args


def check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return
    if shutil.which("java") is None:
        raise SetupError("Java is not installed, and Spark needs it. On Debian/Ubuntu: "
                         f"sudo apt-get install {JAVA_PACKAGE}")


def check_master(master: str, timeout: float = 5.0) -> None:
    if not master.startswith("spark://"):
        return
    for hostport in master[len("spark://"):].split(","):
        parts = urlsplit("//" + hostport)
        host, port = parts.hostname or "", parts.port or 7077
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as e:
            last = f"{host}:{port}: {e.strerror or e}"
    raise SetupError(f"cannot reach the Spark master {master} ({last}); is it running?")


def make_session(master: str, app_name: str = "mqttamqp-report",
                 conf: Sequence[str] = ()) -> Any:
    """A Spark session on ``master`` with the settings the report relies on."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.sources.partitionOverwriteMode", "static"))
    for item in conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise SetupError(f"--conf {item!r}: expected KEY=VALUE")
        builder = builder.config(key.strip(), value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


class Progress:
    """Polls Spark's status tracker: a one-line bar on a terminal, log lines otherwise."""

    def __init__(self, spark: Any, out: TextIO, tty: bool) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.out = out
        self.tty = tty
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="report-progress",
                                       daemon=True)
        self.started = time.monotonic()

    def __enter__(self) -> Progress:
        if self.tty:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(5)
            self.out.write("\r\x1b[K")
            self.out.flush()

    def stage(self, name: str) -> None:
        line = f"[{time.monotonic() - self.started:6.1f}s] {name}"
        if self.tty:
            self.out.write("\r\x1b[K" + line + "\n")
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            done = total = 0
            stages = 0
            try:
                for sid in self.tracker.getActiveStageIds():
                    info = self.tracker.getStageInfo(sid)
                    if info is not None:
                        stages += 1
                        done += info.numCompletedTasks
                        total += info.numTasks
            except Exception:
                continue
            if total:
                width = 30
                filled = int(width * done / total)
                self.out.write(f"\r\x1b[K[{'#' * filled}{'.' * (width - filled)}] "
                               f"{done}/{total} tasks, {stages} stage(s)")
                self.out.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    err = sys.stderr
    try:
        import pyspark  # noqa: F401
    except ImportError:
        err.write("mqttamqp-report needs PySpark: pip install 'mqttamqp[report]' "
                  "(or: pip install pyspark)\n")
        return EXIT_SETUP
    from mqttamqp.pipeline.report import EmptyArchive, ReportOptions, build_report

    try:
        check_java()
        check_master(args.master)
        spark = make_session(args.master, conf=args.conf)
    except SetupError as e:
        err.write(f"mqttamqp-report: {e}\n")
        return EXIT_SETUP
    opts = ReportOptions(archive=args.archive, out=args.out, since=args.since,
                         until=args.until, incremental=args.incremental, top=args.top,
                         flap_threshold=args.flap_threshold)
    tty = err.isatty() and not args.quiet
    try:
        with Progress(spark, err, tty) as progress:
            if not args.quiet:
                progress.stage(f"reading {args.archive} on {args.master}")
            result = build_report(spark, opts,
                                  (lambda _: None) if args.quiet else progress.stage)
    except EmptyArchive as e:
        err.write(f"mqttamqp-report: the archive is empty: {e}\n")
        return EXIT_EMPTY
    finally:
        spark.stop()
    if not args.quiet:
        err.write(summary_line(args.out, args.incremental, result) + "\n")
    return 0


def summary_line(out: str, asked_incremental: bool, result: Any) -> str:
    """The line printed after a run: what the report holds and what this run read."""
    totals = result.summary["totals"]
    if result.incremental:
        run = "incremental run"
    elif asked_incremental:
        run = "full run (no complete incremental state of this archive there yet)"
    else:
        run = "full run"
    return (f"report written to {out}: {totals['messages']} messages, "
            f"{totals['topics']} topics; {run}: {result.files_read} files read, "
            f"{result.rows_read} rows read")
