"""What most sessions never set, kept apart from their hot fields: the kinds of
drops (QoS 0 copies over a congested link's bound, AMQP Rejected, and all of them as
they were at the last change of protocol), the MQTT 5 session expiry interval, and
a bridge backlog's blocking bound. One object made when the first of them is set,
not five slots of every session.

``SessionExtras`` is the part of ``session.Session`` that reads and writes them (a
mixin without slots of its own: ``_extras`` is the session's slot).  What it must
not do: decide what is dropped (the session and its window do), or count the
total (``Session.dropped`` stays a plain slot, read on the hot path).
"""

from __future__ import annotations

from typing import Any, Protocol

from mqttamqp.native import mypyc_attr, trait

__all__ = ["BacklogBound", "Extras", "SessionExtras"]


class BacklogBound(Protocol):
    """A bound that pauses publishers while ``over`` (a bridge's backlog with
    ``on-full = "block"``): also while the session is offline, and never stalled."""

    def over(self, session: Any) -> bool: ...


_NO_DROPS = (0, 0, 0)


class Extras:
    """A session's seldom set fields (``Session.dropped_congested``, ...)."""

    __slots__ = ("backlog_bound", "congested", "expiry", "offset", "rejected")

    def __init__(self) -> None:
        self.congested = 0
        self.rejected = 0
        self.offset: tuple[int, int, int] = _NO_DROPS
        self.expiry: float | None = None
        self.backlog_bound: BacklogBound | None = None


@trait
@mypyc_attr(allow_interpreted_subclasses=True)
class SessionExtras:
    """``Session.dropped_congested``, ``dropped_rejected``, ``drop_offset``,
    ``expiry`` and ``backlog_bound``."""

    __slots__ = ()

    _extras: Extras | None

    @property
    def dropped_congested(self) -> int:
        """Of ``dropped``: QoS 0 copies for a link over its backlog bound."""
        drops = self._extras
        return 0 if drops is None else drops.congested

    @dropped_congested.setter
    def dropped_congested(self, value: int) -> None:
        self._own().congested = value

    @property
    def dropped_rejected(self) -> int:
        """Of ``dropped``: AMQP Rejected (``Broker.rejected``)."""
        drops = self._extras
        return 0 if drops is None else drops.rejected

    @dropped_rejected.setter
    def dropped_rejected(self, value: int) -> None:
        self._own().rejected = value

    @property
    def drop_offset(self) -> tuple[int, int, int]:
        """``dropped``, ``dropped_congested`` and ``dropped_rejected`` as they were
        when the session last changed protocol (what is already labelled with its
        former protocol in the metrics)."""
        drops = self._extras
        return _NO_DROPS if drops is None else drops.offset

    @drop_offset.setter
    def drop_offset(self, value: tuple[int, int, int]) -> None:
        if self._extras is not None or value != _NO_DROPS:
            self._own().offset = value

    @property
    def expiry(self) -> float | None:
        """MQTT 5: seconds the session outlives its connection (None: the 3.1.1
        rules and --session-expiry)."""
        drops = self._extras
        return None if drops is None else drops.expiry

    @expiry.setter
    def expiry(self, value: float | None) -> None:
        if self._extras is not None or value is not None:
            self._own().expiry = value

    @property
    def backlog_bound(self) -> BacklogBound | None:
        """A bound that pauses the publishers feeding this session while it is over
        (``Session.over_high_water``), offline too; None for every other session."""
        drops = self._extras
        return None if drops is None else drops.backlog_bound

    @backlog_bound.setter
    def backlog_bound(self, value: BacklogBound | None) -> None:
        if self._extras is not None or value is not None:
            self._own().backlog_bound = value

    def _own(self) -> Extras:
        drops = self._extras
        if drops is None:
            # (``_extras`` is the session's slot: a second base with slots of its
            # own would not lay out beside ``InflightWindow``)
            drops = self._extras = Extras()  # type: ignore[misc]
        return drops
