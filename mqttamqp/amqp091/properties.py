"""AMQP 0.9.1 basic properties to and from the core's ``Message``.

What it owns: the one mapping table between a 0.9.1 content header's properties
and ``MessageProperties`` (what MQTT 5 and AMQP 1.0 peers see), both ways, and the
delivery's headers a 0.9.1 consumer gets from a durable queue (``x-delivery-count``,
the queue's metadata left out).  The table, also in docs/amqp.md:

=================  ==========================================================
0.9.1 property     core ``MessageProperties`` (MQTT 5 / AMQP 1.0)
=================  ==========================================================
content-type       content_type (MQTT 5 content type; AMQP properties)
correlation-id     correlation_data, UTF-8 (MQTT 5 correlation data; a string
                   to AMQP 1.0 receivers: ``amqp.subscribers``)
reply-to           response_topic (MQTT 5 response topic)
expiration         expiry_interval: milliseconds rounded up to seconds
headers            user_properties: string values (others are not carried)
delivery-mode 2    the message's QoS 1 (persistent); otherwise QoS 0
priority           ``Message.priority`` (AMQP 1.0 header priority, where 4,
                   the default, is none; MQTT: none)
=================  ==========================================================

The other properties (content-encoding, message-id, timestamp, type,
user-id, app-id, headers that are not strings) have no MQTT form: they are kept
between 0.9.1 peers, with the whole property section as the publisher sent it
and the exchange and routing key it was published with (``Message.amqp091``:
``envelope``), which a 0.9.1 consumer gets unchanged (``for_consumer``; only a
redelivery's ``x-delivery-count`` is added, and a dead-lettered message's
``x-death``: queue, reason, count, time, exchange and routing keys, as RabbitMQ
writes it).

What it must not do: route, or know frames (``frames``).
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import Any

from pamqp import commands, decode, encode

from mqttamqp.core.exchanges.topicspace import queue_topic
from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.core.queues.addresses import routing_key
from mqttamqp.core.queues.deaths import DEATHS, Death, read_deaths
from mqttamqp.core.queues.metadata import DLQ_KEYS, METADATA_KEYS

__all__ = ["to_core", "from_core", "for_consumer", "envelope", "opened", "published_form",
           "sent_with",
           "PropertyError"]

Properties = commands.Basic.Properties


# A 0.9.1 short string's bytes (content-type, reply-to, correlation-id, a routing
# key); a table's field names are at most 128 (pamqp truncates longer ones).
SHORT_MAX = 255
_FIELD_NAME_MAX = 128


def _short(text: str | None, dropped: list[str], name: str) -> str | None:
    """``text`` if it fits a short string, else None (``name`` noted in ``dropped``):
    MQTT 5 and AMQP 1.0 strings go to 65535 bytes."""
    if text is None or len(text) <= SHORT_MAX // 4 or len(text.encode("utf-8")) <= SHORT_MAX:
        return text
    dropped.append(name)
    return None


def _key(rest: str | None, queue: str) -> tuple[str, str]:
    """The exchange and routing key of a delivery that reached ``queue`` through the
    MQTT topic space (``rest``: the topic after ``$queue/<name>/``): ``amq.topic``
    with the topic, or the default exchange and the queue's name when the topic does
    not fit a short string."""
    if rest:
        key = rest.replace("/", ".")
        if len(key) <= SHORT_MAX // 4 or len(key.encode("utf-8")) <= SHORT_MAX:
            return "amq.topic", key
    return "", queue


def _fit(rest: str | None, queue: str) -> str:
    """A dead-lettered delivery's routing key: the topic after ``$queue/<name>/``
    if it fits a short string, else the queue's name."""
    if rest and (len(rest) <= SHORT_MAX // 4 or len(rest.encode("utf-8")) <= SHORT_MAX):
        return rest
    return queue


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


# Pure memos of ``published_form`` and ``opened``: a publisher's messages usually
# share exchange, routing key and properties, so a publish finds its core
# properties, QoS, envelope (one bytes object, whose hash Python keeps) and queue
# topic with one lookup instead of three calls, and a delivery its exchange, key and
# properties with one lookup instead of two decodes.  Bounded as the frame decode
# caches (``frames``): ENVELOPE_CACHE_MAX entries of at most ENVELOPE_CACHE_ITEM
# bytes, cleared when full; fixed bounds, no option, counter or log line, for the
# reasons said there.  Their values are immutable (``MessageProperties`` is frozen).
PublishedForm = tuple[MessageProperties | None, int, bytes, "int | None", str]
_PUBLISHED: dict[tuple[str, str, bytes], PublishedForm] = {}
_OPENED: dict[bytes, tuple[str, str, bytes]] = {}
ENVELOPE_CACHE_MAX = 1024
ENVELOPE_CACHE_ITEM = 1024


def envelope(exchange: str, routing_key: str, raw: bytes) -> bytes:
    """What ``Message.amqp091`` holds for a 0.9.1 publish: the exchange and routing
    key it was published with (short strings) and its property section as sent."""
    ex, key = exchange.encode("utf-8"), routing_key.encode("utf-8")
    return bytes((len(ex),)) + ex + bytes((len(key),)) + key + raw


def published_form(props: Any, exchange: str, routing_key: str, raw: bytes
                   ) -> PublishedForm:
    """What the core's ``Message`` of a publish takes from its method and
    properties (``props``, decoded from ``raw``, the property section as sent):
    ``to_core``'s properties and QoS, the ``envelope``, the priority, and the topic
    (the queue's, ``$queue/<key>``, through the default exchange; else empty: the
    exchanges give each queue's copy its own).  Memoized by the three, since
    ``props`` is a function of ``raw`` (not when ``raw`` is unknown, empty).
    Raises ``PropertyError`` as ``to_core`` does."""
    memo = (exchange, routing_key, raw)
    form = _PUBLISHED.get(memo)
    if form is not None:
        return form
    core, qos = to_core(props)
    data = envelope(exchange, routing_key, raw)
    form = (core, qos, data, props.priority,
            "" if exchange else queue_topic(routing_key, routing_key))
    if raw and len(data) <= ENVELOPE_CACHE_ITEM:
        if len(_PUBLISHED) >= ENVELOPE_CACHE_MAX:
            _PUBLISHED.clear()
        _PUBLISHED[memo] = form
    return form


def sent_with(message: Message) -> tuple[str, str] | None:
    """The exchange and routing key a 0.9.1 publisher sent ``message`` with, or
    None (``Exchanges.attach_envelope``: the key its dead letters take)."""
    data = message.amqp091
    if data is None:
        return None
    exchange, key, _ = opened(data)
    return exchange, key


def opened(data: bytes) -> tuple[str, str, bytes]:
    """The exchange, routing key and property section of an envelope
    (``Message.amqp091``), memoized."""
    found = _OPENED.get(data)
    if found is not None:
        return found
    n = data[0]
    exchange = data[1:1 + n].decode("utf-8")
    m = data[1 + n]
    key = data[2 + n:2 + n + m].decode("utf-8")
    found = (exchange, key, data[2 + n + m:])
    if len(data) <= ENVELOPE_CACHE_ITEM:
        if len(_OPENED) >= ENVELOPE_CACHE_MAX:
            _OPENED.clear()
        _OPENED[data] = found
    return found


def for_consumer(message: Message, queue: str, now: float,
                 dropped: list[str] | None = None) -> tuple[bytes, bool, str, str]:
    """What a 0.9.1 consumer of ``queue`` gets for ``message``: the encoded basic
    properties, whether it is a redelivery, and the exchange and routing key.  A
    0.9.1 publisher's properties go as it sent them (``x-delivery-count`` on a
    redelivery and ``x-death`` set in its headers table, the rest copied as bytes:
    ``_with_headers``), with its exchange and key; others
    are mapped from the core's properties, and a message that reached the queue
    through the MQTT topic space (a topic after ``$queue/<name>/``) comes from
    ``amq.topic`` with the topic as key (``a/b`` is ``a.b``; the default exchange
    and the queue's name when the topic is over 255 bytes).  What 0.9.1 cannot carry
    (a string property over 255 bytes, a header name over 128) is left out, its name
    added to ``dropped``."""
    data = message.amqp091
    count, deaths = _marks(message)
    if data is None:
        props, _, redelivered = from_core(message, now, dropped)
        rest = routing_key(queue, message.topic)
        if deaths is not None:
            props.headers = {k: v for k, v in (props.headers or {}).items()
                             if k not in DLQ_KEYS}
            props.headers.update(_x_death(deaths, "", rest or deaths[0][0]))
            return props.marshal(), redelivered, "", _fit(rest, queue)
        exchange, key = _key(rest, queue)
        return props.marshal(), redelivered, exchange, key
    exchange, key, raw = opened(data)
    if not count and deaths is None:
        return raw, bool(message.dup), exchange, key
    added: dict[str, Any] = {}
    if count:
        added["x-delivery-count"] = count
    if deaths is not None:
        # Dead-lettered (x-dead-letter-exchange): RabbitMQ's x-death (a death
        # where it had not been dead-lettered before: the exchange and key it was
        # published with), and the key it reached this queue with.
        added.update(_x_death(deaths, exchange, key))
        exchange, key = "", _fit(routing_key(queue, message.topic), queue)
    return _with_headers(raw, added), bool(count or message.dup), exchange, key


def _x_death(deaths: list[Death], exchange: str, key: str) -> dict[str, Any]:
    """x-death (a table per (queue, reason), the most recent first: count, reason,
    queue, the first time, exchange, routing keys) and the x-first-death- and
    x-last-death- headers, as RabbitMQ writes them; ``exchange`` and ``key`` for
    an entry that has none (``core.queues.deaths``)."""
    tables = [{"count": n, "reason": r, "queue": q,
               "time": datetime.fromtimestamp(first, UTC),
               "exchange": exchange if ex is None else ex,
               "routing-keys": [key if k is None else k]}
              for q, r, n, first, _, ex, k in deaths]
    # (the first death is the entry first seen longest ago, not the list's tail: a
    # repeated (queue, reason) moves to the front; among equal seconds, the older)
    first = tables[min(reversed(range(len(deaths))), key=lambda i: deaths[i][3])]
    last = tables[0]
    return {"x-death": tables,
            "x-first-death-queue": first["queue"], "x-first-death-reason": first["reason"],
            "x-first-death-exchange": first["exchange"],
            "x-last-death-queue": last["queue"], "x-last-death-reason": last["reason"],
            "x-last-death-exchange": last["exchange"]}


_CONTENT_TYPE, _CONTENT_ENCODING, _HEADERS = 0x8000, 0x4000, 0x2000


def _with_headers(raw: bytes, added: dict[str, Any]) -> bytes:
    """The property section ``raw`` (as a 0.9.1 publisher sent it) with the
    ``added`` headers set in its table; the other fields are copied as bytes, not
    decoded and encoded again (pamqp decodes a long string that is not UTF-8 as
    bytes, and cannot encode bytes).  ``x-death`` goes before the earlier deaths.
    ``raw`` unchanged if it cannot be read."""
    try:
        flags = int.from_bytes(raw[0:2], "big")
        at = 2
        for bit in (_CONTENT_TYPE, _CONTENT_ENCODING):
            if flags & bit:
                at += 1 + raw[at]
        fields: list[bytes] = []
        end = at
        if flags & _HEADERS:
            size = int.from_bytes(raw[at:at + 4], "big")
            end = at + 4 + size
            offset = at + 4
            while offset < end:
                n = raw[offset]
                name = raw[offset + 1:offset + 1 + n].decode("utf-8")
                start = offset
                offset += 1 + n
                consumed, value = decode.embedded_value(raw[offset:end])
                offset += consumed
                if name == "x-death" and "x-death" in added:
                    added["x-death"] = _merged(added["x-death"], value)
                elif name.startswith("x-first-death-") and name in added:
                    del added[name]   # (the publisher's earlier first death stays)
                    fields.append(raw[start:offset])
                elif name not in added:
                    fields.append(raw[start:offset])
        body = b"".join(fields)
        for name, value in added.items():
            try:
                piece = encode.field_table({name: value})[4:]
            except (TypeError, ValueError):   # (an earlier x-death we cannot encode)
                piece = encode.field_table({name: value[:1]})[4:]
            body += piece
        table = len(body).to_bytes(4, "big") + body
        return (((flags | _HEADERS).to_bytes(2, "big")) + raw[2:at] + table + raw[end:])
    except (IndexError, ValueError, TypeError, UnicodeDecodeError, struct.error):
        return raw


def _marks(message: Message) -> tuple[int, list[Death] | None]:
    """From one scan of its user properties: the deliveries a durable queue counted
    before this one (its metadata), and the death history of a dead-lettered
    message (``deaths``; from its origin-queue and reason alone, counted once,
    for one dead-lettered before histories were kept), or None."""
    props = message.props
    if props is None:
        return 0, None
    count = -1
    origin = reason = history = None
    for key, value in props.user_properties:
        if key == "delivery-count":
            if count < 0:
                count = max(0, int(value) - 1) if value.isdigit() else 0
        elif key == "origin-queue":
            origin = value
        elif key == "reason":
            reason = value
        elif key == DEATHS:
            history = value
    count = max(count, 0)
    if origin is None or reason is None:
        return count, None
    deaths = read_deaths(history)
    if not deaths:
        at = int(message.timestamp)
        deaths = [(origin, reason, 1, at, at, None, None)]
    return count, deaths


def _merged(ours: list[dict[str, Any]], earlier: Any) -> list[Any]:
    """Our x-death entries, then those a 0.9.1 publisher sent (a message it took
    from a dead-letter queue and published again): an earlier entry for the same
    (queue, reason) as one of ours adds its count to ours, as RabbitMQ counts."""
    if not isinstance(earlier, list):
        return ours
    index = {(t.get("queue"), t.get("reason")): t for t in ours}
    out: list[Any] = list(ours)
    for entry in earlier:
        mine = index.get((entry.get("queue"), entry.get("reason"))) if isinstance(
            entry, dict) else None
        if mine is not None and type(entry.get("count")) is int:
            mine["count"] += entry["count"]
        elif mine is None:
            out.append(entry)
    return out


def from_core(message: Message, now: float, dropped: list[str] | None = None
              ) -> tuple[Any, int, bool]:
    """The basic properties a 0.9.1 consumer gets for ``message``, the count of its
    earlier deliveries (``x-delivery-count``) and whether it is a redelivery.  What
    does not fit 0.9.1 is left out, its name added to ``dropped``."""
    if dropped is None:
        dropped = []
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
            if len(key) > _FIELD_NAME_MAX // 4 and len(key.encode("utf-8")) > _FIELD_NAME_MAX:
                dropped.append("header name")
                continue
            headers[key] = value
        content_type = _short(props.content_type, dropped, "content-type")
        reply_to = _short(props.response_topic, dropped, "reply-to")
        if props.correlation_data is not None:
            correlation = _short(props.correlation_data.decode("utf-8", "replace"),
                                 dropped, "correlation-id")
        left = message.remaining_expiry(now)
        if left is not None:
            expiration = str(left * 1000)
    if count:
        headers["x-delivery-count"] = count
    return Properties(
        content_type=content_type, headers=headers or None,
        delivery_mode=2 if message.qos else 1, correlation_id=correlation,
        reply_to=reply_to, expiration=expiration, priority=message.priority), count, bool(
            message.dup or count)
