"""The kinds of a session's drops, kept apart from its hot fields: most sessions
never drop anything, so the three counts (QoS 0 copies over a congested link's
bound, AMQP Rejected, and all of them as they were at the last change of protocol)
are one object made at the first drop, not three slots of every session.

``DropKinds`` is the part of ``session.Session`` that reads and writes them (a
mixin without slots of its own: ``_drops`` is the session's slot).  What it must
not do: decide what is dropped (the session and its window do), or count the
total (``Session.dropped`` stays a plain slot, read on the hot path).
"""

from __future__ import annotations

__all__ = ["DropKinds", "Drops"]


_NO_DROPS = (0, 0, 0)


class Drops:
    """The kinds of a session's drops (``Session.dropped_congested``, ...)."""

    __slots__ = ("congested", "offset", "rejected")

    def __init__(self) -> None:
        self.congested = 0
        self.rejected = 0
        self.offset: tuple[int, int, int] = _NO_DROPS


class DropKinds:
    """``Session.dropped_congested``, ``dropped_rejected`` and ``drop_offset``."""

    __slots__ = ()

    _drops: Drops | None

    @property
    def dropped_congested(self) -> int:
        """Of ``dropped``: QoS 0 copies for a link over its backlog bound."""
        drops = self._drops
        return 0 if drops is None else drops.congested

    @dropped_congested.setter
    def dropped_congested(self, value: int) -> None:
        self._own_drops().congested = value

    @property
    def dropped_rejected(self) -> int:
        """Of ``dropped``: AMQP Rejected (``Broker.rejected``)."""
        drops = self._drops
        return 0 if drops is None else drops.rejected

    @dropped_rejected.setter
    def dropped_rejected(self, value: int) -> None:
        self._own_drops().rejected = value

    @property
    def drop_offset(self) -> tuple[int, int, int]:
        """``dropped``, ``dropped_congested`` and ``dropped_rejected`` as they were
        when the session last changed protocol (what is already labelled with its
        former protocol in the metrics)."""
        drops = self._drops
        return _NO_DROPS if drops is None else drops.offset

    @drop_offset.setter
    def drop_offset(self, value: tuple[int, int, int]) -> None:
        if self._drops is not None or value != _NO_DROPS:
            self._own_drops().offset = value

    def _own_drops(self) -> Drops:
        drops = self._drops
        if drops is None:
            # (``_drops`` is the session's slot: a second base with slots of its
            # own would not lay out beside ``InflightWindow``)
            drops = self._drops = Drops()  # type: ignore[misc]
        return drops
