"""Log lines limited per cause: what a hostile or broken client can repeat at will
(hitting a limit, say) costs at most one line per cause per interval.

``LogLimiter.allow(cause)`` says whether a line may be written now and how many
were held back since the last one, so that line can say so.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["LogLimiter"]


class LogLimiter:
    def __init__(self, seconds: Callable[[], float], interval: float = 60.0,
                 max_causes: int = 1024) -> None:
        self._seconds = seconds
        self.interval = interval
        self._max_causes = max_causes
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def allow(self, cause: str) -> int | None:
        """None: do not log now (counted).  Otherwise log, mentioning the returned
        number of lines held back since the last one for this cause."""
        now = self._seconds()
        last = self._last.get(cause)
        if last is not None and now - last < self.interval:
            self._held[cause] = self._held.get(cause, 0) + 1
            return None
        if last is None and len(self._last) >= self._max_causes:
            # Bounded: forget the causes not logged for longest.
            for old in sorted(self._last, key=self._last.__getitem__)[:len(self._last) // 2]:
                del self._last[old]
                self._held.pop(old, None)
        self._last[cause] = now
        return self._held.pop(cause, 0)
