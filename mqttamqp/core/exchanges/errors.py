"""The values the 0.9.1 model answers with: ``ChannelError`` (a channel or
connection error the adapter sends as ``channel.close`` / ``connection.close``)
and ``QueueDeclared`` (what ``queue.declare-ok`` carries).

What this module must not do: hold state or know the wire; the adapter turns a
``ChannelError`` into a method frame."""

from __future__ import annotations

from mqttamqp.records import record

__all__ = [
    "ChannelError", "QueueDeclared", "ACCESS_REFUSED", "NOT_FOUND", "RESOURCE_LOCKED",
    "PRECONDITION_FAILED", "NOT_ALLOWED", "NOT_IMPLEMENTED", "COMMAND_INVALID",
    "RESOURCE_ERROR", "CONNECTION_ERRORS",
]

# Reply codes of AMQP 0.9.1 (the spec's constants) the model raises.
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
COMMAND_INVALID = 503
RESOURCE_ERROR = 506
# The codes that are connection errors (connection.close), not channel errors.
CONNECTION_ERRORS = frozenset({NOT_ALLOWED, NOT_IMPLEMENTED, COMMAND_INVALID, 541})

_NAMES = {ACCESS_REFUSED: "ACCESS_REFUSED", NOT_FOUND: "NOT_FOUND",
          RESOURCE_LOCKED: "RESOURCE_LOCKED", PRECONDITION_FAILED: "PRECONDITION_FAILED",
          NOT_ALLOWED: "NOT_ALLOWED", NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
          COMMAND_INVALID: "COMMAND_INVALID", RESOURCE_ERROR: "RESOURCE_ERROR",
          541: "INTERNAL_ERROR"}


class ChannelError(Exception):
    """A 0.9.1 channel (or, for ``CONNECTION_ERRORS``, connection) error: ``code``
    and a readable ``text`` as RabbitMQ writes it (``"NOT_FOUND - no queue 'x'"``)."""

    def __init__(self, code: int, detail: str) -> None:
        self.code = code
        self.text = f"{_NAMES.get(code, 'ERROR')} - {detail}"[:255]
        super().__init__(self.text)

    @property
    def connection_error(self) -> bool:
        return self.code in CONNECTION_ERRORS


@record
class QueueDeclared:
    """``queue.declare-ok``: the queue's name (server-named ones are made up here),
    its ready messages and its consumers."""

    name: str
    message_count: int
    consumer_count: int
