"""What the core sends one gateway client: the MQTT frames of its deliveries, with the
packet ids the core's session gave them (the ``.publish`` delivery's message-id: unique
and stable across reconnects, and the id AMQP_PUBREL names), and which AMQP delivery
each id stands for until the client finishes it (PUBACK; PUBREC then PUBCOMP for
QoS 2).

What it owns: the deliveries in flight (bounded: the ``.publish`` credit keeps at most
that many) and those released (PUBREL sent, PUBCOMP awaited), the frames, and whether
an acknowledgement fits its delivery's QoS and state (the broker's rule,
``core.sessions.window.ack_problem``); it allocates no packet id.  What it must not
do: write, or settle anything upstream (the frontend hands the deliveries it returns
to the channel); it keeps nothing beyond the connection (the core redelivers what was not settled).
"""

from __future__ import annotations

from typing import Any

from mqttamqp.amqp.codec.contract import Mqtt5Props
from mqttamqp.core.sessions.window import ack_problem
from mqttamqp.mqtt.codec import encode, encode_properties, encode_publish
from mqttamqp.mqtt.packets import Properties, Pubrel

__all__ = ["Outbound"]

_EMPTY_PROPS = b"\x00"   # MQTT 5: no properties


class Outbound:
    """The deliveries of one client's connection."""

    __slots__ = ("exactly_once", "inflight", "level", "max_packet", "releasing")

    def __init__(self) -> None:
        self.level = 4
        self.max_packet: int | None = None     # MQTT 5: the client's maximum packet size
        self.inflight: dict[int, Any] = {}    # packet id -> delivery (PUBLISH sent)
        self.releasing: dict[int, Any] = {}   # packet id -> AMQP_PUBREL (PUBREL sent)
        # QoS 2 deliveries from PUBLISH to PUBCOMP (PUBREC'd when no longer in flight)
        self.exactly_once: set[int] = set()

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool, dup: bool,
                dlv: Any, message: Mqtt5Props | None = None, pid: int | None = None
                ) -> bytes | None:
        """The PUBLISH frame of a delivery with the core's packet id ``pid`` (kept in
        flight at QoS > 0), or None when that id is missing or already in flight; an
        MQTT 5 client gets the message's properties.  A frame over the client's maximum
        packet size is b"" (not to be sent: the caller settles and counts it)."""
        props = None
        if self.level == 5:
            props = _EMPTY_PROPS if message is None else encode_properties(Properties(
                payload_format_indicator=message.payload_format,
                message_expiry_interval=message.expiry_interval,
                content_type=message.content_type, response_topic=message.response_topic,
                correlation_data=message.correlation_data,
                user_properties=message.user_properties))
        if qos == 0:
            frame = encode_publish(topic.encode(), payload, 0, retain, False, None, props)
        elif pid is None or pid in self.inflight or pid in self.exactly_once:
            return None   # (exactly_once holds the released ids too: ``pubrel``)
        else:
            frame = encode_publish(topic.encode(), payload, qos, retain, dup, pid, props)
        limit = self.max_packet
        if limit is not None and len(frame) > limit:
            return b""
        if qos:
            self.inflight[pid] = dlv   # type: ignore[index]
            if qos == 2:
                self.exactly_once.add(pid)   # type: ignore[arg-type]
        return frame

    def pubrel(self, packet_id: int, dlv: Any) -> bytes:
        """AMQP_PUBREL came for ``packet_id``: its PUBREL frame; ``dlv`` until PUBCOMP."""
        self.releasing[packet_id] = dlv
        # (after a reconnect the resent PUBREL is the first this connection knows of
        # the delivery: PUBACK, or PUBREC, for it breaks the protocol as on a broker)
        self.exactly_once.add(packet_id)
        return encode(Pubrel(packet_id), self.level)

    def ack_problem(self, kind: str, packet_id: int) -> str | None:
        """Why the client's ``kind`` (PUBACK, PUBREC, PUBCOMP) for ``packet_id`` breaks
        the protocol (PUBREC or PUBCOMP for QoS 1, PUBACK or PUBCOMP before PUBREC,
        PUBACK after it), or None; an id not in flight is none (a late duplicate).
        Between the client's PUBREC and the core's AMQP_PUBREL the delivery counts as
        released, as a broker's persistent session holds PUBREL for its commit."""
        if packet_id in self.inflight:
            if packet_id not in self.exactly_once:
                return None if kind == "PUBACK" else ack_problem(kind, packet_id, 1, False)
            return ack_problem(kind, packet_id, 2, False)
        if packet_id in self.exactly_once:
            return ack_problem(kind, packet_id, 2, True)
        return None

    def acknowledged(self, packet_id: int) -> Any:
        """PUBACK or PUBREC: the delivery it finishes (None: unknown id)."""
        return self.inflight.pop(packet_id, None)

    def completed(self, packet_id: int) -> Any:
        """PUBCOMP: the AMQP_PUBREL delivery it finishes (None: PUBREL not sent yet)."""
        dlv = self.releasing.pop(packet_id, None)
        if dlv is not None:
            self.exactly_once.discard(packet_id)
        return dlv
