"""The MQTT-over-AMQP contract's fields of a received message (docs/amqp.md):
its QoS with the fallback, retain, the payload of a Data or AmqpValue body (and the
JSON form MQTT subscribers get of other bodies), and the MQTT 5 properties in
their AMQP places.

What it must not do: decode bytes (``sections`` did), or import proton, Twisted
or the core.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Container
from typing import Any, NamedTuple

from mqttamqp.amqp.codec.sections import InboundMessage
from mqttamqp.amqp.codec.values import MAX_DEPTH, DecodeError, Described, Symbol

__all__ = ["ANNOTATION_RETAIN", "ANNOTATION_QOS", "ANNOTATION_CLIENT_ID",
           "ANNOTATION_PAYLOAD_FORMAT", "ANNOTATION_SUBSCRIPTION_OPTIONS",
           "subscription_options", "retained_for", "parse_qos", "message_qos", "message_retain",
           "message_payload", "mqtt_payload", "Mqtt5Props", "mqtt5_props"]

ANNOTATION_RETAIN = "x-opt-retain-message"
ANNOTATION_QOS = "x-opt-mqtt-qos"
ANNOTATION_CLIENT_ID = "x-opt-mqtt-client-id"
ANNOTATION_PAYLOAD_FORMAT = "x-opt-mqtt-payload-format"
# AMQP_SUBSCRIBE's MQTT 5 subscription options (an extension: docs/gateway.md)
ANNOTATION_SUBSCRIPTION_OPTIONS = "x-opt-mqtt-subscription-options"
# The options the core keeps per filter: no local (0x04), retain as published (0x08).
_KEPT_OPTIONS = 0x0C
# Retain handling (0x30): read per AMQP_SUBSCRIBE (``retained_for``), not kept.
_RETAIN_HANDLING = 0x30
# Reserved bits of the options byte (MQTT 5 §3.8.3.1): set, the byte is refused.
_RESERVED = 0xC0


def subscription_options(annotations: dict[Any, Any], requests: list[tuple[str, int]]
                         ) -> list[int] | str:
    """Per request of an AMQP_SUBSCRIBE, its options packed with its QoS as
    ``Session.sub_options`` keeps them, from the annotation
    ``x-opt-mqtt-subscription-options`` (a map: filter → the MQTT 5 options byte; no
    local and retain as published are kept, retain handling is ``retained_for``'s,
    the QoS bits ignored); [] without one, or why the annotation is not such a map
    (a byte with retain handling 3 or a reserved bit, 0xC0, is not an option byte,
    as MQTT 5 says)."""
    raw = annotations.get(ANNOTATION_SUBSCRIPTION_OPTIONS)
    if raw is None:
        return []
    if not isinstance(raw, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255
            and not v & _RESERVED and v & _RETAIN_HANDLING != _RETAIN_HANDLING
            for v in raw.values()):
        return (f"annotation {ANNOTATION_SUBSCRIPTION_OPTIONS} must map topic filters to "
                "an options byte (0-255; retain handling 0-2, reserved bits 0xC0 clear)")
    return [qos | (raw.get(f, 0) & _KEPT_OPTIONS) for f, qos in requests]


def retained_for(annotations: dict[Any, Any], requests: list[tuple[str, int]],
                 subscribed: Container[str]) -> list[bool]:
    """Per request of an AMQP_SUBSCRIBE, whether its retained messages follow, by the
    retain handling bits (0x30) of its options byte in ``x-opt-mqtt-subscription-options``
    (checked by ``subscription_options``): 0 (or no annotation) yes, 1 only for a filter
    not in ``subscribed`` (the session's before this AMQP_SUBSCRIBE), 2 no."""
    raw = annotations.get(ANNOTATION_SUBSCRIPTION_OPTIONS)
    if not isinstance(raw, dict):
        return [True] * len(requests)
    wanted = []
    for topic_filter, _qos in requests:
        handling = (raw.get(topic_filter, 0) & _RETAIN_HANDLING) >> 4
        wanted.append(handling == 0 or (handling == 1 and topic_filter not in subscribed))
    return wanted


def _is_ascii_number(text: str) -> bool:
    """Decimal ASCII digits only: str.isdigit() also accepts '²' and '١', which int()
    rejects or reads as another number."""
    return text.isascii() and text.isdigit() and len(text) <= 10


def parse_qos(value: Any) -> int | None:
    """A QoS given as an int or a decimal string; None if it is neither or out of range."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        qos = value
    elif isinstance(value, str) and _is_ascii_number(value.strip()):
        qos = int(value.strip())
    else:
        return None
    return qos if 0 <= qos <= 2 else None


def message_qos(msg: InboundMessage) -> int:
    """The ``x-opt-mqtt-qos`` annotation, else 1 if ``durable`` (seed 000 fallback)."""
    raw = msg.annotations.get(ANNOTATION_QOS)
    if raw is None:
        return 1 if msg.durable else 0
    qos = parse_qos(raw)
    if qos is None:
        raise DecodeError(f"annotation {ANNOTATION_QOS} must be 0, 1 or 2, got {raw!r}")
    return qos


def message_retain(msg: InboundMessage) -> bool:
    raw = msg.annotations.get(ANNOTATION_RETAIN)
    if raw is None:
        return False
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    raise DecodeError(f"annotation {ANNOTATION_RETAIN} must be a boolean, got {raw!r}")


def message_payload(msg: InboundMessage) -> bytes:
    """Data sections joined, or an AmqpValue string (UTF-8) / binary; else DecodeError."""
    kind = msg.body_kind
    if kind == "data":
        return msg.data[0] if len(msg.data) == 1 else b"".join(msg.data)
    if kind == "none":
        return b""
    if kind == "value":
        value = msg.value
        if isinstance(value, bytes):
            return value
        if isinstance(value, str) and not isinstance(value, Symbol):
            return value.encode("utf-8")
        raise DecodeError("body must be Data sections or an AmqpValue holding a string or "
                          f"binary, got an AmqpValue holding {_kind(value)}")
    raise DecodeError("body must be Data sections or an AmqpValue holding a string or "
                      "binary, got an AmqpSequence")


def mqtt_payload(msg: InboundMessage) -> bytes | None:
    """The payload MQTT subscribers get: Data sections joined; an AmqpValue string
    as UTF-8, binary as is; other values and AmqpSequence bodies as JSON where JSON
    can say them (one sequence section is a JSON array, several an array of
    arrays); None where it cannot (the message is for AMQP receivers only)."""
    kind = msg.body_kind
    if kind == "data":
        return msg.data[0] if len(msg.data) == 1 else b"".join(msg.data)
    if kind == "none":
        return b""
    value = msg.value
    if kind == "value":
        if isinstance(value, bytes):
            return value
        if isinstance(value, str) and not isinstance(value, Symbol):
            return value.encode("utf-8")
    elif len(value) == 1:
        value = value[0]
    if not _jsonable(value, 0):
        return None
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode("utf-8")


def _jsonable(value: Any, depth: int) -> bool:
    """Can JSON say ``value`` without losing what it is?  (Symbols and chars are
    strings; binary, described values, UUIDs, decimals and non-string map keys are
    not representable; nor are infinities and NaN.)"""
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if depth > MAX_DEPTH:
        return False
    if isinstance(value, list):
        return all(_jsonable(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _jsonable(item, depth + 1)
                   for key, item in value.items())
    return False


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, Symbol):
        return "a symbol"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "a map"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Described):
        return "a described value"
    return f"a {type(value).__name__}"


class Mqtt5Props(NamedTuple):
    """The MQTT 5 message properties in their AMQP places (docs/amqp.md, the
    mapping table): the core's ``MessageProperties`` field for field, in its order,
    so that the adapter converts with ``MessageProperties(*props)``.  Between
    adapter and codec ``expiry_interval`` is the *remaining* interval, in seconds."""

    payload_format: int | None         # annotation x-opt-mqtt-payload-format
    expiry_interval: int | None        # header.ttl (milliseconds on the wire)
    content_type: str | None           # properties.content-type (a symbol)
    response_topic: str | None         # properties.reply-to
    correlation_data: bytes | None     # properties.correlation-id (binary)
    user_properties: tuple[tuple[str, str], ...]   # application-properties


def mqtt5_props(msg: InboundMessage) -> Mqtt5Props | None:
    """The MQTT 5 properties a received message carries (None: none), raising
    ``DecodeError`` for a payload format annotation that is not 0 or 1.

    An AMQP ttl becomes whole seconds, rounded up (so it never becomes 0 before it
    is over).  A correlation-id that is not binary becomes bytes: a string its
    UTF-8, a UUID its 16 bytes, a ulong its decimal digits.  Application
    properties become user properties in the map's order: strings as they are,
    booleans as ``true``/``false``, numbers in decimal; null, binary, UUID and
    other values are left out (MQTT user properties are string pairs).  So is any
    string or binary MQTT cannot carry (over 65535 bytes, or a string holding
    U+0000): AMQP receivers still get it in the message's own sections."""
    raw = msg.annotations.get(ANNOTATION_PAYLOAD_FORMAT) if msg.annotations else None
    payload_format: int | None = None
    if raw is not None:
        if isinstance(raw, int) and 0 <= raw <= 1:
            payload_format = int(raw)
        else:
            raise DecodeError(f"annotation {ANNOTATION_PAYLOAD_FORMAT} must be 0 or 1, "
                              f"got {raw!r}")
    ttl = msg.ttl
    expiry = None if ttl is None else (ttl + 999) // 1000
    content_type = _mqtt_text(msg.content_type)
    reply_to = _mqtt_text(msg.reply_to)
    correlation = _correlation_bytes(msg.correlation_id)
    if correlation is not None and len(correlation) > 0xFFFF:
        correlation = None
    user = _user_properties(msg.app_properties) if msg.app_properties else ()
    if (payload_format is None and expiry is None and content_type is None
            and reply_to is None and correlation is None and not user):
        return None
    return Mqtt5Props(payload_format, expiry, content_type, reply_to, correlation, user)


def _mqtt_text(value: str | None) -> str | None:
    """``value`` as a plain str if an MQTT 5 string can hold it (§1.5.4), else None."""
    if value is None or "\x00" in value:
        return None
    if len(value) > 0x3FFF and len(value.encode("utf-8")) > 0xFFFF:
        return None
    return str(value)


def _correlation_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode("ascii")
    return None


def _user_properties(app: dict[Any, Any]) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    for key, value in app.items():
        if not isinstance(key, str):
            continue
        text: str | None
        if isinstance(value, str):
            text = value
        elif isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = str(value)
        else:
            continue
        name, text = _mqtt_text(key), _mqtt_text(text)
        if name is not None and text is not None:
            pairs.append((name, text))
    return tuple(pairs)
