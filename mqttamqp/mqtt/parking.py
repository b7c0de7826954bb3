"""What an MQTT connection holds back while publishers to durable queues are
blocked (the queues are full on disk, or their appends wait for the writer).

The connection is still read, so that the acknowledgements of what it consumes
(PUBACK, PUBREC, PUBCOMP, ``$ack``) and PINGREQ are handled and the queues can
drain; the PUBLISHes to ``$queue/`` (and, in order, every packet after the first
of them) wait in ``Parked`` until the queues have room.  Past ``PARKED_BYTES``
or ``PARKED_PACKETS`` the connection stops being read at all
(``protocol.MQTTProtocol._park``).  Nothing here touches the transport.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from mqttamqp.core.queues.addresses import NOT_QUEUED, QUEUE_COMMAND
from mqttamqp.mqtt.packets import Pingreq, Puback, Pubcomp, Publish, Pubrec, Pubrel

__all__ = ["PARKED_BYTES", "PARKED_PACKETS", "Parked"]

# The packets of a connection that wait before it stops being read at all: bytes
# of payload, packets.
PARKED_BYTES = 256 * 1024
PARKED_PACKETS = 1024

# Handled at once even behind parked packets: they only settle what was sent.
_NEVER_PARKED = frozenset((Puback, Pubrec, Pubrel, Pubcomp, Pingreq))


class _Queues(Protocol):
    """What parking asks of the core's queues (``QueueManager``)."""

    @property
    def blocked(self) -> bool: ...

    def kind(self, topic: str) -> int: ...


def _size(packet: Any) -> int:
    return len(packet.payload) + len(packet.topic) if type(packet) is Publish else 16


class Parked:
    """The packets one connection holds while durable queues are blocked."""

    __slots__ = ("bytes", "packets", "waiting")

    def __init__(self) -> None:
        self.waiting = True   # registered with the storage alarm, not resumed yet
        self.packets: deque[Any] = deque()
        self.bytes = 0

    def hold(self, packet: Any, v5: bool, queues: _Queues) -> bool:
        """Hold ``packet`` (True), or let it be handled now (False): a PUBLISH to
        ``$queue/`` waits, and so does every packet after it (their order is kept),
        except acknowledgements and PINGREQ, and queue commands (``$ack``...) that
        settle what this client consumed."""
        kind = type(packet)
        if kind in _NEVER_PARKED:
            return False
        if kind is Publish:
            topic = packet.topic
            props = packet.properties
            # (what the topic is to the queues, the core says: parsed once, cached)
            to_queues = queues.kind(topic) if topic else NOT_QUEUED
            if to_queues == QUEUE_COMMAND and not (
                    self.packets and props is not None and props.topic_alias):
                return False   # (one that sets an alias waits: the held ones use theirs)
            if not self.packets:
                if topic and to_queues == NOT_QUEUED:
                    return False   # (an alias only, MQTT 5: it may be a queue's; it waits)
                if packet.qos and v5 and queues.blocked:
                    return False   # refused at once with 0x97 (``QueueManager.publish``)
        elif not self.packets:
            return False
        self.packets.append(packet)
        self.bytes += _size(packet)
        return True

    @property
    def over_bound(self) -> bool:
        """Too much held: stop reading the connection."""
        return self.bytes > PARKED_BYTES or len(self.packets) > PARKED_PACKETS

    def take(self) -> Any:
        """The first packet held (the queues have room again)."""
        packet = self.packets.popleft()
        self.bytes -= _size(packet)
        return packet
