"""The publish fast path: what a topic publisher's message means to the broker
(``decode_publish``), with the meaning of a sender's repeated sections before the
body cached by their bytes, and each sender's own memo of them
(``recall_publish``), so that the usual next message costs a prefix compare and
the body's slice.

What it must not do: import proton, Twisted or the core.
"""

from __future__ import annotations

from typing import NamedTuple

from mqttamqp.amqp.codec.contract import (
    ANNOTATION_QOS,
    Mqtt5Props,
    message_retain,
    mqtt5_props,
    mqtt_payload,
    parse_qos,
)
from mqttamqp.amqp.codec.sections import (
    DATA_SECTION,
    DATA_VBIN8,
    PREFIX_MAX,
    decode_message,
    is_section_prefix,
)
from mqttamqp.amqp.codec.values import CACHE_SIZE, DecodeError, unpack_uint

__all__ = ["PublishFields", "PublishMemo", "recall_publish", "decode_publish"]

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
    priority: int | None = None   # header.priority as sent (None: not given, or 4)


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
        stop = start + unpack_uint(data, pos + 1)[0]
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
    if data.startswith(DATA_VBIN8, cut):   # (the usual body: under 256 bytes)
        end = len(data)
        if end > cut + 4 and end == cut + 5 + data[cut + 4]:
            return data[cut + 5:]
        return None
    if not data.startswith(DATA_SECTION, cut):
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
    cut = data.rfind(DATA_SECTION)
    if 0 < cut <= PREFIX_MAX:
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
    if (0 < cut <= PREFIX_MAX and msg.body_kind == "data" and len(msg.data) == 1
            and is_section_prefix(prefix) and _sole_data(data, cut) is not None):
        if len(_publish_heads) >= CACHE_SIZE:
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
