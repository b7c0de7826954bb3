"""Debug logging for one client id at a time, for a limited time (the console's
"Debug log" button).

What it owns: which client ids are being debugged and until when, with a bound
on how many at once.  The protocol adapter asks ``until(client_id)`` when a
client connects, and the façade tells a live connection to start; the adapter
logs that connection's packets until the deadline, then stops by itself.

What it must not do: cost anything to clients that are not being debugged (the
adapter checks once per connection, never per packet), or grow without bound.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ClientDebug", "MAX_DEBUGGED", "MAX_DEBUG_LINES", "MAX_DEBUG_SECONDS",
           "LineBudget"]

MAX_DEBUGGED = 16            # client ids debugged at once
MAX_DEBUG_SECONDS = 3600.0   # longest a client is debugged by one request
MAX_DEBUG_LINES = 10_000     # lines one connection may log in one debug window


class LineBudget:
    """How many more debug lines one connection may log: a client that floods
    while debugged must not flood the log; when the budget is spent, debugging
    that connection stops (one line says so)."""

    def __init__(self, lines: int = MAX_DEBUG_LINES) -> None:
        self.left = lines

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


class ClientDebug:
    def __init__(self, seconds: Callable[[], float]) -> None:
        self._seconds = seconds
        self._until: dict[str, float] = {}
        # The same dict, read-only outside: empty while no client is debugged (the
        # adapter tests it before asking ``until``, a call less per connect).
        self.debugged: dict[str, float] = self._until

    def enable(self, client_id: str, duration: float) -> float:
        """Debug ``client_id`` for ``duration`` seconds (at most an hour; 0 stops it)
        and return the deadline.  A ValueError when ``MAX_DEBUGGED`` others are."""
        now = self._seconds()
        self._expire(now)
        duration = max(0.0, min(duration, MAX_DEBUG_SECONDS))
        if duration == 0:
            self._until.pop(client_id, None)
            return now
        if client_id not in self._until and len(self._until) >= MAX_DEBUGGED:
            raise ValueError(f"{MAX_DEBUGGED} clients are being debugged already")
        self._until[client_id] = now + duration
        return now + duration

    def until(self, client_id: str) -> float | None:
        """The deadline of ``client_id``'s debug logging, if it is on."""
        deadline = self._until.get(client_id)
        if deadline is None:
            return None
        if deadline <= self._seconds():
            del self._until[client_id]
            return None
        return deadline

    def active(self) -> dict[str, float]:
        """Client ids being debugged, with their deadlines."""
        self._expire(self._seconds())
        return dict(self._until)

    def _expire(self, now: float) -> None:
        for client_id in [c for c, t in self._until.items() if t <= now]:
            del self._until[client_id]
