"""The archive's writer process, seen from the broker: started with the archive's
configuration, given one frame at a time and its answer awaited, replaced after a
failure (no sooner than ``RESPAWN_DELAY``), stopped and reaped.  Only the archive's
feeding thread calls it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from twisted.logger import Logger

from mqttamqp.archive.frames import FORMAT, REFUSED, read_frame, write_frame

__all__ = ["ANSWER_WAIT", "EXIT_WAIT", "RESPAWN_DELAY", "WriterProcess"]

log = Logger(namespace="mqttamqp.archive")

RESPAWN_DELAY = 1.0      # seconds before a failed writer process is replaced
EXIT_WAIT = 30.0         # seconds a closing writer process has to exit
ANSWER_WAIT = 120.0      # seconds without an answer before a writer is taken for dead

_CHILD = ("import sys\n"
          "if sys.argv[1] not in sys.path: sys.path.insert(0, sys.argv[1])\n"
          "from mqttamqp.archive.writer import main\n"
          "main()\n")

# The directory that holds the mqttamqp package, for the writer process's sys.path.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

class WriterProcess:
    """One writer child process at a time (see the module)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config
        self._child: subprocess.Popen[bytes] | None = None
        self.respawn_at = 0.0   # monotonic time before which no new process starts
        self.failures = 0       # in the current spell (logged once, at its start)
        self.refused = False    # the writer refused our frames' format: none again

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.pid if child is not None else None

    @property
    def running(self) -> bool:
        return self._child is not None

    def spawn(self) -> None:
        """Start a writer process and hand it the configuration (OSError if not)."""
        child = subprocess.Popen([sys.executable, "-c", _CHILD, _PACKAGE_ROOT],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 close_fds=True)
        assert child.stdin is not None
        try:
            write_frame(child.stdin.fileno(), {"format": FORMAT, **self._config})
        except OSError:
            self._child = child
            self.stop()
            raise
        self._child = child

    def respawn(self, stopping: bool) -> bool:
        """Start a new writer process if its time has come (or the archive is
        stopping); true if one runs now."""
        if self.refused or (not stopping and time.monotonic() < self.respawn_at):
            return False
        try:
            self.spawn()
        except OSError:
            if not self.failures:   # one traceback per spell, not per second
                log.failure("archive: cannot start a writer process; retrying every "
                            "{s}s, records are dropped and counted meanwhile",
                            s=RESPAWN_DELAY)
            self.failures += 1
            self.respawn_at = time.monotonic() + RESPAWN_DELAY
            return False
        return True

    def exchange(self, frame: tuple[Any, ...], timeout: float = ANSWER_WAIT) -> Any:
        """One frame to the writer process and its answer (blocking, GIL released
        while waiting; a writer that does not answer within ``timeout`` is taken
        for dead)."""
        child = self._child
        assert child is not None and child.stdin is not None and child.stdout is not None
        write_frame(child.stdin.fileno(), frame)
        return read_frame(child.stdout.fileno(), timeout)

    def failed(self) -> None:
        """The process died or answered nonsense: end it; a new one may start after
        ``RESPAWN_DELAY``. One that refused our frames' format (its code on disk is
        not this broker's) is not started again: one line says so."""
        if self.stop(grace=1.0) == REFUSED:
            self.refused = True
            log.error("archive: the writer process refused this broker's frames "
                      "(format {version}): the code on disk is not the one the broker "
                      "runs; restart the broker after an upgrade. Records are dropped "
                      "and counted until then", version=FORMAT)
            return
        if not self.failures:   # one traceback per spell, not per second
            log.failure("archive: the writer process failed; its open segments are lost")
        self.failures += 1
        self.respawn_at = time.monotonic() + RESPAWN_DELAY

    def recovered(self) -> None:
        """A step went through: a spell of failures, if any, is over (one line)."""
        if self.failures:
            log.info("archive: the writer process works again after {n} failure(s)",
                     n=self.failures)
            self.failures = 0

    def stop(self, grace: float = EXIT_WAIT) -> int | None:
        """Make sure the writer process is gone and reaped: end of file on its stdin
        makes it exit; if it has not within ``grace`` seconds, SIGKILL to its own
        PID (through its ``Popen``). Its exit status (None if none ran)."""
        child, self._child = self._child, None
        if child is None:
            return None
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()
        try:
            return child.wait(grace)
        except subprocess.TimeoutExpired:
            child.kill()
            return child.wait()
