"""The sections of a received message (AMQP 1.0 §3.2): decoding a transfer's
payload (the bare message with its annotations) into an ``InboundMessage``, its
sections in order and each once, and the fields of each that the broker looks at.

What it must not do: decide what the fields mean to the broker (``contract``,
``publish``), or import proton, Twisted or the core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mqttamqp.amqp.codec.values import CACHE_SIZE, DecodeError, Symbol, ValueDecoder

__all__ = ["InboundMessage", "decode_message", "is_section_prefix", "DATA_SECTION",
           "DATA_VBIN8", "PREFIX_MAX"]

# -- section descriptors -------------------------------------------------------------

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x74, 0x75, 0x76, 0x77, 0x78

_SECTION_NAMES = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}


@dataclass
class InboundMessage:
    """The fields of a received message that the broker looks at."""

    durable: bool = False
    delivery_count: int = 0
    annotations: dict[Any, Any] = field(default_factory=dict)
    message_id: Any = None
    to: str | None = None
    subject: str | None = None
    reply_to: str | None = None
    correlation_id: Any = None
    body_kind: str = "none"        # "none", "data", "value" or "sequence"
    data: list[bytes] = field(default_factory=list)
    value: Any = None              # the AmqpValue, or the list of AmqpSequence sections
    # Where the bare message's sections after the annotations begin (properties, or
    # the first section after the message-annotations), and where the properties
    # section ends; -1 when there is none.  ``native_sections`` cuts there.
    bare_start: int = -1
    props_end: int = -1
    last_section: int = 0          # the rank of the last section read (their order)
    ttl: int | None = None         # header.ttl, milliseconds
    content_type: str | None = None
    app_properties: dict[Any, Any] | None = None
    priority: int | None = None    # header.priority (None: not given, or the default 4)

    def copy(self) -> InboundMessage:
        """A copy that shares the (read-only) annotations and value."""
        return InboundMessage(self.durable, self.delivery_count, self.annotations,
                              self.message_id, self.to, self.subject, self.reply_to,
                              self.correlation_id, self.body_kind, list(self.data),
                              list(self.value) if self.body_kind == "sequence" else self.value,
                              self.bare_start, self.props_end, self.last_section,
                              self.ttl, self.content_type, self.app_properties,
                              self.priority)


def _section_code(descriptor: Any) -> int:
    if isinstance(descriptor, Symbol):
        code = _SECTION_NAMES.get(descriptor)
        if code is None:
            raise DecodeError(f"unknown message section {descriptor!r}")
        return code
    if isinstance(descriptor, int) and not isinstance(descriptor, bool) \
            and HEADER <= descriptor <= FOOTER:
        return descriptor
    raise DecodeError(f"unknown message section descriptor {descriptor!r}")


def _in_order(msg: InboundMessage, code: int) -> None:
    """Sections come in the order of AMQP 1.0 §3.2, each once, but for the body's
    (several Data or AmqpSequence sections): a header or annotations after the
    properties or the body would be a different message to each reader."""
    rank = code if code < DATA else (DATA if code <= AMQP_VALUE else FOOTER)
    last = msg.last_section
    if rank < last or (rank == last and rank != DATA):
        raise DecodeError("message sections out of order or repeated (AMQP 1.0 §3.2)")
    msg.last_section = rank


def _field(items: list[Any], index: int) -> Any:
    return items[index] if index < len(items) else None


def _optional_str(value: Any, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise DecodeError(f"properties.{name} must be a string")


DATA_SECTION = b"\x00\x53\x75"
DATA_VBIN8 = DATA_SECTION + b"\xa0"
PREFIX_MAX = 1024
# Sections before the (last) Data section, by their exact bytes → what they decoded
# to.  A sender repeats them for every message (same topic, same annotations), and
# decoding is deterministic, so identical bytes need not be decoded twice.
_prefixes: dict[bytes, InboundMessage] = {}


def is_section_prefix(prefix: bytes) -> bool:
    """``prefix`` is what ``decode_message`` decoded of a message before its (last)
    Data section: it ends on a section boundary."""
    return prefix in _prefixes


def decode_message(data: bytes) -> InboundMessage:
    """Decode a complete transfer payload (the bare message with its annotations)."""
    end = len(data)
    if end == 0:
        raise DecodeError("empty message")
    cut = data.rfind(DATA_SECTION)
    if 0 < cut <= PREFIX_MAX:
        head = _prefixes.get(data[:cut])
        if head is not None:
            return _decode_sections(data, cut, head.copy(), -1)
    return _decode_sections(data, 0, InboundMessage(), cut if 0 < cut <= PREFIX_MAX else -1)


def _decode_sections(data: bytes, pos: int, msg: InboundMessage, snapshot_at: int
                     ) -> InboundMessage:
    decoder = ValueDecoder(data)
    end = len(data)
    while pos < end:
        if pos == snapshot_at:
            if len(_prefixes) >= CACHE_SIZE:
                _prefixes.clear()
            _prefixes[bytes(data[:pos])] = msg.copy()
        if data[pos] != 0x00:
            raise DecodeError("message section is not a described type")
        start = pos
        if pos + 3 < end and data[pos + 1] == 0x53:
            # The usual small-ulong descriptor: read the section without a Described.
            code = data[pos + 2]
            if not HEADER <= code <= FOOTER:
                raise DecodeError(f"unknown message section descriptor {code!r}")
            pos += 3
            _in_order(msg, code)
            if code >= PROPERTIES and msg.bare_start < 0:
                msg.bare_start = start
            if code == DATA and data[pos] == 0xA0:
                stop = pos + 2 + data[pos + 1] if pos + 1 < end else end + 1
                if stop > end:
                    raise DecodeError("truncated data section")
                if msg.body_kind not in ("none", "data"):
                    raise DecodeError("message mixes Data with another body section")
                msg.body_kind = "data"
                msg.data.append(bytes(data[pos + 2:stop]))
                pos = stop
                continue
            value, pos = decoder.value(pos, end, 1)
        else:
            section, pos = decoder.value(pos, end, 0)
            code = _section_code(section.descriptor)
            value = section.value
            _in_order(msg, code)
            if code >= PROPERTIES and msg.bare_start < 0:
                msg.bare_start = start
        if code == HEADER:
            if not isinstance(value, list):
                raise DecodeError("header section is not a list")
            durable = _field(value, 0)
            if durable is not None and not isinstance(durable, bool):
                raise DecodeError("header.durable is not a boolean")
            msg.durable = bool(durable)
            priority = _field(value, 1)
            if priority is not None:
                if (not isinstance(priority, int) or isinstance(priority, bool)
                        or not 0 <= priority <= 255):
                    raise DecodeError("header.priority is not a ubyte")
                # (4 is the default: as if not given, as ``native_flag`` keeps it,
                # so that a message saying so costs a priority queue nothing more)
                msg.priority = None if priority == 4 else priority
            ttl = _field(value, 2)
            if ttl is not None:
                if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0:
                    raise DecodeError("header.ttl is not an unsigned int")
                msg.ttl = ttl
            count = _field(value, 4)
            if count is not None:
                if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                    raise DecodeError("header.delivery-count is not an unsigned int")
                msg.delivery_count = count
        elif code == MESSAGE_ANNOTATIONS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise DecodeError("message-annotations section is not a map")
            msg.annotations = value
        elif code == PROPERTIES:
            if not isinstance(value, list):
                raise DecodeError("properties section is not a list")
            msg.message_id = _field(value, 0)
            msg.to = _optional_str(_field(value, 2), "to")
            msg.subject = _optional_str(_field(value, 3), "subject")
            msg.reply_to = _optional_str(_field(value, 4), "reply-to")
            msg.correlation_id = _field(value, 5)
            msg.content_type = _optional_str(_field(value, 6), "content-type")
            msg.props_end = pos
        elif code == DATA:
            if not isinstance(value, bytes):
                raise DecodeError("data section does not hold binary")
            if msg.body_kind not in ("none", "data"):
                raise DecodeError("message mixes Data with another body section")
            msg.body_kind = "data"
            msg.data.append(value)
        elif code == AMQP_VALUE:
            if msg.body_kind != "none":
                raise DecodeError("message has more than one body section with AmqpValue")
            msg.body_kind = "value"
            msg.value = value
        elif code == AMQP_SEQUENCE:
            if msg.body_kind not in ("none", "sequence"):
                raise DecodeError("message mixes AmqpSequence with another body section")
            if not isinstance(value, list):
                raise DecodeError("amqp-sequence section does not hold a list")
            if msg.body_kind == "none":
                msg.body_kind = "sequence"
                msg.value = []
            msg.value.append(value)
        elif code == APPLICATION_PROPERTIES:
            if value is not None and not isinstance(value, dict):
                raise DecodeError("application-properties section is not a map")
            msg.app_properties = value
        # delivery-annotations and the footer are not used
    return msg
