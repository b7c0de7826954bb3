"""The log's format (``--log-format text|json``) and level (``--log-level``).

JSON lines go through twisted.logger's own ``jsonFileLogObserver`` (one object a
line, no record separator), after a step that gives every event the same
top-level fields whatever the call site named its keys: ``time`` (ISO 8601,
UTC), ``level``, ``namespace``, ``event`` (the formatted text), and, when the
event has them, ``client``, ``remote`` and ``reason``.  Log shippers key on
those; the call site's own keys stay beside them.

What it owns: building the observer twistd logs to.  What it must not do:
change what the broker logs or how often (the rate limits live where the lines
are written).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, Any

from twisted.logger import (
    FilteringLogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    formatEvent,
    jsonFileLogObserver,
    textFileLogObserver,
)
from twisted.python.logfile import LogFile

__all__ = ["FORMATS", "LEVELS", "StableFields", "make_observer", "open_destination"]

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warn", "error", "critical")

# The call sites' names for the stable fields, in order of preference.
_ALIASES = {
    "client": ("client", "client_id", "c"),
    "remote": ("remote", "peer"),
    "reason": ("reason", "cause", "why", "e"),
}


class StableFields:
    """Adds the stable fields to each event, then hands it on (to the JSON writer)."""

    def __init__(self, observer: Callable[[dict[str, Any]], None]) -> None:
        self.observer = observer

    def __call__(self, event: dict[str, Any]) -> None:
        # The logger and source objects cannot be written as JSON (they would be
        # {"unpersistable": true} on every line).
        out = {k: v for k, v in event.items() if k not in ("log_logger", "log_source")}
        level = event.get("log_level")
        out["level"] = level.name if isinstance(level, type(LogLevel.info)) else "info"
        when = event.get("log_time")
        if isinstance(when, int | float):
            out["time"] = datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds")
        out["namespace"] = event.get("log_namespace", "")
        text = formatEvent(event)
        failure = event.get("log_failure")
        if failure is not None:
            text += "\n" + failure.getTraceback()
        out["event"] = text
        for field, names in _ALIASES.items():
            for name in names:
                value = event.get(name)
                if value is not None and value != "":
                    out[field] = str(value)
                    break
        self.observer(out)


def open_destination(logfile: str | None, nodaemon: bool) -> IO[str]:
    """Where twistd itself would log: standard output under ``-n`` (or with
    ``--logfile -``), else the log file (``twistd.log`` by default) as twistd opens
    it (a ``LogFile``, rotated at 1 MB)."""
    if logfile == "-" or (nodaemon and not logfile):
        return sys.stdout
    stream: Any = LogFile.fromFullPath(logfile or "twistd.log")
    return stream  # type: ignore[no-any-return]


def level_filter(level: str = "debug") -> Any:
    """The level filter of ``make_observer``; ``set_level`` changes it live."""
    return LogLevelFilterPredicate(defaultLogLevel=LogLevel.levelWithName(level))


def set_level(predicate: Any, level: str) -> None:
    predicate.setLogLevelForNamespace("", LogLevel.levelWithName(level))


def make_observer(stream: IO[str], fmt: str = "text", level: str = "info",
                  predicate: Any = None) -> Any:
    """The observer (an ``ILogObserver``) for ``--log-format`` and ``--log-level``
    (``predicate``: a ``level_filter`` to keep for changing the level later)."""
    sink: Any = textFileLogObserver(stream)
    if fmt == "json":
        sink = StableFields(jsonFileLogObserver(stream, recordSeparator=""))
    if predicate is None:
        predicate = level_filter(level)
    return FilteringLogObserver(sink, [predicate])
