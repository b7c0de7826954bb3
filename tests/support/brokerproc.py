"""Run the real broker (``twistd -n mqttamqp``) as a child process for integration tests.

It listens on port 0 on 127.0.0.1; the bound ports are read from its log
(``listening for MQTT on 127.0.0.1:PORT``), waiting on the log lines themselves
with a timeout.  Only processes started here are ever signalled, by their PID.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from linequeue import next_line

TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")
_LISTEN = re.compile(r"listening for ([\w-]+) on ([\d.]+):(\d+)")


class BrokerProcess:
    def __init__(self, data_dir: str, *extra: str, listeners: tuple[str, ...] = ("--mqtt",),
                 env: dict[str, str] | None = None,
                 descriptions: dict[str, str] | None = None) -> None:
        """``descriptions``: an endpoint description per listener option in place of
        ``tcp:0:interface=127.0.0.1`` (e.g. an ``ssl:0:...`` one)."""
        self.data_dir = data_dir
        self.extra = extra
        self.listeners = listeners
        self.descriptions = descriptions or {}
        self.env = env
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        self.ports: dict[str, int] = {}

    @property
    def mqtt_port(self) -> int:
        return self.ports["MQTT"]

    def start(self, timeout: float = 30.0, expect: tuple[str, ...] | None = None
              ) -> BrokerProcess:
        """Start it and wait until the listeners of ``expect`` (options, e.g.
        ``("--metrics",)``; default: every listener) say where they listen."""
        args = [TWISTD, "-n", "--pidfile=", "--logfile=-", "mqttamqp", "--data", self.data_dir]
        for option in ("--mqtt", "--amqp", "--web", "--mqtt-ws", "--metrics"):
            where = (self.descriptions.get(option, "tcp:0:interface=127.0.0.1")
                     if option in self.listeners else "none")
            args += [option, where]
        args += list(self.extra)
        env = dict(os.environ)
        env.update(self.env or {})
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()
        wanted = {opt.lstrip("-").upper() for opt in (expect or self.listeners)}
        self.ports = {}
        while not wanted <= set(self.ports):
            line = self.wait_for_line(r"listening for|Traceback|#critical\]", timeout)
            m = _LISTEN.search(line)
            if m is None:
                raise RuntimeError("broker failed to start:\n" + self.output())
            self.ports[m.group(1).upper()] = int(m.group(3))
        return self

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)
            self.lines.put(line)
        self.lines.put("")  # EOF marker

    def wait_for_line(self, pattern: str, timeout: float = 10.0) -> str:
        """Wait until the broker logs a line matching ``pattern`` (regex); return it.
        ``timeout`` bounds the whole wait, however many other lines come meanwhile."""
        rx = re.compile(pattern)
        return next_line(self.lines, lambda line: rx.search(line) is not None, timeout,
                         f"log line matching {pattern!r}", self.output)

    def output(self) -> str:
        return "".join(self.log[-200:])

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode if self.proc.returncode is not None else 0

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RestartableBroker(BrokerProcess):
    """``BrokerProcess`` that tolerates ZODB's start-up warning after a SIGKILL.

    After kill -9 the FileStorage index file is stale and the last transaction may be
    half written; ZODB says "Ignoring index for ...", "... truncated, possibly due to
    damaged records at N" and "Writing truncated data from ..." (through stdlib
    logging, which reaches twistd's log as ``[stderr#error]``), rebuilds the index
    and sets the partial transaction aside.  The base harness treats any start-up
    line containing "error" as a failed start, so these recovery notices (lines
    naming the storage file) are skipped here.
    """

    def wait_for_line(self, pattern: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = super().wait_for_line(pattern, max(0.0, deadline - time.monotonic()))
            recovery_notice = ("[stderr#error]" in line and "mqttamqp.fs" in line
                               and "Traceback" not in line and ".lock" not in line)
            if not recovery_notice:
                return line


def assert_refused_before_start(out: subprocess.CompletedProcess[str], first: str,
                                tmp_path: Path) -> None:
    """Exit status 1, the error then one hint line (not the help), nothing started."""
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 2, out.stderr
    assert lines[0].startswith("twistd mqttamqp: ") and first in lines[0], lines
    assert lines[1] == "(twistd mqttamqp --help lists the options)"
    assert not (tmp_path / "data").exists()
