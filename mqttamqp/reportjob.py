"""The report job on a schedule (``--report-every``) and on demand (the console's
"Run report now"): ``mqttamqp-report --incremental`` as a child process of the broker.

``ReportJob`` owns when the job runs, that at most one runs at a time, what the
console shows of it (idle / running since / the last run's end, exit status,
duration and, after a failure, the last lines of its output) and stopping it with
the broker. It must never run Spark (or import PySpark) in the broker's process:
PySpark is only looked up (``importlib.util.find_spec``) to say how to install it.

How a process is started is behind ``ProcessRunner`` so that unit tests use a fake
runner and ``task.Clock``; ``SpawnRunner`` is the real one (``reactor.spawnProcess``,
output read by the reactor, never a blocking wait). The child runs at nice 19 like
the archive's writer, in a process group of its own (its PID is the group's id),
so that stopping it by its PID also stops the JVM PySpark starts under it:
SIGTERM to the group, then SIGKILL after ``stop_grace`` seconds.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import sys
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from twisted.internet import protocol
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

__all__ = ["ReportJob", "ProcessRunner", "RunningProcess", "SpawnRunner", "parse_duration",
           "INSTALL_HINT", "JOB_NICE"]

log = Logger(namespace="mqttamqp.reportjob")

JOB_NICE = 19          # like the archive's writer: the broker comes first
INSTALL_HINT = ("PySpark is not installed, so the report cannot run: "
                "pip install '.[report]' (and apt-get install default-jre-headless), "
                "then restart the broker")
_TAIL_LINES = 20       # lines of output kept for the console after a failure
_LINE_BYTES = 500      # longest line kept (a JVM stack line can be very long)
_PENDING_BYTES = 64 << 10   # partial line held while waiting for its end
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Runs argv[3:] at nice argv[1] in a new session (process group = its PID).
_LAUNCHER = ("import os, sys\n"
             "os.setsid()\n"
             "os.nice(int(sys.argv[1]))\n"
             "os.execvp(sys.argv[2], sys.argv[2:])\n")


def parse_duration(text: str) -> float:
    """``"1h"``, ``"30m"``, ``"90s"``, ``"1d"``, ``"1h30m"``: seconds. ``ValueError``
    says what is accepted."""
    value = text.strip().lower()
    parts = re.findall(r"(\d+)([smhd])", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"{text!r} is not a duration (say 30m, 1h, 1h30m, 1d or 90s)")
    seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"{text!r}: the duration must be more than 0")
    return float(seconds)


class RunningProcess(Protocol):
    pid: int

    def kill(self, signo: int) -> None:
        """Send ``signo`` to the process (and what it started)."""


class ProcessRunner(Protocol):
    def start(self, argv: Sequence[str], on_output: Callable[[bytes], None],
              on_exit: Callable[[int | None, int | None], None]) -> RunningProcess:
        """Start ``argv``; ``on_output`` gets its stdout and stderr as they come,
        ``on_exit(exit_code, signal)`` is called once when it has ended."""


class _Child(protocol.ProcessProtocol):
    def __init__(self, on_output: Callable[[bytes], None],
                 on_exit: Callable[[int | None, int | None], None]) -> None:
        self.on_output = on_output
        self.on_exit = on_exit

    def connectionMade(self) -> None:
        transport: Any = self.transport
        transport.closeStdin()      # the job reads nothing from the broker

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        self.on_output(data)

    def processEnded(self, reason: Failure) -> None:
        value = reason.value
        self.on_exit(getattr(value, "exitCode", None), getattr(value, "signal", None))


class _Spawned:
    def __init__(self, pid: int) -> None:
        self.pid = pid

    def kill(self, signo: int) -> None:
        try:
            os.killpg(self.pid, signo)   # its own group: the JVM under it too
        except ProcessLookupError:
            try:   # not yet its own group (just started): the process itself
                os.kill(self.pid, signo)
            except ProcessLookupError:
                pass


class SpawnRunner:
    """Starts the job through ``reactor.spawnProcess``, niced, in its own group."""

    def __init__(self, reactor: Any, nice: int = JOB_NICE) -> None:
        self.reactor = reactor
        self.nice = nice

    def start(self, argv: Sequence[str], on_output: Callable[[bytes], None],
              on_exit: Callable[[int | None, int | None], None]) -> RunningProcess:
        args = [sys.executable, "-c", _LAUNCHER, str(self.nice), *argv]
        transport = self.reactor.spawnProcess(_Child(on_output, on_exit), sys.executable,
                                              args, env=os.environ.copy())
        return _Spawned(transport.pid)


def pyspark_installed() -> bool:
    return importlib.util.find_spec("pyspark") is not None


class ReportJob:
    """Runs the report job every ``every`` seconds (None: only when asked), one at
    a time, and keeps its state for the console."""

    def __init__(self, clock: Any, runner: ProcessRunner, archive_dir: str, report_dir: str,
                 *, every: float | None = None, command: Sequence[str] | None = None,
                 available: Callable[[], bool] = pyspark_installed,
                 stop_grace: float = 10.0) -> None:
        self.clock = clock
        self.runner = runner
        self.every = every
        self.archive_dir = archive_dir
        self.report_dir = report_dir
        # A given command (tests, custom jobs) needs no PySpark in this interpreter.
        self.command: tuple[str, ...] = (sys.executable, "-m", "mqttamqp.pipeline")
        # Looked up once, here, not on the reactor thread (it reads directories).
        installed = available()
        self._available: Callable[[], bool] = lambda: installed
        if command is not None:
            self.set_command(command)
        self.stop_grace = stop_grace
        self._process: RunningProcess | None = None
        self._started_at: float | None = None
        self._trigger: str | None = None
        self._tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self._pending = b""
        self._last: dict[str, Any] | None = None
        self._next_call: Any = None
        self._skip_logged = False
        self._ended: list[Deferred[None]] = []
        self._kill_call: Any = None
        self._stopping = False
        self._unavailable_logged = False

    def set_command(self, command: Sequence[str]) -> None:
        """Run ``command`` instead of ``python -m mqttamqp.pipeline`` (tests, custom
        jobs); it needs no PySpark in this interpreter."""
        if not command:
            raise ValueError("report job: the command is empty")
        self.command = tuple(command)
        self._available = lambda: True

    @property
    def argv(self) -> tuple[str, ...]:
        return (*self.command, "--archive", self.archive_dir, "--out", self.report_dir,
                "--incremental")

    @property
    def running(self) -> bool:
        return self._process is not None

    # -- schedule -----------------------------------------------------------------------

    def start(self) -> None:
        """Arm the schedule: the first run comes ``every`` seconds after the start
        (not at once: a starting broker has enough to do)."""
        if self.every is not None:
            self._next_call = self.clock.callLater(self.every, self._due)

    def _due(self) -> None:
        assert self.every is not None
        self._next_call = self.clock.callLater(self.every, self._due)
        self.run_now("schedule")

    # -- runs -----------------------------------------------------------------------------

    def run_now(self, trigger: str) -> tuple[bool, str]:
        """Start a run unless one runs (then skip it, logged once per running job)
        or PySpark is missing. ``(started, what happened)`` for the console."""
        if self._stopping:
            return False, "the broker is stopping"
        if not self._available():
            if not self._unavailable_logged:
                self._unavailable_logged = True
                log.warn("report job: {hint}", hint=INSTALL_HINT)
            return False, INSTALL_HINT
        if self._process is not None:
            if not self._skip_logged:
                self._skip_logged = True
                log.info("report job: a run ({trigger}) is skipped: the one started at "
                         "{since} is still running; further skips are not logged until "
                         "it ends", trigger=trigger, since=self._started_at)
            return False, "a report is already running"
        self._tail.clear()
        self._pending = b""
        self._started_at = self.clock.seconds()
        self._trigger = trigger
        try:
            self._process = self.runner.start(self.argv, self._output, self._exited)
        except Exception as e:
            self._process = None
            self._finish_record(None, None, f"cannot start: {e}")
            log.error("report job: cannot start {argv}: {e}", argv=self.argv, e=e)
            return False, f"the report job cannot start: {e}"
        log.info("report job started ({trigger}), pid {pid}", trigger=trigger,
                 pid=self._process.pid)
        return True, "the report job has started"

    def _output(self, data: bytes) -> None:
        data = self._pending + data
        *lines, rest = data.split(b"\n")
        self._pending = rest[-_PENDING_BYTES:]
        for line in lines[-_TAIL_LINES:]:
            text = line.rstrip(b"\r").decode("utf-8", "replace")
            # progress bars redraw with \r: keep what the line ended as
            text = text.rsplit("\r", 1)[-1]
            if text.strip():
                self._tail.append(text[:_LINE_BYTES])

    def _exited(self, code: int | None, signo: int | None) -> None:
        if self._pending.strip():
            self._output(b"\n")
        self._finish_record(code, signo, None)
        self._process = None
        self._skip_logged = False
        if self._kill_call is not None and self._kill_call.active():
            self._kill_call.cancel()
        self._kill_call = None
        ended, self._ended = self._ended, []
        for d in ended:
            d.callback(None)

    def _finish_record(self, code: int | None, signo: int | None, error: str | None) -> None:
        now = self.clock.seconds()
        started = self._started_at if self._started_at is not None else now
        ok = error is None and code == 0
        self._last = {
            "trigger": self._trigger, "started_at": started, "finished_at": now,
            "duration": now - started, "exit_code": code, "signal": signo, "ok": ok,
            "error": error, "output_tail": None if ok else list(self._tail)}
        self._started_at = None
        if ok:
            log.info("report job finished in {d:.1f} s", d=now - started)
        elif error is None:
            log.warn("report job failed ({how}) after {d:.1f} s; its last output:\n{tail}",
                     how=f"exit status {code}" if signo is None else f"signal {signo}",
                     d=now - started, tail="\n".join(self._tail))

    # -- for the console -------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Idle or running since when, the next scheduled run, the last run. The
        console calls it from a worker thread: each attribute is read once."""
        available = self._available()
        process, since, last, next_call = (self._process, self._started_at, self._last,
                                           self._next_call)
        next_at = None
        if next_call is not None and next_call.active():
            next_at = next_call.getTime()
        return {
            "state": "running" if process is not None else "idle",
            "running_since": since if process is not None else None,
            "pid": process.pid if process is not None else None,
            "every": self.every, "next_run": next_at,
            "available": available, "hint": None if available else INSTALL_HINT,
            "last": None if last is None else dict(last),
        }

    # -- stopping with the broker ------------------------------------------------------------

    def stop(self) -> Deferred[None]:
        """No more runs; a running job gets SIGTERM, then SIGKILL after
        ``stop_grace`` seconds. Fires once it has ended."""
        self._stopping = True
        if self._next_call is not None and self._next_call.active():
            self._next_call.cancel()
        process = self._process
        if process is None:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._ended.append(d)
        log.info("report job: stopping pid {pid}", pid=process.pid)
        process.kill(signal.SIGTERM)
        if self._kill_call is None:
            self._kill_call = self.clock.callLater(self.stop_grace, self._kill, process)
        return d

    def _kill(self, process: RunningProcess) -> None:
        self._kill_call = None
        if self._process is process:
            log.warn("report job: pid {pid} ignored SIGTERM for {g} s; SIGKILL",
                     pid=process.pid, g=self.stop_grace)
            process.kill(signal.SIGKILL)
