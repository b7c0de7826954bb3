"""The application message as the core routes it, independent of the wire protocol."""

from __future__ import annotations

from typing import Final

from mqttamqp.records import final_record

__all__ = ["Message", "MessageProperties", "WillMessage", "body_size", "stub"]


@final_record
class MessageProperties:
    """What an MQTT 5 publisher said about its message beyond topic and payload,
    kept in the protocol-neutral form the core stores and forwards.

    Delivered to MQTT 5 subscribers as PUBLISH properties; an MQTT 3.1.1
    subscriber gets the message without them.  The AMQP adapter maps them to and
    from its sections (``content_type`` <-> properties.content-type,
    ``correlation_data`` <-> correlation-id, ``response_topic`` <-> reply-to,
    ``user_properties`` <-> application-properties, ``expiry_interval`` <->
    header.ttl, ``payload_format`` <-> annotation x-opt-mqtt-payload-format).

    ``expiry_interval`` counts seconds from the message's ``timestamp``: the
    message expires at ``timestamp + expiry_interval`` wherever it waits (queue,
    retained store), and what is left of it is forwarded.
    """

    payload_format: Final[int | None]  # 1: the payload is UTF-8 text
    expiry_interval: Final[int | None]
    content_type: Final[str | None]
    response_topic: Final[str | None]
    correlation_data: Final[bytes | None]
    user_properties: Final[tuple[tuple[str, str], ...]]

    def __init__(self, payload_format: int | None = None,
                 expiry_interval: int | None = None, content_type: str | None = None,
                 response_topic: str | None = None, correlation_data: bytes | None = None,
                 user_properties: tuple[tuple[str, str], ...] = ()) -> None:
        self.payload_format = payload_format
        self.expiry_interval = expiry_interval
        self.content_type = content_type
        self.response_topic = response_topic
        self.correlation_data = correlation_data
        self.user_properties = user_properties


@final_record
class Message:
    """A routed message.

    ``qos`` is the publish QoS; the delivery QoS to a subscriber is
    ``min(qos, granted)``.  ``publisher`` is the MQTT client id or AMQP container id
    (kept across the MQTT/AMQP bridge).  ``dup`` is true when the publisher sent it
    as a redelivery (and, in a durable queue's delivery copy, when the queue delivered
    it before); ``timestamp`` is seconds since the epoch at the broker.

    A message from an AMQP sender also keeps what AMQP receivers get as it was sent
    (``native``: its header's durable and priority, and its properties, application
    properties, body and footer, encoded: ``amqp.codec.native.native_sections``);
    ``payload`` is then its MQTT form.  One from an AMQP 0.9.1 publisher keeps its
    basic properties as sent (``amqp091``) for 0.9.1 consumers.  ``amqp_only``: the
    body has no MQTT form (e.g. a map holding binary), so it reaches AMQP topic
    receivers only.
    """

    topic: Final[str]
    payload: Final[bytes]
    qos: Final[int]
    retain: Final[bool]
    publisher: Final[str | None]
    timestamp: Final[float]
    dup: Final[bool]
    native: Final[bytes | None]
    amqp_only: Final[bool]
    props: Final[MessageProperties | None]  # MQTT 5 properties (None: none given)
    # From an AMQP 0.9.1 publisher: its content header's properties as sent (property
    # flags and values), what 0.9.1 consumers get (``amqp091.properties``); the core
    # never looks inside.
    amqp091: Final[bytes | None]
    # The priority its publisher gave (AMQP 1.0 header priority, 0.9.1 basic
    # property priority; None: not given).  Only a queue with priority levels reads
    # it (``core.queues.priority``); MQTT gives none.
    priority: Final[int | None]

    def __init__(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                 publisher: str | None = None, timestamp: float = 0.0, dup: bool = False,
                 native: bytes | None = None, amqp_only: bool = False,
                 props: MessageProperties | None = None, amqp091: bytes | None = None,
                 priority: int | None = None) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.publisher = publisher
        self.timestamp = timestamp
        self.dup = dup
        self.native = native
        self.amqp_only = amqp_only
        self.props = props
        self.amqp091 = amqp091
        self.priority = priority

    def expired(self, now: float) -> bool:
        """Past its message expiry interval (never, without one)."""
        props = self.props
        return (props is not None and props.expiry_interval is not None
                and now >= self.timestamp + props.expiry_interval)

    def remaining_expiry(self, now: float) -> int | None:
        """Whole seconds of its expiry interval left at ``now`` (None: no expiry)."""
        props = self.props
        if props is None or props.expiry_interval is None:
            return None
        return max(0, int(self.timestamp + props.expiry_interval - now + 0.999))

    def with_retain(self, retain: bool) -> Message:
        return self if self.retain == retain else self.with_flags(retain, self.dup)

    def with_flags(self, retain: bool, dup: bool) -> Message:
        """A copy with these ``retain`` and ``dup`` flags (what ``dataclasses.replace``
        gives, built positionally: ``replace`` reads every field by name and passes
        them as keywords, several times the cost; tests/unit/core/test_message.py
        checks the two agree)."""
        return Message(self.topic, self.payload, self.qos, retain, self.publisher,
                       self.timestamp, dup, self.native, self.amqp_only, self.props,
                       self.amqp091, self.priority)


def body_size(message: Message) -> int:
    """The bytes of ``message`` that the memory budget counts: its payload and,
    from an AMQP sender, its AMQP form."""
    native = message.native
    return len(message.payload) + (len(native) if native is not None else 0)


def stub(message: Message) -> Message:
    """``message`` without its body: what a queue keeps in memory of a message
    whose body is in storage only (topic, properties, time: what matching,
    retention and the console need)."""
    m = message
    return Message(m.topic, b"", m.qos, m.retain, m.publisher, m.timestamp, m.dup, None,
                   m.amqp_only, m.props, m.amqp091, m.priority)


@final_record
class WillMessage:
    """A stored will: published on behalf of ``owner`` when it drops without a clean close.

    ``origin`` is ``"mqtt"`` for a CONNECT will or ``"amqp"`` for an AMQP_WILL (keyed
    by link name).
    """

    owner: Final[str]
    topic: Final[str]
    payload: Final[bytes]
    qos: Final[int]
    retain: Final[bool]
    origin: Final[str]
    created: Final[float]
    props: Final[MessageProperties | None]  # MQTT 5 will properties
    delay: Final[float]  # MQTT 5 will delay interval, seconds

    def __init__(self, owner: str, topic: str, payload: bytes, qos: int, retain: bool,
                 origin: str = "mqtt", created: float = 0.0,
                 props: MessageProperties | None = None, delay: float = 0.0) -> None:
        self.owner = owner
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.origin = origin
        self.created = created
        self.props = props
        self.delay = delay

    def as_message(self, timestamp: float) -> Message:
        return Message(self.topic, self.payload, self.qos, self.retain, self.owner, timestamp,
                       props=self.props)
