"""The queue namespaces' addresses: ``$queue/<name>/...`` and ``$dlq/<name>/...``.

Parses publish topics (routing key, or an ``$ack``/``$nack``/``$reject`` action)
and subscription filters (the group's filter), a consumer's ``stream-offset`` and
default group, and holds the values the protocol adapters share with the queues
(``Consumer``, ``Refusal`` and the MQTT 5 reason codes a refusal carries).

What this module must not do: hold state; it is pure string handling."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from mqttamqp.core.message import Message
from mqttamqp.core.topics import validate_topic_filter
from mqttamqp.records import record

__all__ = [
    "QUEUE_PREFIX", "DLQ_PREFIX", "ACK", "NACK", "REJECT", "ACTIONS", "CLASSIC", "STREAM",
    "NOT_QUEUED", "QUEUED", "QUEUE_COMMAND",
    "UNSPECIFIED_ERROR", "TOPIC_NAME_INVALID", "QUOTA_EXCEEDED",
    "QueueAddress", "Refusal", "Consumer", "is_queue_topic", "is_queue_command", "is_command",
    "parse_queue_topic", "parse_queue_filter", "parse_stream_offset", "default_group",
    "routing_key",
]

QUEUE_PREFIX = "$queue/"
DLQ_PREFIX = "$dlq/"
ACK, NACK, REJECT = "$ack", "$nack", "$reject"
ACTIONS = (ACK, NACK, REJECT)
CLASSIC, STREAM = "classic", "stream"

# What a publish topic is to the queues (``QueueManager.kind``): not theirs, a
# publish to a queue (taken or refused), an acknowledgement command (``$ack``...).
NOT_QUEUED, QUEUED, QUEUE_COMMAND = 0, 1, 2

# MQTT 5 PUBACK reason codes a queue publish or acknowledgement may get.
UNSPECIFIED_ERROR = 0x80
TOPIC_NAME_INVALID = 0x90
QUOTA_EXCEEDED = 0x97


def is_queue_topic(topic: str) -> bool:
    """A topic (or filter) of the queue namespaces, ``$queue/`` or ``$dlq/``."""
    return topic.startswith(QUEUE_PREFIX) or topic.startswith(DLQ_PREFIX)


def is_command(address: QueueAddress | str, topic: str) -> bool:
    """Is the queue publish topic ``topic``, parsed as ``address``, an
    acknowledgement (``is_queue_command``)?  Also when it did not parse."""
    if isinstance(address, str):
        return is_queue_command(topic)
    return address.action is not None


def is_queue_command(topic: str) -> bool:
    """``$queue/.../$ack``, ``$nack`` or ``$reject`` (or the same under ``$dlq/``)."""
    return is_queue_topic(topic) and topic.rsplit("/", 1)[-1] in ACTIONS


@record
class QueueAddress:
    """A parsed queue topic: the queue's key (``name`` or ``$dlq/name``), what
    follows it (routing key of a publish, filter of a subscription) and, for
    ``$ack``/``$nack``/``$reject``, the action."""

    queue: str
    rest: str
    action: str | None = None

    @property
    def name(self) -> str:
        """The queue's name without the ``$dlq/`` namespace."""
        return self.queue[len(DLQ_PREFIX):] if self.queue.startswith(DLQ_PREFIX) else self.queue

    @property
    def dead_letter(self) -> bool:
        return self.queue.startswith(DLQ_PREFIX)


@record
class Refusal:
    """Why a queue publish or acknowledgement was refused (MQTT 5 reason code and
    string; AMQP Rejected's description).  ``lasting``: refused for good whatever
    ``code`` says, the same message is refused again (a message a reject-publish
    queue could never take gets QUOTA_EXCEEDED, MQTT 5's code for it, as RabbitMQ
    gives it; ``amqp.refusals`` reads the flag, not the code)."""

    code: int
    reason: str
    lasting: bool = False


def _split(topic: str) -> tuple[str, str, str] | str:
    if topic.startswith(QUEUE_PREFIX):
        prefix, body = "", topic[len(QUEUE_PREFIX):]
    elif topic.startswith(DLQ_PREFIX):
        prefix, body = DLQ_PREFIX, topic[len(DLQ_PREFIX):]
    else:
        return "not a queue topic"
    name, _, rest = body.partition("/")
    if not name:
        return f"{topic!r} names no queue: use $queue/<name>/..."
    if "+" in name or "#" in name or name.startswith("$"):
        return f"a queue name may not hold + or # or start with $ ({name!r})"
    return prefix, name, rest


def parse_queue_topic(topic: str) -> QueueAddress | str:
    """A queue publish topic → its address, or why it is refused (a str)."""
    split = _split(topic)
    if isinstance(split, str):
        return split
    prefix, name, rest = split
    if "+" in rest or "#" in rest:
        return f"a queue publish topic may not hold wildcards ({topic!r})"
    last = rest.rsplit("/", 1)[-1] if rest else ""
    if last in ACTIONS:
        return QueueAddress(prefix + name, rest[: -len(last)].rstrip("/"), last)
    if prefix:
        return f"{topic!r}: messages reach a dead-letter queue only by dead-lettering"
    return QueueAddress(name, rest)


def parse_queue_filter(topic_filter: str) -> QueueAddress | str:
    """A queue subscription → its address (``rest`` the group's filter, ``#`` when
    none is given), or why it is refused."""
    split = _split(topic_filter)
    if isinstance(split, str):
        return split
    prefix, name, rest = split
    rest = rest or "#"
    problem = validate_topic_filter(rest)
    if problem is not None:
        return f"{topic_filter!r}: {problem}"
    return QueueAddress(prefix + name, rest)


def default_group(client_id: str) -> str:
    """The group of an MQTT 3.x consumer, as FluxMQ: its client id up to the first
    ``-`` (``worker-1`` and ``worker-2`` are group ``worker``)."""
    return client_id.split("-", 1)[0] or client_id


def parse_stream_offset(value: str | None) -> tuple[str, float] | str:
    """``stream-offset``: ``first``, ``last``, an offset (digits), or a timestamp
    (ISO 8601, or ``@`` and seconds since the epoch).  Returns ``(kind, value)``
    with kind ``first``/``last``/``offset``/``time``, or why it is refused."""
    if value is None or value == "" or value == "first":
        return ("first", 0.0)
    if value == "last":
        return ("last", 0.0)
    if value.isdigit():
        return ("offset", float(int(value)))
    try:
        if value.startswith("@"):
            return ("time", float(value[1:]))
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return (f"stream-offset {value!r}: use first, last, an offset, an ISO 8601 time "
                "or @<seconds since the epoch>")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return ("time", moment.timestamp())


@record
class Consumer:
    """How a subscription joins a queue: its group (None: the client id up to its
    first ``-``), ``classic`` or ``stream`` mode, a stream's start
    (``parse_stream_offset``), and whether it acknowledges with
    ``$ack``/``$nack``/``$reject`` (None: if it speaks MQTT 5).  ``held``: its
    claims last until it leaves (an AMQP 0.9.1 consumer keeps its unacknowledged
    deliveries with its channel, as RabbitMQ): no visibility timeout, no takeover.
    ``selector``: it takes only the messages this is true of (an AMQP 1.0 receiver's
    selector); the others stay for other members.  ``browse``: not a member but a
    browser (``browsing``): it reads the queue without taking anything."""

    group: str | None = None
    mode: str | None = None
    stream_offset: str | None = None
    explicit: bool | None = None
    held: bool = False
    selector: Callable[[Message], bool] | None = None
    browse: bool = False


def routing_key(queue: str, topic: str) -> str:
    # (``$queue/<name>/<key>`` or ``$dlq/<name>/<key>``: the key after the name)
    _, _, rest = topic.partition(queue[len(DLQ_PREFIX):] + "/" if queue.startswith(DLQ_PREFIX)
                                 else queue + "/")
    return rest
