"""What the broker tells its archive: one call per routed message and one per event.

The core depends on this contract only; ``mqttamqp.archive.Archive`` implements it
and the service wires it in (``NoRecorder`` when the archive is off).  The event
kinds and causes are the values of the archive's ``kind`` and ``reason`` columns
(``tests/test_archive_wiring.py`` checks they match ``mqttamqp.archive``'s).

What it must not do: cost the hot path more than an append (the archive buffers
and writes off the reactor thread, dropping and counting when it falls behind).
"""

from __future__ import annotations

from typing import Protocol

__all__ = [
    "Recorder", "NoRecorder",
    "CONNECT", "DISCONNECT", "WILL_PUBLISHED", "SESSION_CREATED", "SESSION_RESUMED",
    "SESSION_CLEARED", "SESSION_EXPIRED", "SUBSCRIBE", "UNSUBSCRIBE", "AUTH_FAILURE",
    "CONSOLE_ACTION", "EVENT_KINDS",
    "CAUSE_CLEAN", "CAUSE_LOST", "CAUSE_KEEPALIVE", "CAUSE_PROTOCOL_ERROR",
    "CAUSE_TAKEN_OVER", "CAUSE_CONSOLE", "CAUSE_SHUTDOWN", "CAUSE_RESTART",
]

CONNECT = "connect"
DISCONNECT = "disconnect"
WILL_PUBLISHED = "will_published"
SESSION_CREATED = "session_created"
SESSION_RESUMED = "session_resumed"
SESSION_CLEARED = "session_cleared"
SESSION_EXPIRED = "session_expired"
SUBSCRIBE = "subscribe"
UNSUBSCRIBE = "unsubscribe"
AUTH_FAILURE = "auth_failure"
CONSOLE_ACTION = "console_action"
EVENT_KINDS = frozenset({
    CONNECT, DISCONNECT, WILL_PUBLISHED, SESSION_CREATED, SESSION_RESUMED,
    SESSION_CLEARED, SESSION_EXPIRED, SUBSCRIBE, UNSUBSCRIBE, AUTH_FAILURE,
    CONSOLE_ACTION,
})

CAUSE_CLEAN = "clean"                    # MQTT DISCONNECT / AMQP close without error
CAUSE_LOST = "lost"                      # the socket went away
CAUSE_KEEPALIVE = "keepalive"            # keepalive (or AMQP idle time-out) expired
CAUSE_PROTOCOL_ERROR = "protocol_error"  # malformed or forbidden input
CAUSE_TAKEN_OVER = "taken_over"          # a newer connection claimed the client id
CAUSE_CONSOLE = "console"                # an operator's action
CAUSE_SHUTDOWN = "shutdown"              # the broker stopped
CAUSE_RESTART = "restart"                # a will published after the restart's grace


class Recorder(Protocol):
    def message(self, timestamp: float, topic: str, qos: int, retain: bool, payload: bytes,
                publisher: str | None, user: str | None, protocol: str, deliveries: int,
                dropped: int) -> None:
        """A message was routed: ``deliveries`` sessions took it, ``dropped`` at a bound."""

    def event(self, timestamp: float, kind: str, client_id: str | None,
              **fields: object) -> None:
        """Something happened to ``client_id`` (``kind``: one of ``EVENT_KINDS``)."""

    def stats(self) -> dict[str, int]:
        """Counters for ``$SYS`` and the console (``dropped`` among them)."""


class NoRecorder:
    """The archive is off: nothing is recorded."""

    def message(self, timestamp: float, topic: str, qos: int, retain: bool, payload: bytes,
                publisher: str | None, user: str | None, protocol: str, deliveries: int,
                dropped: int) -> None:
        pass

    def event(self, timestamp: float, kind: str, client_id: str | None,
              **fields: object) -> None:
        pass

    def stats(self) -> dict[str, int]:
        return {}
