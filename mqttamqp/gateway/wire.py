"""The contract's messages as one gateway client's channel writes and reads them
(docs/gateway.md, ``shared/AMQP-CONTRACT.md``): the control messages (AMQP_CLOSE,
AMQP_LIST, AMQP_SUBSCRIBE, ...) and AMQP_WILL it sends, the core's outcomes of them,
and what a ``.publish`` delivery is: a message of the session with the core's packet
id (its message-id), or an AMQP_PUBREL, or something the gateway rejects.

What it must not do: hold state, touch links or sessions (``channel`` does), or read
or write MQTT (``frontend``).
"""

from __future__ import annotations

from typing import Any

from proton import Message, symbol

from mqttamqp.amqp.codec.contract import (
    ANNOTATION_QOS,
    ANNOTATION_RETAIN,
    Mqtt5Props,
)
from mqttamqp.amqp.codec.encode import encode_publish5
from mqttamqp.amqp.codec.publish import PublishFields, decode_publish
from mqttamqp.amqp.codec.sections import decode_message
from mqttamqp.amqp.codec.values import DecodeError
from mqttamqp.net.rawproton import condition, delivery_remote, lib

__all__ = ["Refused", "Outcome", "control_message", "will_message", "outcome_of",
           "session_delivery", "subscriptions", "message_id"]

ACCEPTED: int = lib.PN_ACCEPTED
REJECTED: int = lib.PN_REJECTED
RELEASED: int = lib.PN_RELEASED
MODIFIED: int = lib.PN_MODIFIED


class Refused(Exception):
    """The core would not serve this client: ``unavailable`` (CONNACK 3 / 0x88) or
    not authorized (CONNACK 5 / 0x87); ``reason`` for the log."""

    def __init__(self, reason: str, unauthorized: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.unauthorized = unauthorized


class Outcome:
    """A disposition from the core: ``accepted``, or why not (``reason``)."""

    __slots__ = ("accepted", "condition", "reason")

    def __init__(self, accepted: bool, reason: str = "", condition: str = "") -> None:
        self.accepted = accepted
        self.reason = reason
        self.condition = condition


def control_message(subject: str, client_id: str, **fields: Any) -> bytes:
    msg = Message(subject=subject, durable=True)
    msg.correlation_id = f"$mqtt.to.{client_id}.publish"
    for name, value in fields.items():
        setattr(msg, name, value)
    return bytes(msg.encode())


def will_message(client_id: str, topic: str, payload: bytes, qos: int, retain: bool,
                 props: Mqtt5Props | None = None) -> bytes:
    """AMQP_WILL; an MQTT 5 will's properties (``props``) in the places a PUBLISH's
    take (docs/amqp.md, the mapping), where the core's will service reads them: the
    expiry interval as header.ttl, payload format as its annotation, content type,
    response topic as reply-to, correlation data as a binary correlation-id, user
    properties as application-properties (a map: of a repeated name the first).  The
    will delay interval has no place in the contract (docs/gateway.md)."""
    if props is None:
        msg = Message(subject="will", durable=qos > 0, address=topic, body=payload)
        msg.annotations = {symbol(ANNOTATION_RETAIN): retain, symbol(ANNOTATION_QOS): qos}
        msg.inferred = True   # (bytes as a Data section)
        return bytes(msg.encode())
    if props.payload_format == 1 and not _utf8(payload):
        # (a broker keeps a will declared UTF-8 that is not; the core's will service
        # refuses one, so the declaration is left out: docs/gateway.md)
        props = props._replace(payload_format=None)
    # (the project's encoder, as for AMQP_PUBLISH: an expiry interval 0 is header.ttl
    # 0, which proton's Message would leave out, a will that never expires)
    return encode_publish5(topic, payload, qos, retain, 0, None, None, props,
                           subject="will")


def _utf8(payload: bytes) -> bool:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


_ACCEPTED = Outcome(True)   # (shared: the usual answer costs no object)
_PROPERTIES = b"\x00\x53\x73"


def _pubrel_id(data: bytes) -> int | None:
    """The packet id of an AMQP_PUBREL on ``.publish``, or None: not one."""
    try:
        msg = decode_message(data)
    except DecodeError:
        return None
    packet_id = msg.message_id
    if msg.subject == "pubrel" and isinstance(packet_id, int) and 1 <= packet_id <= 65535:
        return packet_id
    return None


def message_id(data: bytes, start: int) -> int | None:
    """The ulong message-id of the properties section at ``start`` (the packet id the
    core gave a QoS 1 or 2 delivery), or None; read in place, no decode."""
    if start < 0 or not data.startswith(_PROPERTIES, start):
        return None
    pos = start + 3
    code = data[pos] if pos < len(data) else 0
    if code == 0xC0 and data[pos + 2]:     # list8: size, count
        pos += 3
    elif code == 0xD0 and data[pos + 5:pos + 9] != b"\0\0\0\0":   # list32
        pos += 9
    else:
        return None
    code = data[pos]
    if code == 0x53 or code == 0x52:       # smallulong / smalluint
        return data[pos + 1]
    if code == 0x80 or code == 0x70:       # ulong / uint
        size = 8 if code == 0x80 else 4
        return int.from_bytes(data[pos + 1:pos + 1 + size], "big")
    return None


def outcome_of(dlv: Any, state: int) -> Outcome:
    """The core's outcome of our delivery ``dlv`` (a raw pointer)."""
    if state == ACCEPTED:
        return _ACCEPTED
    both = (condition(lib.pn_disposition_condition(delivery_remote(dlv)))
            if state == REJECTED else None)
    if both is None:
        return Outcome(False, {RELEASED: "released", MODIFIED: "modified"}.get(
            state, f"outcome {state}"))
    name, description = both
    return Outcome(False, f"{name}: {description}" if description else name, name)


def session_delivery(data: bytes, presettled: bool
                     ) -> tuple[PublishFields, int | None] | int | str:
    """What a ``.publish`` delivery is: a message of the session (its fields, whole
    topic and payload, and for QoS 1 and 2 the core's packet id), the packet id of an
    AMQP_PUBREL, or why the gateway rejects it."""
    try:
        fields = decode_publish(data, presettled)
    except DecodeError as e:
        return f"a message the gateway cannot read: {e}"
    if fields.to is None or fields.payload is None:
        packet_id = _pubrel_id(data)
        return "a message with no topic or no MQTT payload" if packet_id is None else packet_id
    if not fields.qos:
        return fields, None
    packet_id = message_id(data, fields.bare_start)
    if packet_id is None or not 1 <= packet_id <= 65535:
        return f"a QoS {fields.qos} message without its packet id as message-id"
    return fields, packet_id


def subscriptions(body: Any) -> dict[str, int]:
    """AMQP_SUBSCRIPTIONS' map: filter → QoS (what is not one is left out)."""
    if not isinstance(body, dict):
        return {}
    return {str(k): int(v) for k, v in body.items() if str(v).isdigit() or isinstance(v, int)}
