"""The application message as the core routes it, independent of the wire protocol."""

from __future__ import annotations

from dataclasses import replace

from mqttamqp.records import record

__all__ = ["Message", "WillMessage"]


@record
class Message:
    """A routed message.

    ``qos`` is the publish QoS; the delivery QoS to a subscriber is
    ``min(qos, granted)``.  ``publisher`` is the MQTT client id or AMQP container id
    (kept across the MQTT/AMQP bridge).  ``dup`` is true when the publisher sent it
    as a redelivery; ``timestamp`` is seconds since the epoch at the broker.

    A message from an AMQP sender also keeps what AMQP receivers get as it was sent
    (``native``: its properties, application properties, body and footer, encoded);
    ``payload`` is then its MQTT form.  ``amqp_only``: the body has no MQTT form
    (e.g. a map holding binary), so it reaches AMQP topic receivers only.
    """

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    publisher: str | None = None
    timestamp: float = 0.0
    dup: bool = False
    native: bytes | None = None
    amqp_only: bool = False

    def with_retain(self, retain: bool) -> Message:
        return self if self.retain == retain else replace(self, retain=retain)


@record
class WillMessage:
    """A stored will: published on behalf of ``owner`` when it drops without a clean close.

    ``origin`` is ``"mqtt"`` for a CONNECT will or ``"amqp"`` for an AMQP_WILL (keyed
    by link name).
    """

    owner: str
    topic: str
    payload: bytes
    qos: int
    retain: bool
    origin: str = "mqtt"
    created: float = 0.0

    def as_message(self, timestamp: float) -> Message:
        return Message(self.topic, self.payload, self.qos, self.retain, self.owner, timestamp)
