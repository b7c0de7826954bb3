"""The metadata a queue delivery carries (seed 004's contract).

MQTT 5 consumers see it as user properties, AMQP receivers as message annotations
(``amqp.links``), MQTT 3.x consumers not at all; a dead-lettered message adds its
origin (``DLQ_KEYS``).  Built once per delivery on the dispatch path: keep it lean."""

from __future__ import annotations

from mqttamqp.core.message import Message, MessageProperties

__all__ = ["METADATA_KEYS", "DLQ_KEYS", "METADATA_PROTOCOLS", "COUNT_ONLY_ATTRIBUTE",
           "with_metadata", "without_metadata"]

# The user properties a queue gives its deliveries (the seed's contract for MQTT 5;
# an AMQP receiver gets them as message annotations, see amqp.links), and those a
# dead-lettered one adds.
DLQ_KEYS = frozenset(("origin-queue", "origin-offset", "origin-group", "delivery-count",
                      "reason", "dead-letter-exchange", "dead-letter-routing-key",
                      "deaths"))
# The protocols whose deliveries carry the metadata (MQTT 5 user properties, AMQP
# message annotations, AMQP 0.9.1 x-delivery-count; the console's tail shows it too).
METADATA_PROTOCOLS = frozenset(("mqtt5", "amqp", "amqp0-9-1", "console", ""))
# A consumer's link whose class sets this attribute True reads nothing of the
# metadata but the delivery count, and only past the first delivery (AMQP 0.9.1:
# ``x-delivery-count`` and the redelivered flag; its sessions are "amqp", as AMQP
# 1.0's): for a message whose properties go to it as its publisher sent them
# (``Message.amqp091``) and that has no user properties of its own, a first,
# uncounted delivery needs no copy at all (``Dispatch._deliver``).
COUNT_ONLY_ATTRIBUTE = "reads_delivery_count_only"
METADATA_KEYS = frozenset(("message-id", "group-id", "queue", "offset", "delivery-count"))


def without_metadata(users: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    if not users:
        return users
    return tuple(kv for kv in users if kv[0] not in METADATA_KEYS)


def with_metadata(message: Message, queue: str, group: str, offset: int, count: int,
                   again: bool) -> Message:
    """The delivery's copy: the seed's metadata as user properties (MQTT 5 sees them;
    AMQP gets them as message annotations and header fields; MQTT 3.x nothing), and
    ``dup`` when the message was delivered before (``again``: AMQP's first-acquirer
    is then false; a stream read is never a first acquisition, it claims nothing)."""
    p = message.props
    users: tuple[tuple[str, str], ...] = (
        ("message-id", f"{queue}:{offset}"), ("group-id", group), ("queue", queue),
        ("offset", str(offset)), ("delivery-count", str(count)))
    m = message
    # (built field by field: ``dataclasses.replace`` twice was 9 us a delivery)
    if p is None:
        props = MessageProperties(None, None, None, None, None, users)
    else:
        props = MessageProperties(p.payload_format, p.expiry_interval, p.content_type,
                                  p.response_topic, p.correlation_data,
                                  (*without_metadata(p.user_properties), *users))
    return Message(m.topic, m.payload, m.qos, m.retain, m.publisher, m.timestamp, again,
                   m.native, m.amqp_only, props, m.amqp091, m.priority)


