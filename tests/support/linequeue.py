"""Waiting for a line of a child process's output: the lines a reader thread puts in
a ``queue.Queue`` ("" at the end of the output), and one wait bounded as a whole,
however many other lines come meanwhile (a broker or Mosquitto logging a
reconnecting bridge all the time must not keep it waiting for ever)."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

__all__ = ["next_line"]


def next_line(lines: queue.Queue[str], wanted: Callable[[str], bool], timeout: float,
              what: str, output: Callable[[], str]) -> str:
    """The next line for which ``wanted`` is true, within ``timeout`` seconds in all.
    ``TimeoutError`` when the time is up, ``RuntimeError`` when the output ended
    first; both name ``what`` and carry ``output()``."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no {what} within {timeout:g} s:\n" + output())
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            continue
        if line == "":
            raise RuntimeError(f"the output ended before {what}:\n" + output())
        if wanted(line):
            return line
