"""Route the standard library's ``logging`` (ZODB, transaction) into Twisted's logger.

Without it, ZODB's records reach twistd as raw stderr lines, all shown as errors —
including the routine "truncated, possibly due to damaged records" notice a
FileStorage prints when it recovers after a crash.  With it they keep their level
and their logger name.
"""

from __future__ import annotations

import logging

from twisted.logger import Logger, LogLevel

__all__ = ["install"]

_LEVELS = [
    (logging.CRITICAL, LogLevel.critical),
    (logging.ERROR, LogLevel.error),
    (logging.WARNING, LogLevel.warn),
    (logging.INFO, LogLevel.info),
]


class _ToTwisted(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        level = LogLevel.debug
        for threshold, twisted_level in _LEVELS:
            if record.levelno >= threshold:
                level = twisted_level
                break
        try:
            text = record.getMessage()
        except Exception:  # a bad format string must not break logging
            text = str(record.msg)
        Logger(namespace=record.name).emit(level, "{text}", text=text)


# Libraries whose info lines narrate routine work: RelStorage logs a dozen lines per
# pack (and the broker packs whenever the storage grew by --pack-growth MB, with a
# line of its own), and one per connection it opens.  Their warnings still come.
QUIET = ("relstorage",)


def install(level: int = logging.INFO) -> None:
    """Send stdlib records at ``level`` and above to Twisted's log (idempotent);
    the ``QUIET`` libraries from warnings up."""
    root = logging.getLogger()
    if not any(isinstance(h, _ToTwisted) for h in root.handlers):
        root.addHandler(_ToTwisted())
    root.setLevel(level)
    for name in QUIET:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
