"""Selectors on AMQP 1.0 receivers: the ``apache.org:selector-filter:string``
source filter, and the fields of a message a selector reads.

What it owns: reading a receiver's source filter map (``source_selector``: the
selector it asks for, or why it is refused), and the predicate over a core
``Message`` the core applies (``message_predicate``): the header and properties
fields under their JMS names (``JMSPriority``, ``JMSMessageID``,
``JMSCorrelationID``, ``JMSType``, ``JMSTimestamp``, ``JMSDeliveryMode``) and the
application properties; of a message from an AMQP sender its own sections
(decoded up to the body, never further, and once per message however many
receivers ask), of one from MQTT its MQTT 5 properties (user properties are the
application properties).

What it must not do: parse the selector language (``core.selectors``), attach
links (``attach``) or decide deliveries (the core).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mqttamqp.amqp.codec.native import native_header
from mqttamqp.amqp.codec.values import DecodeError, Described, Symbol, ValueDecoder
from mqttamqp.core.message import Message
from mqttamqp.core.queues.priority import DEFAULT_PRIORITY
from mqttamqp.core.selectors import (
    MAX_SELECTOR_LENGTH,
    Selector,
    SelectorError,
    compile_selector,
)

__all__ = ["SELECTOR_FILTER", "SELECTOR_CODE", "source_selector", "message_predicate",
           "message_fields"]

SELECTOR_FILTER = "apache.org:selector-filter:string"
SELECTOR_CODE = 0x0000468C00000004

_PROPERTIES, _APPLICATION_PROPERTIES, _DATA = 0x73, 0x74, 0x75
_SECTION_CODES = {"amqp:properties:list": _PROPERTIES,
                  "amqp:application-properties:map": _APPLICATION_PROPERTIES}


def source_selector(filters: Any, max_length: int = MAX_SELECTOR_LENGTH
                    ) -> tuple[Any, Selector] | str | None:
    """The selector a source's filter map (as proton decodes it) asks for, with its
    key in the map (echoed in the attach's answer); None: no filter; a string: why
    the filters are refused (another kind of filter, or a selector that does not
    parse)."""
    if not filters:
        return None
    if not isinstance(filters, dict):
        return "the source's filter is not a map"
    found: tuple[Any, Selector] | None = None
    for key, value in filters.items():
        descriptor = getattr(value, "descriptor", None)
        if str(descriptor) != SELECTOR_FILTER and descriptor != SELECTOR_CODE:
            return f"source filter {str(key)!r} is not supported (only {SELECTOR_FILTER})"
        if found is not None:
            return "more than one selector filter"
        text = getattr(value, "value", None)
        if not isinstance(text, str):
            return f"selector filter {str(key)!r} is not a string"
        try:
            found = (key, compile_selector(text, max_length))
        except SelectorError as exc:
            return f"selector {text[:80]!r} does not parse: {exc}"
    return found


# The last message's fields: a message routed to several selective receivers is
# read once (message, its fields).
_last: list[Any] = [None, None]


def message_predicate(selector: Selector) -> Callable[[Message], bool]:
    """What the core asks of each message for a receiver with ``selector``."""
    matches = selector.matches

    def predicate(message: Message) -> bool:
        last = _last
        if last[0] is message:
            fields = last[1]
        else:
            fields = message_fields(message)
            last[0], last[1] = message, fields
        try:
            return matches(fields.get)
        except Exception:   # (never expected: a receiver's selector must not fail a publish)
            return False
    return predicate


def message_fields(message: Message) -> dict[str, Any]:
    """The fields a selector may name, of ``message``: the JMS header names and
    the application properties (an application property does not hide a header
    field)."""
    native = message.native
    if native is None:
        return _mqtt_fields(message)
    try:
        return _native_fields(native)
    except (DecodeError, IndexError, TypeError, ValueError):
        return {}   # (stored as validated: not expected; nothing to select on)


def _mqtt_fields(message: Message) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    props = message.props
    if props is not None:
        for name, value in props.user_properties:
            fields.setdefault(name, value)
        if props.correlation_data is not None:
            fields["JMSCorrelationID"] = props.correlation_data.decode("utf-8", "replace")
    # (the level a priority queue ranks it at: ``level_of``'s default, 0 for an
    # AMQP 0.9.1 message without one, as RabbitMQ, 4 otherwise)
    priority = message.priority
    if priority is None:
        priority = 0 if message.amqp091 is not None else DEFAULT_PRIORITY
    fields["JMSPriority"] = priority
    fields["JMSDeliveryMode"] = "PERSISTENT" if message.qos else "NON_PERSISTENT"
    fields["JMSTimestamp"] = int(message.timestamp * 1000)
    return fields


def _native_fields(native: bytes) -> dict[str, Any]:
    durable, priority, pos = native_header(native)
    fields: dict[str, Any] = {}
    decoder = ValueDecoder(native)
    end = len(native)
    properties: Any = None
    while pos < end and native[pos] == 0x00:
        if pos + 2 < end and native[pos + 1] == 0x53:
            code, pos = native[pos + 2], pos + 3
        else:
            descriptor, pos = decoder.value(pos + 1, end, 1)
            code = _SECTION_CODES.get(str(descriptor), _DATA) if isinstance(
                descriptor, Symbol) else int(descriptor)
        if code >= _DATA:
            break   # (the body and after: never read)
        value, pos = decoder.value(pos, end, 1)
        if code == _PROPERTIES and isinstance(value, list):
            properties = value
        elif code == _APPLICATION_PROPERTIES and isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str):
                    fields[str(key)] = item
    if properties is not None:
        _property(fields, "JMSMessageID", properties, 0)
        _property(fields, "JMSType", properties, 3)
        _property(fields, "JMSCorrelationID", properties, 5)
        if len(properties) > 9 and isinstance(properties[9], int):
            fields["JMSTimestamp"] = properties[9]
    fields["JMSPriority"] = 4 if priority is None else priority
    fields["JMSDeliveryMode"] = "PERSISTENT" if durable else "NON_PERSISTENT"
    return fields


def _property(fields: dict[str, Any], name: str, items: list[Any], index: int) -> None:
    value = items[index] if index < len(items) else None
    if isinstance(value, Described):
        value = value.value
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if value is not None and not isinstance(value, bool):
        fields[name] = str(value)
    else:
        fields.pop(name, None)
