"""One recorder for the core made of several: the archive and the webhooks.

The core takes a single ``Recorder`` (``core.recorder``); ``fan_out`` gives it one
that passes every call to each of the given recorders, in order, and merges their
``stats()``.  With one recorder it returns that recorder itself, so a broker with
only the archive pays nothing for this module.

What it must not do: add work per message beyond the calls themselves (with one
recorder taking messages, the router calls that recorder's ``message`` directly).
"""

from __future__ import annotations

from typing import Any, Protocol

from mqttamqp.core.recorder import NoRecorder, Recorder

__all__ = ["FanOutRecorder", "fan_out"]


class MessageCall(Protocol):
    """``Recorder.message``'s signature, for the call ``FanOutRecorder`` routes."""

    def __call__(self, timestamp: float, topic: str, qos: int, retain: bool, payload: bytes,
                 publisher: str | None, user: str | None, protocol: str | None,
                 deliveries: int, dropped: int) -> None: ...


class FanOutRecorder:
    """Two recorders as one. ``message`` is the bound method of whichever of them
    takes messages, or a call to both only when both do: the archive with webhooks
    that want no messages (the default) costs one call a message, not three. The
    choice is made again whenever ``records_messages`` is read and what the two say
    has changed (a SIGHUP adds or removes message hooks); the router reads it before
    every ``message`` call (``core.recorder``: read per publish)."""

    message: MessageCall

    def __init__(self, first: Recorder, second: Recorder) -> None:
        self.first = first
        self.second = second
        self._first = first.records_messages
        self._second = second.records_messages
        self._choose()

    @property
    def records_messages(self) -> bool:
        first = self.first.records_messages
        second = self.second.records_messages
        if first != self._first or second != self._second:
            self._first = first
            self._second = second
            self._choose()
        return first or second

    def _choose(self) -> None:
        first, second = self._first, self._second
        if first and not second:
            self.message = self.first.message
        elif second and not first:
            self.message = self.second.message
        else:   # both, or neither (then the router does not call it)
            self.message = self._both

    def _both(self, timestamp: float, topic: str, qos: int, retain: bool, payload: bytes,
              publisher: str | None, user: str | None, protocol: str | None,
              deliveries: int, dropped: int) -> None:
        self.first.message(timestamp, topic, qos, retain, payload, publisher, user,
                           protocol, deliveries, dropped)
        self.second.message(timestamp, topic, qos, retain, payload, publisher, user,
                            protocol, deliveries, dropped)

    def event(self, timestamp: float, kind: str, client_id: str | None,
              **fields: object) -> None:
        self.first.event(timestamp, kind, client_id, **fields)
        self.second.event(timestamp, kind, client_id, **fields)

    def stats(self) -> dict[str, int]:
        merged = dict(self.first.stats())
        merged.update(self.second.stats())
        return merged


def fan_out(*recorders: Any) -> Recorder:
    """A recorder passing each call to every one of ``recorders`` (None skipped)."""
    present: list[Recorder] = [r for r in recorders if r is not None]
    if not present:
        return NoRecorder()
    combined = present[0]
    for recorder in present[1:]:
        combined = FanOutRecorder(combined, recorder)
    return combined
