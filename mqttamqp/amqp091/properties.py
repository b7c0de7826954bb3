"""AMQP 0.9.1 basic properties to and from the core's ``Message``.

What it owns: the one mapping table between a 0.9.1 content header's properties
and ``MessageProperties`` (what MQTT 5 and AMQP 1.0 peers see), both ways, and the
delivery's headers a 0.9.1 consumer gets from a durable queue (``x-delivery-count``,
the queue's metadata left out).  The table, also in docs/amqp.md:

=================  ==========================================================
0.9.1 property     core ``MessageProperties`` (MQTT 5 / AMQP 1.0)
=================  ==========================================================
content-type       content_type (MQTT 5 content type; AMQP properties)
correlation-id     correlation_data, UTF-8 (MQTT 5 correlation data)
reply-to           response_topic (MQTT 5 response topic)
expiration         expiry_interval: milliseconds rounded up to seconds
headers            user_properties: string values (others are not carried)
delivery-mode 2    the message's QoS 1 (persistent); otherwise QoS 0
=================  ==========================================================

The other properties (content-encoding, priority, message-id, timestamp, type,
user-id, app-id) have no MQTT form and are not carried yet (issue 27: kept between
0.9.1 peers is still to do).

What it must not do: route, or know frames (``frames``).
"""

from __future__ import annotations

from typing import Any

from pamqp import commands

from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.core.queues.metadata import METADATA_KEYS

__all__ = ["to_core", "from_core", "PropertyError"]

Properties = commands.Basic.Properties


class PropertyError(ValueError):
    """A property the broker refuses (a malformed expiration)."""


def to_core(props: Any) -> tuple[MessageProperties | None, int]:
    """The core's properties of a published message, and its QoS (1: persistent)."""
    qos = 1 if props.delivery_mode == 2 else 0
    expiry: int | None = None
    if props.expiration is not None:
        text = str(props.expiration)
        if not text.isdigit():
            raise PropertyError(f"invalid expiration {text!r}: milliseconds as digits")
        expiry = (int(text) + 999) // 1000
    users: tuple[tuple[str, str], ...] = ()
    headers = props.headers
    if headers:
        users = tuple((str(k), v) for k, v in headers.items() if isinstance(v, str))
    correlation = props.correlation_id
    if (props.content_type is None and correlation is None and props.reply_to is None
            and expiry is None and not users):
        return None, qos
    return MessageProperties(
        None, expiry, props.content_type, props.reply_to,
        correlation.encode("utf-8") if correlation is not None else None, users), qos


def from_core(message: Message, now: float) -> tuple[Any, int, bool]:
    """The basic properties a 0.9.1 consumer gets for ``message``, the count of its
    earlier deliveries (``x-delivery-count``) and whether it is a redelivery."""
    props = message.props
    count = 0
    headers: dict[str, Any] = {}
    content_type = reply_to = correlation = expiration = None
    if props is not None:
        for key, value in props.user_properties:
            if key in METADATA_KEYS:
                if key == "delivery-count" and value.isdigit():
                    count = max(0, int(value) - 1)
                continue
            headers[key] = value
        content_type = props.content_type
        reply_to = props.response_topic
        if props.correlation_data is not None:
            correlation = props.correlation_data.decode("utf-8", "replace")
        left = message.remaining_expiry(now)
        if left is not None:
            expiration = str(left * 1000)
    if count:
        headers["x-delivery-count"] = count
    return Properties(
        content_type=content_type, headers=headers or None,
        delivery_mode=2 if message.qos else 1, correlation_id=correlation,
        reply_to=reply_to, expiration=expiration), count, bool(message.dup or count)
