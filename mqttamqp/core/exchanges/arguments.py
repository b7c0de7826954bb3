"""Queue arguments as RabbitMQ reads them, checked and mapped onto the queue
manager's mechanisms.

A known argument with an invalid value is refused (406); an unknown one (``x-``
or not) is accepted and kept (clients and frameworks send many); a redeclaration
must repeat the ``COMPARED`` ones as they were (406), as RabbitMQ checks; what
each known one does here:

* ``x-message-ttl`` (ms): the queue's retention by age (``Retention.max_age``):
  messages older than it leave the queue, dead-lettered (reason ``expired``) when
  the queue has a dead-letter exchange;
* ``x-max-length`` / ``x-max-length-bytes``: retention by count / payload bytes;
  ``x-overflow`` ``drop-head`` (the default: the oldest go, dead-lettered with
  reason ``maxlen``) or ``reject-publish`` / ``reject-publish-dlx`` (a publish to
  a full queue is refused: a confirm is a ``basic.nack``; with ``-dlx`` it is
  dead-lettered, reason ``maxlen``); refused (406), whatever its value, on a stream
  queue, as RabbitMQ refuses it there (a stream drops the oldest);
* ``x-dead-letter-exchange`` / ``x-dead-letter-routing-key``: the queue manager's
  dead letters (a reject, too many deliveries) are routed there instead of to
  ``$dlq/<name>``;
* ``x-expires`` (ms): the queue is deleted once unused that long (no consumer, no
  ``basic.get``, no redeclare);
* ``x-queue-type``: ``classic`` (the default) or ``stream`` (consumers read by
  cursor, ``x-stream-offset``); ``quorum`` is refused (406);
* ``x-max-priority`` (0-255, as RabbitMQ checks it; 0: none): the queue's priority
  levels (``Retention.max_priority``, ``core.queues.priority``): a message's basic
  property ``priority`` above it counts as it, one without as 0; a queue without
  it is first in first out whatever its messages' priorities; refused (406) on a
  stream queue, which RabbitMQ does not give priorities either;
* ``x-single-active-consumer``, ``x-queue-mode``, ``x-queue-master-locator``...:
  accepted and kept, not enforced.

What this module must not do: hold state; it parses a field table into
``QueueArguments`` and says why one is refused.
"""

from __future__ import annotations

from collections.abc import Mapping

from mqttamqp.core.queues.model import Retention
from mqttamqp.records import record

__all__ = ["QueueArguments", "parse_queue_arguments", "OVERFLOWS", "COMPARED"]

OVERFLOWS = ("drop-head", "reject-publish", "reject-publish-dlx")
_QUEUE_TYPES = ("classic", "stream")
# The arguments a redeclaration must repeat as they were (RabbitMQ's list): others
# may differ from one declaration to the next.
COMPARED = frozenset((
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-length-bytes", "x-max-in-memory-length",
    "x-max-in-memory-bytes", "x-max-priority", "x-overflow", "x-queue-mode",
    "x-queue-version", "x-single-active-consumer", "x-queue-type", "x-delivery-limit",
    "x-max-age", "x-stream-max-segment-size-bytes", "x-queue-leader-locator",
    "x-queue-master-locator", "x-initial-cluster-size", "x-quorum-initial-group-size"))


@record
class QueueArguments:
    """The arguments this broker acts on (None: not given)."""

    message_ttl: int | None = None          # ms
    expires: int | None = None              # ms
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    max_priority: int | None = None
    queue_type: str = "classic"

    def age(self) -> float | None:
        """x-message-ttl in seconds; 0 is a millisecond (what a consumer with room
        takes at once is delivered, the rest expires: RabbitMQ's TTL 0)."""
        if self.message_ttl is None:
            return None
        return max(self.message_ttl, 1) / 1000.0

    def retention(self, default: Retention) -> Retention:
        """``default`` with what the arguments bound instead."""
        return Retention(
            self.age() if self.message_ttl is not None else default.max_age,
            self.max_length_bytes if self.max_length_bytes is not None
            else default.max_bytes,
            self.max_length if self.max_length is not None else default.max_messages,
            self.max_priority if self.max_priority is not None else default.max_priority)


def _integer(name: str, value: object, low: int, high: int | None = None) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"invalid arg '{name}': {value!r} is not an integer"
    if value < low or (high is not None and value > high):
        bound = f"{low} to {high}" if high is not None else f"at least {low}"
        return f"invalid arg '{name}': {value} is out of range ({bound})"
    return value


def _text(name: str, value: object) -> str | tuple[str]:
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            return (f"invalid arg '{name}': not UTF-8",)
    if not isinstance(value, str):
        return (f"invalid arg '{name}': {value!r} is not a string",)
    return value


def parse_queue_arguments(arguments: Mapping[str, object] | None, durable: bool,
                          exclusive: bool, auto_delete: bool) -> QueueArguments | str:
    """The arguments of a ``queue.declare``, or why they are refused (406)."""
    if not arguments:
        return QueueArguments()
    found: dict[str, object] = {}
    for name, low, high, field in (("x-message-ttl", 0, None, "message_ttl"),
                                   ("x-expires", 1, None, "expires"),
                                   ("x-max-length", 0, None, "max_length"),
                                   ("x-max-length-bytes", 0, None, "max_length_bytes"),
                                   ("x-max-priority", 0, 255, "max_priority")):
        if name in arguments:
            value = _integer(name, arguments[name], low, high)
            if isinstance(value, str):
                return value
            found[field] = value
    for name, field in (("x-overflow", "overflow"),
                        ("x-dead-letter-exchange", "dead_letter_exchange"),
                        ("x-dead-letter-routing-key", "dead_letter_routing_key"),
                        ("x-queue-type", "queue_type")):
        if name in arguments:
            text = _text(name, arguments[name])
            if isinstance(text, tuple):
                return text[0]
            found[field] = text
    overflow = found.get("overflow", "drop-head")
    if overflow not in OVERFLOWS:
        return f"invalid arg 'x-overflow': {overflow!r} (use {', '.join(OVERFLOWS)})"
    queue_type = found.get("queue_type", "classic")
    if queue_type == "quorum":
        return ("invalid arg 'x-queue-type': quorum queues are not supported by this "
                "broker (one node: use classic, or stream)")
    if queue_type not in _QUEUE_TYPES:
        return f"invalid arg 'x-queue-type': {queue_type!r} (use classic or stream)"
    if queue_type == "stream" and (not durable or exclusive or auto_delete):
        return "a stream queue must be durable, not exclusive and not auto-delete"
    if queue_type == "stream" and found.get("max_priority"):
        return "invalid arg 'x-max-priority': a stream queue has no priorities"
    if queue_type == "stream" and "overflow" in found:
        return ("invalid arg 'x-overflow': a stream queue refuses no publish (its "
                "x-max-length and x-max-length-bytes drop the oldest)")
    if "dead_letter_routing_key" in found and "dead_letter_exchange" not in found:
        return ("invalid arg 'x-dead-letter-routing-key': it needs "
                "x-dead-letter-exchange")
    return QueueArguments(**found)  # type: ignore[arg-type]
