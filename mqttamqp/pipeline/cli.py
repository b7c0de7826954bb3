"""``mqttamqp-report`` / ``python -m mqttamqp.pipeline``: the command line of the
report job.

This module owns argument parsing, the checks that turn common set-up mistakes
into one clear sentence (no PySpark, no Java, master unreachable, empty archive),
the Spark session, and progress output (a bar on a terminal, plain lines
otherwise). Like the broker, the job listens on loopback only unless told: in
local mode Spark's driver binds 127.0.0.1 (Spark would otherwise pick the box's
first non-loopback address), and its web UI is off unless ``--spark-ui``.
The Spark logic itself is in ``report``; this module must not build DataFrames,
and it must never run inside the broker's process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import urlsplit

__all__ = ["main", "parse_args", "make_session", "session_settings", "driver_address",
           "check_master", "SetupError", "JAVA_PACKAGE", "LOOPBACK"]

#: What to install when ``java`` is missing (Debian's headless JRE).
JAVA_PACKAGE = "default-jre-headless"
EXIT_SETUP = 2
EXIT_EMPTY = 3
EXIT_BUSY = 4     # another run is writing the same --out
LOCK_NAME = ".report.lock"
LOOPBACK = "127.0.0.1"
_DRIVER_ADDRESS_KEYS = ("spark.driver.host", "spark.driver.bindAddress")


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
                   help="extra Spark setting (repeatable), e.g. for s3a credentials "
                        "or spark.driver.host on a multi-host cluster")
    p.add_argument("--spark-ui", action="store_true",
                   help="start Spark's web UI on the driver's address (off by default)")
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


def check_master(master: str, timeout: float = 5.0) -> str | None:
    """Connect to a standalone master (``spark://``); the local address the
    connection came from (the one the cluster can reach this box on), or ``None``
    for any other master."""
    if not master.startswith("spark://"):
        return None
    for hostport in master[len("spark://"):].split(","):
        parts = urlsplit("//" + hostport)
        host, port = parts.hostname or "", parts.port or 7077
        try:
            with socket.create_connection((host, port), timeout=timeout) as conn:
                return str(conn.getsockname()[0])
        except OSError as e:
            last = f"{host}:{port}: {e.strerror or e}"
    raise SetupError(f"cannot reach the Spark master {master} ({last}); is it running?")


def driver_address(master: str, reached_from: str | None,
                   environ: Mapping[str, str] = os.environ) -> str | None:
    """Where the driver listens when ``--conf`` does not say: ``SPARK_LOCAL_IP``
    if set, else loopback in local mode, else the address this box reached the
    standalone master from (``None``: Spark's own choice, e.g. on YARN)."""
    if environ.get("SPARK_LOCAL_IP"):
        return environ["SPARK_LOCAL_IP"]
    if master.startswith("local"):
        return LOOPBACK
    return reached_from


def session_settings(master: str, conf: Sequence[str] = (), spark_ui: bool = False,
                     reached_from: str | None = None,
                     environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Every setting the job gives its Spark session; ``--conf`` items come last
    and win."""
    settings = {"spark.sql.session.timeZone": "UTC",
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.sources.partitionOverwriteMode": "static",
                "spark.ui.enabled": "true" if spark_ui else "false"}
    extra: dict[str, str] = {}
    for item in conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise SetupError(f"--conf {item!r}: expected KEY=VALUE")
        extra[key.strip()] = value
    address = driver_address(master, reached_from, environ)
    # A --conf spark.driver.host alone must keep Spark's rule that the driver binds
    # the host it advertises, so neither key is set when either is given.
    if address is not None and not any(k in extra for k in _DRIVER_ADDRESS_KEYS):
        settings.update(dict.fromkeys(_DRIVER_ADDRESS_KEYS, address))
    settings.update(extra)
    return settings


def make_session(master: str, app_name: str = "mqttamqp-report",
                 conf: Sequence[str] = (), spark_ui: bool = False,
                 reached_from: str | None = None) -> Any:
    """A Spark session on ``master`` with the settings the report relies on."""
    settings = session_settings(master, conf, spark_ui, reached_from)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not any(k in _conf_keys(conf) for k in _DRIVER_ADDRESS_KEYS):
        # Spark's UI binds SPARK_LOCAL_IP, or every address when it is unset; the
        # variable is read when the JVM starts, so it is set before the session.
        address = settings.get("spark.driver.bindAddress")
        if address is not None:
            os.environ.setdefault("SPARK_LOCAL_IP", address)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _conf_keys(conf: Sequence[str]) -> set[str]:
    return {item.partition("=")[0].strip() for item in conf}


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


def lock_out(out: str) -> Any:
    """An exclusive lock on a local report folder (``OUT/.report.lock``), held while the
    run lasts, or None for a folder on a cluster file system (not locked).  Raises
    ``BlockingIOError`` when another run holds it: two runs on one folder (a manual run
    beside the broker's --report-every) would both write the incremental state and
    count files twice."""
    import fcntl

    parts = urlsplit(out)
    if parts.scheme not in ("", "file"):
        return None
    path = parts.path if parts.scheme == "file" else out
    os.makedirs(path, exist_ok=True)
    f = open(os.path.join(path, LOCK_NAME), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    err = sys.stderr
    try:
        lock = lock_out(args.out)
    except BlockingIOError:
        err.write(f"mqttamqp-report: another report run is writing {args.out}; nothing "
                  "was changed (run again when it has ended)\n")
        return EXIT_BUSY
    except OSError as e:
        err.write(f"mqttamqp-report: cannot use {args.out}: {e.strerror or e}\n")
        return EXIT_SETUP
    try:
        return _run(args, err)
    finally:
        if lock is not None:
            lock.close()


def _run(args: argparse.Namespace, err: TextIO) -> int:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        err.write("mqttamqp-report needs PySpark: pip install 'mqttamqp[report]' "
                  "(or: pip install pyspark)\n")
        return EXIT_SETUP
    from mqttamqp.pipeline.report import EmptyArchive, ReportOptions, build_report

    try:
        check_java()
        reached_from = check_master(args.master)
        spark = make_session(args.master, conf=args.conf, spark_ui=args.spark_ui,
                             reached_from=reached_from)
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
                if args.spark_ui:
                    progress.stage(f"Spark UI at {spark.sparkContext.uiWebUrl}")
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
