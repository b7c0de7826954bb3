"""AMQP 1.0 message bodies as the MQTT-over-AMQP contract uses them: bytes in,
plain Python values out, and the encoder for the messages the broker sends.

What it owns: decoding a transfer's payload (the bare message: header,
annotations, properties, body sections) into an ``InboundMessage`` with limits on
depth and value count, so that any bytes either decode or raise ``DecodeError``
with a reason; reading the contract's fields from it (QoS with its fallback,
retain, the payload of a Data or AmqpValue body); encoding AMQP_PUBLISH by hand
(the hot path: one message per delivery) and the control messages.

What it must not do: touch a socket, a proton engine or the broker.  It imports
proton only to encode the rare control messages.
"""

from __future__ import annotations

import json
import math
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "DecodeError", "Symbol", "Described", "InboundMessage", "decode_message", "decode_publish",
    "PublishFields", "mqtt_payload", "native_sections", "native_parts", "encode_native",
    "decode_value", "message_qos", "message_retain", "message_payload", "parse_qos",
    "encode_publish", "encode_control", "ANNOTATION_RETAIN", "ANNOTATION_QOS",
    "ANNOTATION_CLIENT_ID", "ANNOTATION_PAYLOAD_FORMAT", "Mqtt5Props", "mqtt5_props",
    "encode_publish5", "PublishMemo", "recall_publish", "native_flag", "native_header",
    "Annotations", "NO_ANNOTATIONS", "encode_annotations",
]

ANNOTATION_RETAIN = "x-opt-retain-message"
ANNOTATION_QOS = "x-opt-mqtt-qos"
ANNOTATION_CLIENT_ID = "x-opt-mqtt-client-id"
ANNOTATION_PAYLOAD_FORMAT = "x-opt-mqtt-payload-format"

MAX_DEPTH = 32


class DecodeError(Exception):
    """The bytes are not a message this broker can use; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Symbol(str):
    """An AMQP symbol (kept apart from strings so a caller can tell them apart)."""

    __slots__ = ()


class Described(NamedTuple):
    descriptor: Any
    value: Any


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
    priority: int | None = None    # header.priority (None: not given, which means 4)

    def copy(self) -> InboundMessage:
        """A copy that shares the (read-only) annotations and value."""
        return InboundMessage(self.durable, self.delivery_count, self.annotations,
                              self.message_id, self.to, self.subject, self.reply_to,
                              self.correlation_id, self.body_kind, list(self.data),
                              list(self.value) if self.body_kind == "sequence" else self.value,
                              self.bare_start, self.props_end, self.last_section,
                              self.ttl, self.content_type, self.app_properties,
                              self.priority)


# -- the decoder ---------------------------------------------------------------------

_unpack_b = struct.Struct(">b").unpack_from
_unpack_h = struct.Struct(">h").unpack_from
_unpack_H = struct.Struct(">H").unpack_from
_unpack_i = struct.Struct(">i").unpack_from
_unpack_I = struct.Struct(">I").unpack_from
_unpack_q = struct.Struct(">q").unpack_from
_unpack_Q = struct.Struct(">Q").unpack_from
_unpack_f = struct.Struct(">f").unpack_from
_unpack_d = struct.Struct(">d").unpack_from

# Width in bytes of the fixed-width encodings, by format code.
_FIXED = {
    0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0,
    0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1, 0x56: 1,
    0x60: 2, 0x61: 2,
    0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4, 0x74: 4,
    0x80: 8, 0x81: 8, 0x82: 8, 0x83: 8, 0x84: 8,
    0x94: 16, 0x98: 16,
}


class _Decoder:
    __slots__ = ("budget", "buf")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        # Bounds the work a hostile message can cause (e.g. an array of a billion
        # zero-width nulls): every decoded value costs one.
        self.budget = 64 + 2 * len(buf)

    def need(self, pos: int, n: int, end: int) -> None:
        if pos + n > end:
            raise DecodeError("truncated AMQP value")

    def value(self, pos: int, end: int, depth: int) -> tuple[Any, int]:
        if pos >= end:
            raise DecodeError("truncated AMQP value")
        buf = self.buf
        code = buf[pos]
        pos += 1
        # The common scalars first, inline (this is the per-message path).
        if code == 0x40:
            self.budget -= 1
            return None, pos
        if code == 0xA1 or code == 0xA3 or code == 0xA0:
            self.budget -= 1
            if pos >= end:
                raise DecodeError("truncated AMQP value")
            stop = pos + 1 + buf[pos]
            if stop > end:
                raise DecodeError("truncated AMQP value")
            raw = bytes(buf[pos + 1:stop])
            if code == 0xA0:
                return raw, stop
            try:
                if code == 0xA1:
                    return raw.decode("utf-8"), stop
                return Symbol(raw.decode("ascii")), stop
            except UnicodeDecodeError:
                return self.variable(code, pos + 1, stop - pos - 1), stop
        if code == 0x41 or code == 0x42:
            self.budget -= 1
            return code == 0x41, pos
        if code == 0x43 or code == 0x44:
            self.budget -= 1
            return 0, pos
        if code == 0x50 or code == 0x52 or code == 0x53:
            self.budget -= 1
            if pos >= end:
                raise DecodeError("truncated AMQP value")
            return buf[pos], pos + 1
        if code == 0x00:
            if depth >= MAX_DEPTH:
                raise DecodeError("AMQP value nested too deeply")
            descriptor, pos = self.value(pos, end, depth + 1)
            inner, pos = self.value(pos, end, depth + 1)
            return Described(descriptor, inner), pos
        return self.body(code, pos, end, depth)

    def body(self, code: int, pos: int, end: int, depth: int) -> tuple[Any, int]:
        self.budget -= 1
        if self.budget < 0:
            raise DecodeError("AMQP value has too many elements")
        buf = self.buf
        width = _FIXED.get(code)
        if width is not None:
            self.need(pos, width, end)
            return self.fixed(code, pos), pos + width
        if code in (0xA0, 0xA1, 0xA3):
            self.need(pos, 1, end)
            size = buf[pos]
            pos += 1
            self.need(pos, size, end)
            return self.variable(code, pos, size), pos + size
        if code in (0xB0, 0xB1, 0xB3):
            self.need(pos, 4, end)
            size = _unpack_I(buf, pos)[0]
            pos += 4
            self.need(pos, size, end)
            return self.variable(code, pos, size), pos + size
        if code in (0xC0, 0xC1, 0xD0, 0xD1):
            if depth >= MAX_DEPTH:
                raise DecodeError("AMQP value nested too deeply")
            if code < 0xD0:
                self.need(pos, 2, end)
                size, count = buf[pos], buf[pos + 1]
                start = pos + 1
            else:
                self.need(pos, 8, end)
                size, count = _unpack_I(buf, pos)[0], _unpack_I(buf, pos + 4)[0]
                start = pos + 4
            stop = start + size
            if size < (1 if code < 0xD0 else 4) or stop > end:
                raise DecodeError("AMQP compound value overruns its buffer")
            pos = start + (1 if code < 0xD0 else 4)
            items: list[Any] = []
            for _ in range(count):
                item, pos = self.value(pos, stop, depth + 1)
                items.append(item)
            if pos != stop:
                raise DecodeError("AMQP compound value size does not match its content")
            if code in (0xC0, 0xD0):
                return items, pos
            if count % 2:
                raise DecodeError("AMQP map with an odd number of elements")
            result: dict[Any, Any] = {}
            try:
                for i in range(0, count, 2):
                    result[items[i]] = items[i + 1]
            except TypeError:
                raise DecodeError("AMQP map key is not a scalar") from None
            return result, pos
        if code in (0xE0, 0xF0):
            if depth >= MAX_DEPTH:
                raise DecodeError("AMQP value nested too deeply")
            if code == 0xE0:
                self.need(pos, 2, end)
                size, count = buf[pos], buf[pos + 1]
                start, pos = pos + 1, pos + 2
            else:
                self.need(pos, 8, end)
                size, count = _unpack_I(buf, pos)[0], _unpack_I(buf, pos + 4)[0]
                start, pos = pos + 4, pos + 8
            stop = start + size
            if stop > end or pos > stop:
                raise DecodeError("AMQP array overruns its buffer")
            self.need(pos, 1, stop)
            element = buf[pos]
            pos += 1
            descriptor: Any = None
            described = element == 0x00
            if described:
                descriptor, pos = self.value(pos, stop, depth + 1)
                self.need(pos, 1, stop)
                element = buf[pos]
                pos += 1
            elements: list[Any] = []
            for _ in range(count):
                item, pos = self.body(element, pos, stop, depth + 1)
                elements.append(Described(descriptor, item) if described else item)
            if pos != stop:
                raise DecodeError("AMQP array size does not match its content")
            return elements, pos
        raise DecodeError(f"unknown AMQP format code 0x{code:02x}")

    def fixed(self, code: int, pos: int) -> Any:
        buf = self.buf
        if code == 0x40:
            return None
        if code == 0x41:
            return True
        if code == 0x42:
            return False
        if code in (0x43, 0x44):
            return 0
        if code == 0x45:
            return []
        if code in (0x50, 0x52, 0x53):
            return buf[pos]
        if code in (0x51, 0x54, 0x55):
            return _unpack_b(buf, pos)[0]
        if code == 0x56:
            if buf[pos] > 1:
                raise DecodeError("AMQP boolean is neither 0 nor 1")
            return buf[pos] == 1
        if code == 0x60:
            return _unpack_H(buf, pos)[0]
        if code == 0x61:
            return _unpack_h(buf, pos)[0]
        if code == 0x70:
            return _unpack_I(buf, pos)[0]
        if code == 0x71:
            return _unpack_i(buf, pos)[0]
        if code == 0x72:
            return _unpack_f(buf, pos)[0]
        if code == 0x73:
            point = _unpack_I(buf, pos)[0]
            if point > 0x10FFFF:
                raise DecodeError("AMQP char out of range")
            return chr(point)
        if code in (0x80,):
            return _unpack_Q(buf, pos)[0]
        if code in (0x81, 0x83):
            return _unpack_q(buf, pos)[0]
        if code == 0x82:
            return _unpack_d(buf, pos)[0]
        if code == 0x98:
            return uuid.UUID(bytes=bytes(buf[pos:pos + 16]))
        return bytes(buf[pos:pos + _FIXED[code]])  # decimals: kept raw

    def variable(self, code: int, pos: int, size: int) -> Any:
        raw = bytes(self.buf[pos:pos + size])
        if code in (0xA0, 0xB0):
            return raw
        try:
            if code in (0xA1, 0xB1):
                return raw.decode("utf-8")
            return Symbol(raw.decode("ascii"))
        except UnicodeDecodeError:
            kind = "string" if code in (0xA1, 0xB1) else "symbol"
            raise DecodeError(f"AMQP {kind} is not valid "
                              f"{'UTF-8' if kind == 'string' else 'ASCII'}") from None


def decode_value(data: bytes) -> Any:
    """Decode exactly one AMQP value (for tests and control bodies)."""
    decoder = _Decoder(data)
    value, pos = decoder.value(0, len(data), 0)
    if pos != len(data):
        raise DecodeError("trailing bytes after the AMQP value")
    return value


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


_DATA_SECTION = b"\x00\x53\x75"
_DATA_VBIN8 = _DATA_SECTION + b"\xa0"
_PREFIX_MAX = 1024
_PREFIX_CACHE_SIZE = 256
# Sections before the (last) Data section, by their exact bytes → what they decoded
# to.  A sender repeats them for every message (same topic, same annotations), and
# decoding is deterministic, so identical bytes need not be decoded twice.
_prefixes: dict[bytes, InboundMessage] = {}


def decode_message(data: bytes) -> InboundMessage:
    """Decode a complete transfer payload (the bare message with its annotations)."""
    end = len(data)
    if end == 0:
        raise DecodeError("empty message")
    cut = data.rfind(_DATA_SECTION)
    if 0 < cut <= _PREFIX_MAX:
        head = _prefixes.get(data[:cut])
        if head is not None:
            return _decode_sections(data, cut, head.copy(), -1)
    return _decode_sections(data, 0, InboundMessage(), cut if 0 < cut <= _PREFIX_MAX else -1)


def _decode_sections(data: bytes, pos: int, msg: InboundMessage, snapshot_at: int
                     ) -> InboundMessage:
    decoder = _Decoder(data)
    end = len(data)
    while pos < end:
        if pos == snapshot_at:
            if len(_prefixes) >= _PREFIX_CACHE_SIZE:
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
                msg.priority = priority
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


# -- the publish fast path -------------------------------------------------------------

class PublishFields(NamedTuple):
    """What a topic publisher's message means to the broker."""

    to: str | None
    payload: bytes | None  # the MQTT payload; None: the body has no MQTT form
    qos: int            # see ``decode_publish``
    retain: bool
    redelivered: bool   # header.delivery-count > 0
    wait: bool          # acknowledge only once durable (QoS > 0 and persisted)
    durable: bool       # header.durable as sent
    bare_start: int     # see ``InboundMessage``
    props_end: int
    props: Mqtt5Props | None   # what MQTT 5 subscribers get as PUBLISH properties
    priority: int | None = None   # header.priority as sent (None: not given)


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


# Sections before the one Data section, by their exact bytes → (to, QoS annotation
# (None if absent) or why it is unusable, retain, redelivered, durable, bare_start,
# props_end, MQTT 5 properties, priority).  Only prefixes that ``decode_message``
# confirmed to end on a section boundary get here.
_Head = tuple[str | None, int | str | None, bool, bool, bool, int, int, Mqtt5Props | None,
              int | None]
_publish_heads: dict[bytes, _Head] = {}


def _sole_data(data: bytes, pos: int) -> bytes | None:
    """The payload if ``data[pos:]`` is exactly one Data section, else None."""
    pos += 3  # the Data section descriptor
    end = len(data)
    if pos + 1 < end and data[pos] == 0xA0:
        start = pos + 2
        stop = start + data[pos + 1]
    elif pos + 5 <= end and data[pos] == 0xB0:
        start = pos + 5
        stop = start + _unpack_I(data, pos + 1)[0]
    else:
        return None
    return data[start:stop] if stop == end else None


_fields = tuple.__new__


class PublishMemo:
    """One sender's last sections before the body, and what ``decode_publish`` made
    of them (``fields``, with payload None).  A sender repeats them for every
    message, so its next one costs a prefix compare and the body's slice
    (``recall_publish``), not a copy, a hash and a lookup of the prefix."""

    __slots__ = ("fields", "prefix", "presettled")

    def __init__(self) -> None:
        self.prefix = b""
        self.presettled = False
        self.fields: PublishFields | None = None

    def remember(self, prefix: bytes, presettled: bool, fields: PublishFields) -> None:
        self.prefix = prefix
        self.presettled = presettled
        self.fields = fields._replace(payload=None)


def recall_publish(data: bytes, presettled: bool, memo: PublishMemo) -> bytes | None:
    """The payload of ``data`` if it is ``memo``'s sections followed by exactly one
    Data section (its fields are then ``memo.fields``); else None: decode it with
    ``decode_publish``.  The prefix was decoded in full and ends on a section
    boundary, so bytes in the payload cannot pass for it."""
    prefix = memo.prefix
    if not prefix or memo.presettled is not presettled or not data.startswith(prefix):
        return None
    cut = len(prefix)
    if data.startswith(_DATA_VBIN8, cut):   # (the usual body: under 256 bytes)
        end = len(data)
        if end > cut + 4 and end == cut + 5 + data[cut + 4]:
            return data[cut + 5:]
        return None
    if not data.startswith(_DATA_SECTION, cut):
        return None
    return _sole_data(data, cut)


def decode_publish(data: bytes, presettled: bool, memo: PublishMemo | None = None
                   ) -> PublishFields:
    """The fields of a message sent to a topic (raises ``DecodeError``).

    QoS: a pre-settled delivery is QoS 0 whatever its annotation says (the
    annotation is not checked).  Otherwise the ``x-opt-mqtt-qos`` annotation of
    the contract, and without one the settlement decides: unsettled is QoS 1 (at
    least once).  ``wait``: the Accepted waits for the commit when the message is
    persisted, that is when it carries the QoS annotation (the contract's
    messages) or its header says ``durable``.

    A sender repeats the same sections before the body for every message, so their
    meaning is cached by their bytes and only the Data section is read again;
    ``memo`` (the sender's own) is given the prefix when it was one of those.
    """
    cut = data.rfind(_DATA_SECTION)
    if 0 < cut <= _PREFIX_MAX:
        prefix = data[:cut]
        head = _publish_heads.get(prefix)
        if head is not None:
            payload = _sole_data(data, cut)
            if payload is not None:
                qos = _qos_of(head[1], presettled)
                # tuple.__new__: half the cost of the NamedTuple's own constructor
                fields = _fields(PublishFields, (
                    head[0], payload, qos, head[2], head[3],
                    qos > 0 and (head[1] is not None or head[4]), head[4],
                    head[5] if head[5] >= 0 else cut, head[6], head[7], head[8]))
                if memo is not None:
                    memo.remember(prefix, presettled, fields)
                return fields
    msg = decode_message(data)
    payload = mqtt_payload(msg)
    retain = message_retain(msg)
    annotated: int | str | None
    raw = msg.annotations.get(ANNOTATION_QOS)
    if raw is None:
        annotated = None
    else:
        annotated = parse_qos(raw)
        if annotated is None:
            annotated = f"annotation {ANNOTATION_QOS} must be 0, 1 or 2, got {raw!r}"
    redelivered = msg.delivery_count > 0
    qos = _qos_of(annotated, presettled)
    props = mqtt5_props(msg)
    fields = PublishFields(msg.to, payload, qos, retain, redelivered,
                           qos > 0 and (annotated is not None or msg.durable), msg.durable,
                           msg.bare_start, msg.props_end, props, msg.priority)
    if (0 < cut <= _PREFIX_MAX and msg.body_kind == "data" and len(msg.data) == 1
            and prefix in _prefixes and _sole_data(data, cut) is not None):
        if len(_publish_heads) >= _PREFIX_CACHE_SIZE:
            _publish_heads.clear()
        _publish_heads[prefix] = (msg.to, annotated, retain, redelivered, msg.durable,
                                  msg.bare_start if msg.bare_start < cut else -1,
                                  msg.props_end, props, msg.priority)
        if memo is not None:
            memo.remember(prefix, presettled, fields)
    return fields


def _qos_of(qos: int | str | None, presettled: bool) -> int:
    if presettled:
        return 0
    if qos is None:
        return 1     # unsettled, no annotation: at least once
    if isinstance(qos, str):
        raise DecodeError(qos)
    return qos


# -- the message as AMQP receivers get it ------------------------------------------------

_native_props: dict[tuple[bytes, str], bytes] = {}


def native_sections(data: bytes, bare_start: int, props_end: int, to: str | None,
                    topic: str, durable: bool, priority: int | None = None,
                    keep_to: bool = False) -> bytes:
    """What an AMQP receiver gets of a received message as it was sent: the
    header fields the sender set that the broker keeps (``native_flag``), then its
    properties, application properties, body and footer.  ``to`` is set to the topic
    the message was routed to, unless ``keep_to`` (a durable queue keeps the bare
    message exactly as sent, AMQP 1.0 §3.2).  The rest of the header and the
    annotations are the broker's own (``encode_native``)."""
    head, cut = native_parts(data, bare_start, props_end, to, topic, durable, priority,
                             keep_to)
    return head + data[cut:]


def native_flag(durable: bool, priority: int | None) -> bytes:
    """The first bytes of a native message: 0 or 1 (``durable``), or, when the
    sender gave a priority other than the default 4, 2 or 3 followed by it.  (Stored
    with retained and queued messages: records made before priority was kept start
    with 0 or 1, and still read.)"""
    if priority is None or priority == 4:
        return b"\x01" if durable else b"\x00"
    return bytes((3 if durable else 2, priority))


def native_header(native: bytes) -> tuple[bool, int | None, int]:
    """``native``'s durable flag, its priority (None: the default) and where its
    sections begin."""
    flag = native[0]
    if flag & 2:
        return bool(flag & 1), native[1], 2
    return flag == 1, None, 1


def native_parts(data: bytes, bare_start: int, props_end: int, to: str | None,
                 topic: str, durable: bool, priority: int | None = None,
                 keep_to: bool = False) -> tuple[bytes, int]:
    """``native_sections`` as ``head + data[cut:]``: the same for every message with
    the same sections before the body (a sender's memo), so a sender keeps them."""
    flag = native_flag(durable, priority)
    if keep_to:
        return flag, bare_start if bare_start >= 0 else len(data)
    if props_end >= 0 and to == topic:
        return flag, bare_start
    cut = props_end if props_end >= 0 else (bare_start if bare_start >= 0 else len(data))
    raw = data[bare_start:props_end] if props_end >= 0 else b""
    key = (raw, topic)
    props = _native_props.get(key)
    if props is None:
        items = _raw_list_items(raw) if raw else []
        while len(items) < 3:
            items.append(b"\x40")
        items[2] = _str(topic)
        while items and items[-1] == b"\x40" and len(items) > 3:
            items.pop()
        props = _PROPERTIES_PREFIX + _compound(0xC0, 0xD0, len(items), b"".join(items))
        if len(_native_props) >= _PREFIX_CACHE_SIZE:
            _native_props.clear()
        _native_props[key] = props
    return flag + props, cut


def _raw_list_items(section: bytes) -> list[bytes]:
    """The encoded elements of a described list section (already validated)."""
    return _raw_items(section, 0xC0, 0xD0)


def _raw_items(section: bytes, small: int, large: int) -> list[bytes]:
    """The encoded elements of a described list (``small``/``large`` 0xC0/0xD0) or
    map (0xC1/0xD1, keys and values in turn) section (already validated)."""
    decoder = _Decoder(section)
    end = len(section)
    _, pos = decoder.value(1, end, 1)         # the descriptor
    code = section[pos] if pos < end else 0
    if code == 0x45 or code == 0x40:
        return []
    if code not in (small, large) or pos + (3 if code == small else 9) > end:
        raise DecodeError("section is not a " + ("list" if small == 0xC0 else "map"))
    if code == small:
        count, pos = section[pos + 2], pos + 3
    else:
        count, pos = _unpack_I(section, pos + 5)[0], pos + 9
    items = []
    for _ in range(count):
        _, stop = decoder.value(pos, end, 1)
        items.append(section[pos:stop])
        pos = stop
    return items


# -- reading the contract's fields ---------------------------------------------------

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


# -- the encoder -------------------------------------------------------------------------

_pack_I = struct.Struct(">I").pack


def _sym(name: str) -> bytes:
    raw = name.encode("ascii")
    return b"\xa3" + bytes((len(raw),)) + raw


def _str(value: str) -> bytes:
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) < 256:
        return b"\xa1" + bytes((len(raw),)) + raw
    return b"\xb1" + _pack_I(len(raw)) + raw


def _uint(value: int) -> bytes:
    if value == 0:
        return b"\x43"
    if value < 256:
        return b"\x52" + bytes((value,))
    return b"\x70" + _pack_I(value & 0xFFFFFFFF)


def _compound(code8: int, code32: int, count: int, items: bytes) -> bytes:
    if len(items) + 1 < 256 and count < 256:
        return bytes((code8, len(items) + 1, count)) + items
    return bytes((code32,)) + _pack_I(len(items) + 4) + _pack_I(count) + items


_HEADER_PREFIX = b"\x00\x53\x70"
_ANNOTATIONS_PREFIX = b"\x00\x53\x72"
_PROPERTIES_PREFIX = b"\x00\x53\x73"
_DATA_PREFIX = b"\x00\x53\x75"
_RETAIN_TRUE = _sym(ANNOTATION_RETAIN) + b"\x41"
_RETAIN_FALSE = _sym(ANNOTATION_RETAIN) + b"\x42"
_QOS = [_sym(ANNOTATION_QOS) + b"\x54" + bytes((q,)) for q in range(3)]
_CLIENT_ID = _sym(ANNOTATION_CLIENT_ID)
_PAYLOAD_FORMAT = _sym(ANNOTATION_PAYLOAD_FORMAT)
_APP_PROPERTIES_PREFIX = b"\x00\x53\x74"


def _ulong(value: int) -> bytes:
    if value < 256:
        return b"\x53" + bytes((value,))
    return b"\x80" + struct.pack(">Q", value)


def encode_publish(topic: str, payload: bytes, qos: int, retain: bool, delivery_count: int,
                   publisher: str | None, message_id: int | None = None,
                   first_acquirer: bool = False) -> bytes:
    """AMQP_PUBLISH as the contract lays it out: header (durable, first-acquirer,
    delivery-count), message-annotations (retain, qos, publisher), properties
    (``message-id`` = the packet id for QoS 1/2, which AMQP_PUBREL names; ``to``),
    one Data section."""
    head = _head(qos, retain, delivery_count, publisher, qos > 0, None, first_acquirer)
    properties = (b"\x40" if message_id is None else _ulong(message_id)) + b"\x40" + _str(topic)
    if len(payload) < 256:
        data = b"\xa0" + bytes((len(payload),)) + payload
    else:
        data = b"\xb0" + _pack_I(len(payload)) + payload
    return b"".join((head, _PROPERTIES_PREFIX, _compound(0xC0, 0xD0, 3, properties),
                     _DATA_PREFIX, data))


Annotations = tuple[bytes, int]
"""Message annotations the broker adds after the contract's: the encoded key/value
pairs and how many elements (keys and values) they are (``encode_annotations``)."""

NO_ANNOTATIONS: Annotations = (b"", 0)


def encode_annotations(pairs: Sequence[tuple[str, str | int]]) -> Annotations:
    """Annotations keyed by symbols: a str value as a string, an int as a ulong."""
    raw = b"".join(_sym(key) + (_ulong(value) if isinstance(value, int) else _str(value))
                   for key, value in pairs)
    return raw, 2 * len(pairs)


def encode_publish5(topic: str, payload: bytes, qos: int, retain: bool, delivery_count: int,
                    publisher: str | None, message_id: int | str | None, props: Mqtt5Props,
                    first_acquirer: bool = False,
                    annotations: Annotations = NO_ANNOTATIONS) -> bytes:
    """AMQP_PUBLISH of a message with MQTT 5 properties, in their places of the
    mapping: header.ttl (``props.expiry_interval`` is what is left of it), the
    payload format annotation, properties reply-to, correlation-id (binary) and
    content-type (a symbol; left out unless ASCII, as symbols are), and
    application-properties (the first value of a repeated key); ``annotations``
    after the contract's.  Not cached: the slower path, taken only by messages that
    carry properties."""
    head = _encode_head(qos, retain, delivery_count, publisher, qos > 0,
                        _ttl_ms(props.expiry_interval), props.payload_format, None,
                        first_acquirer, annotations)
    items = [_message_id(message_id), b"\x40", _str(topic), b"\x40",
             b"\x40" if props.response_topic is None else _str(props.response_topic),
             b"\x40" if props.correlation_data is None else _bin(props.correlation_data),
             b"\x40" if props.content_type is None or not props.content_type.isascii()
             else _sym(props.content_type)]
    while items[-1] == b"\x40" and len(items) > 3:
        items.pop()
    parts = [head, _PROPERTIES_PREFIX, _compound(0xC0, 0xD0, len(items), b"".join(items))]
    if props.user_properties:
        parts.append(_application_properties(props.user_properties))
    parts.append(_DATA_PREFIX)
    parts.append(_bin(payload))
    return b"".join(parts)


def _message_id(message_id: int | str | None) -> bytes:
    if message_id is None:
        return b"\x40"
    return _str(message_id) if isinstance(message_id, str) else _ulong(message_id)


def _ttl_ms(seconds: int | None) -> int | None:
    """header.ttl for an expiry interval: milliseconds, at most a uint's worth."""
    return None if seconds is None else min(seconds * 1000, 0xFFFFFFFF)


def _bin(value: bytes) -> bytes:
    if len(value) < 256:
        return b"\xa0" + bytes((len(value),)) + value
    return b"\xb0" + _pack_I(len(value)) + value


def _application_properties(pairs: tuple[tuple[str, str], ...]) -> bytes:
    """A map of string to string; of a key given more than once, the first value."""
    seen: set[str] = set()
    items = []
    for key, value in pairs:
        if key not in seen:
            seen.add(key)
            items.append(_str(key) + _str(value))
    return _APP_PROPERTIES_PREFIX + _compound(0xC1, 0xD1, 2 * len(items), b"".join(items))


def encode_native(native: bytes, qos: int, retain: bool, delivery_count: int,
                  publisher: str | None, props: Mqtt5Props | None = None,
                  first_acquirer: bool = False,
                  annotations: Annotations = NO_ANNOTATIONS) -> bytes:
    """A message from an AMQP sender as an AMQP receiver gets it: a header with the
    sender's ``durable`` and ``priority`` (``native_flag``), and the contract's
    annotations (then ``annotations``), then the sender's own sections (``native``
    is what ``native_sections`` made).  With ``props``, the header carries what is
    left of its ttl and the annotations its payload format (the sender's own
    properties and application properties are in ``native``)."""
    flag = native[0]
    if flag & 2:
        durable, priority, start = bool(flag & 1), native[1], 2
    else:
        durable, priority, start = flag == 1, None, 1
    if annotations[1] == 0 and (props is None or (
            props.expiry_interval is None and props.payload_format is None)):
        key = (qos, retain, delivery_count, publisher, durable, priority, first_acquirer)
        head = _heads.get(key) or _head(*key)   # (``_head``'s cache, looked up here)
    else:
        head = _encode_head(qos, retain, delivery_count, publisher, durable,
                            None if props is None else _ttl_ms(props.expiry_interval),
                            None if props is None else props.payload_format, priority,
                            first_acquirer, annotations)
    if len(native) < 4096:
        return head + native[start:]   # (for a small message, cheaper than a view and a join)
    return b"".join((head, memoryview(native)[start:]))


_heads: dict[tuple[int, bool, int, str | None, bool, int | None, bool], bytes] = {}


def _head(qos: int, retain: bool, delivery_count: int, publisher: str | None,
          durable: bool, priority: int | None, first_acquirer: bool) -> bytes:
    """Header and message-annotations, cached: the same for every message of one
    publisher (``durable`` is the contract's QoS > 0, or a native sender's own)."""
    key = (qos, retain, delivery_count, publisher, durable, priority, first_acquirer)
    head = _heads.get(key)
    if head is None:
        head = _encode_head(qos, retain, delivery_count, publisher, durable, None, None,
                            priority, first_acquirer)
        if len(_heads) >= _PREFIX_CACHE_SIZE:
            _heads.clear()
        _heads[key] = head
    return head


def _encode_head(qos: int, retain: bool, delivery_count: int, publisher: str | None,
                 durable: bool, ttl: int | None = None, payload_format: int | None = None,
                 priority: int | None = None, first_acquirer: bool = False,
                 extra: Annotations = NO_ANNOTATIONS) -> bytes:
    header_items = b"".join((b"\x41" if durable else b"\x42",
                             b"\x40" if priority is None else b"\x50" + bytes((priority,)),
                             b"\x40" if ttl is None else _uint(ttl),
                             b"\x41" if first_acquirer else b"\x42",
                             _uint(delivery_count)))
    annotations = (_RETAIN_TRUE if retain else _RETAIN_FALSE) + _QOS[qos]
    pairs = 4
    if publisher is not None:
        annotations += _CLIENT_ID + _str(publisher)
        pairs = 6
    if payload_format is not None:
        annotations += _PAYLOAD_FORMAT + b"\x50" + bytes((payload_format & 0xFF,))
        pairs += 2
    if extra[1]:
        annotations += extra[0]
        pairs += extra[1]
    return b"".join((_HEADER_PREFIX, _compound(0xC0, 0xD0, 5, header_items),
                     _ANNOTATIONS_PREFIX, _compound(0xC1, 0xD1, pairs, annotations)))


def encode_control(subject: str, *, correlation_id: Any = None, message_id: Any = None,
                   body: Any = None, durable: bool = True) -> bytes:
    """A control message (AMQP_SUBSCRIPTIONS, AMQP_PUBREL) with an AmqpValue body."""
    from proton import Message

    msg = Message(subject=subject, durable=durable)
    if correlation_id is not None:
        msg.correlation_id = correlation_id
    if message_id is not None:
        msg.id = message_id
    if body is not None:
        msg.body = body
    return bytes(msg.encode())
