"""Mosquitto (Debian's ``mosquitto`` binary) as a broker for tests: a temporary config
(one loopback listener, anonymous, persistence in the temp directory), started on a
free loopback port and waited for on its own log line; stopped by its PID only."""

from __future__ import annotations

import getpass
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

from linequeue import next_line
from ports import free_port


class MosquittoServer:
    """``start``/``stop`` may be repeated: the port and the persistence stay."""

    def __init__(self, directory: str, port: int | None = None, extra: str = "") -> None:
        """``extra``: more lines of mosquitto.conf (limits: ``max_qos 1``...)."""
        self.directory = directory
        self.port = port or free_port()
        self.conf = os.path.join(directory, "mosquitto.conf")
        with open(self.conf, "w") as f:
            f.write(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
                    f"persistence true\npersistence_location {directory}/\n"
                    "log_dest stderr\nlog_type all\n"
                    # (as root, Mosquitto drops to user mosquitto, which cannot
                    # write its persistence file into our temp directory)
                    f"user {getpass.getuser()}\n" + extra)
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []

    def start(self, timeout: float = 10.0) -> MosquittoServer:
        self.lines = queue.Queue()
        self.proc = subprocess.Popen(["mosquitto", "-c", self.conf], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        threading.Thread(target=self._pump, args=(self.proc, self.lines), daemon=True).start()
        try:
            self.wait_for(" running", timeout)
        except AssertionError:
            self.stop(signal.SIGKILL)   # (no fixture teardown runs after a failed start)
            raise
        return self

    def _pump(self, proc: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.log.append(line)
            lines.put(line)
        lines.put("")

    def wait_for(self, text: str, timeout: float = 10.0) -> str:
        """The next log line holding ``text`` (``timeout`` bounds the whole wait)."""
        try:
            return next_line(self.lines, lambda line: text in line, timeout,
                             f"mosquitto line holding {text!r}",
                             lambda: "".join(self.log[-30:]))
        except (TimeoutError, RuntimeError) as e:
            raise AssertionError(str(e)) from None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)
        self.proc = None


def running_mosquitto(tmp_path: Path, name: str = "mosquitto") -> Iterator[MosquittoServer]:
    """A plain Mosquitto in ``tmp_path/name``, started, stopped after (the body of the
    bridge tests' ``remote`` fixtures: ``yield from running_mosquitto(tmp_path)``)."""
    directory = tmp_path / name
    directory.mkdir()
    server = MosquittoServer(str(directory)).start()
    try:
        yield server
    finally:
        server.stop()
