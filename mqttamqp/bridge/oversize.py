"""A PUBLISH from a 3.1.1 remote above this broker's maximum packet size, read past.

A 3.1.1 remote cannot be told our maximum packet size (MQTT 5's CONNECT property), so
it may send a message we will not take.  Closing the connection would not help: the
remote sends it again after each reconnect, and the ``in`` direction stalls behind it
for good.  So the client reads past it instead, as Mosquitto does with a message over
its ``message_size_limit``: ``OversizedPublish`` reads the packet's fixed and variable
headers (QoS, packet id, topic) and discards the rest as it arrives, never holding
more than the headers; the client then acknowledges it (the remote forgets it) and the
bridge counts and logs it as dropped.

What it must not do: hold the payload, or touch a transport (``client`` does).
"""

from __future__ import annotations

from mqttamqp.mqtt.fields import MalformedPacket, long_remaining_length

__all__ = ["OversizedPublish"]


class OversizedPublish:
    """One oversized PUBLISH being read past: ``feed`` bytes until it returns what
    follows the packet.  ``qos``, ``packet_id``, ``topic`` and ``size`` are known
    from then on."""

    __slots__ = ("_head", "_left", "packet_id", "qos", "size", "topic")

    def __init__(self) -> None:
        self._head = bytearray()   # the packet's first bytes, until its headers are read
        self._left = -1            # bytes of the packet still to discard (-1: headers first)
        self.qos = 0
        self.packet_id: int | None = None
        self.topic = ""
        self.size = 0

    def feed(self, data: bytes) -> bytes | None:
        """Take the bytes of the packet from ``data``: the bytes after the packet, or
        None while the packet goes on.  ``MalformedPacket`` if its headers are."""
        if self._left < 0:
            self._head += data
            if not self._headers():
                return None
            data, self._head = bytes(self._head), bytearray()
        if len(data) < self._left:
            self._left -= len(data)
            return None
        rest = data[self._left:]
        self._left = 0
        return rest

    def _headers(self) -> bool:
        """Read the headers from ``_head`` (False: more bytes are needed)."""
        head = self._head
        n = len(head)
        if n < 2:
            return False
        if head[0] >> 4 != 3:
            raise MalformedPacket("an oversized packet that is not a PUBLISH", 0x95)
        length, start = long_remaining_length(head, 0, n)
        if start < 0:
            return False
        qos = (head[0] >> 1) & 3
        if start + 2 > n:
            return False
        p = start + 2 + (head[start] << 8 | head[start + 1])
        if p + (2 if qos else 0) > n:
            return False
        self.qos = qos
        self.topic = head[start + 2:p].decode("utf-8", "replace")
        self.packet_id = (head[p] << 8 | head[p + 1]) if qos else None
        self.size = start + length
        # (``feed`` then discards the packet's bytes from the start of ``_head``)
        self._left = self.size
        return True
