"""The formatted log lines whose format holds a string, while in a ``with`` block
(Twisted's global log publisher; the observer is removed on the way out)."""

from __future__ import annotations

from typing import Any

from twisted.logger import formatEvent, globalLogPublisher

__all__ = ["LogLines"]


class LogLines:
    """``with LogLines("--close-grace") as lines:``: the lines logged meanwhile whose
    format holds that string, formatted."""

    def __init__(self, needle: str) -> None:
        self.needle = needle
        self.lines: list[str] = []

    def _observe(self, event: dict[str, Any]) -> None:
        if self.needle in str(event.get("log_format", "")):
            self.lines.append(formatEvent(event))

    def __enter__(self) -> list[str]:
        globalLogPublisher.addObserver(self._observe)
        return self.lines

    def __exit__(self, *exc: object) -> None:
        globalLogPublisher.removeObserver(self._observe)
