"""The encoder of the messages the broker sends: AMQP_PUBLISH by hand (the hot
path: one message per delivery, its header and annotations cached per
publisher), with MQTT 5 properties in their places, a native message with the
contract's header and annotations before the sender's own sections, and the
rare control messages (through proton).

What it must not do: decode (the other modules do), or import Twisted or the core.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from mqttamqp.amqp.codec.contract import (
    ANNOTATION_CLIENT_ID,
    ANNOTATION_PAYLOAD_FORMAT,
    ANNOTATION_QOS,
    ANNOTATION_RETAIN,
    Mqtt5Props,
)
from mqttamqp.amqp.codec.values import CACHE_SIZE

__all__ = ["encode_publish", "encode_publish5", "encode_native", "encode_control",
           "encode_annotations", "Annotations", "NO_ANNOTATIONS", "amqp_string", "compound",
           "PROPERTIES_PREFIX"]

_pack_I = struct.Struct(">I").pack


def _sym(name: str) -> bytes:
    raw = name.encode("ascii")
    return b"\xa3" + bytes((len(raw),)) + raw


def amqp_string(value: str) -> bytes:
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


def compound(code8: int, code32: int, count: int, items: bytes) -> bytes:
    if len(items) + 1 < 256 and count < 256:
        return bytes((code8, len(items) + 1, count)) + items
    return bytes((code32,)) + _pack_I(len(items) + 4) + _pack_I(count) + items


_HEADER_PREFIX = b"\x00\x53\x70"
_ANNOTATIONS_PREFIX = b"\x00\x53\x72"
PROPERTIES_PREFIX = b"\x00\x53\x73"
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
                   first_acquirer: bool = False, priority: int | None = None) -> bytes:
    """AMQP_PUBLISH as the contract lays it out: header (durable, ``priority`` if the
    publisher gave one, first-acquirer, delivery-count), message-annotations (retain,
    qos, publisher), properties (``message-id`` = the packet id for QoS 1/2, which
    AMQP_PUBREL names; ``to``), one Data section."""
    head = _head(qos, retain, delivery_count, publisher, qos > 0, priority, first_acquirer)
    properties = ((b"\x40" if message_id is None else _ulong(message_id)) + b"\x40"
                  + amqp_string(topic))
    if len(payload) < 256:
        data = b"\xa0" + bytes((len(payload),)) + payload
    else:
        data = b"\xb0" + _pack_I(len(payload)) + payload
    return b"".join((head, PROPERTIES_PREFIX, compound(0xC0, 0xD0, 3, properties),
                     _DATA_PREFIX, data))


Annotations = tuple[bytes, int]
"""Message annotations the broker adds after the contract's: the encoded key/value
pairs and how many elements (keys and values) they are (``encode_annotations``)."""

NO_ANNOTATIONS: Annotations = (b"", 0)


def encode_annotations(pairs: Sequence[tuple[str, str | int]]) -> Annotations:
    """Annotations keyed by symbols: a str value as a string, an int as a ulong."""
    raw = b"".join(_sym(key) + (_ulong(value) if isinstance(value, int) else amqp_string(value))
                   for key, value in pairs)
    return raw, 2 * len(pairs)


def _correlation(value: bytes | None, text: bool) -> bytes:
    if value is None:
        return b"\x40"
    return amqp_string(value.decode("utf-8", "replace")) if text else _bin(value)


def encode_publish5(topic: str, payload: bytes, qos: int, retain: bool, delivery_count: int,
                    publisher: str | None, message_id: int | str | None, props: Mqtt5Props,
                    first_acquirer: bool = False,
                    annotations: Annotations = NO_ANNOTATIONS,
                    correlation_text: bool = False, priority: int | None = None,
                    subject: str | None = None) -> bytes:
    """AMQP_PUBLISH of a message with MQTT 5 properties, in their places of the
    mapping: header.ttl (``props.expiry_interval`` is what is left of it), the
    payload format annotation, properties reply-to, correlation-id (binary, or
    its UTF-8 as a string with ``correlation_text``: what an AMQP 0.9.1 publisher
    sent) and content-type (a symbol; left out unless ASCII, as symbols are), and
    application-properties (the first value of a repeated key); ``annotations``
    after the contract's; header.priority if the publisher gave one; properties
    subject if given (AMQP_WILL: ``will``).  Not cached: the
    slower path, taken only by messages that carry properties."""
    head = _encode_head(qos, retain, delivery_count, publisher, qos > 0,
                        _ttl_ms(props.expiry_interval), props.payload_format, priority,
                        first_acquirer, annotations)
    items = [_message_id(message_id), b"\x40", amqp_string(topic),
             b"\x40" if subject is None else amqp_string(subject),
             b"\x40" if props.response_topic is None else amqp_string(props.response_topic),
             _correlation(props.correlation_data, correlation_text),
             b"\x40" if props.content_type is None or not props.content_type.isascii()
             else _sym(props.content_type)]
    while items[-1] == b"\x40" and len(items) > 3:
        items.pop()
    parts = [head, PROPERTIES_PREFIX, compound(0xC0, 0xD0, len(items), b"".join(items))]
    if props.user_properties:
        parts.append(_application_properties(props.user_properties))
    parts.append(_DATA_PREFIX)
    parts.append(_bin(payload))
    return b"".join(parts)


def _message_id(message_id: int | str | None) -> bytes:
    if message_id is None:
        return b"\x40"
    return amqp_string(message_id) if isinstance(message_id, str) else _ulong(message_id)


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
            items.append(amqp_string(key) + amqp_string(value))
    return _APP_PROPERTIES_PREFIX + compound(0xC1, 0xD1, 2 * len(items), b"".join(items))


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
        if len(_heads) >= CACHE_SIZE:
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
        annotations += _CLIENT_ID + amqp_string(publisher)
        pairs = 6
    if payload_format is not None:
        annotations += _PAYLOAD_FORMAT + b"\x50" + bytes((payload_format & 0xFF,))
        pairs += 2
    if extra[1]:
        annotations += extra[0]
        pairs += extra[1]
    return b"".join((_HEADER_PREFIX, compound(0xC0, 0xD0, 5, header_items),
                     _ANNOTATIONS_PREFIX, compound(0xC1, 0xD1, pairs, annotations)))


def encode_control(subject: str, *, correlation_id: Any = None, message_id: Any = None,
                   body: Any = None, durable: bool = True) -> bytes:
    """A control message (AMQP_SUBSCRIPTIONS, AMQP_PUBREL) with an AmqpValue body."""
    from proton import Message

    # (Any: proton's stubs say ``encode`` returns bytes, it returns a bytearray, and
    # compiled code checks the declared type of what a call returns)
    msg: Any = Message(subject=subject, durable=durable)
    if correlation_id is not None:
        msg.correlation_id = correlation_id
    if message_id is not None:
        msg.id = message_id
    if body is not None:
        msg.body = body
    return bytes(msg.encode())
