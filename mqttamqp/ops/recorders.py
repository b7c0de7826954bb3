"""One recorder for the core made of several: the archive and the webhooks.

The core takes a single ``Recorder`` (``core.recorder``); ``fan_out`` gives it one
that passes every call to each of the given recorders, in order, and merges their
``stats()``.  With one recorder it returns that recorder itself, so a broker with
only the archive pays nothing for this module.

What it must not do: add work per message beyond the calls themselves (with one
recorder taking messages, the router calls that recorder's ``message`` directly).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from mqttamqp.core.recorder import NoRecorder, Recorder

__all__ = ["FanOutRecorder", "fan_out"]


class MessageCall(Protocol):
    """``Recorder.message``'s signature, for the call ``FanOutRecorder`` routes."""

    def __call__(self, timestamp: float, topic: str, qos: int, retain: bool, payload: bytes,
                 publisher: str | None, user: str | None, protocol: str | None,
                 deliveries: int, dropped: int) -> None: ...


class EventCall(Protocol):
    """``Recorder.event``'s signature, for the call ``FanOutRecorder`` routes."""

    def __call__(self, timestamp: float, kind: str, client_id: str | None,
                 **fields: object) -> None: ...


class FieldsEventCall(Protocol):
    """``Recorder.fields_event``'s signature, for the call ``FanOutRecorder`` routes."""

    def __call__(self, timestamp: float, kind: str, client_id: str | None,
                 names: tuple[str, ...], values: tuple[object, ...]) -> None: ...


class FanOutRecorder:
    """Two recorders as one. ``message`` is the bound method of whichever of them
    takes messages, or a call to both only when both do: the archive with webhooks
    that want no messages (the default) costs one call a message, not three, and
    ``records_messages`` is a plain attribute (the router reads it per publish).

    Both are chosen again when a recorder says its ``records_messages`` changed by
    calling what it holds in its ``on_change`` list (``WebhookRecorder.configure``
    at a SIGHUP); a recorder without ``on_change`` must keep its answer (the
    archive's is always true). A fan-out has ``on_change`` too, for one above it.

    ``event`` and ``fields_event`` are chosen the same way, by ``records_events`` (a
    recorder without it takes every event): webhooks with no hook on events cost
    nothing per connect."""

    message: MessageCall
    records_messages: bool
    event: EventCall
    fields_event: FieldsEventCall
    records_events: bool

    def __init__(self, first: Recorder, second: Recorder) -> None:
        self.first = first
        self.second = second
        self.on_change: list[Callable[[], None]] = []
        for recorder in (first, second):
            listeners = getattr(recorder, "on_change", None)
            if listeners is not None:
                listeners.append(self._choose)
        self._choose()

    def _choose(self) -> None:
        first, second = self.first, self.second
        takes = first.records_messages, second.records_messages
        # (neither: the router does not call it)
        self.message = _pick(*takes, first.message, second.message, self._both, self._both)
        self.records_messages = takes[0] or takes[1]
        takes = getattr(first, "records_events", True), getattr(second, "records_events", True)
        self.event = _pick(*takes, first.event, second.event, self._both_events, _no_event)
        self.fields_event = _pick(*takes, first.fields_event, second.fields_event,
                                  self._both_fields_events, _no_fields_event)
        self.records_events = takes[0] or takes[1]
        for listener in self.on_change:
            listener()

    def _both(self, timestamp: float, topic: str, qos: int, retain: bool, payload: bytes,
              publisher: str | None, user: str | None, protocol: str | None,
              deliveries: int, dropped: int) -> None:
        self.first.message(timestamp, topic, qos, retain, payload, publisher, user,
                           protocol, deliveries, dropped)
        self.second.message(timestamp, topic, qos, retain, payload, publisher, user,
                            protocol, deliveries, dropped)

    def _both_events(self, timestamp: float, kind: str, client_id: str | None,
                     **fields: object) -> None:
        self.first.event(timestamp, kind, client_id, **fields)
        self.second.event(timestamp, kind, client_id, **fields)

    def _both_fields_events(self, timestamp: float, kind: str, client_id: str | None,
                            names: tuple[str, ...], values: tuple[object, ...]) -> None:
        self.first.fields_event(timestamp, kind, client_id, names, values)
        self.second.fields_event(timestamp, kind, client_id, names, values)

    def stats(self) -> dict[str, int]:
        merged = dict(self.first.stats())
        merged.update(self.second.stats())
        return merged


def _pick(first: bool, second: bool, first_call: Any, second_call: Any, both: Any,
          neither: Any) -> Any:
    """The call for a fan-out of two: the one recorder that takes it, or ``both``."""
    if first and second:
        return both
    if first:
        return first_call
    return second_call if second else neither


def _no_event(timestamp: float, kind: str, client_id: str | None, **fields: object) -> None:
    pass


def _no_fields_event(timestamp: float, kind: str, client_id: str | None,
                     names: tuple[str, ...], values: tuple[object, ...]) -> None:
    pass


def fan_out(*recorders: Any) -> Recorder:
    """A recorder passing each call to every one of ``recorders`` (None skipped)."""
    present: list[Recorder] = [r for r in recorders if r is not None]
    if not present:
        return NoRecorder()
    combined = present[0]
    for recorder in present[1:]:
        combined = FanOutRecorder(combined, recorder)
    return combined
