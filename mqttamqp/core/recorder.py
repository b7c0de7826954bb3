"""What the broker tells its archive: one call per routed message and one per event.

The core depends on this contract only; ``mqttamqp.archive.Archive`` implements it
and the service wires it in (``NoRecorder`` when the archive is off).  The event
kinds and causes are ``mqttamqp.events``, shared with the archive's schema.

What it must not do: cost the hot path more than an append (the archive buffers
and writes off the reactor thread, dropping and counting when it falls behind).
"""

from __future__ import annotations

from typing import Protocol

from mqttamqp.events import (
    AUTH_FAILURE,
    CAUSE_CLEAN,
    CAUSE_CONSOLE,
    CAUSE_KEEPALIVE,
    CAUSE_LIMIT,
    CAUSE_LOST,
    CAUSE_PROTOCOL_ERROR,
    CAUSE_RESTART,
    CAUSE_SHUTDOWN,
    CAUSE_STORAGE,
    CAUSE_TAKEN_OVER,
    CONNECT,
    CONSOLE_ACTION,
    DISCONNECT,
    EVENT_KINDS,
    SESSION_CLEARED,
    SESSION_CREATED,
    SESSION_EXPIRED,
    SESSION_RESUMED,
    SUBSCRIBE,
    UNSUBSCRIBE,
    WILL_PUBLISHED,
)

__all__ = [
    "Recorder", "NoRecorder", "records",
    "CONNECT", "DISCONNECT", "WILL_PUBLISHED", "SESSION_CREATED", "SESSION_RESUMED",
    "SESSION_CLEARED", "SESSION_EXPIRED", "SUBSCRIBE", "UNSUBSCRIBE", "AUTH_FAILURE",
    "CONSOLE_ACTION", "EVENT_KINDS",
    "CAUSE_CLEAN", "CAUSE_LOST", "CAUSE_KEEPALIVE", "CAUSE_PROTOCOL_ERROR",
    "CAUSE_TAKEN_OVER", "CAUSE_CONSOLE", "CAUSE_SHUTDOWN", "CAUSE_RESTART", "CAUSE_STORAGE",
    "CAUSE_LIMIT",
]



class Recorder(Protocol):
    @property
    def records_messages(self) -> bool:
        """False while the recorder would drop every ``message`` call (webhooks that
        want no messages): the router then skips building the call.  Read per
        publish."""

    def message(self, timestamp: float, topic: str, qos: int, retain: bool, payload: bytes,
                publisher: str | None, user: str | None, protocol: str | None,
                deliveries: int, dropped: int) -> None:
        """A message was routed: ``deliveries`` sessions took it, ``dropped`` at a bound."""

    def event(self, timestamp: float, kind: str, client_id: str | None,
              **fields: object) -> None:
        """Something happened to ``client_id`` (``kind``: one of ``EVENT_KINDS``)."""

    def fields_event(self, timestamp: float, kind: str, client_id: str | None,
                     names: tuple[str, ...], values: tuple[object, ...]) -> None:
        """``event`` with its fields as ``names`` (a constant tuple of the caller's)
        and ``values``, in order: the same record, without keyword arguments to
        pass and parse (the connect path's two events, issue 31 §2)."""

    def stats(self) -> dict[str, int]:
        """Counters for ``$SYS`` and the console (``dropped`` among them)."""


def records(recorder: Recorder) -> bool:
    """False for ``NoRecorder``: callers skip the work of building what it would drop."""
    return not isinstance(recorder, NoRecorder)


class NoRecorder:
    """The archive is off: nothing is recorded."""

    records_messages = False
    records_events = False

    def message(self, timestamp: float, topic: str, qos: int, retain: bool, payload: bytes,
                publisher: str | None, user: str | None, protocol: str | None,
                deliveries: int, dropped: int) -> None:
        pass

    def event(self, timestamp: float, kind: str, client_id: str | None,
              **fields: object) -> None:
        pass

    def fields_event(self, timestamp: float, kind: str, client_id: str | None,
                     names: tuple[str, ...], values: tuple[object, ...]) -> None:
        pass

    def stats(self) -> dict[str, int]:
        return {}
