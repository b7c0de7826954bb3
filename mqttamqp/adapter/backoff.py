"""Reconnect delays of the broker's outbound connections (bridges, gateway mode's
upstream connections): ``Backoff``, a minimum doubled after each failure up to a
bound, reset once a connection is accepted.

What it owns: the delays only.  What it must not do: schedule anything or know what
connects (its callers do).  (Here, not in ``bridge``: the gateway uses it and the
bridges use the gateway's engine, so neither package may hold it for the other.)
"""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    """Reconnect delays: ``minimum``, then doubled each failure up to ``maximum``;
    ``reset`` once a connection is accepted."""

    __slots__ = ("_next", "maximum", "minimum")

    def __init__(self, minimum: float, maximum: float) -> None:
        self.minimum = minimum
        self.maximum = maximum
        self._next = minimum

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self._next = self.minimum
