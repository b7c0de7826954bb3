"""What a delivery to an MQTT 5 client looks like on the wire, sans-IO.

It owns the MQTT 5 PUBLISH built for one subscriber: the message's properties
with what is left of its expiry interval, the subscription identifiers of the
filters it matched (as the core found them when it routed the message,
``core.routing.suboptions``: never matched here), the outbound topic alias, and
the client's maximum packet size (a frame above it is not sent).
``protocol.MQTTProtocol.send_publish`` writes the frame (and builds the 3.1.1 and
property-less MQTT 5 frames itself, inline: the hot path); ``QOS0_FRAME`` is the
one-entry cache of a message's 3.1.1 QoS 0 frame that ``send_publish`` reads and
``flows`` fills with the bytes a plain 3.1.1 QoS 0 PUBLISH came in.  What it must not do:
touch a transport, a timer, a log or the broker.
"""

from __future__ import annotations

from typing import Any, Final

from mqttamqp.core.message import Message
from mqttamqp.mqtt.codec import encode_properties, encode_publish
from mqttamqp.mqtt.v5 import Negotiated, publish_properties

__all__ = ["QOS0_FRAME", "QOS0_FRAME5", "publish5"]

#: One-entry cache of the 3.1/3.1.1 QoS 0 frame of a message: (message, retain,
#: frame).  Fan-out sends the same message to many subscribers in a row: encoded
#: once (``protocol.MQTTProtocol.send_publish``); a 3.1.1 PUBLISH whose bytes are
#: that frame puts them here before it is routed (``flows``): not encoded at all.
QOS0_FRAME: Final[list[Any]] = [None, False, b""]
#: The same for MQTT 5 subscribers without properties (``send_publish``).
QOS0_FRAME5: Final[list[Any]] = [None, False, b""]


def publish5(v5: Negotiated, message: Message, qos: int, packet_id: int | None, dup: bool,
             retain: bool, now: float, ids: tuple[int, ...] = ()) -> tuple[bytes, bool]:
    """The MQTT 5 PUBLISH of ``message`` for this client at ``now``, with the
    subscription identifiers ``ids`` (the router's, found when it matched), and
    whether it fits the client's maximum packet size (when it does not, the frame is
    the one without an alias, never sent: the caller counts and says so)."""
    topic = message.topic.encode()
    frame = encode_publish(topic, message.payload, qos, retain, dup, packet_id,
                           encode_properties(publish_properties(message, now, None, ids)))
    limit = v5.client_max_packet
    if limit is not None and len(frame) > limit:
        v5.too_large += 1
        return frame, False
    if v5.client_alias_max:
        alias, with_topic = v5.outbound_alias(message.topic)
        if alias is not None:
            aliased = encode_publish(
                topic if with_topic else b"", message.payload, qos, retain, dup, packet_id,
                encode_properties(publish_properties(message, now, alias, ids)))
            if limit is None or len(aliased) <= limit:
                return aliased, True
            # A new alias costs 3 bytes more: without it the message fits.
            v5.forget_alias(message.topic)
    return frame, True
