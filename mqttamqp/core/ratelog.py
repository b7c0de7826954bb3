"""Log lines limited per cause: what a hostile or broken client can repeat at will
(hitting a limit, say) costs at most one line per cause per interval.

``LogLimiter.allow(cause)`` says whether a line may be written now and how many
were held back since the last one, so that line can say so.  With ``burst`` a
cause may have that many lines per interval (a line per connection, say, but not
thousands a second in a connection storm: formatting them was a third of the
broker's CPU while 5,000 clients connected).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["LogLimiter"]


class LogLimiter:
    def __init__(self, seconds: Callable[[], float], interval: float = 60.0,
                 max_causes: int = 1024, burst: int = 1) -> None:
        self._seconds = seconds
        self.interval = interval
        self.burst = burst        # lines per cause per interval
        self._max_causes = max_causes
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._used: dict[str, int] = {}

    def ready(self, cause: str) -> bool:
        """Would ``allow(cause)`` let a line through now?  (Nothing is counted.)"""
        last = self._last.get(cause)
        return (last is None or self._seconds() - last >= self.interval
                or self._used.get(cause, 1) < self.burst)

    def allow(self, cause: str) -> int | None:
        """None: do not log now (counted).  Otherwise log, mentioning the returned
        number of lines held back since the last one for this cause."""
        now = self._seconds()
        last = self._last.get(cause)
        if last is not None and now - last < self.interval:
            used = self._used.get(cause, 1)
            if used < self.burst:
                self._used[cause] = used + 1
                return 0
            self._held[cause] = self._held.get(cause, 0) + 1
            return None
        if last is None and len(self._last) >= self._max_causes:
            # Bounded: forget the causes not logged for longest.
            for old in sorted(self._last, key=self._last.__getitem__)[:len(self._last) // 2]:
                del self._last[old]
                self._held.pop(old, None)
                self._used.pop(old, None)
        self._last[cause] = now
        self._used[cause] = 1
        return self._held.pop(cause, 0)
